"""What `bench/testbed_long_table.py` and `bench/testbed_long_figures.py` both read from the long testbed runs'
records (`bench/testbed_long.py` writes them): the evaluation modes, which methods are GRPO baselines and in which
order they are shown, what each run is compared with, the base model's record a mode compares with, each seed's
records of a checkpoint, the paired pass@k difference with its bootstrap interval, and what became of one problem in
a run. It sits below both, so that the figures need not import the table, which imports the figures to draw them."""

from __future__ import annotations

import statistics

MODES = {"t1": "T = 1", "matched": "base entropy", "t1-chain": "T = 1, right chains",
         "matched-chain": "base entropy, right chains"}
"""Evaluation modes (`testbed_long.MODES`): sampled at T = 1 or at the base model's entropy, and correct when the
answer is right or (`-chain`) when every worked step is."""


CONTROLS = {"sft": "grpo"}
"""Runs that are not RL methods but controls of one, and the run each is compared with: `sft`, supervised fine-tuning
on the right chains of the RL training prompts, matched to `grpo` in steps and tokens (bench/testbed_ood_sft.py,
issue 53). Not a GRPO baseline: nothing is compared with it."""


def is_baseline(method: str) -> bool:
    """Whether `method` is a GRPO baseline (`grpo`, `grpo__agg__lo-hi[__uN]`), not a method built on GRPO."""
    return method == "grpo" or method.startswith("grpo__")


def reference(method: str) -> str:
    """The run a method's records are compared with: a control's (`CONTROLS`), else the GRPO baseline of the
    method's objective (`learning.baseline`)."""
    from learning import baseline

    return CONTROLS.get(method) or baseline(method)


def ordered_methods(records: dict) -> list[str]:
    """The methods recorded (not the base model): `grpo` first, then the methods, then the other GRPO baselines."""
    return sorted({m for m, *_ in records if m != "base"}, key=lambda m: (m != "grpo", m.startswith("grpo__"), m))


def base_mode(mode: str) -> str:
    """The base model's record a mode compares with: the base model at T = 1 (its own entropy), same judge."""
    return "t1-chain" if mode.endswith("-chain") else "t1"


def per_problem(record: dict, k: int) -> dict[str, float]:
    """pass@k of each problem of an eval record (`--curve`'s per-problem counts)."""
    from explorl.metrics import pass_at_k

    p = record["curve"]["problems"]
    return {pid: pass_at_k(n, c, k) for pid, n, c in zip(p["id"], p["n"], p["correct"])}


def paired(pairs: list[tuple[dict, dict]], k: int) -> tuple[float, float, float, list[float]] | None:
    """Mean pass@k difference (second minus first) over the problems every pair scored and over the (seed) pairs
    given, its 95% bootstrap interval over problems and seeds (`metrics.bootstrap_ci_seeds`: with one pair, over
    problems only), and each pair's own mean; None without pairs."""
    from explorl.metrics import bootstrap_ci_seeds

    if not pairs:
        return None
    per_pair = [(per_problem(ref, k), per_problem(other, k)) for ref, other in pairs]
    common = set.intersection(*(a.keys() & b.keys() for a, b in per_pair))
    if not common:
        return None
    pids = sorted(common)  # sorted: the bootstrap's draws do not depend on hash order
    rows = [[b[pid] - a[pid] for pid in pids] for a, b in per_pair]
    return (*bootstrap_ci_seeds(rows, n_boot=2000, seed=0), [statistics.fmean(row) for row in rows])


def records_at(records: dict, method: str, step: int | None, split: str, mode: str) -> list[dict]:
    """The records of `method` at `step` on (split, mode), one per seed in seed order (none for step None)."""
    return [r for (m, _, s, sp, md), r in sorted(records.items(), key=lambda item: item[0][1])
            if (m, s, sp, md) == (method, step, split, mode)]


def fate(base_count: int | None, seen: list[int], min_hits: int) -> str | None:
    """What became of one problem in a run, `seen` its correct samples in each seed: "lost" where the base model
    solved it at least `min_hits` times and the run never does in any seed, "gained" where the base never did and
    the run does at least `min_hits` times in every seed, else None (also where the base did not evaluate it)."""
    if base_count is None:
        return None
    if base_count >= min_hits and max(seen) == 0:
        return "lost"
    if base_count == 0 and min(seen) >= min_hits:
        return "gained"
    return None
