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
