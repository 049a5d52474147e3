"""Reward functions for tests on random tiny models (which never solve arithmetic, so every reward would be 0)."""


def contains_digit(completion: str, answer: str, **meta) -> float:
    """1.0 when the completion has a digit: about 70% of a random char model's 12-token responses do."""
    return float(any(c.isdigit() for c in completion))
