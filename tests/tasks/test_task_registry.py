"""Tasks are found through the registry: the built-in names, clear errors, and a task registered by a plugin."""

import dataclasses

import pytest

from explorl.algos.registry import entries, lookup, names, register
from explorl.config import TaskConfig
from explorl.rewards import exact_reward, extract_boxed
from explorl.tasks import Problem, load_task

TINY_TRAIN = [Problem(prompt="1+1=?\n", answer="2"), Problem(prompt="2+2=?\n", answer="4")]
TINY_EVAL = [Problem(prompt="3+3=?\n", answer="6")]


def tiny_test_task(cfg: TaskConfig):
    """A fixed two-problem task, as a plugin would register it."""
    return TINY_TRAIN, TINY_EVAL, (exact_reward, False), extract_boxed


if "tiny_test_task" not in names("task"):  # the registry is process-global; this module may be imported again
    register("task", "tiny_test_task")(tiny_test_task)


def test_builtin_tasks_are_registered():
    assert {"arith", "file", "rg:<argument>"} <= set(names("task"))
    assert lookup("task", "rg:chain_sum").name == "rg"


def test_every_field_a_task_reads_exists():
    fields = {f.name for f in dataclasses.fields(TaskConfig)}
    for entry in entries("task").values():
        assert set(entry.reads) <= fields, entry.name


@pytest.mark.parametrize("name", ["nope", "rg:", "rg", "arith:x"])
def test_unknown_task_lists_the_valid_ones(name):
    with pytest.raises(ValueError, match=r"task\.name: .* is not a task; valid: .*arith.*file.*rg:<argument>"):
        load_task(TaskConfig(name=name))


def test_a_registered_task_loads_through_load_task():
    task = load_task(TaskConfig(name="tiny_test_task"))
    assert task.name == "tiny_test_task"
    assert task.train == TINY_TRAIN and task.eval == TINY_EVAL
    assert task.reward_fn is exact_reward and task.isolate is False
    assert task.extract_answer is extract_boxed


def test_reward_override_applies_to_a_registered_task():
    task = load_task(TaskConfig(name="tiny_test_task", reward="math"))
    assert task.isolate is True
