"""reasoning-gym tasks: loading, disjoint splits, scoring through the dataset's own score_answer."""

import json

import pytest

from explorl.config import TaskConfig
from explorl.rewards import RewardRunner
from explorl.tasks import load_task
from explorl.tasks.rg import extract_rg_answer, rg_reward


@pytest.fixture(scope="module")
def task():
    """A small chain_sum task (loading reasoning-gym once per module)."""
    return load_task(TaskConfig(name="rg:chain_sum", train_size=40, eval_size=10, data_seed=11))


def test_loads_with_boxed_instruction(task):
    assert (len(task.train), len(task.eval)) == (40, 10)
    p = task.train[0]
    assert p.prompt.startswith(p.meta["entry"]["question"]) and p.prompt.endswith("within \\boxed{}.")
    assert p.meta["rg_name"] == "chain_sum" and p.answer == p.meta["entry"]["answer"]
    json.dumps([q.meta for q in task.train + task.eval])
    assert task.isolate and task.reward_fn is rg_reward
    assert not {q.meta["entry"]["question"] for q in task.train} & {q.meta["entry"]["question"] for q in task.eval}


def test_own_answer_scores_one_and_wrong_answer_zero(task):
    p = task.eval[0]
    assert rg_reward(f"so \\boxed{{{p.answer}}}", p.answer, **p.meta) == 1.0
    assert rg_reward(f"\\boxed{{{int(p.answer) + 1}}}", p.answer, **p.meta) == 0.0
    problems = task.train[:3]
    completions = [f"\\boxed{{{q.answer}}}" for q in problems] + ["\\boxed{banana}", f"work\n{problems[0].answer}"]
    answers = [q.answer for q in problems] + [problems[0].answer] * 2
    metas = [q.meta for q in problems] + [problems[0].meta] * 2
    res = RewardRunner(task.reward_fn, isolate=True, timeout_s=10.0)(completions, answers, metas)
    assert res.rewards == [1.0, 1.0, 1.0, 0.0, 1.0] and res.errors == 0


def test_custom_template_has_no_instruction():
    t = load_task(TaskConfig(name="rg:chain_sum", train_size=2, eval_size=1, prompt_template="Q: {question} A:"))
    assert t.train[0].prompt == f"Q: {t.train[0].meta['entry']['question']} A:"


def test_extract_rg_answer():
    assert extract_rg_answer("a\n\\boxed{ 42 }\nthanks") == "42"
    assert extract_rg_answer("thinking\n 17 \n\n") == "17"
    assert extract_rg_answer("") is None


def test_unknown_dataset_lists_valid_names():
    with pytest.raises(ValueError, match=r"task.name: 'rg:chain_summ' .* Did you mean rg:chain_sum.*available, e.g."):
        load_task(TaskConfig(name="rg:chain_summ"))


@pytest.mark.parametrize("typed, meant", [("countdown_game", "rg:countdown"), ("maze_runner", "rg:maze")])
def test_an_unknown_name_far_from_any_as_a_whole_is_matched_by_a_word(typed, meant):
    # difflib finds nothing close to the whole name; a dataset sharing one of its words is suggested instead
    with pytest.raises(ValueError, match=rf"'rg:{typed}' is not a reasoning-gym dataset. Did you mean [^?]*{meant}"):
        load_task(TaskConfig(name=f"rg:{typed}"))
