"""The task data types, `Problem` and `Task`, apart from `explorl.tasks` so that task modules can import them
without importing the package that imports them (no import circle)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable


@dataclass
class Problem:
    """One prompt with its ground truth."""

    prompt: str
    """Text fed to the model, already templated."""
    answer: str
    """Ground truth, as a string."""
    meta: dict = field(default_factory=dict)
    """JSON-serialisable extras passed to the reward function as keyword arguments (id, difficulty, ...)."""
    messages: list[dict] | None = None
    """A conversational row's chat messages (`{"role", "content"}` dicts), prompted through the chat template;
    `prompt` then holds their contents as plain text, for logs."""
    solution: str | None = None
    """A worked solution ending in the answer (the completion a perfect model writes), the target of `explorl sft`;
    None when the task gives none."""


@dataclass
class Task:
    """Train and eval problems plus how to score a completion and read its final answer."""

    name: str
    train: list[Problem]
    eval: list[Problem]
    reward_fn: Callable
    """`fn(completion, answer, **meta) -> float`, or a `rewards.WeightedRewards` (several functions, weights, a
    batched function): score it with `rewards.RewardRunner`."""
    isolate: bool
    """Whether `reward_fn` must run in the sandbox's worker pool (slow or unsafe checkers); for a
    `WeightedRewards`, whether any of its functions does."""
    extract_answer: Callable[[str], str | None]
    """The final answer of a completion (for majority voting); None when there is none."""
