"""Issue 56 item 4: whatever a reward returns, the run goes on. A value that is not a finite number (an int of 400
digits, a Decimal too large for a float, NaN, a complex number, an array) scores 0 and is counted as a `value`
failure naming its type, in training (`RewardRunner`, in a worker or here, per sample or batched) and in the dry run
(`check_rewards`, `train.preflight.check_run_inputs`); numbers that are finite floats in any spelling are scores."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # workers find the helpers in tests/
import broken_rewards  # noqa: E402

from explorl.config import load_config  # noqa: E402
from explorl.rewards import RewardLimits, RewardRunner, check_rewards, exact_reward  # noqa: E402

SCORES = {"decimal": 0.25, "np": 0.5, "np-int": 1.0, "np-0d": 0.75, "true": 1.0, "one": 1.0}
"""The values that are scores (`broken_rewards._odd_value`), as floats."""
TOO_LARGE = {"huge": "int", "-huge": "int", "digits": "int", "fraction": "Fraction", "decimal-huge": "Decimal"}
"""Exact numbers no float holds, by the type the message names."""
NOT_FINITE = {"snan": "Decimal", "np-inf": "float64", "inf": "float", "np-1d": "ndarray", "complex": "complex",
              "np-complex": "complex128", "np-str": "ndarray"}
NAMES = [*SCORES, *TOO_LARGE, *NOT_FINITE]


def _check(result, names: list[str]) -> dict:
    """Assert the scores and failures of `names` scored by `odd_values`; returns the failures by name."""
    assert result.rewards == [SCORES.get(n, 0.0) for n in names]
    assert all(isinstance(r, float) for r in result.rewards)
    failed = {names[f.index]: f for f in result.failures}
    assert set(failed) == set(names) - set(SCORES)
    assert (result.errors, result.timeouts) == (len(failed), 0)
    for name, f in failed.items():
        if name == "unloadable":
            continue
        kind = {**TOO_LARGE, **NOT_FINITE}[name]
        assert f.kind == "value" and f.message.startswith(f"{kind}: returned "), f.message
        assert "not a finite number" in f.message and len(f.message) < 250, f.message
        assert ("too large for a float" in f.message) == (name in TOO_LARGE), f.message
    return failed


@pytest.mark.parametrize("isolate", [False, True], ids=["here", "worker"])
def test_every_kind_of_number_scores_or_fails_alone(isolate):
    names = [*NAMES, "unloadable"]
    runner = RewardRunner(broken_rewards.odd_values, isolate=isolate, timeout_s=30, workers=2)
    result = runner(names, ["1"] * len(names))
    unloadable = _check(result, names)["unloadable"]
    if isolate:  # the worker pickled it; the trainer cannot load it: an error of that item, not of the run
        assert unloadable.kind == "error"
        assert unloadable.message == "could not load the result from the worker: RuntimeError('cannot be rebuilt here')"
    else:
        assert unloadable.kind == "value" and unloadable.message.startswith("_Unloadable: returned <")


@pytest.mark.parametrize("isolate", [False, True], ids=["here", "worker"])
def test_a_batched_reward_s_bad_scores_fail_alone_and_a_huge_list_fails_the_batch(isolate):
    fn = broken_rewards.batched_odd_values
    _check(RewardRunner(fn, isolate=isolate, timeout_s=30, workers=1)(NAMES, ["1"] * len(NAMES)), NAMES)
    result = RewardRunner(broken_rewards.batched_huge_list, isolate=isolate, timeout_s=30, workers=1)(["a", "b"],
                                                                                                  ["1", "1"])
    assert result.rewards == [0.0, 0.0] and result.errors == 2
    assert result.failures[0].message.startswith("list: returned 1000000 scores for 2 completions")


def test_the_reward_check_before_a_run_refuses_an_int_too_large_for_a_float():
    with pytest.raises(ValueError, match=r"task.reward\[0\]: broken_rewards:returns_huge_int returned a value that is "
                                         r"not a score on a sample completion .*: int: returned 1000.*, not a finite "
                                         r"number, too large for a float"):
        check_rewards("broken_rewards:returns_huge_int", (exact_reward, False), "4", "\\boxed{4}")
    # under the run's threshold it is a warning, as any failure is
    (line,) = check_rewards("broken_rewards:returns_huge_int", (exact_reward, False), "4", "\\boxed{4}",
                            limits=RewardLimits(max_failure_frac=1.0))
    assert line[1].startswith("warning: broken_rewards:returns_huge_int failed on 1 of 1 sample rows")


def test_the_dry_run_reports_an_int_too_large_for_a_float(tiny_model_dir, tmp_path):
    from explorl.train.preflight import check_run_inputs

    cfg = load_config(None, [f"model.path={tiny_model_dir}", "task.reward=broken_rewards:returns_huge_int",
                             "task.difficulties=[1]", "task.train_size=16", "task.eval_size=2",
                             f"run.out_dir={tmp_path / 'run'}"])
    with pytest.raises(ValueError, match=r"int: returned 1000.*not a finite number, too large for a float"):
        check_run_inputs(cfg)
