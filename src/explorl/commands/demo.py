"""`explorl demo [CONFIG]`: the main job, base eval, GRPO, eval after, a before/after table (`explorl.train.demo`); run
again after Ctrl-C, it continues from the last checkpoint."""

from __future__ import annotations

import explorl.commands.common as common
import explorl.train.demo as train_demo  # `train_demo.run_demo` looked up at call time: tests replace it
from explorl.config import load_config


def add_parser(sub) -> None:
    d = sub.add_parser("demo", help="the main job: base eval, GRPO, eval after, before/after table")
    d.add_argument("config", nargs="?", default=None, help="config (default: configs/quickstart.yaml)")
    d.add_argument("overrides", nargs="*", help="key.sub=value overrides")
    d.set_defaults(fn=cmd_demo)


def cmd_demo(args) -> int:
    try:
        train_demo.run_demo(args.config, args.overrides, console=common.console)
    except KeyboardInterrupt:  # Ctrl-C: after a checkpoint, a demo continues with the demo's own command
        out_dir = load_config(args.config or train_demo.DEFAULT_CONFIG, args.overrides).run.out_dir
        common.console.print(train_demo.interrupted_hint(out_dir), soft_wrap=True)
        return 130
    return 0
