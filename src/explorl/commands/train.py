"""`explorl train CONFIG [key=value ...]`: train a policy (`explorl.train.loop`), or `--resume RUN` a killed run."""

from __future__ import annotations

import json

import explorl.commands.common as common
import explorl.train.loop as loop  # `loop.train` looked up at call time: tests replace it
import explorl.train.preflight as preflight  # `preflight.check_run_inputs` likewise
from explorl.commands.common import _config_source, _print_checks, _print_config_summary, _print_table


def add_parser(sub) -> None:
    t = sub.add_parser("train", help="train a policy from a YAML config")
    t.add_argument("config", nargs="?", help="YAML config (e.g. configs/quickstart.yaml)")
    t.add_argument("overrides", nargs="*", help="key.sub=value overrides, e.g. sampling.temperature=0.7")
    t.add_argument("--dry-run", action="store_true",
                   help="validate, print where each non-default value came from and check every input, then exit")
    t.add_argument("--resume", metavar="RUN", help="continue a killed run from its last checkpoint")
    t.set_defaults(fn=cmd_train)


def cmd_train(args) -> int:
    console = common.console
    cfg = _print_config_summary(*_config_source(args, "train", "configs/quickstart.yaml"))
    checks = preflight.check_run_inputs(cfg, resume=args.resume)  # the same checks before a real run as for --dry-run
    if args.dry_run:
        console.print("[green]config is valid[/] (dry run: nothing trained); checked without loading weights:")
        _print_checks(checks)
        return 0
    run_dir = loop.train(cfg, resume=args.resume, console=console)
    result = json.loads((run_dir / "eval.json").read_text())
    _print_table("held-out evaluation", {"trained": result}, cfg.run.eval_k)
    console.print(f"run directory: {run_dir}")
    return 0
