"""`python -m explorl` is the `explorl` command."""

import sys

from explorl.cli import main

sys.exit(main())
