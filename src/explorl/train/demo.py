"""The main job (`make demo`): evaluate the base model, run GRPO, evaluate again.

Prints a before/after table and writes `runs/demo/summary.json` as
`{"base": {"pass@1", "pass@8", "entropy"}, "trained": {...}}`.

A demo's run directory (`run.out_dir`, `runs/demo`) gets `demo.json` when the demo stops, finished or interrupted
(Ctrl-C, SIGTERM: the trainer writes a checkpoint first): the config and overrides it ran with and the base model's
evaluation. Run again with the same config and overrides, an interrupted demo continues from its last checkpoint and
then writes the summary; a finished demo, or one of another config, is deleted first, saying so. A directory without
`demo.json` (another run, a demo killed outright, anything else) is never deleted.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from explorl.config import load_config
from explorl.evaluation.evaluate import EvalPlan, evaluate
from explorl.models import load_policy
from explorl.rollout.sampler import Sampler
from explorl.runs import nofollow
from explorl.tasks import load_task
from explorl.tasks.chat import prompt_encoder
from explorl.train.loop import train

DEFAULT_CONFIG = Path(__file__).resolve().parents[3] / "configs" / "quickstart.yaml"
MARKER = "demo.json"
"""The file that marks a directory as a demo's run: its config, overrides and the base model's evaluation."""


def demo_state(run_dir: Path, config: str, overrides: list[str]) -> tuple[str, dict | None, str]:
    """What `run_dir` holds for a demo of `config` with `overrides`, as (state, its demo.json, why):
    `new` nothing; `continue` an interrupted demo of the same config and overrides with a checkpoint; `replace` a
    finished demo, one of another config or overrides, or one stopped before its first checkpoint; `foreign`
    something that is not a demo's run (never deleted)."""
    if not run_dir.exists() or not any(run_dir.iterdir()):
        return "new", None, ""
    try:
        marker = json.loads((run_dir / MARKER).read_text())
    except (OSError, ValueError):
        marker = None
    if not isinstance(marker, dict):
        return "foreign", None, (f"holds no {MARKER}: not a finished or interrupted demo (another run, a demo killed "
                                 f"outright, or other files)")
    if (run_dir / "summary.json").exists():
        return "replace", marker, "holds a finished demo"
    if marker.get("config") != config or marker.get("overrides") != list(overrides):
        return "replace", marker, "holds a demo of another config or other overrides"
    if not any(p.is_dir() for p in (run_dir / "checkpoints").glob("step_*")):
        return "replace", marker, "holds a demo stopped before its first checkpoint"
    return "continue", marker, "holds an interrupted demo"


def run_demo(config: str | None, overrides: list[str], *, console) -> dict:
    path = Path(config) if config else DEFAULT_CONFIG
    cfg = load_config(path, overrides)
    run_dir = Path(cfg.run.out_dir)
    t0 = time.perf_counter()
    console.rule("explorl demo")
    state, marker, why = demo_state(run_dir, str(path.resolve()), list(overrides))
    shown = escape(str(run_dir))
    if state == "foreign":
        raise FileExistsError(f"run.out_dir={run_dir} {why}; the demo deletes and rewrites only its own runs, so it "
                              f"leaves this one alone: delete {run_dir} to run the demo there, continue a run with "
                              f"`explorl train --resume {run_dir}`, or choose another run.out_dir")
    if state == "replace":
        console.print(f"{shown} {why}: deleting it (its checkpoints, metrics, samples, final model and summary) to "
                      f"start afresh", highlight=False, soft_wrap=True)
        shutil.rmtree(run_dir)
    if state == "continue":
        base = marker["base"]
        console.print(f"continuing the interrupted demo in {shown} from its last checkpoint (the base model's "
                      f"evaluation is kept from its start; delete {shown} to start afresh)", highlight=False,
                      soft_wrap=True)
    else:
        model, tok, _ = load_policy(cfg.model)
        task = load_task(cfg.task)
        ks = sorted(set(cfg.run.eval_k) | {1})
        console.print(f"evaluating the base model on {len(task.eval)} held-out problems, n={cfg.run.eval_n} ...")
        # sampled as the trained model's evaluation samples (`held_out_evaluator`: the run's sampling settings)
        plan = EvalPlan(n=cfg.run.eval_n, ks=ks, temperature=cfg.run.eval_temperature,
                        seed=cfg.run.seed + 10_007 * (cfg.run.steps + 1), reward_timeout_s=cfg.task.reward_timeout_s)
        base, _ = evaluate(Sampler.from_config(model, tok, cfg.sampling), tok, task.eval, task, plan,
                           encode=prompt_encoder(tok, cfg.task))
        del model
        console.print(f"training with {cfg.algo.advantage} for {cfg.run.steps} steps -> {run_dir}")
    marker = {"config": str(path.resolve()), "overrides": list(overrides), "base": base}
    try:
        train(cfg, console=console, resume=run_dir if state == "continue" else None)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the run directory says it is this demo's, to be continued
        if run_dir.is_dir():
            nofollow.write_atomic(run_dir / MARKER, json.dumps(marker, indent=1))
        raise
    nofollow.write_atomic(run_dir / MARKER, json.dumps(marker, indent=1))  # never through a symbolic link
    trained = json.loads((run_dir / "eval.json").read_text())
    ks = sorted(set(cfg.run.eval_k) | {1})
    keys = [f"pass@{k}" for k in ks] + ["entropy", "length"]
    table = Table(title=f"held-out {cfg.task.name}: base vs after {cfg.run.steps} GRPO steps "
                        f"(n={cfg.run.eval_n}, T={cfg.run.eval_temperature})")
    table.add_column("model")
    for k in keys:
        table.add_column(k, justify="right")
    table.add_row("base", *[f"{base[k]:.3f}" for k in keys])
    table.add_row("trained", *[f"{trained[k]:.3f}" for k in keys])
    console.print(table)
    summary = {"base": {k: base[k] for k in keys}, "trained": {k: trained[k] for k in keys},
               "config": str(path), "seconds": time.perf_counter() - t0}
    nofollow.write_atomic(run_dir / "summary.json", json.dumps(summary, indent=2))
    console.print(f"wrote {run_dir / 'summary.json'} ({summary['seconds']:.0f}s in all)")
    return summary


def interrupted_hint(run_dir: str | Path) -> str:
    """What to do after Ctrl-C stopped a demo (rich markup): the demo's own command again, not `explorl train
    --resume`, which would train on but never write the demo's summary."""
    shown = escape(str(run_dir))
    return (f"[yellow]demo interrupted[/]: run `make demo` (or the same `explorl demo` command) again: it continues "
            f"from the last checkpoint in {shown} and writes the summary (`explorl train --resume` would not); delete "
            f"{shown} to start afresh")
