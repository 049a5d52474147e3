"""Reading run directories (config.yaml, metrics.jsonl, eval.json) and grouping runs that differ only in seed."""

from __future__ import annotations

import copy
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

# config fields that do not make two runs different experiments: the seed and where the run was written
SEED_KEYS = (("run", "seed"), ("run", "out_dir"))


class RunError(ValueError):
    """A path that is not a readable run directory."""


def _finite(value: Any) -> float | None:
    """`value` as a float, or None for null, NaN, infinities and non-numbers."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


@dataclass
class Run:
    """One run directory: its config, per-step training records, evaluation records and final evaluation."""

    path: Path
    name: str
    config: dict
    config_text: str
    steps: list[dict] = field(default_factory=list)
    """Training records of metrics.jsonl (those with keys besides `step` and `eval/*`), in file order."""
    evals: list[dict] = field(default_factory=list)
    """Held-out evaluations during training: {'step': s, 'pass@1': ..., ...} (the `eval/` prefix removed)."""
    final: dict | None = None
    """eval.json, or the last evaluation of metrics.jsonl when the run has no eval.json (None if neither)."""
    skipped_lines: int = 0
    """Lines of metrics.jsonl that were not JSON objects (e.g. a line cut short by a killed run)."""
    members: list[Run] = field(default_factory=list)
    """For a seed mean (`seed_mean`): the runs it averages; empty for a run read from disk."""

    @property
    def seed(self) -> Any:
        return (self.config.get("run") or {}).get("seed")

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of a scalar training metric, leaving out steps where it is null or not finite."""
        xs, ys = [], []
        for rec in self.steps:
            y = _finite(rec.get(key))
            if y is not None and _finite(rec.get("step")) is not None:
                xs.append(int(rec["step"]))
                ys.append(y)
        return xs, ys

    def eval_series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of an evaluation metric such as `pass@1` over training."""
        xs, ys = [], []
        for rec in self.evals:
            y = _finite(rec.get(key))
            if y is not None:
                xs.append(int(rec["step"]))
                ys.append(y)
        return xs, ys

    def has(self, key: str) -> bool:
        return bool(self.series(key)[0])

    def pass_ks(self) -> list[int]:
        """k values of pass@k found in the evaluations and the final evaluation, ascending."""
        ks: set[int] = set()
        for rec in [*self.evals, *([self.final] if self.final else [])]:
            for key in rec:
                if key.startswith("pass@") and key[5:].isdigit():
                    ks.add(int(key[5:]))
        return sorted(ks)

    def position_profile(self, last_frac: float = 0.2) -> list[float | None] | None:
        """Mean of `entropy/by_position` over the last `last_frac` of the training steps (None when absent).

        Bins are averaged separately, each over the steps where that bin is not null.
        """
        profiles = [rec["entropy/by_position"] for rec in self.steps
                    if isinstance(rec.get("entropy/by_position"), list) and rec["entropy/by_position"]]
        if not profiles:
            return None
        tail = profiles[-max(1, math.ceil(len(profiles) * last_frac)):]
        width = max(len(p) for p in tail)
        out: list[float | None] = []
        for i in range(width):
            vals = [v for p in tail if i < len(p) and (v := _finite(p[i])) is not None]
            out.append(statistics.fmean(vals) if vals else None)
        return out if any(v is not None for v in out) else None


def load_run(path: str | Path) -> Run:
    """Read a run directory written by `explorl train`; raises RunError when `path` is not one."""
    path = Path(path)
    if not path.exists():
        raise RunError(f"{path}: no such directory; give a run directory made by `explorl train`")
    if not path.is_dir():
        raise RunError(f"{path}: not a directory; give a run directory made by `explorl train`")
    missing = [n for n in ("config.yaml", "metrics.jsonl") if not (path / n).is_file()]
    if missing:
        raise RunError(f"{path}: not a run directory (no {' or '.join(missing)}); "
                       f"give a directory made by `explorl train`")
    config_text = (path / "config.yaml").read_text()
    try:
        config = yaml.safe_load(config_text) or {}
    except yaml.YAMLError as e:
        raise RunError(f"{path / 'config.yaml'}: not valid YAML ({e})") from None
    if not isinstance(config, dict):
        raise RunError(f"{path / 'config.yaml'}: expected a mapping of config sections")
    run = Run(path=path, name=path.resolve().name, config=config, config_text=config_text)

    by_step: dict[int, dict] = {}
    for line in (path / "metrics.jsonl").read_text().splitlines():
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            run.skipped_lines += 1
            continue
        if not isinstance(rec, dict) or _finite(rec.get("step")) is None:
            run.skipped_lines += 1
            continue
        step = int(rec["step"])
        ev = {k[5:]: v for k, v in rec.items() if k.startswith("eval/")}
        if ev:
            by_step.setdefault(step, {"step": step}).update(ev)  # the final eval shares the last step's number
        if any(k != "step" and not k.startswith("eval/") for k in rec):
            run.steps.append(rec)
    run.evals = [by_step[s] for s in sorted(by_step)]

    eval_path = path / "eval.json"
    if eval_path.is_file():
        try:
            final = json.loads(eval_path.read_text())
        except json.JSONDecodeError as e:
            raise RunError(f"{eval_path}: not valid JSON ({e})") from None
        run.final = final if isinstance(final, dict) else None
    elif run.evals:
        run.final = dict(run.evals[-1])
    return run


def config_key(config: dict) -> str:
    """A canonical string of `config` without the seed and output directory (equal for seeds of one setup)."""
    cfg = copy.deepcopy(config)
    for section, key in SEED_KEYS:
        if isinstance(cfg.get(section), dict):
            cfg[section].pop(key, None)
    return json.dumps(cfg, sort_keys=True, default=str)


def group_by_config(runs: list[Run]) -> list[list[Run]]:
    """Runs whose configs are equal except `run.seed` and `run.out_dir`, grouped in order of first appearance."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(config_key(run.config), []).append(run)
    return list(groups.values())


