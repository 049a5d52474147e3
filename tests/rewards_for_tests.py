"""Reward functions for tests on random tiny models (which never solve arithmetic, so every reward would be 0)."""

from explorl.rewards import batched


def contains_digit(completion: str, answer: str, **meta) -> float:
    """1.0 when the completion has a digit: about 70% of a random char model's 12-token responses do."""
    return float(any(c.isdigit() for c in completion))


def has_equals(completion: str, answer: str, **meta) -> float:
    """1.0 when the completion has an `=` (a second per-sample reward for the weighted-sum tests)."""
    return float("=" in completion)


@batched
def digit_share(completions: list[str], answers: list[str], **meta) -> list[float]:
    """Batched: the share of each completion's characters that are digits (0 for an empty one)."""
    return [sum(c.isdigit() for c in x) / len(x) if x else 0.0 for x in completions]


def trl_style_length(completions, answers, **kwargs):
    """Batched by TRL's naming alone (first parameter `completions`, no mark): each completion's length / 100."""
    return [len(c) / 100 for c in completions]
