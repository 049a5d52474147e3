"""Reward functions: boxed extraction, math-verify in the sandbox, adversarial completions, batch scoring."""

import math
import sys
import threading
import time
from pathlib import Path

import pytest

# workers start with this sys.path, so they find the helpers in tests/
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import sandbox_helpers  # noqa: E402,F401

from explorl.rewards import (  # noqa: E402
    RewardRunner, exact_reward, extract_boxed, int_reward, math_check, math_reward, resolve_reward, reward_versions,
)

# ---------------------------------------------------------------------------------------------- extract_boxed


@pytest.mark.parametrize("text, expected", [
    ("the answer is \\boxed{42}.", "42"),
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("\\boxed{1} then \\boxed{2}", "2"),
    ("\\fbox{7}", "7"),
    ("\\boxed {x+1}", "x+1"),
    ("\\boxed{\\{1,2\\}}", "\\{1,2\\}"),
    ("\\boxed{a{b{c}}d}", "a{b{c}}d"),
    ("\\boxed{}", ""),
    ("no box here", None),
    ("\\boxed{1", None),
    ("\\boxed{1} and \\boxed{2", None),  # the last box is the final answer, even when unbalanced
    ("\\boxed{" + "1" * 3000 + "}", None),
])
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


def test_extract_boxed_is_bounded_on_huge_input():
    t = time.monotonic()
    assert extract_boxed("{" * 5_000_000 + "\\boxed{" + "{" * 5_000_000) is None
    assert extract_boxed("x" * 5_000_000 + "\\boxed{5}") == "5"
    assert extract_boxed("\\boxed{" + "{" * 10_000 + "}" * 10_001) is None  # too long
    assert time.monotonic() - t < 2.0
    assert extract_boxed("\\boxed{" + "1" * 3000 + "}", max_len=5000) == "1" * 3000


# ------------------------------------------------------------------------------------------------ math_reward


