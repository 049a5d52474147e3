"""Correctness is its own rule, not the weighted reward: one `task.reward` entry (the first by default, or
`task.correct_by`) above `task.correct_threshold` decides pass@k, maj@k and the unsolvable sets; the final answer
of maj@k and the format rate follow `task.answer_pattern` (the last `\\boxed{}` by default)."""

from __future__ import annotations

import pytest

from explorl.config import ConfigError, load_config
from explorl.evaluation.evaluate import EvalPlan, evaluate
from explorl.models import load_policy
from explorl.rollout.sampler import Sampler
from explorl.tasks import load_task
from explorl.tasks.base import pattern_extractor

TWO = ["task.reward=[rewards_for_tests:has_equals,rewards_for_tests:contains_digit]", "task.reward_weights=[0.1,3.0]"]
TEXTS = ["12", "a=b", "x", "1=1"]  # digit only, '=' only, neither, both


def _runner_and_task(*overrides):
    task = load_task(load_config(None, [*TWO, *overrides, "task.train_size=4", "task.eval_size=2"]).task)
    return task.reward_runner(5.0), task


def test_the_first_entry_decides_not_the_weighted_sum():
    runner, task = _runner_and_task()
    rr = runner(TEXTS, ["0"] * 4)
    # weighted: 0.1 * has_equals + 3.0 * contains_digit = 3.0, 0.1, 0, 3.1: three samples above 0.5
    assert rr.rewards == pytest.approx([3.0, 0.1, 0.0, 3.1])
    # correct by the first entry, has_equals, alone: "a=b" and "1=1"
    assert rr.judged == [0.0, 1.0, 0.0, 1.0] and task.correct(rr) == [False, True, False, True]


def test_correct_by_names_another_entry_and_the_threshold_applies_to_its_own_score():
    runner, task = _runner_and_task("task.correct_by=rewards_for_tests:contains_digit")
    assert task.correct(runner(TEXTS, ["0"] * 4)) == [True, False, False, True]
    runner, task = _runner_and_task("task.correct_by=rewards_for_tests.contains_digit", "task.correct_threshold=1.0")
    assert task.correct(runner(TEXTS, ["0"] * 4)) == [False] * 4  # the score is 1.0, not above 1.0


def test_bad_rules_are_refused_naming_the_field():
    with pytest.raises(ConfigError, match="task.correct_by: 'math' is not one of the task.reward entries"):
        load_config(None, [*TWO, "task.correct_by=math"])
    with pytest.raises(ConfigError, match="task.answer_pattern: .* needs a group"):
        load_config(None, ["task.answer_pattern=Answer: [0-9]+"])
    with pytest.raises(ConfigError, match="task.answer_pattern: .* is not a regular expression"):
        load_config(None, ["task.answer_pattern=Answer: ([0-9]+"])


def test_answer_pattern_reads_the_last_answer_and_the_format_counts_exactly_one():
    extract = pattern_extractor(r"Answer: *(-?[0-9]+)")
    assert extract("work... Answer: 12\nso Answer: -7 ") == "-7"
    assert extract("no answer here") is None
    assert extract("x" * 10_000 + "Answer: 5") == "5"  # the tail is searched
    assert extract("Answer: 5" + "x" * 10_000) is None  # beyond the last 4,000 characters: not read
    task = load_task(load_config(None, ["task.answer_pattern=Answer: *(-?[0-9]+)", "task.train_size=4",
                                        "task.eval_size=2"]).task)
    assert task.well_formatted("Answer: 3") and not task.well_formatted("Answer: 3 Answer: 4")
    assert not task.well_formatted("\\boxed{3}")  # the pattern replaces the boxed default
    default = load_task(load_config(None, ["task.train_size=4", "task.eval_size=2"]).task)
    assert default.well_formatted("\\boxed{3}") and not default.well_formatted("Answer: 3")


def test_evaluation_counts_pass_at_k_by_the_rule(tiny_model_dir):
    """On a random tiny model: a sample is correct when it has an '=' (the first entry), whatever contains_digit's
    weight 3 adds; pass@1 is that rate."""
    cfg = load_config(None, [*TWO, f"model.path={tiny_model_dir}", "task.train_size=4", "task.eval_size=6",
                             "task.difficulties=[1]"])
    model, tok, _ = load_policy(cfg.model)
    task = load_task(cfg.task)
    sampler = Sampler(model, tok.eos_token_id, tok.pad_token_id, 12)
    summary, results = evaluate(sampler, tok, task.eval, task, EvalPlan(n=8, ks=[1], seed=0, keep_completions=True))
    texts = [t for r in results for t in r.completions]
    judged = [c for r in results for c in r.correct]
    assert judged == ["=" in t for t in texts]
    assert summary["pass@1"] == pytest.approx(sum(judged) / len(judged))
    # the weighted sum would have called these correct: a digit (weight 3) without an '='
    digit_only = [i for i, t in enumerate(texts) if any(c.isdigit() for c in t) and "=" not in t]
    assert digit_only, "the sample has no digit-only completion; pick another seed"
    assert all(not judged[i] for i in digit_only)
    rewards = [rw for r in results for rw in r.rewards]
    assert all(rewards[i] > 0.5 for i in digit_only)
