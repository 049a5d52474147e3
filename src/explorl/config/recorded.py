"""A run directory's config.yaml written by an earlier version of explorl, read in today's form.

explorl records every field of a run's config, resolved, in RUN/config.yaml, and `explorl train --resume`, `explorl
eval` (of RUN, RUN/final or a checkpoint), `explorl export`, `explorl probe --run` and the engines read it back with
`load_config`. The keys a later version moved (`explorl.config.moved`) are refused in a user's YAML and on the
command line, naming what replaced them; in a recorded config (`is_recorded_config`) they are translated instead,
before validation (`upgrade_recorded`):

- a switch becomes the selection that replaced it (`algo.tis: true` -> `algo.importance_weights: tis`,
  `algo.overlong: penalty` -> `algo.reward_shapers: [dapo_overlong]`; `false` and `none` select nothing);
- a flat option key moves under its entry's name (`algo.tis_cap` -> `algo.tis.cap`, `algo.erpo_gamma` ->
  `algo.erpo.gamma`) when the config selects that entry (by name, through an entry that reads its options, or
  through another entry's options such as `sampling.adaptive.base`), and is dropped otherwise: earlier versions
  recorded the defaults of every method, and the options of an entry that is not selected are refused.

One warning (`RecordedConfigWarning`) says that the file was written by an earlier version and what was translated.
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from typing import Any, Callable

import yaml

from explorl.algos.registry import lookup
from explorl.config.building import from_dict
from explorl.config.moved import MOVED_KEYS, MOVED_SWITCHES
from explorl.config.schema import Config, ConfigError, ModelConfig
from explorl.config.selection import import_plugins, selected_entries, use_python_path

SECTIONS = ("algo", "sampling", "budget")
"""The sections that held the keys of earlier versions."""


class RecordedConfigWarning(UserWarning):
    """A run directory's config.yaml was written by an earlier version and read in today's form."""


def is_run_dir(path: str | Path) -> bool:
    """Whether `path` is a run directory: a config.yaml beside `metrics.jsonl`, `final/` or `checkpoints/`."""
    p = Path(path)
    return (p / "config.yaml").is_file() and ((p / "metrics.jsonl").exists() or (p / "final").is_dir()
                                              or (p / "checkpoints").is_dir())


def is_recorded_config(path: str | Path) -> bool:
    """Whether the file `path` is a run directory's config.yaml (written by explorl, not by a user)."""
    p = Path(path)
    return p.name == "config.yaml" and is_run_dir(p.parent)


def recorded_model(path: str | Path) -> ModelConfig:
    """The `model` section of a run's config.yaml, read as data: nothing is imported or checked against the registry
    (what `explorl export` and `explorl eval --config` need of a run, whatever code its config names); its paths
    resolved as loading resolves them."""
    from explorl.config.layers import read_layers, settings

    return from_dict(ModelConfig, settings(read_layers(Path(path))).get("model") or {}, "model.")


def upgrade_for(path: str | Path | None) -> Callable[[dict, Path], dict] | None:
    """The upgrade `read_layers` applies to the config file `path`: `upgrade_recorded` for a run directory's
    config.yaml, None for any other file (a user's YAML keeps the refusal of earlier keys)."""
    return upgrade_recorded if path is not None and is_recorded_config(path) else None


def upgrade_recorded(data: dict, path: Path) -> dict:
    """`data`, the mapping read from the recorded config `path`, in today's form (the module's rules); `data` itself
    when it holds no key of an earlier version. Warns once (`RecordedConfigWarning`) when something was
    translated."""
    old = {name: [k for k, v in section.items() if _is_old(f"{name}.{k}", v)]
           for name in SECTIONS if isinstance(section := data.get(name), dict)}
    if not any(old.values()):
        return data
    data = copy.deepcopy(data)
    notes: list[str] = []
    lifted: list[str] = []  # the flat keys taken out, `section.key`
    candidates: dict[str, dict[str, dict[str, Any]]] = {}  # section -> entry -> {field: value}
    for name, keys in old.items():
        section = data[name]
        for key in keys:
            if f"{name}.{key}" in MOVED_SWITCHES:
                notes.append(_select(section, name, key, section.pop(key), MOVED_SWITCHES[f"{name}.{key}"]))
            else:
                entry, field_name = MOVED_KEYS[f"{name}.{key}"].split(".")[1:]
                candidates.setdefault(name, {}).setdefault(entry, {})[field_name] = section.pop(key)
                lifted.append(f"{name}.{key}")
    placed = _place_options(data, candidates)
    moved = [k for k in lifted if MOVED_KEYS[k].split(".")[1] in placed.get(k.split(".")[0], ())]
    dropped = [k for k in lifted if k not in moved]
    notes += [f"{key} -> {MOVED_KEYS[key]}" for key in moved]
    if dropped:
        shown = ", ".join(dropped[:6]) + (f" and {len(dropped) - 6} more" if len(dropped) > 6 else "")
        notes.append(f"dropped the recorded options of methods it does not select ({shown})")
    warnings.warn(f"{path}: written by an earlier version of explorl, read in today's form: {'; '.join(notes)}",
                  RecordedConfigWarning, stacklevel=2)
    return data