@pytest.mark.parametrize("completion, answer, expected", [
    ("so \\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("\\boxed{\\frac{1}{2}}", "1/2", 1.0),
    ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
    ("\\boxed{x^2+2x+1}", "(x+1)^2", 1.0),
    ("\\boxed{\\{2,1\\}}", "\\{1,2\\}", 1.0),
    ("\\boxed{1} no, wait: \\boxed{3}", "3", 1.0),
    ("\\boxed{\\frac{1}{3}}", "0.5", 0.0),
    ("\\boxed{3}", "$3$", 1.0),
    ("the answer is 0.5", "0.5", 0.0),  # no box, no reward
    ("\\boxed{}", "0", 0.0),
])
def test_math_reward(completion, answer, expected):
    assert math_reward(completion, answer) == expected


def _pwned(tmp_path):
    """A completion that would create a file if anything evaluated it as Python."""
    return f"\\boxed{{__import__('os').system('touch {tmp_path}/pwned')}}"


@pytest.mark.parametrize("make", [
    lambda tmp: "\\boxed{" + "{" * 10000 + "}" * 10000 + "}",
    lambda tmp: "\\boxed{" + "{" * 60 + "1" + "}" * 60 + "}",
    lambda tmp: "\\boxed{9^9^9^9}",
    lambda tmp: "\\boxed{9^{9^{9^{9}}}}",
    lambda tmp: "\\boxed{10^{10^{10}}}!",
    _pwned,
    lambda tmp: "\\boxed{eval('1')}",
    lambda tmp: "9" * 1_000_000,
    lambda tmp: "\\boxed{" + "1+" * 500_000 + "1}",
], ids=["deep-braces", "depth-60", "tower", "tower-braced", "10^10^10", "python-code", "eval", "1MB", "1MB-box"])
def test_adversarial_completions_score_zero_in_bounded_time(make, tmp_path):
    completion = make(tmp_path)
    t = time.monotonic()
    assert math_reward(completion, "1", timeout_s=3.0) == 0.0
    assert time.monotonic() - t < 3.0 + 3.0
    assert not (tmp_path / "pwned").exists()


def test_math_reward_is_correct_after_huge_padding():
    assert math_reward("x" * 1_000_000 + "\\boxed{\\frac{2}{4}}", "0.5") == 1.0


def test_math_reward_from_a_thread():
    results = []
    threads = [threading.Thread(target=lambda: results.append(math_reward("\\boxed{2}", "2"))) for _ in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    assert results == [1.0, 1.0, 1.0]


def test_math_check_in_process_from_a_thread():
    # signal-based timeouts cannot work outside the main thread: math_check must switch them off, not fail
    results = []
    th = threading.Thread(target=lambda: results.append(math_check("\\boxed{\\frac{1}{2}}", "0.5")))
    th.start()
    th.join(30)
    assert results == [1.0]


# ------------------------------------------------------------------------------------------- cheap rewards


def test_exact_reward():
    assert exact_reward("\\boxed{ Paris }", "Paris") == 1.0
    assert exact_reward("\\boxed{paris}", "Paris") == 0.0
    assert exact_reward("Paris", "Paris") == 0.0


@pytest.mark.parametrize("completion, expected", [
    ("7+12=19\n19-5=14\n\\boxed{14}", 1.0),
    ("\\boxed{ 14 }", 1.0),
    ("\\boxed{014}", 1.0),
    ("\\boxed{15}", 0.0),
    ("\\boxed{7+7}", 0.0),  # never evaluated
    ("\\boxed{14.0}", 0.0),
    ("\\boxed{1e1}", 0.0),
    ("\\boxed{" + "9" * 40 + "}", 0.0),
    ("14", 0.0),
    ("", 0.0),
])
def test_int_reward(completion, expected):
    assert int_reward(completion, "14") == expected
    assert int_reward("\\boxed{-4}", "-4") == 1.0


# ------------------------------------------------------------------------------------------- RewardRunner

_BATCH = ["7", "8", "raise", "nan", "inf", "str", "none", "true"]


def test_runner_in_process_counts_errors():
    run = RewardRunner(sandbox_helpers.flaky_reward, isolate=False)
    res = run(_BATCH, ["7"] * len(_BATCH), [{}] * len(_BATCH))
    assert res.rewards == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert (res.errors, res.timeouts) == (5, 0)


def test_runner_isolated_counts_errors_and_timeouts():
    batch = _BATCH + ["sleep", "die", "7"]
    metas = [{}] * (len(batch) - 1) + [{"scale": 0.5}]
    res = RewardRunner(sandbox_helpers.flaky_reward, isolate=True, timeout_s=1.0, workers=2)(
        batch, ["7"] * len(batch), metas)
    assert res.rewards == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.5]
    assert (res.errors, res.timeouts) == (6, 1)
    assert all(isinstance(r, float) and math.isfinite(r) for r in res.rewards)


def test_runner_with_math_checker():
    fn, isolate = resolve_reward("math", None)
    res = RewardRunner(fn, isolate=isolate, timeout_s=5.0)(
        ["\\boxed{0.5}", "\\boxed{1/3}", "nothing", "\\boxed{9^{9^{9^{9}}}}"], ["1/2"] * 4,
        [{"id": i} for i in range(4)])
    assert res.rewards == [1.0, 0.0, 0.0, 0.0]
    assert res.errors == 0


def test_runner_checks_lengths():
    with pytest.raises(ValueError, match="2 completions, 1 answers"):
        RewardRunner(exact_reward, isolate=False)(["a", "b"], ["a"], [{}, {}])


# ----------------------------------------------------------------------------------------- resolve_reward


def test_resolve_reward():
    default = (int_reward, False)
    assert resolve_reward("auto", default) is default
    assert resolve_reward("math", default) == (math_check, True)
    assert resolve_reward("exact", default) == (exact_reward, False)
    assert resolve_reward("sandbox_helpers:flaky_reward", default) == (sandbox_helpers.flaky_reward, True)
    with pytest.raises(ValueError, match="task.reward: cannot import module 'no_such_module_xyz'"):
        resolve_reward("no_such_module_xyz:f", default)
    with pytest.raises(ValueError, match="task.reward: module 'sandbox_helpers' has no attribute 'nope'"):
        resolve_reward("sandbox_helpers:nope", default)
    with pytest.raises(ValueError, match="task.reward"):
        resolve_reward("sandbox_helpers:", default)


# --------------------------------------------------------------------------- failures come back with their text

import broken_rewards  # noqa: E402


def test_runner_reports_what_each_failure_was():
    batch = ["7", "raise", "nan", "str", "sleep", "die"]
    res = RewardRunner(sandbox_helpers.flaky_reward, isolate=True, timeout_s=1.0, workers=2)(batch, ["7"] * 6)
    assert res.rewards == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert [(f.index, f.kind) for f in res.failures] == [(1, "error"), (2, "value"), (3, "value"), (4, "timeout"),
                                                         (5, "error")]
    raised, nan, text, timeout, died = res.failures
    assert raised.message == "RuntimeError('reward bug')"
    assert raised.detail.startswith("Traceback (most recent call last):")
    assert "in flaky_reward" in raised.detail and raised.detail.rstrip().endswith("RuntimeError: reward bug")
    assert (raised.completion, raised.answer) == ("raise", "7")
    assert nan.message.startswith("float: returned nan, not a finite number")
    assert text.message.startswith("str: returned '1.0', not a finite number")
    assert timeout.message == "timed out after 1 s (task.reward_timeout_s)"
    assert died.message == "worker died (exit code 1)" and died.detail == died.message
    assert (res.errors, res.timeouts) == (4, 1) == (len(res.failures) - 1, 1)


def test_runner_reports_a_wrong_signature_and_in_process_tracebacks():
    res = RewardRunner(broken_rewards.one_argument, isolate=True, timeout_s=5.0, workers=1)(["a"], ["b"])
    (f,) = res.failures
    assert f.kind == "error" and "TypeError" in f.message and "positional argument" in f.message
    assert "return fn(completion, answer, **meta)" in f.detail  # the call that did not match the signature
    here = RewardRunner(broken_rewards.divides_by_zero, isolate=False)(["ab", "c"], ["1", "1"])
    assert [x.message for x in here.failures] == ["ZeroDivisionError('division by zero')"] * 2
    assert "in divides_by_zero" in here.failures[0].detail
    # one bug, two inputs: the same failure for reporting (the key ignores the message, which may quote input)
    assert here.failures[0].key == here.failures[1].key != res.failures[0].key


def test_failure_excerpts_are_bounded():
    res = RewardRunner(broken_rewards.returns_text, isolate=False)(["x" * 5000], ["y" * 10])
    (f,) = res.failures
    assert f.completion == "x" * 300 + "... (5000 characters)" and f.answer == "y" * 10


def test_a_batch_of_hanging_samples_runs_in_parallel_across_the_pool():
    # Issue 10 item 2: the runner used one shared worker, so 8 hanging samples took the sum of their limits
    # (measured before the fix: 4.75 s for 8 x 0.5 s; 16.6-16.8 s for 8 x 2 s). The default pool has one worker
    # per CPU (2 to 16): on 2 shared cores 8 x 0.5 s now takes 2.34-2.62 s, and 8 x 2 s 8.3-8.5 s, i.e.
    # limit x ceil(8 / 2) plus ~0.1 s per round to restart the killed workers.
    # The bound is the serial time itself (8 x the limit): one worker at a time cannot finish below it, while the
    # pool's rounds (about half of it on 2 cores) leave room for a loaded machine. A tighter bound (rounds x 0.7 s
    # + 0.5 s at a 0.5 s limit) failed once with three CPU-bound jobs on the 2 cores.
    from explorl.rewards.sandbox import default_workers

    limit = 1.0
    run = RewardRunner(sandbox_helpers.flaky_reward, isolate=True, timeout_s=limit)
    assert run.workers == default_workers() >= 2
    run(["7"] * run.workers, ["7"] * run.workers)  # workers started (start-up is not part of any limit)
    t = time.monotonic()
    res = run(["sleep"] * 8, ["7"] * 8)
    elapsed = time.monotonic() - t
    assert res.timeouts == 8 and res.rewards == [0.0] * 8
    rounds = math.ceil(8 / run.workers)
    assert elapsed < 8 * limit, elapsed  # one at a time: >= 8 x the limit
    assert elapsed >= limit * rounds - 0.05  # and the limit itself still holds: nothing returned early



# ----------------------------------------------------------------------------------------------------------------
# check_rewards: every task.reward entry called once on a sample before a run (the dry run's,
# tests/commands/test_cli.py)


def test_check_rewards_imports_every_entry_before_a_worker_starts(tmp_path, monkeypatch):
    """A `module:function` next to the config is found through the working directory, which `resolve_reward`
    puts on sys.path; workers copy sys.path when they start, so a worker started for `math` before the user's
    module was resolved would not find it. Training resolves every entry first; so does the check."""
    from explorl.rewards import RewardLimits, check_rewards
    from explorl.rewards.sandbox import close_shared_pools

    (tmp_path / "check_rewards_mod.py").write_text("def fmt(completion, answer, **meta):\n"
                                                   "    return 0.5 if 'boxed' in completion else 0.0\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])  # restored afterwards
    close_shared_pools()  # no worker started with another sys.path
    try:
        lines = check_rewards(["math", "check_rewards_mod:fmt"], (exact_reward, False), "4", "so \\boxed{4}",
                              {"id": "x"}, limits=RewardLimits(timeout_s=5.0, workers=1))
    finally:
        close_shared_pools()
    assert lines == [("task.reward[0]", "math (explorl.rewards:math_check) returned 1.0 on a sample completion"),
                     ("task.reward[1]", "check_rewards_mod:fmt returned 0.5 on a sample completion")]
    # `auto` is the task's own reward; an entry that cannot be imported is named by its index
    assert check_rewards("auto", (exact_reward, False), "4", "\\boxed{5}") == [
        ("task.reward[0]", "auto (explorl.rewards:exact_reward) returned 0.0 on a sample completion")]
    with pytest.raises(ValueError, match=r"task.reward\[1\]: cannot import module 'no_such_module_xyz'"):
        check_rewards("exact,no_such_module_xyz:f", (exact_reward, False), "4", "\\boxed{4}")


# ------------------------------------------------------------------------------ stated equations: verified, chain


@pytest.mark.parametrize("text, expected", [
    ("1-18=-17\n-17+3=-14", (2, 0)),
    ("1-18=-16\n-16+3=-13", (2, 1)),  # 1-18 is -17; the next line is right for its own operands
    ("so 3 \\times 4 = 12, and 12+5 = 17.", (2, 0)),  # sentence punctuation after a result
    ("2+2=5. Then 3*3=9.", (2, 1)),
    ("3*4+2=14 and 2-3*4=-10", (2, 0)),  # products first: 12+2, 2-12
    ("3--2=5", (1, 0)),  # a negative operand
    ("x^2-4=0", (0, 0)),  # a power: not an integer equation
    ("x-2-4=-6", (0, 0)),  # a variable before it
    ("1.5+2=3.5 and 0.5+2=2", (0, 0)),  # decimals are not checked
    ("1,000+5=1,005", (0, 0)),  # thousands separators are not parsed
    ("2+3=5+0", (0, 0)),  # a chain a=b+c: the right side is not one integer
    ("a=3+4=7", (0, 0)),
    ("f(2)=4", (0, 0)),  # no operator
    ("12/4+1=4", (0, 0)),  # division is not checked
    ("no equations here", (0, 0)),
])
def test_false_equations(text, expected):
    from explorl.rewards import false_equations

    assert false_equations(text) == expected


def test_false_equations_is_bounded_on_huge_input():
    from explorl.rewards import MAX_SCAN, false_equations

    # only the last MAX_SCAN = 100,000 characters are read: "1+1=3" (5) and 99,995 before it, which are 16,665
    # whole "1+1=2 " (6 each) after a fragment "+1=2 " (5) that has no first operand: 16,666 equations
    assert MAX_SCAN == 100_000
    assert false_equations("1+1=2 " * 50_000 + "1+1=3") == (16_666, 1)
    assert false_equations("1+" * 100_000 + "=2") == (0, 0)  # 100k operators: more than 20, not an equation


def test_verified_reward_zeroes_a_right_answer_reached_through_false_arithmetic():
    from explorl.rewards import verified_reward

    right = "2-11=-9\n-9+5=-4\n\\boxed{-4}"
    guessed = "2-11=-8\n-8+5=-4\n\\boxed{-4}"  # -8+5 is -3: two false equations, the answer right by luck
    assert verified_reward(right, "-4", checker=int_reward) == 1.0
    assert verified_reward(guessed, "-4", checker=int_reward) == 0.0
    assert int_reward(guessed, "-4") == 1.0
    assert verified_reward("2-11=-9\n\\boxed{-9}", "-4", checker=int_reward) == 0.0  # true steps, wrong answer


def test_chain_reward_needs_every_step_of_the_solution():
    from explorl.rewards import chain_reward
    from explorl.tasks.arith import from_expression

    p = from_expression("2-11+5")
    assert p.meta["solution"] == "2-11=-9\n-9+5=-4\n\\boxed{-4}"
    assert chain_reward(" 2-11=-9\n\n-9+5=-4 \n\\boxed{-4}\n", p.answer, **p.meta) == 1.0  # blank lines, spaces
    assert chain_reward("2+5=7\n7-11=-4\n\\boxed{-4}", p.answer, **p.meta) == 0.0  # right answer, other order
    assert chain_reward("2-11=-9\n\\boxed{-4}", p.answer, **p.meta) == 0.0  # a step left out
    # text after the boxed answer on its line is not work (version 2): stray braces, a remark; a second boxed
    # answer is read instead of the first (extract_boxed), another line or another answer is a wrong chain
    work = "2-11=-9\n-9+5=-4\n"
    assert chain_reward(work + "\\boxed{-4}}}", p.answer, **p.meta) == 1.0
    assert chain_reward(work + "\\boxed{-4} so -4", p.answer, **p.meta) == 1.0
    assert chain_reward(work + "\\boxed{-4}\\boxed{7}", p.answer, **p.meta) == 0.0
    assert chain_reward(work + "\\boxed{-45}", p.answer, **p.meta) == 0.0
    assert chain_reward(work + "\\boxed{-4}\nmore", p.answer, **p.meta) == 0.0
    assert chain_reward(work + "-4", p.answer, **p.meta) == 0.0
    with pytest.raises(ValueError, match="worked solution"):
        chain_reward("\\boxed{-4}", "-4")


def test_resolve_verified_and_chain():
    import functools
    import pickle

    from explorl.rewards import chain_reward, verified_reward

    fn, isolate = resolve_reward("verified", (int_reward, False))
    assert isinstance(fn, functools.partial) and fn.func is verified_reward and not isolate
    fn, isolate = resolve_reward("verified", (math_check, True))  # a slow checker stays in the worker pool
    assert isolate and pickle.loads(pickle.dumps(fn)).keywords["checker"] is math_check
    assert fn("1+1=3\n\\boxed{2}", "2") == 0.0 and fn("1+1=2\n\\boxed{2}", "2") == 1.0
    assert resolve_reward("chain", (int_reward, False)) == (chain_reward, False)
    assert reward_versions("chain") == {"chain": 2} and reward_versions("auto,chain") == {"chain": 2}
    assert reward_versions(["math", "my_rewards:fmt"]) == {}

    def batch_checker(completions, answers, **meta):  # a batched default cannot be wrapped per sample
        return [1.0] * len(completions)
    with pytest.raises(ValueError, match="per-sample checker"):
        resolve_reward("verified", (batch_checker, False))


def test_verified_runs_in_the_worker_pool():
    run = RewardRunner(resolve_reward("verified", (math_check, True))[0], isolate=True, timeout_s=20)
    result = run(["1+1=2\n\\boxed{2}", "1+1=3\n\\boxed{2}"], ["2", "2"])
    assert result.rewards == [1.0, 0.0] and result.errors == 0
