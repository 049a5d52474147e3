"""Pooling the seeds of one config: runs grouped by config (`group_by_config`), their per-step mean
(`seed_mean`), legend labels per group, and the mean over seeds with a 95% t-interval (`seed_stat`)."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from typing import Any

from explorl.report.configs import canonical, without_seed
from explorl.report.runs import Run, finite_number


def group_by_config(runs: list[Run]) -> list[list[Run]]:
    """Runs whose configs are equal except `run.seed` and `run.out_dir`, grouped in order of first appearance."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(json.dumps(canonical(without_seed(run.config, run)), sort_keys=True, default=str),
                          []).append(run)
    return list(groups.values())


def _mean_records(records: list[dict]) -> dict:
    """Key-wise mean of records of one step: scalars over the finite values, lists element-wise."""
    out: dict[str, Any] = {}
    for key in dict.fromkeys(k for r in records for k in r):
        values = [r.get(key) for r in records]
        if all(isinstance(v, list) for v in values):
            width = max(len(v) for v in values)
            cols = [[f for v in values if i < len(v) and (f := finite_number(v[i])) is not None] for i in range(width)]
            out[key] = [statistics.fmean(c) if c else None for c in cols]
        else:
            kept = [f for f in map(finite_number, values) if f is not None]
            out[key] = statistics.fmean(kept) if kept else None
    return out


def _common_steps(record_lists: list[list[dict]]) -> list[dict]:
    """Per step present in every list, the mean record (`step` kept as an int)."""
    by_step = [{int(r["step"]): r for r in recs} for recs in record_lists]
    shared = sorted(set.intersection(*(set(b) for b in by_step))) if by_step else []
    return [_mean_records([b[s] for b in by_step]) | {"step": s} for s in shared]


def seed_mean(group: list[Run], name: str) -> Run:
    """One curve for the seeds of one config: per-step means over the steps every run has (training records and
    evaluations), the mean final evaluation, and the runs themselves in `members` (for min-max bands)."""
    if not group:
        raise ValueError("seed_mean: empty group")
    finals = [r.final for r in group if r.final]
    return Run(path=group[0].path.parent, name=name, config=group[0].config, config_text=group[0].config_text,
               steps=_common_steps([r.steps for r in group]), evals=_common_steps([r.evals for r in group]),
               final=_mean_records(finals) if finals else None, members=list(group))


def group_labels(groups: list[list[Run]], run_label: dict[int, str]) -> list[str]:
    """A legend label per config group: a lone run keeps its own label (`run_label[id(run)]`); seeds of one
    config take their shared parent directory's name (`runs/learning/grpo/seed0` -> `grpo`), or `config N`
    where that is not shared or would repeat a label."""
    labels = []
    for i, g in enumerate(groups):
        parents = {r.path.resolve().parent.name for r in g}
        labels.append(run_label[id(g[0])] if len(g) == 1 else next(iter(parents)) if len(parents) == 1 else "")
    return [lab if lab and labels.count(lab) == 1 else f"config {i + 1}" for i, lab in enumerate(labels)]


# ----------------------------------------------------------------------------------------------------------------
# confidence intervals across seeds

# two-sided 95% quantiles of Student's t (t_{0.975, df}) for df = 1..30
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t_quantile_975(df: int) -> float:
    """t_{0.975} with `df` degrees of freedom: tabulated up to 30, a Cornish-Fisher expansion beyond (error < 1e-4)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


@dataclass
class SeedStat:
    """A metric over the seeds of one config: mean and, with two or more seeds, a 95% t-interval."""

    values: list[float]
    mean: float
    low: float | None = None
    high: float | None = None

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def half_width(self) -> float | None:
        return None if self.low is None else (self.high - self.low) / 2


def seed_stat(values: list[float | None]) -> SeedStat | None:
    """Mean over seeds with a t-based 95% confidence interval of the mean (None with fewer than two values).

    The interval is mean +- t_{0.975,n-1} * s / sqrt(n) with s the sample standard deviation; it is not clipped,
    so with few seeds it may leave [0, 1] for a rate such as pass@k.
    """
    vals = [v for v in (finite_number(x) for x in values) if v is not None]
    if not vals:
        return None
    mean = statistics.fmean(vals)
    if len(vals) < 2:
        return SeedStat(vals, mean)
    hw = t_quantile_975(len(vals) - 1) * statistics.stdev(vals) / math.sqrt(len(vals))
    return SeedStat(vals, mean, mean - hw, mean + hw)
