"""The rollout/trainer mismatch (`mismatch/*`, explorl.algos.mismatch) in metrics.jsonl on every step of a run of the
quickstart config on the embedded model (issue 52 item 4): with the single-update shortcut (the update forward's
log-probs before its step), with a pi_old forward (two epochs) and under verl's bypass mode (pi_old the rollout's: the
update forward's log-probs), in float32 at top-p 1 and 0.9."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from explorl.algos.mismatch import MISMATCH_KEYS
from explorl.config import load_config
from explorl.train.loop import train
from explorl.train.update import on_policy_single_update

QUICKSTART = Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml"


def _run(tmp_path: Path, *extra: str) -> list[dict]:
    cfg = load_config(str(QUICKSTART), [f"run.out_dir={tmp_path / 'run'}", "run.steps=2", "run.batch_size=2",
                                        "run.eval_every=0", "task.eval_size=2", "run.eval_n=1", "run.eval_k=[1]",
                                        "run.save_every=0", "run.log_samples=0", *extra])
    run = train(cfg, progress=False)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if "loss/pg" in r]  # the training steps (the final evaluation's line has no update)


def _mismatch(r: dict) -> dict:
    return {k.removeprefix("mismatch/"): v for k, v in r.items() if k.startswith("mismatch/")}


@pytest.mark.parametrize("extra", [(), ("algo.epochs=2",)], ids=["single-update", "pi-old-forward"])
def test_same_kernels_same_temperature_no_top_p_measure_no_mismatch(tmp_path, extra):
    assert on_policy_single_update(load_config(str(QUICKSTART), list(extra))) == (extra == ())
    steps = _run(tmp_path, *extra)
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        m = _mismatch(r)
        assert set(m) == set(MISMATCH_KEYS), r["step"]
        # the sampler's incremental float32 forward and the trainer's full one differ by rounding only
        assert abs(m["kl"]) < 1e-6 and 0 <= m["k3_kl"] < 1e-9
        assert 1 - 1e-4 < m["ratio_min"] <= m["ratio_max"] < 1 + 1e-4
        assert m["ratio_oob"] == 0.0 and m["ess"] == pytest.approx(1.0, abs=1e-9)
        assert m["training_ppl"] == pytest.approx(m["rollout_ppl"], rel=1e-5)
        assert m["ppl_ratio"] == pytest.approx(1.0, abs=1e-5)
        assert m["tokens"] > 0
        if extra:  # pi_old's forward covers every response token
            assert m["tokens"] == pytest.approx(r["length/mean"] * r["rollouts/total"])


@pytest.mark.parametrize("extra", [(), ("algo.loss=bypass_mode",)], ids=["single-update", "bypass-mode"])
def test_top_p_that_the_trainer_does_not_apply_shows_as_ratios_of_the_nucleus_mass(tmp_path, extra):
    # the sampler renormalises over the nucleus (mass Z >= 0.9), the trainer scores the full softmax: every ratio is
    # Z, in [0.9, 1], so none is outside [0.9, 1.1] while the KL and the perplexity gap are plain. Under verl's bypass
    # mode pi_old is the rollout itself: the mismatch is the update forward's, not the rollout's with itself (ratio 1)
    steps = _run(tmp_path, "sampling.top_p=0.9", *extra)
    for r in steps:
        m = _mismatch(r)
        assert set(m) == set(MISMATCH_KEYS), r["step"]
        assert m["kl"] > 1e-3 and m["k3_kl"] > 1e-5
        assert 0.9 - 1e-4 < m["ratio_min"] < 0.99 and m["ratio_max"] <= 1 + 1e-5
        assert m["ratio_oob"] == 0.0
        assert m["log_ppl_diff"] > 1e-3 and m["ppl_ratio"] > 1.0 and m["training_ppl"] > m["rollout_ppl"]
        assert m["chi2_token"] < 0 and m["ess"] < 1.0
