"""Saying that reward calls failed during an evaluation, in the same words wherever it runs: `explorl eval`, and the
periodic and final evaluations of `explorl train` (`evaluate.held_out_evaluator`). A failed call scores 0, so
without this line a pass@k would quietly measure a broken reward instead of the model."""

from __future__ import annotations

from typing import Any

from rich.text import Text


def reward_calls(summary: dict, task: Any) -> int:
    """The reward calls an evaluation made: problems x samples per problem x the task's reward functions."""
    parts = getattr(task.reward_fn, "parts", None)
    return summary["problems"] * summary["n"] * (len(parts) if parts else 1)


def report_reward_failures(console: Any, failures: list, calls: int, reward: str, *, fix: str,
                           where: str = "") -> bool:
    """Print how many of an evaluation's `calls` reward calls failed or timed out (`failures`, the
    `rewards.RewardFailure`s `evaluate` collects) and the first one: a `warning:` line, or an `error:` line ending
    with `fix` when most failed (the pass@k then measures the failures, not the model). `reward` names the reward
    (`task.reward`, and where it came from), `where` the evaluation (a prefix such as "evaluation at step 4: ").
    Nothing when none failed. Returns whether most failed."""
    if not failures:
        return False
    said = (f"{where}{len(failures)} of {calls} reward calls failed or timed out (task.reward={reward}; they scored "
            f"0). First: {failures[0].message}")
    if len(failures) > calls / 2:
        console.print(Text(f"error: most reward calls failed: {said}. {fix}"), style="bold red")
        return True
    console.print(Text(f"warning: {said}"), style="yellow")
    return False
