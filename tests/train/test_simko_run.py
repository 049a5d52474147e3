"""SimKO (docs/methods.md §5w) trains in explorl's loop: two steps of the quickstart config on the embedded model,
with pi_old's own forward (its top-K log-probs in the batch, several updates per batch) and with the one-update
shortcut (the update's forward stands in for pi_old's), each with a finite loss and SimKO's statistics logged."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from explorl.config import load_config
from explorl.train.loop import train
from explorl.train.update import on_policy_single_update

QUICKSTART = Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml"


@pytest.mark.parametrize("extra", [("algo.mini_batches=2",), ()], ids=["pi-old-forward", "single-update"])
def test_simko_trains_with_a_finite_loss_and_logs_its_gate(tmp_path, extra):
    cfg = load_config(str(QUICKSTART), [
        f"run.out_dir={tmp_path / 'run'}", "run.steps=2", "run.batch_size=2", "run.eval_every=0", "task.eval_size=2",
        "run.eval_n=1", "run.eval_k=[1]", "run.save_every=0", "run.log_samples=0", "sampling.max_new_tokens=16",
        "algo.loss=simko", "algo.simko.alpha=0.5", "algo.simko.tau=0.5", *extra])
    assert on_policy_single_update(cfg) == (extra == ())
    run = train(cfg, progress=False)
    steps = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if "loss/pg" in x]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert r["loss/nonfinite"] == 0 and math.isfinite(r["loss/pg"]) and math.isfinite(r["optim/grad_norm"])
        assert 0 < r["loss/simko_gate_frac"] <= 0.5 and 0 <= r["loss/simko_neg_scaled_frac"] <= 0.5