def _mean_records(records: list[dict]) -> dict:
    """Key-wise mean of records of one step: scalars over the finite values, lists element-wise."""
    out: dict[str, Any] = {}
    for key in dict.fromkeys(k for r in records for k in r):
        values = [r.get(key) for r in records]
        if all(isinstance(v, list) for v in values):
            width = max(len(v) for v in values)
            cols = [[f for v in values if i < len(v) and (f := _finite(v[i])) is not None] for i in range(width)]
            out[key] = [statistics.fmean(c) if c else None for c in cols]
        else:
            finite = [f for f in map(_finite, values) if f is not None]
            out[key] = statistics.fmean(finite) if finite else None
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


def flatten(config: dict, prefix: str = "") -> dict[str, Any]:
    """{'algo.eps_low': 0.2, ...}: nested sections joined with dots (lists kept as values)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def config_differences(groups: list[list[Run]]) -> list[dict[str, Any]]:
    """For each group, the config fields (seed and out_dir aside) whose values are not the same in all groups."""
    flats = [flatten(g[0].config) for g in groups]
    ignore = {".".join(k) for k in SEED_KEYS}
    keys = sorted({k for f in flats for k in f} - ignore)
    varying = [k for k in keys if len({json.dumps(f.get(k), sort_keys=True, default=str) for f in flats}) > 1]
    return [{k: f.get(k) for k in varying} for f in flats]


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
    vals = [v for v in (_finite(x) for x in values) if v is not None]
    if not vals:
        return None
    mean = statistics.fmean(vals)
    if len(vals) < 2:
        return SeedStat(vals, mean)
    hw = t_quantile_975(len(vals) - 1) * statistics.stdev(vals) / math.sqrt(len(vals))
    return SeedStat(vals, mean, mean - hw, mean + hw)
