"""`explorl rft CONFIG [key=value ...]`: rejection-sampling fine-tuning (`explorl.finetune.rft`)."""

from __future__ import annotations

import explorl.commands.common as common
import explorl.train.preflight as preflight  # `preflight.check_run_inputs` looked up at call time: tests replace it
from explorl.commands.common import _print_checks, _print_config_summary
from explorl.finetune.rft import run_rft


def add_parser(sub) -> None:
    f = sub.add_parser("rft", help="rejection-sampling fine-tuning with exploration-aware data selection")
    f.add_argument("config", help="YAML config (e.g. configs/rft.yaml)")
    f.add_argument("overrides", nargs="*", help="key.sub=value overrides, e.g. rft.strategies=[noisy]")
    f.add_argument("--dry-run", action="store_true",
                   help="validate, print where each non-default value came from, check the inputs, then exit")
    f.set_defaults(fn=cmd_rft)


def cmd_rft(args) -> int:
    console = common.console
    cfg = _print_config_summary(args.config, list(args.overrides))
    checks = [c for c in preflight.check_run_inputs(cfg) if c[0] != "run.out_dir"]  # rft keeps its own output layout
    if args.dry_run:
        console.print("[green]config is valid[/] (dry run: nothing trained); checked without loading weights:")
        _print_checks(checks)
        return 0
    run_dir = run_rft(cfg, console=console)
    console.print(f"run directory: {run_dir} (per-iteration results in rft.json)")
    return 0
