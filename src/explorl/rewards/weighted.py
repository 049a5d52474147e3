"""Rewards as TRL users write them: `WeightedRewards`, several functions scored as their weighted sum (TRL's
`reward_funcs` with `reward_weights`), each function's scores kept apart for the `reward/<name>` metrics; `batched`,
the mark of a reward called once per batch as `fn(completions, answers, **meta) -> list[float]`."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable


def batched(fn: Callable) -> Callable:
    """Mark `fn` as a batched reward, called once per batch: `fn(completions: list[str], answers: list[str],
    **meta) -> list[float]`, one score per completion in order; each meta key holds one value per completion
    (None where a sample lacks it), as TRL passes dataset columns. Returns `fn` itself (with `fn.batched = True`),
    so it stays importable by name for the worker pool."""
    fn.batched = True  # type: ignore[attr-defined]
    return fn


def is_batched(fn: Callable) -> bool:
    """Whether `fn` scores a whole batch per call: marked with `@batched` (a true `batched` attribute), or its first
    parameter is named `completions`, as TRL's reward functions are written."""
    if getattr(fn, "batched", False):
        return True
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return False
    return bool(params) and params[0] == "completions"


@dataclass(frozen=True)
class RewardPart:
    """One function of a `WeightedRewards`."""

    name: str
    """Metric name, logged as `reward/<name>` (`reward_metric_name` of its `task.reward` entry)."""
    fn: Callable
    """`fn(completion, answer, **meta) -> float`, or a batched function (`is_batched`)."""
    isolate: bool
    """Whether `fn` runs in the worker pool."""
    weight: float = 1.0
    """Its weight in the sum."""


class WeightedRewards:
    """Several reward functions scored as one: reward = sum_i weight_i * r_i, r_i the score of function i (0.0 where
    it failed), as TRL's `reward_funcs` with `reward_weights`. `RewardRunner` scores each function on the batch
    and keeps each one's scores (`RewardResult.by_function`); calling the object scores one sample here."""

    def __init__(self, parts: list[RewardPart]):
        if not parts:
            raise ValueError("WeightedRewards: no reward functions")
        self.parts = list(parts)

    @property
    def isolate(self) -> bool:
        """True when any of the functions runs in the worker pool."""
        return any(p.isolate for p in self.parts)

    def __call__(self, completion: str, answer: str, **meta: Any) -> float:
        """The weighted sum for one sample, every function called in this process, without time limit; an exception
        propagates (for direct use such as `experiments.impact`; training and evaluation use `RewardRunner`)."""
        total = 0.0
        for k, p in enumerate(self.parts):
            if is_batched(p.fn):
                value = p.fn([completion], [answer], **{key: [v] for key, v in meta.items()})[0]
            else:
                value = p.fn(completion, answer, **meta)
            total = p.weight * float(value) if k == 0 else total + p.weight * float(value)
        return total

    def __repr__(self) -> str:
        return "WeightedRewards(" + ", ".join(f"{p.weight:g} * {p.name}" for p in self.parts) + ")"
