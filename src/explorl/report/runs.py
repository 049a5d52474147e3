"""Reading run directories (config.yaml, metrics.jsonl, eval.json, samples.jsonl) and grouping runs that differ
only in seed."""

from __future__ import annotations

import copy
import json
import math
import re
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
    history: list[dict] = field(default_factory=list)
    """config_history.jsonl: one record per resume that changed keys (`resumed_after_step`, `changes`: dotted key ->
    [old, new]), oldest first; empty for a run that ran on one config."""

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

    def reward_functions(self) -> list[str]:
        """The metric names (`reward/<name>`, `rewards.reward_metric_name`) of the run's reward functions when its
        config's `task.reward` names several (each then logs its own mean); empty for a single function."""
        from explorl.rewards import reward_entries, reward_metric_name

        task = self.config.get("task")
        spec = task.get("reward") if isinstance(task, dict) else None
        if not isinstance(spec, (str, list)) or not spec:
            return []
        entries = [str(e) for e in reward_entries(spec)]
        return list(dict.fromkeys(reward_metric_name(e) for e in entries)) if len(entries) > 1 else []

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
    run.history = _config_history(path / "config_history.jsonl")

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


# a number as YAML 1.2 writes it but PyYAML (YAML 1.1) reads as a string: `1e-5` (no dot), `.5e3`
_EXPONENT_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def canonical(value: Any) -> Any:
    """`value` with equal settings written alike: numbers as floats (`64` = `64.0`; booleans stay booleans), a
    string that is a number in exponent form as that number (`1e-05`, which YAML 1.1 reads as text), mappings
    and lists element by element."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and _EXPONENT_NUMBER.fullmatch(value.strip()):
        return float(value)
    if isinstance(value, dict):
        return {str(k): canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [canonical(v) for v in value]
    return value


def _same(values: list[Any]) -> bool:
    return len({json.dumps(canonical(v), sort_keys=True, default=str) for v in values}) <= 1


def _json_objects(path: Path) -> list[dict]:
    """The JSON objects of a JSONL file a report reads; lines that are not one are skipped (a report shows what a
    damaged or still-running run holds), and a missing file gives []."""
    if not path.is_file():
        return []
    objects = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            objects.append(value)
    return objects


def _config_history(path: Path) -> list[dict]:
    """The records of a run's config_history.jsonl that say what changed (unreadable lines skipped)."""
    return [r for r in _json_objects(path) if isinstance(r.get("changes"), dict)]


def changed_during(run: Run) -> dict[str, str]:
    """The keys a resume changed, each as what ran: `5e-4 -> 1e-4 after step 2` (`-> ... after step N` per change;
    seed and out_dir aside)."""
    out: dict[str, str] = {}
    skip = {".".join(k) for k in SEED_KEYS}
    for record in run.history:
        step = record.get("resumed_after_step", "?")
        for key, change in record["changes"].items():
            if key in skip or not isinstance(change, list) or len(change) != 2:
                continue
            old, new = (_plain_value(v) for v in change)
            out[key] = f"{out.get(key, old)} -> {new} after step {step}"
    return out


def _plain_value(value: Any) -> str:
    return "-" if value is None else str(value)


def _set_dotted(config: dict, key: str, value: Any) -> None:
    node = config
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {}) if isinstance(node.get(part, {}), dict) else {}
    node[parts[-1]] = value


def _without_seed(config: dict, run: Run | None = None) -> dict:
    """`config` without `run.seed` and `run.out_dir`; with `run`, each key a resume changed holds what ran
    (`changed_during`), so a run that changed a key mid-way is not a seed of one that did not."""
    cfg = copy.deepcopy(config)
    for section, key in SEED_KEYS:
        if isinstance(cfg.get(section), dict):
            cfg[section].pop(key, None)
    for key, ran in (changed_during(run) if run is not None else {}).items():
        _set_dotted(cfg, key, ran)
    return cfg


def config_key(config: dict) -> str:
    """A canonical string of `config` without the seed and output directory (equal for seeds of one setup; equal
    settings written differently, `64` and `64.0`, are equal: `canonical`)."""
    return json.dumps(canonical(_without_seed(config)), sort_keys=True, default=str)


def group_by_config(runs: list[Run]) -> list[list[Run]]:
    """Runs whose configs are equal except `run.seed` and `run.out_dir`, grouped in order of first appearance."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(json.dumps(canonical(_without_seed(run.config, run)), sort_keys=True, default=str),
                          []).append(run)
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


class Missing:
    """The value of a config key a run's config does not have (shown as `-`)."""

    def __repr__(self) -> str:
        return "-"


MISSING = Missing()


