"""Evaluation at a matched sampling entropy (`explorl eval --match-entropy`): the bisection reaches a target whose
temperature is known, and `base` is a model's own entropy at T = 1."""

from __future__ import annotations

import json

import pytest

from explorl import commands
from explorl.config import load_config
from explorl.evaluation.evaluate import EntropySearch, match_entropy, sampled_entropy
from explorl.models import load_policy
from explorl.rollout.sampler import Sampler
from explorl.tasks import load_task

SMALL = ["task.difficulties=[1]", "task.train_size=8", "task.eval_size=8"]


@pytest.fixture(scope="module")
def setup(tiny_model_dir):
    cfg = load_config(None, [f"model.path={tiny_model_dir}", *SMALL])
    model, tok, _ = load_policy(cfg.model)
    return model, tok, load_task(cfg.task).eval[:6]


def test_the_entropy_temperature_curve_rises_and_bisection_finds_a_known_temperature(setup):
    model, tok, problems = setup
    sampler = Sampler(model, tok.eos_token_id, tok.pad_token_id, 12)
    kw = dict(n=4, seed=3)
    curve = [sampled_entropy(sampler, tok, problems, t, **kw) for t in (0.3, 0.6, 1.0, 1.5)]
    assert curve == sorted(curve) and curve[0] < curve[-1]  # hotter samples, higher entropy
    # the target is the entropy this very procedure measures at T = 0.7: bisection must come back to it
    target = sampled_entropy(sampler, tok, problems, 0.7, **kw)
    m = match_entropy(sampler, tok, problems, target, search=EntropySearch(tol=1e-3), **kw)
    assert abs(m.entropy - target) <= 1e-3 and m.temperature == pytest.approx(0.7, rel=0.05)
    assert m.iterations >= 1 and (m.problems, m.n) == (6, 4)
    # targets beyond what [lo, hi] reaches stop at the ends
    assert match_entropy(sampler, tok, problems, 0.0, **kw).temperature == 0.05
    assert match_entropy(sampler, tok, problems, 1e9, **kw).temperature == 4.0


def test_eval_match_entropy_records_what_it_found(tiny_model_dir, tmp_path, monkeypatch):
    lines: list[str] = []
    monkeypatch.setattr(commands.common.console, "print", lambda *a, **k: lines.append(" ".join(str(x) for x in a)))
    out = tmp_path / "m.json"
    args = ["eval", "--model", str(tiny_model_dir), "--task", "arith", "--n", "2", "--k", "1", "--device", "cpu",
            "--max-new-tokens", "12", "--task-opt", "difficulties=[1]", "--task-opt", "train_size=8",
            "--task-opt", "eval_size=8", "--calibration", "4", "--out", str(out), "--overwrite"]
    assert commands.main([*args, "--match-entropy", "base"]) == 0, lines
    record = json.loads(out.read_text())
    m = record["match_entropy"]
    # a plain model is its own base: its entropy at T = 1 is matched near T = 1 (the samples themselves change with
    # the temperature, so the curve is not exactly smooth: within the entropy tolerance, T within a few percent)
    assert m["of"] == "base" and m["temperature"] == pytest.approx(1.0, rel=0.05) and m["iterations"] >= 1
    assert abs(m["entropy"] - m["target"]) <= 2e-3 and record["temperature"] == m["temperature"]
    assert record["settings"]["temperature"]["from"] == "--match-entropy"
    assert any("matched entropy: target" in line for line in lines)
    with pytest.raises(SystemExit, match="neither a number"):
        commands.main([*args, "--match-entropy", "hot"])
    with pytest.raises(SystemExit, match="per-token"):
        commands.main([*args, "--match-entropy", "1.0", "--schedule", "ead"])
