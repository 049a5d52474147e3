"""`python -m explorl` is the `explorl` command."""

import sys

from explorl.commands import main

sys.exit(main())
