"""Broken reward functions for the tests of issue 10 item 1 (spawned workers import them by name: tests/ is on
sys.path). Each is broken in one of the ways a user's reward can be."""

import os

from explorl.rewards import batched


def divides_by_zero(completion, answer, **meta):
    """Raises on every sample."""
    return len(completion) / 0


def one_argument(completion):
    """The wrong signature: the runner calls fn(completion, answer, **meta)."""
    return 1.0


def returns_text(completion, answer, **meta):
    """A string is not a reward."""
    return "1.0"


def nan_without_digit(completion, answer, **meta):
    """NaN for a completion without a digit (about 30% of a random char model's 12-token responses), else 1."""
    return 1.0 if any(c.isdigit() for c in completion) else float("nan")


def raises_once_flag_exists(completion, answer, **meta):
    """Fine until the file named by EXPLORL_TEST_BREAK_FLAG exists, then raises on every sample."""
    if os.path.exists(os.environ.get("EXPLORL_TEST_BREAK_FLAG", "/nonexistent")):
        raise KeyError(f"no field {completion[:5]!r}")
    return float(any(c.isdigit() for c in completion))


@batched
def one_score_short(completions, answers, **meta):
    """Batched, but returns one score fewer than it was given completions."""
    return [1.0] * (len(completions) - 1)


@batched
def nan_for_the_second(completions, answers, **meta):
    """Batched: NaN for the second completion, 1 for the others."""
    return [float("nan") if i == 1 else 1.0 for i in range(len(completions))]


def batched_returns_a_float(completions, answers, **meta):
    """Batched by TRL's naming, but returns one number instead of a list."""
    return 1.0


@batched
def batched_raises(completions, answers, **meta):
    """Batched, raises on every call."""
    raise RuntimeError(f"cannot score {len(completions)} completions")


def returns_none(completion, answer, **meta):
    """Forgets to return its score."""
    score = float(str(answer) in completion)  # noqa: F841


def hangs(completion, answer, **meta):
    """Never returns (until its worker is killed)."""
    import time

    while True:
        time.sleep(1)


def returns_huge_int(completion, answer, **meta):
    """10**400: a Python int, exact, and too large for any float (issue 56 item 4: it crashed the run)."""
    return 10**400


def _odd_value(name):
    import decimal
    import fractions

    import numpy as np

    return {"huge": 10**400, "-huge": -(10**400), "digits": 10**5000, "fraction": fractions.Fraction(10**400, 3),
            "decimal": decimal.Decimal("0.25"), "decimal-huge": decimal.Decimal("1e400"),
            "snan": decimal.Decimal("sNaN"), "np": np.float64(0.5), "np-inf": np.float64("inf"),
            "np-int": np.int64(1), "np-0d": np.array(0.75), "np-1d": np.array([1.0]), "complex": 1 + 0j,
            "np-complex": np.complex128(1), "np-str": np.array("1.0"), "true": True, "inf": float("inf"),
            "unloadable": _Unloadable(), "one": 1}[name]


def odd_values(completion, answer, **meta):
    """Returns the value the completion names (`_odd_value`): numbers of every kind, some not a finite float."""
    return _odd_value(completion)


@batched
def batched_odd_values(completions, answers, **meta):
    """Batched: one `_odd_value` per completion."""
    return [_odd_value(c) for c in completions]


@batched
def batched_huge_list(completions, answers, **meta):
    """Batched, but returns a million scores."""
    return [1.0] * 10**6


def _rebuild_only_in(pid):
    """Unpickling an `_Unloadable` works in the process that made it and raises anywhere else."""
    if os.getpid() != pid:
        raise RuntimeError("cannot be rebuilt here")
    return _Unloadable()


class _Unloadable:
    """A value the worker can send but the trainer cannot load."""

    def __reduce__(self):
        return _rebuild_only_in, (os.getpid(),)
