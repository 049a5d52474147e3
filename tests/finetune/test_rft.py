"""Rejection-sampling fine-tuning: data selection by hand, and a one-iteration run on a tiny model."""

import io
import json
import random

from rich.console import Console

from explorl.config import load_config
from explorl.finetune.rft import run_rft, select_samples


def _cand(i, correct, passes=True, entropy=0.0, branching=0.0):
    return {"id": i, "correct": correct, "passes_filter": passes, "entropy": entropy, "branching": branching}


def test_selection_strategies():
    cands = ([_cand(i, True, entropy=i, branching=10 - i) for i in range(10)]
             + [_cand(10, True, passes=False, entropy=99)]  # fails the rule filters: never chosen
             + [_cand(20 + i, False) for i in range(30)])
    rng = random.Random(0)
    plain = select_samples(cands, [], noisy_frac=0.05, select_frac=0.5, rng=rng)
    assert sorted(c["id"] for c in plain) == list(range(10))
    # entropy keeps the top half of the 10 filtered correct samples by entropy: ids 9..5
    top = select_samples(cands, ["entropy"], noisy_frac=0.05, select_frac=0.5, rng=rng)
    assert sorted(c["id"] for c in top) == [5, 6, 7, 8, 9]
    # branching ranks by branching = 10 - i: ids 0..4
    top = select_samples(cands, ["branching"], noisy_frac=0.05, select_frac=0.5, rng=rng)
    assert sorted(c["id"] for c in top) == [0, 1, 2, 3, 4]
    # noisy adds round(0.05 * 10) = 0 -> at least one incorrect sample; with 0.2: round(2.0) = 2
    noisy = select_samples(cands, ["noisy"], noisy_frac=0.05, select_frac=0.5, rng=rng)
    assert sum(not c["correct"] for c in noisy) == 1 and len(noisy) == 11
    noisy = select_samples(cands, ["noisy"], noisy_frac=0.2, select_frac=0.5, rng=rng)
    assert sum(not c["correct"] for c in noisy) == 2


def test_rft_iteration_on_a_tiny_model(tiny_model_dir, tmp_path):
    cfg = load_config(None, [f"model.path={tiny_model_dir}", f"run.out_dir={tmp_path / 'rft'}",
                             "task.reward=rewards_for_tests:contains_digit", "task.eval_size=4",
                             "task.train_size=16", "sampling.max_new_tokens=12", "run.eval_n=2", "run.eval_k=[1,2]",
                             "rft.iterations=1", "rft.prompts=8", "rft.samples_per_prompt=4",
                             "rft.strategies=[noisy,branching]"])
    out = run_rft(cfg, console=Console(file=io.StringIO()))
    history = json.loads((out / "rft.json").read_text())
    assert [h["iteration"] for h in history] == [0, 1]
    assert {"pass@1", "pass@2", "selected"} <= set(history[1])
    assert (out / "final" / "config.json").exists()