def _is_old(key: str, value: Any) -> bool:
    """Whether the dotted `key` with `value` is written as earlier versions wrote it: a flat option key, or a switch
    set to one of the values it took (a mapping or null under a switch's name are today's options of the entry,
    `algo.tis: {cap: 2}`; any other value is left to be refused as a user's YAML is)."""
    return key in MOVED_KEYS or (key in MOVED_SWITCHES and _as_written(value) in _switch_values(MOVED_SWITCHES[key]))


def _as_written(value: Any) -> Any:
    """A switch's value as YAML writes it (`true`, `penalty`); a mapping or null as itself (hashable: not a value)."""
    if isinstance(value, bool):
        return str(value).lower()
    return value if isinstance(value, (str, int, float)) else None


def _switch_values(switch: dict[Any, str]) -> dict[Any, str]:
    """`MOVED_SWITCHES`' entry with its old values as YAML writes them (`True` -> `true`)."""
    return {_as_written(old): to for old, to in switch.items()}


def _select(section: dict, name: str, key: str, value: Any, switch: dict[Any, str]) -> str:
    """Set in `section` the selection that replaced the switch `name.key` = `value` (`MOVED_SWITCHES`), and say
    what was done. A list selection (`algo.reward_shapers`) is added to what the section already selects; a single
    one refuses a different selection written beside it."""
    shown, new = _as_written(value), _switch_values(switch)
    target, text = new[shown].split("=", 1)
    field_name, selection = target.split(".", 1)[1], yaml.safe_load(text)
    if isinstance(selection, list):
        section[field_name] = list(section.get(field_name) or []) + \
            [x for x in selection if x not in (section.get(field_name) or [])]
    elif section.get(field_name, selection) != selection and selection != "none":
        raise ConfigError(f"{name}.{key}: {shown} selects {new[shown]}, but {target} is "
                          f"{section[field_name]!r} in the same file")
    else:
        section.setdefault(field_name, selection)
    return f"{name}.{key}={shown} -> {new[shown]}"


def _place_options(data: dict, candidates: dict[str, dict[str, dict[str, Any]]]) -> dict[str, set[str]]:
    """Put each entry's lifted options (`candidates`: section -> entry -> {field: value}) under its name in `data`
    when the config selects that entry, under the options already written there; returns the names placed per
    section. The selection is the registry's (`selected_entries`), repeated as placed options select more (the
    adaptive schedule's `base`); where the registry cannot say (the file names an entry no module registers), the
    entries named in the section's own fields."""
    placed: dict[str, set[str]] = {}
    for _ in range(sum(map(len, candidates.values())) + 1):
        try:
            in_use = _options_in_use(data)
        except ConfigError:  # the validation that follows names the problem, with the file and line
            in_use = {(s, n) for s, entries in candidates.items() for n in entries if _named_in(data.get(s), n)}
        new = {(s, n) for s, n in in_use if n in candidates.get(s, {}) and n not in placed.get(s, set())}
        if not new:
            break
        for s, n in sorted(new):
            data[s][n] = {**candidates[s][n], **(data[s].get(n) or {})}
            placed.setdefault(s, set()).add(n)
    return placed


def _options_in_use(data: dict) -> set[tuple[str, str]]:
    """(section, entry name) of the options each entry that the config `data` selects reads (`Entry.options_owner`),
    after importing `run.plugins` as validation does."""
    cfg = from_dict(Config, data)
    use_python_path(cfg.run.python_path)
    import_plugins(cfg.run.plugins)
    return {(section, lookup(e.kind, e.options_owner).name) for section, found in selected_entries(cfg).items()
            for e in found}


def _named_in(section: Any, name: str) -> bool:
    """Whether a field of `section` names `name` (as its value or in its list)."""
    return isinstance(section, dict) and any(v == name or (isinstance(v, list) and name in v)
                                             for v in section.values())
