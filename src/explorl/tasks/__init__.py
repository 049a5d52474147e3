"""Tasks: prompts with ground-truth answers plus the reward that checks them.

`load_task(cfg.task)` builds the task registered (kind `task` of `explorl.algos.registry`) under `cfg.name`:
- `arith`: built-in procedural arithmetic with worked solutions (what the embedded tiny model learns),
- `file`: question/answer rows from JSONL, JSON or Parquet,
- `hf`: a Hugging Face dataset (`save_to_disk` directory, local data files or a Hub name, `datasets`),
- `rg:<name>`: a reasoning-gym procedural dataset, scored by the dataset's own `score_answer`,
or any task a plugin registers with `@register("task", name)`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from explorl.algos.registry import Entry, lookup, names
from explorl.rewards import (BUILTIN_REWARDS, RewardRunner, resolve_reward, resolve_rewards, reward_entries,
                             reward_metric_name)
from explorl.tasks import arith, files, hf, rg  # noqa: F401  (fill the task registry)
from explorl.tasks.base import Problem, Task, pattern_extractor

if TYPE_CHECKING:
    from explorl.config.schema import TaskConfig

__all__ = ["Problem", "Task", "load_task"]


def load_task(cfg: TaskConfig) -> Task:
    """Build the task named by `cfg.name` and apply `cfg.reward` (with `cfg.reward_weights`); ValueError names the
    bad config field."""
    train, eval_, default, extract = _task_entry(cfg.name).fn(cfg)
    reward_fn, isolate = resolve_rewards(cfg.reward, cfg.reward_weights, default)
    if cfg.answer_pattern:
        extract = pattern_extractor(cfg.answer_pattern)
    judge = None
    if cfg.correct_by:  # the entry as written in task.reward, or its metric name
        by_name = {reward_metric_name(e): reward_metric_name(e) for e in reward_entries(cfg.reward)}
        by_name.update({e: reward_metric_name(e) for e in reward_entries(cfg.reward)})
        judge = by_name[cfg.correct_by]
    return Task(name=cfg.name, train=train, eval=eval_, reward_fn=reward_fn, isolate=isolate,
                extract_answer=extract, correct_by=judge, correct_threshold=cfg.correct_threshold,
                answer_pattern=cfg.answer_pattern)


def _task_entry(name: str) -> Entry:
    """The registry entry of task `name`; ValueError listing the valid names (`rg` alone needs its argument)."""
    try:
        return lookup("task", name)
    except KeyError:
        raise ValueError(f"task.name: {name!r} is not a task; valid: {', '.join(names('task'))}") from None


def answer_pattern_warning(cfg: TaskConfig, problems: Sequence[Problem] = ()) -> str | None:
    """A warning when `task.reward` names a function of the user's own (`module:function`) and `task.answer_pattern`
    is empty: maj@k, the answer votes and the format rate then read each completion's last `\\boxed{...}` as its
    answer, which a reward that reads answers its own way does not (issue 41: maj@1 0.0 beside pass@1 0.0078).
    With sample `problems`, none when every such function reads `\\boxed{}` itself (`_reads_boxed`)."""
    own = [e for e in reward_entries(cfg.reward) if e not in BUILTIN_REWARDS]
    if not own or cfg.answer_pattern or (problems and all(_reads_boxed(cfg, e, problems) for e in own)):
        return None
    return (f"task.reward names your own {', '.join(own)} and task.answer_pattern is empty, so maj@k, the answer "
            f"votes and the format rate read each completion's last \\boxed{{...}} as its answer; if your reward "
            f"reads answers another way, set task.answer_pattern to a regular expression whose first group is the "
            f"answer (e.g. 'Answer: *(.+)')")


def _reads_boxed(cfg: TaskConfig, entry: str, problems: Sequence[Problem]) -> bool:
    """Whether reward `entry` scores each sample problem's right answer in `\\boxed{}` above a completion that states
    no answer: then it reads answers where maj@k does (a reward of the row alone, or of another format, does not).
    It runs as training runs it (`RewardRunner`); a failure counts as not reading."""
    fn, isolate = resolve_reward(entry, (None, False))
    runner = RewardRunner(fn, isolate=isolate, timeout_s=cfg.reward_timeout_s, workers=cfg.reward_workers)
    answers, metas = [p.answer for p in problems], [p.meta for p in problems]
    right = runner([f"The answer is \\boxed{{{a}}}." for a in answers], answers, metas)
    none = runner(["I cannot tell."] * len(answers), answers, metas)
    if right.failures or none.failures:
        return False
    return all(r > n for r, n in zip(right.rewards, none.rewards))
