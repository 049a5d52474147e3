"""`explorl train CONFIG [key=value ...]`: train a policy (`explorl.trainer`), or `--resume RUN` a killed run."""

from __future__ import annotations

import json

from rich.syntax import Syntax

import explorl.commands.common as common
from explorl.commands.common import _print_checks, _print_table, _run_config
from explorl.config import dump_yaml


def add_parser(sub) -> None:
    t = sub.add_parser("train", help="train a policy from a YAML config")
    t.add_argument("config", nargs="?", help="YAML config (e.g. configs/quickstart.yaml)")
    t.add_argument("overrides", nargs="*", help="key.sub=value overrides, e.g. sampling.temperature=0.7")
    t.add_argument("--dry-run", action="store_true", help="validate and print the resolved config, then exit")
    t.add_argument("--resume", metavar="RUN", help="continue a killed run from its last checkpoint")
    t.set_defaults(fn=cmd_train)


def cmd_train(args) -> int:
    console = common.console
    cfg = _run_config(args, "train", "configs/quickstart.yaml")
    console.rule("resolved config")
    console.print(Syntax(dump_yaml(cfg), "yaml", background_color="default", word_wrap=True))  # never crop
    from explorl.models import check_run_inputs

    checks = check_run_inputs(cfg, resume=args.resume)  # the same checks before a real run as for --dry-run
    if args.dry_run:
        console.print("[green]config is valid[/] (dry run: nothing trained); checked without loading weights:")
        _print_checks(checks)
        return 0
    from explorl.trainer import train

    run_dir = train(cfg, resume=args.resume, console=console)
    result = json.loads((run_dir / "eval.json").read_text())
    _print_table("held-out evaluation", {"trained": result}, cfg.run.eval_k)
    console.print(f"run directory: {run_dir}")
    return 0
