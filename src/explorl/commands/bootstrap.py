"""`explorl bootstrap --out DIR`: train a tiny default model as the shipped embedded one was (`explorl.bootstrap`)."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text

import explorl.commands.common as common


def add_parser(sub) -> None:
    b = sub.add_parser("bootstrap", help="train a tiny default model as the shipped embedded one was trained")
    b.add_argument("--out", required=True, help="directory to write (the shipped model lies in explorl/embedded/)")
    b.add_argument("--force", action="store_true", help="retrain even if cached")
    b.set_defaults(fn=cmd_bootstrap)


def cmd_bootstrap(args) -> int:
    from explorl.bootstrap import bootstrap

    console = common.console
    target = Path(args.out)
    if (target / "config.json").exists() and not args.force:
        console.print(f"a model is already at {target} (use --force to retrain)")
        return 0
    bootstrap(target, console=console)
    console.print(Text(f"use it with EXPLORL_EMBEDDED={target} (model.path=embedded) or model.path={target}; the "
                       f"embedded default that ships with explorl is unchanged"))
    return 0
