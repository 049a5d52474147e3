"""Where arith coverage is lost (issue "Coverage at equal entropy", item 4): reads completions files
(`explorl eval --task arith --save-completions FILE`) and checks every line of every completion against the
problem's worked solution, so a wrong answer is traced to its first mistake:
- `copy`: the line's operator or operand is not the problem's next one (an operation skipped, repeated or misread);
- `carry`: the line does not start from the previous line's result;
- `arith`: the line's result is wrong for its own operands;
- `stop`: the chain ends (or the answer is boxed) before the last operation;
- `format`: a line that is not `a op b = c`, or a boxed value that is not the last line's result.

For each file: the share of completions whose first mistake is of each kind, the step at which the first mistake
falls, and the per-step accuracy (the probability that a step with no mistake before it is right), which decides
how the probability of a correct chain, and so pass@k, falls with the number of operations; how many right answers
were guessed (a right answer with a mistake on the way); and pass@1 and pass@n per difficulty, judged by the answer
and by the chain.

    python bench/coverage_where.py base.jsonl grpo.jsonl ...
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from collections import Counter, defaultdict
from pathlib import Path

from explorl.metrics import pass_at_k
from explorl.rewards import extract_boxed
from explorl.tasks.arith import operations

_LINE = re.compile(r"^(-?\d+)([+-])(\d+)=(-?\d+)$")
_BOXED = re.compile(r"^\\boxed\{(-?\d+)\}")  # what follows on its line is not work (`chain_reward`)
KINDS = ("copy", "carry", "arith", "stop", "format")


def first_mistake(prompt: str, completion: str) -> tuple[str | None, int]:
    """(kind, step) of a completion's first mistake, (None, number of steps) for a right one; steps count from 0."""
    value, ops = operations(prompt)
    lines = [s.strip() for s in completion.strip().splitlines() if s.strip()]
    for j, line in enumerate(lines):
        boxed = _BOXED.match(line)
        if boxed:
            if j < len(ops):
                return "stop", j
            read = extract_boxed(line) == boxed.group(1)  # a second boxed answer after it is the one read
            return (None, j) if read and int(boxed.group(1)) == value else ("format", j)
        m = _LINE.match(line)
        if m is None or j >= len(ops):
            return "format", min(j, len(ops))
        a, op, b, c = int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4))
        if (op, b) != ops[j]:
            return "copy", j
        if a != value:
            return "carry", j
        if c != (a + b if op == "+" else a - b):
            return "arith", j
        value = c
    return ("stop", len(lines)) if len(lines) <= len(ops) else ("format", len(ops))


def report(path: Path) -> dict:
    rows = [json.loads(line) for line in open(path) if line.strip()]
    kinds: Counter = Counter()
    reached: Counter = Counter()  # steps reached with no mistake before them
    wrong_at: dict[str, Counter] = defaultdict(Counter)
    per_problem: dict[str, list] = {}  # problem -> [difficulty, samples, right answers, right chains]
    guessed = 0
    for r in rows:
        kind, step = first_mistake(r["prompt"], r["completion"])
        counts = per_problem.setdefault(r["problem"], [len(operations(r["prompt"])[1]), 0, 0, 0])
        counts[1] += 1
        counts[2] += bool(r["correct"])
        counts[3] += kind is None
        guessed += bool(r["correct"]) and kind is not None
        kinds[kind or "right"] += 1
        for j in range(step + (kind is not None)):
            reached[j] += 1
        if kind is not None:
            wrong_at[kind][step] += 1
    total = len(rows)
    step_acc = {j: 1 - sum(wrong_at[k][j] for k in KINDS) / reached[j] for j in sorted(reached)}
    by_difficulty: dict[int, dict[str, float]] = {}
    for d in sorted({c[0] for c in per_problem.values()}):
        group = [c for c in per_problem.values() if c[0] == d]
        n = min(c[1] for c in group)
        by_difficulty[d] = {f"{judge} pass@{k}": statistics.fmean(pass_at_k(c[1], c[col], k) for c in group)
                            for judge, col in (("answer", 2), ("chain", 3)) for k in (1, n)}
    right_answers = sum(c[2] for c in per_problem.values())
    return {"completions": total, "kinds": {k: kinds[k] / total for k in ("right", *KINDS)},
            "step_accuracy": step_acc, "wrong_at": {k: dict(wrong_at[k]) for k in KINDS},
            "right_answers": right_answers, "guessed": guessed, "by_difficulty": by_difficulty}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+", type=Path)
    args = ap.parse_args(argv)
    reports = {p.stem: report(p) for p in args.files}
    print("| file | completions | right | " + " | ".join(f"first mistake: {k}" for k in KINDS) + " |")
    print("|---|---:|---:|" + "---:|" * len(KINDS))
    for name, r in reports.items():
        print(f"| {name} | {r['completions']} | " + " | ".join(f"{r['kinds'][k]:.3f}" for k in ("right", *KINDS))
              + " |")
    steps = sorted({j for r in reports.values() for j in r["step_accuracy"]})
    print("\nPer-step accuracy (a step reached with no mistake before it is right):\n")
    print("| file | " + " | ".join(f"step {j}" for j in steps) + " |")
    print("|---|" + "---:|" * len(steps))
    for name, r in reports.items():
        print(f"| {name} | " + " | ".join(f"{r['step_accuracy'].get(j, float('nan')):.3f}" for j in steps) + " |")
    print("\nRight answers, and how many were guessed (a mistake on the way):\n")
    print("| file | right answers | guessed | share guessed |\n|---|---:|---:|---:|")
    for name, r in reports.items():
        print(f"| {name} | {r['right_answers']} | {r['guessed']} | {r['guessed'] / max(r['right_answers'], 1):.2f} |")
    print("\npass@k per difficulty (operations), judged by the answer and by the chain:\n")
    for name, r in reports.items():
        for d, row in r["by_difficulty"].items():
            print(f"{name} d={d}: " + ", ".join(f"{k} {v:.3f}" for k, v in row.items()))
    print("\nFirst mistakes by kind and step (counts):\n")
    for name, r in reports.items():
        print(f"{name}: " + "; ".join(f"{k} {dict(sorted(r['wrong_at'][k].items()))}" for k in KINDS
                                     if r["wrong_at"][k]))


if __name__ == "__main__":
    main()
