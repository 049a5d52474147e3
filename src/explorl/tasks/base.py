"""The task data types, `Problem` and `Task`, apart from `explorl.tasks` so that task modules can import them
without importing the package that imports them (no import circle)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

from explorl.analysis.text import format_issue
from explorl.rewards import RewardRunner


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
    correct_by: str | None = None
    """The reward function (its metric name, `rewards.reward_metric_name`) whose unweighted score decides whether a
    sample is correct; None: the first (`task.correct_by`)."""
    correct_threshold: float = 0.5
    """A sample is correct when that score exceeds this (`task.correct_threshold`)."""
    answer_pattern: str = ""
    """A regular expression whose first group is a completion's final answer (`task.answer_pattern`); empty: the
    task's own extractor (the last `\\boxed{...}`)."""

    def reward_runner(self, timeout_s: float = 5.0, workers: int | None = None):
        """A `rewards.RewardRunner` for this task's reward, judging correctness by `correct_by`."""
        return RewardRunner(self.reward_fn, isolate=self.isolate, timeout_s=timeout_s, workers=workers,
                            judge=self.correct_by)

    def correct(self, result) -> list[bool]:
        """Which samples of a `RewardResult` are correct: the judging function's score above the threshold."""
        return [score > self.correct_threshold for score in result.judged]

    def well_formatted(self, text: str) -> bool:
        """Whether a completion states exactly one final answer: one match of `answer_pattern`, or with none set
        exactly one `\\boxed{` (STILL's format check, `analysis.text.format_issue`)."""
        if self.answer_pattern:
            return len(re.findall(self.answer_pattern, text[-ANSWER_WINDOW:])) == 1
        return not format_issue(text)


ANSWER_WINDOW = 4000
"""An answer pattern reads at most the last this-many characters of a completion (model output is untrusted: a
bounded input keeps a user's regular expression's time bounded too)."""


def pattern_extractor(pattern: str) -> Callable[[str], str | None]:
    """`extract_answer` for `task.answer_pattern`: the first group of its last match in the completion's tail."""
    compiled = re.compile(pattern)

    def extract(text: str) -> str | None:
        matches = list(compiled.finditer(text[-ANSWER_WINDOW:]))
        return matches[-1].group(1).strip() if matches else None

    return extract


PREFLIGHT_SAMPLES = 8
"""How many training problems the checks before a run call the reward on, spread over the training data."""


def spread(items: list, k: int = PREFLIGHT_SAMPLES) -> list:
    """Up to `k` items evenly spread over `items`, the first and the last included: item round(i * (n - 1) / (k - 1))
    for i = 0 .. k-1 (n = 20, k = 8: items 0, 3, 5, 8, 11, 14, 16, 19)."""
    n = len(items)
    if n <= k:
        return list(items)
    if k == 1:
        return [items[0]]
    return [items[round(i * (n - 1) / (k - 1))] for i in range(k)]
