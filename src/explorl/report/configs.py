"""Comparing run configs: equal settings written alike (`canonical`), the seed and output directory set aside
(`without_seed`, `config_key`), what a resume changed (`changed_during`) and the keys in which configs differ
(`config_differences`, the "differs in" column of `explorl compare`)."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from typing import TYPE_CHECKING, Any

from explorl.algos.registry import SECTIONS, entries
from explorl.config.selection import fill_registry

if TYPE_CHECKING:
    from explorl.report.runs import Run

# config fields that do not make two runs different experiments: the seed and where the run was written
SEED_KEYS = (("run", "seed"), ("run", "out_dir"))

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


def without_seed(config: dict, run: Run | None = None) -> dict:
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
    return json.dumps(canonical(without_seed(config)), sort_keys=True, default=str)


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
    configs = [without_seed(g[0].config, g[0]) for g in groups]  # a key a resume changed: what ran
    options = _method_options_apart(configs)
    out: list[dict[str, Any]] = [{} for _ in groups]
    _differences(configs, "", out, list(range(len(groups))))
    return [dict(sorted((k, v) for k, v in d.items() if not (v is MISSING and k in options))) for d in out]


def _option_defaults(section: str, name: str) -> dict | None:
    """The default options of the registered entry `name` of a `section` (algo, sampling, budget) as plain data, or
    None when no entry of that section has options under that name (a plugin's not imported here)."""
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
