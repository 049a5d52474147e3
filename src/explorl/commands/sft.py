"""`explorl sft CONFIG [key=value ...]`: supervised fine-tuning on the task's worked solutions
(`explorl.finetune.sft`)."""

from __future__ import annotations

import json

import explorl.commands.common as common
import explorl.finetune.sft as finetune_sft  # `finetune_sft.run_sft` looked up at call time: tests replace it
import explorl.train.preflight as preflight  # `preflight.check_run_inputs` likewise
from explorl.commands.common import _config_source, _print_checks, _print_config_summary, _print_table
from explorl.tasks import load_task


def add_parser(sub) -> None:
    sf = sub.add_parser("sft", help="supervised fine-tuning on the task's worked solutions (the SFT baselines of "
                                    "ERPO and STILL); writes a run directory like train")
    sf.add_argument("config", nargs="?", help="YAML config (e.g. configs/sft.yaml)")
    sf.add_argument("overrides", nargs="*", help="key.sub=value overrides, e.g. sft.epochs=1 optim.lr=1e-4")
    sf.add_argument("--dry-run", action="store_true",
                    help="validate, print where each non-default value came from, check the inputs, then exit")
    sf.add_argument("--resume", metavar="RUN", help="continue the SFT run in RUN from its last checkpoint")
    sf.set_defaults(fn=cmd_sft)


def cmd_sft(args) -> int:
    console = common.console
    cfg = _print_config_summary(*_config_source(args, "sft", "configs/sft.yaml"))
    checks = preflight.check_run_inputs(cfg, resume=args.resume, command="sft")  # the same checks before a real run
    if args.dry_run:
        with_solution, missing = finetune_sft.worked_solutions(load_task(cfg.task), cfg.task.name,
                                                               cfg.task.solution_field)
        checks.append(("sft data", f"{len(with_solution)} training problems with a worked solution"
                                   + (f" ({missing} without one are skipped)" if missing else "")))
        console.print("[green]config is valid[/] (dry run: nothing trained); checked without loading weights:")
        _print_checks(checks)
        return 0
    run_dir = finetune_sft.run_sft(cfg, console=console, resume=args.resume)
    result = json.loads((run_dir / "eval.json").read_text())
    _print_table("held-out evaluation", {"sft": result}, cfg.run.eval_k)
    console.print(f"run directory: {run_dir} (evaluate it with `explorl eval --model {run_dir / 'final'}`)")
    return 0
