"""The main job (`make demo`): bootstrap if needed, evaluate the base model, run GRPO, evaluate again.

Prints a before/after table and writes `runs/demo/summary.json` as
`{"base": {"pass@1", "pass@8", "entropy"}, "trained": {...}}`.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from explorl.config import load_config

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml"


def run_demo(config: str | None, overrides: list[str], *, console) -> dict:
    from rich.table import Table

    from explorl.evaluate import evaluate
    from explorl.models import load_policy
    from explorl.tasks import load_task
    from explorl.tasks.chat import prompt_encoder
    from explorl.trainer import train

    path = Path(config) if config else DEFAULT_CONFIG
    cfg = load_config(path, overrides)
    run_dir = Path(cfg.run.out_dir)
    t0 = time.perf_counter()
    console.rule("explorl demo")
    model, tok, _ = load_policy(cfg.model)
    task = load_task(cfg.task)
    ks = sorted(set(cfg.run.eval_k) | {1})
    console.print(f"evaluating the base model on {len(task.eval)} held-out problems, n={cfg.run.eval_n} ...")
    base, _ = evaluate(model, tok, task.eval, task, n=cfg.run.eval_n, ks=ks, temperature=cfg.run.eval_temperature,
                       max_new_tokens=cfg.sampling.max_new_tokens, seed=cfg.run.seed + 10_007 * (cfg.run.steps + 1),
                       reward_timeout_s=cfg.task.reward_timeout_s, encode=prompt_encoder(tok, cfg.task))
    del model
    if run_dir.exists():  # the demo always starts afresh
        shutil.rmtree(run_dir)
    console.print(f"training with {cfg.algo.advantage} for {cfg.run.steps} steps -> {run_dir}")
    train(cfg, console=console)
    trained = json.loads((run_dir / "eval.json").read_text())
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
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    console.print(f"wrote {run_dir / 'summary.json'} ({summary['seconds']:.0f}s in all)")
    return summary
