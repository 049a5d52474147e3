"""Reading a run directory (config.yaml, metrics.jsonl, eval.json, config_history.jsonl) as a `Run`: what every
report starts from. Grouping seeds is `report.seeds`, comparing configs `report.configs`, logged completions
`report.examples`."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from explorl.config.files import read_yaml
from explorl.config.schema import ConfigError
from explorl.rewards import reward_entries, reward_metric_name


class RunError(ValueError):
    """A path that is not a readable run directory."""


def finite_number(value: Any) -> float | None:
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
            y = finite_number(rec.get(key))
            if y is not None and finite_number(rec.get("step")) is not None:
                xs.append(int(rec["step"]))
                ys.append(y)
        return xs, ys

    def eval_series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of an evaluation metric such as `pass@1` over training."""
        xs, ys = [], []
        for rec in self.evals:
            y = finite_number(rec.get(key))
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
            vals = [v for p in tail if i < len(p) and (v := finite_number(p[i])) is not None]
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
    try:  # bounded as every config file is (size, depth, aliases): a run directory may come from anyone
        config = read_yaml(path / "config.yaml")
    except ConfigError as e:
        raise RunError(str(e)) from None
    config_text = (path / "config.yaml").read_text()
    run = Run(path=path, name=path.resolve().name, config=config, config_text=config_text)

    by_step: dict[int, dict] = {}
    for line in (path / "metrics.jsonl").read_text().splitlines():
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (json.JSONDecodeError, RecursionError):  # RecursionError: brackets nested past Python's stack
            run.skipped_lines += 1
            continue
        if not isinstance(rec, dict) or finite_number(rec.get("step")) is None:
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
        except (json.JSONDecodeError, RecursionError) as e:
            raise RunError(f"{eval_path}: not valid JSON ({e or 'nested too deeply'})") from None
        run.final = final if isinstance(final, dict) else None
    elif run.evals:
        run.final = dict(run.evals[-1])
    return run


def read_json_objects(path: Path) -> list[dict]:
    """The JSON objects of a JSONL file a report reads; lines that are not one are skipped (a report shows what a
    damaged or still-running run holds), and a missing file gives []."""
    if not path.is_file():
        return []
    objects = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            value = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            continue
        if isinstance(value, dict):
            objects.append(value)
    return objects


def _config_history(path: Path) -> list[dict]:
    """The records of a run's config_history.jsonl that say what changed (unreadable lines skipped)."""
    return [r for r in read_json_objects(path) if isinstance(r.get("changes"), dict)]
