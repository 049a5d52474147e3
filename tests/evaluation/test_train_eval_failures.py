"""Issue 56 item 9: the evaluations of `explorl train` (every `run.eval_every` steps and at the end) say when reward
calls failed, in the words of `explorl eval` (`evaluation.failures.report_reward_failures`), instead of printing a
pass@k that quietly counts the failures as wrong answers."""

from __future__ import annotations

import io
import json

from rich.console import Console

from explorl.config import load_config

BASE = ["run.steps=2", "run.batch_size=2", "sampling.group_size=2", "sampling.max_new_tokens=8",
        "task.difficulties=[1]", "task.train_size=16", "task.eval_size=4", "run.eval_n=2", "run.eval_k=[1]",
        "task.max_reward_failure_frac=1"]  # training goes on whatever fails: the evaluations are under test


def _train(tiny_model_dir, out, *extra) -> tuple[str, dict]:
    """(what the run printed, its eval.json)."""
    from explorl.train.loop import train

    cfg = load_config(None, [f"model.path={tiny_model_dir}", f"run.out_dir={out}", *BASE, *extra])
    buf = io.StringIO()
    run = train(cfg, console=Console(file=buf, width=500), progress=False)
    return buf.getvalue(), json.loads((run / "eval.json").read_text())


def test_training_warns_when_reward_calls_fail_in_its_evaluations(tiny_model_dir, tmp_path):
    # one function of two fails on every sample: half the calls, a warning (4 problems x 2 samples x 2 functions)
    reward = "[rewards_for_tests:contains_digit, broken_rewards:divides_by_zero]"
    said, final = _train(tiny_model_dir, tmp_path / "run", f"task.reward={reward}", "run.eval_every=1",
                         "run.eval_sets={hard: {difficulties: [3], eval_size: 3}}")
    for step in (1, 2):  # the periodic evaluation and the one at the end, each set on its own
        assert (f"warning: held-out evaluation at step {step}: 8 of 16 reward calls failed or timed out "
                f"(task.reward=['rewards_for_tests:contains_digit', 'broken_rewards:divides_by_zero']; they "
                f"scored 0). First: broken_rewards.divides_by_zero: ZeroDivisionError") in said
        assert f"warning: held-out evaluation at step {step} on run.eval_sets.hard: 6 of 12 reward calls" in said
    assert "error: most reward calls failed" not in said
    assert final["errors"] == 8


def test_training_says_when_most_reward_calls_of_its_final_evaluation_fail(tiny_model_dir, tmp_path):
    said, final = _train(tiny_model_dir, tmp_path / "run", "task.reward=broken_rewards:divides_by_zero")
    assert ("error: most reward calls failed: held-out evaluation at step 2: 8 of 8 reward calls failed or timed "
            "out (task.reward='broken_rewards:divides_by_zero'; they scored 0). First: ZeroDivisionError") in said
    assert "The held-out evaluation at step 2 measures the failures, not the model" in said
    assert final["errors"] == 8  # the run still completes and records it