def _differences(nodes: list[Any], prefix: str, out: list[dict[str, Any]], rows: list[int]) -> None:
    """Fill `out[i]` (for the configs `rows`, whose values at `prefix` are `nodes`) with the keys that differ among
    them: mappings in every config are compared key by key; elsewhere the key itself differs, a mapping in some
    configs and not in others being one entry for the latter and, among the former, compared key by key again
    (or shown whole when they agree)."""
    if _same([None if n is MISSING else n for n in nodes]):
        return
    mappings = [i for i, n in enumerate(nodes) if isinstance(n, dict)]
    if len(mappings) == len(nodes):
        keys = dict.fromkeys(k for n in nodes for k in n)
        for key in keys:
            _differences([n.get(key, MISSING) for n in nodes], f"{prefix}{key}.", out, rows)
        return
    name = prefix[:-1]
    for i, n in enumerate(nodes):
        if i not in mappings:
            out[rows[i]][name] = n
    if len(mappings) > 1 and not _same([nodes[i] for i in mappings]):
        _differences([nodes[i] for i in mappings], prefix, out, [rows[i] for i in mappings])
    else:
        for i in mappings:
            out[rows[i]][name] = nodes[i]


def config_differences(groups: list[list[Run]]) -> list[dict[str, Any]]:
    """For each group, the config keys (seed and out_dir aside) whose values differ among the groups, with the
    group's value (`MISSING` where its config lacks the key), sorted by key. Keys equal in every group are left
    out (also when written differently, `canonical`); a section that only some configs have is one key for the
    others (`run.eval_sets.ood: -`), and among the configs that have it, the keys in which they differ.

    A method's options (`algo.clip_cov`, `sampling.ead`, `budget.dapo`: every selected entry's, as a run's
    config.yaml records them) go with its choice, which is listed itself (`algo.loss=clip_cov`): a config that does
    not select the method is not said to lack them, and a config that does shows only the options it sets away from
    the method's defaults (`_method_options_apart`). A key that a resume changed shows what ran, `5e-4 -> 1e-4 after
    step 2` (config_history.jsonl), so it differs from a run that ran on either value throughout."""
    configs = [_without_seed(g[0].config, g[0]) for g in groups]  # a key a resume changed: what ran
    options = _method_options_apart(configs)
    out: list[dict[str, Any]] = [{} for _ in groups]
    _differences(configs, "", out, list(range(len(groups))))
    return [dict(sorted((k, v) for k, v in d.items() if not (v is MISSING and k in options))) for d in out]


def _option_defaults(section: str, name: str) -> dict | None:
    """The default options of the registered entry `name` of a `section` (algo, sampling, budget) as plain data, or
    None when no entry of that section has options under that name (a plugin's not imported here)."""
    import dataclasses

    from explorl.algos.registry import SECTIONS, entries
    from explorl.config.validation import fill_registry

    fill_registry()
    for kind, owner in SECTIONS.items():
        entry = entries(kind).get(name) if owner == section else None
        if entry is not None and entry.options is not None:
            return json.loads(json.dumps(dataclasses.asdict(entry.options()), default=str))
    return None


def _method_options_apart(configs: list[dict]) -> set[str]:
    """In place: for each method's options mapping (`algo.<name>`, `sampling.<name>`, `budget.<name>`) that only
    some of `configs` hold, drop from those the options at the method's defaults (all of them: the mapping goes), so
    "differs in" names the choice (`algo.loss=clip_cov`) and the options set away from its paper's defaults. Returns
    the dotted keys of those mappings (a config without one is not listed as lacking it: `algo.clip_cov=-`)."""
    found = set()
    for section in ("algo", "sampling", "budget"):
        sections = [c.get(section) if isinstance(c.get(section), dict) else None for c in configs]
        names = dict.fromkeys(k for sec in sections if sec for k, v in sec.items() if isinstance(v, dict))
        for name in names:
            holders = [sec for sec in sections if sec is not None and isinstance(sec.get(name), dict)]
            if len(holders) == len(configs):
                continue  # every config selects it: compared key by key as any section
            defaults = _option_defaults(section, name)
            if defaults is None:
                continue
            found.add(f"{section}.{name}")
            for sec in holders:
                kept = {k: v for k, v in sec[name].items() if canonical(v) != canonical(defaults.get(k, MISSING))}
                if kept:
                    sec[name] = kept
                else:
                    del sec[name]
    return found


# ----------------------------------------------------------------------------------------------------------------
# example completions (samples.jsonl: `RunLog.log_samples`)


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
    return [row for row in _json_objects(Path(path)) if _finite(row.get("step")) is not None
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
            if (r := _finite(reward)) is not None and isinstance(text, str):
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
