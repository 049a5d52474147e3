"""Built-in arithmetic task: exact prompt/solution format, splits, determinism, reward."""

import random
import re

import pytest

from explorl.config import TaskConfig
from explorl.rewards import extract_boxed, int_reward
from explorl.tasks import load_task
from explorl.tasks.arith import arith_task, from_expression, make_problem, operations, solution


def test_format_of_a_fixed_expression():
    p = from_expression("7+12-5")
    assert p.prompt == "7+12-5=?\n"
    assert p.answer == "14"
    assert solution(p) == "7+12=19\n19-5=14\n\\boxed{14}"
    assert p.meta == {"difficulty": 2, "solution": solution(p), "id": "7+12-5=?\n"}


def test_negative_intermediate_values():
    p = from_expression("3-9+2")
    assert solution(p) == "3-9=-6\n-6+2=-4\n\\boxed{-4}"
    assert p.answer == "-4"
    assert solution(from_expression("1-20-20")) == "1-20=-19\n-19-20=-39\n\\boxed{-39}"


def test_operations_of_an_expression_or_its_prompt():
    assert operations("7+12-5") == (7, [("+", 12), ("-", 5)])
    assert operations("7+12-5=?\n") == operations("7+12-5")
    assert operations("30") == (30, [])
    with pytest.raises(ValueError, match="not an expression"):
        operations("7*5=?\n")


@pytest.mark.parametrize("bad", ["", "7+", "+7", "7+-5", "7*5", "7 + 5", "-3+4", "7+5=12"])
def test_from_expression_rejects_other_syntax(bad):
    with pytest.raises(ValueError):
        from_expression(bad)


def test_make_problem_ranges():
    rng = random.Random(0)
    for d in (1, 3, 8):
        for _ in range(50):
            p = make_problem(rng, d)
            operands = [int(x) for x in re.findall(r"\d+", p.prompt)]
            assert len(operands) == d + 1 and all(1 <= x <= 20 for x in operands)
            assert p.meta["difficulty"] == d
            assert len(solution(p).splitlines()) == d + 1
            assert int(p.answer) == eval(p.prompt[:-3])  # test-only check of a trusted generated expression


def test_the_default_operands_keep_every_split_as_it_was():
    # prompts of the testbed's split (difficulties 3-7, data_seed 1234) as the code before task.operands drew them
    train, eval_ = arith_task([3, 4, 5, 6, 7], 4096, 128, 1234)
    assert [p.prompt for p in eval_[:2]] == ["4+3+3+12+1+1-20=?\n", "20-5+6+1-8+18-3=?\n"]
    assert train[0].prompt == "17+13+3+3-13-9=?\n"
    assert arith_task([3, 4, 5, 6, 7], 4096, 128, 1234, operands=(1, 20)) == (train, eval_)


def test_operands_from_another_range():
    train, eval_ = arith_task([2, 3], 200, 50, seed=0, operands=(21, 30))
    for p in train + eval_:
        operands = [int(x) for x in re.findall(r"\d+", p.prompt)]
        assert all(21 <= x <= 30 for x in operands) and len(operands) == p.meta["difficulty"] + 1
    assert {x for p in train for x in map(int, re.findall(r"\d+", p.prompt))} == set(range(21, 31))
    # difficulty 1 on [5, 6]: 2 x 2 operands x 2 operators = 8 expressions
    with pytest.raises(ValueError, match="exceed the 8 distinct"):
        arith_task([1], 8, 1, seed=0, operands=(5, 6))


@pytest.mark.parametrize("bad", ["[0, 20]", "[30, 21]", "[5]", "[1, 2000000]"])
def test_operands_out_of_range_are_refused_with_the_field(bad):
    from explorl.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"task\.operands: an inclusive range"):
        load_config(None, [f"task.operands={bad}"])


def test_splits_disjoint_deterministic_and_mixed():
    train, eval_ = arith_task([1, 2, 5], 500, 100, seed=7)
    assert len(train) == 500 and len(eval_) == 100
    prompts = [p.prompt for p in train]
    assert len(set(prompts)) == 500
    assert not set(prompts) & {p.prompt for p in eval_}
    assert {p.meta["difficulty"] for p in train} == {1, 2, 5}
    again, again_eval = arith_task([1, 2, 5], 500, 100, seed=7)
    assert again == train and again_eval == eval_
    assert arith_task([1, 2, 5], 500, 100, seed=8)[0] != train


def test_too_small_space_is_a_clear_error():
    with pytest.raises(ValueError, match="task.train_size"):
        arith_task([1], 800, 1, seed=0)  # difficulty 1 has 20 * 2 * 20 = 800 expressions


def test_int_reward_on_solutions():
    train, _ = arith_task([1, 2, 3, 4, 5], 200, 10, seed=1)
    for p in train:
        assert int_reward(solution(p), p.answer, **p.meta) == 1.0
        assert int_reward(solution(p).replace("\\boxed{", "\\boxed{1"), p.answer, **p.meta) == 0.0
        assert extract_boxed(solution(p)) == p.answer
    assert int_reward("garbage", "3") == 0.0
    assert int_reward("\\boxed{3", "3") == 0.0


def test_load_task():
    task = load_task(TaskConfig(name="arith", difficulties=[1, 3], train_size=64, eval_size=16, data_seed=3))
    assert (len(task.train), len(task.eval)) == (64, 16)
    assert task.reward_fn is int_reward and task.isolate is False
    assert task.extract_answer("x \\boxed{5}") == "5"
    exact = load_task(TaskConfig(name="arith", train_size=4, eval_size=4, reward="exact"))
    assert exact.reward_fn.__name__ == "exact_reward" and not exact.isolate
    with pytest.raises(ValueError, match="task.name"):
        load_task(TaskConfig(name="nope"))


def test_the_prompt_template_wraps_each_question():
    """Issue 56: `task.prompt_template` was silently ignored by `arith` (every template evaluated the same prompts);
    it wraps each question, the answers and solutions stay."""
    plain = load_task(TaskConfig(name="arith", train_size=4, eval_size=3))
    wrapped = load_task(TaskConfig(name="arith", train_size=4, eval_size=3, prompt_template="Q: {question}"))
    for p, q in zip(plain.train + plain.eval, wrapped.train + wrapped.eval):
        assert q.prompt == "Q: " + p.prompt and (q.answer, q.solution) == (p.answer, p.solution)
    assert plain.eval[0].prompt.endswith("=?\n")
