"""Example completions of a report: the best and the worst logged completion of a few training steps
(samples.jsonl, written by `RunLog.log_samples`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from explorl.report.runs import finite_number, read_json_objects


@dataclass
class Example:
    """One logged completion shown in a report: the best or worst (by reward) of its training step."""

    step: int
    which: str
    """`best`, `worst`, or `only` (the step logged one scored completion)."""
    prompt: str
    answer: str
    completion: str
    reward: float
    of: int
    """How many scored completions the step logged (the best and worst are of these)."""


def load_samples(path: str | Path) -> list[dict]:
    """The rows of a run's samples.jsonl (`{"step", "prompt", "answer", "completions": [...], "rewards": [...]}`,
    the first `run.log_samples` prompts of each step); unreadable lines are skipped, a missing file gives []."""
    return [row for row in read_json_objects(Path(path)) if finite_number(row.get("step")) is not None
            and isinstance(row.get("completions"), list) and isinstance(row.get("rewards"), list)]


def spread_steps(steps: list[int], count: int = 3) -> list[int]:
    """`count` steps spread over `steps` (sorted, distinct): the first, the last and evenly between (3: first,
    middle, last)."""
    steps = sorted(set(steps))
    if len(steps) <= count:
        return steps
    if count == 1:
        return [steps[-1]]
    return list(dict.fromkeys(steps[round(i * (len(steps) - 1) / (count - 1))] for i in range(count)))


def example_completions(samples: list[dict], count: int = 3) -> list[Example]:
    """The best and the worst completion (by reward; the first logged on a tie) of `count` steps of `samples`
    spread over the run (`spread_steps`: first, middle and last logged step), in step order."""
    by_step: dict[int, list[tuple[float, dict, str]]] = {}
    for row in samples:
        scored = by_step.setdefault(int(row["step"]), [])
        for text, reward in zip(row["completions"], row["rewards"]):
            if (r := finite_number(reward)) is not None and isinstance(text, str):
                scored.append((r, row, text))
    out = []
    for step in spread_steps([s for s, scored in by_step.items() if scored], count):
        scored = by_step[step]
        best = max(scored, key=lambda x: x[0])
        worst = min(scored, key=lambda x: x[0])
        picks = [("only", best)] if len(scored) == 1 else [("best", best), ("worst", worst)]
        for which, (reward, row, text) in picks:
            out.append(Example(step, which, str(row.get("prompt", "")), str(row.get("answer", "")), text, reward,
                               len(scored)))
    return out
