"""Tasks: prompts with ground-truth answers plus the reward that checks them.

`load_task(cfg.task)` builds one of
- `arith`: built-in procedural arithmetic with worked solutions (what the embedded tiny model learns),
- `file`: question/answer rows from JSONL, JSON or Parquet,
- `rg:<name>`: a reasoning-gym procedural dataset, scored by the dataset's own `score_answer`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from explorl.config import TaskConfig


@dataclass
class Problem:
    """One prompt with its ground truth."""

    prompt: str
    """Text fed to the model, already templated."""
    answer: str
    """Ground truth, as a string."""
    meta: dict = field(default_factory=dict)
    """JSON-serialisable extras passed to the reward function as keyword arguments (id, difficulty, ...)."""


@dataclass
class Task:
    """Train and eval problems plus how to score a completion and read its final answer."""

    name: str
    train: list[Problem]
    eval: list[Problem]
    reward_fn: Callable
    """`fn(completion, answer, **meta) -> float`."""
    isolate: bool
    """Whether `reward_fn` must run in the sandbox's worker pool (slow or unsafe checkers)."""
    extract_answer: Callable[[str], str | None]
    """The final answer of a completion (for majority voting); None when there is none."""


def load_task(cfg: TaskConfig) -> Task:
    """Build the task named by `cfg.name` and apply `cfg.reward`; ValueError names the bad config field."""
    from explorl.rewards import extract_boxed, resolve_reward

    extract = extract_boxed
    if cfg.name == "arith":
        from explorl.tasks.arith import arith_task, default_reward

        train, eval_ = arith_task(cfg.difficulties, cfg.train_size, cfg.eval_size, cfg.data_seed)
        default = default_reward()
    elif cfg.name == "file":
        from explorl.tasks.files import default_reward, load_file_task

        train, eval_ = load_file_task(cfg)
        default = default_reward()
    elif cfg.name.startswith("rg:") and len(cfg.name) > 3:
        from explorl.tasks.rg import default_reward, extract_rg_answer, load_rg_task

        train, eval_ = load_rg_task(cfg)
        default, extract = default_reward(), extract_rg_answer
    else:
        raise ValueError(f"task.name: {cfg.name!r} is not a task; valid: arith, file, rg:<reasoning-gym dataset>")
    reward_fn, isolate = resolve_reward(cfg.reward, default)
    return Task(name=cfg.name, train=train, eval=eval_, reward_fn=reward_fn, isolate=isolate,
                extract_answer=extract)
