"""`explorl demo [CONFIG]`: the main job, base eval, GRPO, eval after, a before/after table (`explorl.demo`)."""

from __future__ import annotations

import explorl.commands.common as common


def add_parser(sub) -> None:
    d = sub.add_parser("demo", help="the main job: base eval, GRPO, eval after, before/after table")
    d.add_argument("config", nargs="?", default=None, help="config (default: configs/quickstart.yaml)")
    d.add_argument("overrides", nargs="*", help="key.sub=value overrides")
    d.set_defaults(fn=cmd_demo)


def cmd_demo(args) -> int:
    from explorl.demo import run_demo

    run_demo(args.config, args.overrides, console=common.console)
    return 0
