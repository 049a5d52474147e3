"""The checks before a run: every `task.reward` entry called once on sample completions, as training calls it, and
refused with a message naming the entry, the rows and the first failure when it would stop training."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from explorl.rewards.resolve import BUILTIN_REWARDS, resolve_reward, reward_entries
from explorl.rewards.runner import RewardFailure, RewardRunner, short_repr
from explorl.rewards.weighted import is_batched


@dataclass(frozen=True)
class RewardLimits:
    """How training runs a run's reward functions and how many failures it bears (`check_rewards`)."""

    timeout_s: float = 5.0
    """The time limit of a reward call (`task.reward_timeout_s`)."""
    workers: int | None = None
    """The worker processes of the reward pool (`task.reward_workers`; None: the pool's default)."""
    max_failure_frac: float = 0.0
    """The fraction of the samples an entry may fail on before training stops (`task.max_reward_failure_frac`)."""


def check_rewards(spec: str | list[str], task_default: tuple[Callable, bool], answer: str | list[str],
                  completion: str | list[str], meta: dict | list[dict] | None = None, *,
                  limits: RewardLimits = RewardLimits(), where: list[str] | None = None) -> list[tuple[str, str]]:
    """Call every entry of `task.reward` (`spec`; `auto` is `task_default`, the task's own reward) on sample
    completions, as training calls it: through a `RewardRunner` of that function alone, so per-sample as
    `fn(completion, answer, **meta)` or batched (`is_batched`) with lists, in the worker pool or here as
    `resolve_reward` says, under the limit `limits.timeout_s` (`task.reward_timeout_s`) with `limits.workers`.
    `answer`, `meta` (and `where`, each sample's row for messages, e.g. `data.jsonl:17`) are training problems',
    `completion` a sample completion for each (its worked solution, or a boxed answer); one sample or lists of them
    (the checks before a run take up to 8 rows spread over the data).

    The run's own rule decides (`task.max_reward_failure_frac`, `limits.max_failure_frac`): an entry that fails on
    more than that fraction of the samples raises ValueError naming `task.reward[i]`, the function, the rows and the
    first failure (with the exception's traceback): what would stop training; fewer failures give a `warning:` line
    naming the rows (training scores them 0 and counts them). An entry that cannot be imported always raises.
    Returns one (`task.reward[i]`, description) per entry, for the dry run to print."""
    max_failure_frac = limits.max_failure_frac
    answers = [answer] if isinstance(answer, str) else list(answer)
    completions = [completion] if isinstance(completion, str) else list(completion)
    metas = [dict(m or {}) for m in meta] if isinstance(meta, list) else [dict(meta or {}) for _ in answers]
    rows = list(where) if where is not None else [str(m.get("id", f"sample {i + 1}")) for i, m in enumerate(metas)]
    entries = reward_entries(spec)
    resolved = []
    for i, entry in enumerate(entries):  # all imported first, as training does, before a worker starts
        try:
            resolved.append(resolve_reward(entry, task_default))
        except ValueError as e:
            raise ValueError(str(e).replace("task.reward:", f"task.reward[{i}]:", 1)) from None
    n = len(answers)
    on = "a sample completion" if n == 1 else f"{n} sample completions (rows {', '.join(rows)})"
    lines = []
    for i, (entry, (fn, isolate)) in enumerate(zip(entries, resolved)):
        label = f"task.reward[{i}]"
        name = entry
        if entry in BUILTIN_REWARDS:
            name = f"{entry} ({_public_name(getattr(fn, 'func', fn))})"  # verified: a partial of verified_reward
        runner = RewardRunner(fn, isolate=isolate, timeout_s=limits.timeout_s, workers=limits.workers)
        result = runner(completions, answers, metas)
        failed = sorted({f.index for f in result.failures})
        if failed and len(failed) > max_failure_frac * n:
            raise ValueError(_failure_message(f"{label}: {name}", fn, result.failures[0], completions, answers, rows,
                                              len(failed), max_failure_frac))
        scores = ", ".join(f"{x!r}" for x in result.rewards[:8])
        if failed:
            f = result.failures[0]
            detail = f"\n{f.detail.rstrip()}" if f.detail and f.detail != f.message else ""
            lines.append((label, f"warning: {name} failed on {len(failed)} of {n} sample rows "
                                 f"({', '.join(rows[j] for j in failed)}; the first: {f.message}); training scores "
                                 f"such samples 0 and counts them, stopping only when more than "
                                 f"task.max_reward_failure_frac={max_failure_frac:g} of a step's fail{detail}"))
            continue
        lines.append((label, f"{name} returned {scores} on {on}"))
    return lines


def _failure_message(entry: str, fn: Callable, f: RewardFailure, completions: list[str], answers: list[str],
                     rows: list[str], failed: int, frac: float) -> str:
    """Why `check_rewards` refuses an entry (`entry`: `task.reward[i]: name`): the first failure (on which row, what
    it did) and the rule; one row per sample in `completions`, `answers` and `rows`."""
    n = len(answers)
    sample = f"completion {short_repr(completions[f.index])}, answer {short_repr(answers[f.index])}"
    where = f"on a sample completion ({sample})" if n == 1 else \
        f"on {failed} of {n} sample rows, more than task.max_reward_failure_frac={frac:g}; first on {rows[f.index]} " \
        f"({sample})"
    if f.kind == "timeout":
        return (f"{entry} {f.message} {where}; training would score 0 on every sample it times out on. "
                f"Make the function faster or raise task.reward_timeout_s")
    if f.kind == "value":
        return (f"{entry} returned a value that is not a score {where}: {f.message}; training would count "
                f"it as a failure and score 0")
    detail = f"\n{f.detail.rstrip()}" if f.detail and f.detail != f.message else ""
    call = "fn(completions, answers, **meta), batched" if is_batched(fn) else "fn(completion, answer, **meta)"
    return (f"{entry} raised {f.message} when called as training calls it ({call}) {where}; training would "
            f"score 0 wherever it raises.{detail}")


def _public_name(fn: Callable) -> str:
    """`module:function` of a reward function, for messages; explorl's own are named by the package that exports
    them (`explorl.rewards:math_check`), not by the module inside it that defines them."""
    module = getattr(fn, "__module__", "?")
    if isinstance(module, str) and module.startswith("explorl.rewards."):
        module = "explorl.rewards"
    return f"{module}:{getattr(fn, '__qualname__', fn)!s}"
