"""The layers of a config and their one precedence: the command line > the file > its `methods:` > its `base:` >
the defaults (`read_layers`), merged by `settings`; two methods of one file that disagree are refused unless a higher
layer settles the key. `explorl config FILE --explain` names the layer each value came from.
"""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path
from typing import Any

from explorl.config.building import apply_override
from explorl.config.files import display_path, read_yaml
from explorl.config.paths import resolve_paths, resolve_paths_of_overrides
from explorl.config.schema import ConfigError, short_repr

METHODS_DIR = Path(__file__).resolve().parents[1] / "methods"
"""The method layers shipped with explorl (`methods: [e3]`): each a method's settings as its paper gives them
(algo, sampling, budget, and an optimizer setting the paper fixes), and nothing of a model's scale."""


def method_names() -> list[str]:
    """The names of the method layers shipped with explorl."""
    return sorted(p.stem for p in METHODS_DIR.glob("*.yaml"))


@dataclasses.dataclass
class Layer:
    """One source of settings, as `read_layers` stacks them: a config file's own keys, a method layer, the command
    line. Its `data` is nested like a config file, paths already resolved."""

    source: str
    """How `explorl config FILE --explain` names it: `my.yaml`, `base: quickstart.yaml`, `methods: e3
    (src/explorl/methods/e3.yaml)`, `command line`."""
    data: dict
    """The settings, nested as in YAML (`{"algo": {"loss_agg": ...}}`)."""
    method: bool = False
    """Whether a `methods:` entry brought it (its options are dropped with its choice, `_drop_lost_options`)."""
    file: Path | None = None
    """The YAML file it was read from (None: the command line)."""

    def sets(self, key: str) -> bool:
        """Whether this layer decides the dotted `key`: it sets the key, a section holding it (`algo.erpo: null`),
        or something inside it."""
        value: Any = self.data
        for part in key.split("."):
            if not isinstance(value, dict) or part not in value:
                return False
            value = value[part]
            if not isinstance(value, dict):
                return True
        return True


@dataclasses.dataclass
class _Conflict:
    """Two methods of one file that set a key differently: refused unless a layer from `owner` on (the file's own
    keys, a file that takes it as `base:`, the command line) sets the key itself."""

    file: Path
    key: str
    first: tuple[str, Any]
    second: tuple[str, Any]
    owner: Layer


def read_layers(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> list[Layer]:
    """The layers of a config, lowest first, under one precedence: **the command line > the file > its `methods:`
    (in order, a later one over an earlier one) > its `base:` > the defaults**. A `base:` file is read the same way
    (its own keys over its methods over its base), so it is one layer group below the file's methods: a method you
    name overrides what your base sets, and what you set in the file itself overrides both.

    Two methods of one file that set a key to different values are refused, naming each key, unless the key is
    settled by a higher layer: the file's own keys, a file that takes this one as its `base:`, or the command line.
    `settings` merges the layers; `explorl config FILE --explain` shows which layer each value came from."""
    layers: list[Layer] = []
    conflicts: list[_Conflict] = []
    if path is not None:
        layers, conflicts = _file_layers(Path(path), "", 0)
    command_line: dict[str, Any] = {}
    for ov in overrides:
        apply_override(command_line, ov)
    if command_line:
        resolve_paths_of_overrides(command_line)
        layers.append(Layer("command line", command_line))
    unsettled = [c for c in conflicts if not _settled(c, layers)]
    if unsettled:
        file = unsettled[0].file
        both = "; ".join(f"methods {c.first[0]!r} and {c.second[0]!r} both set {c.key} ({short_repr(c.first[1])} vs "
                         f"{short_repr(c.second[1])})" for c in unsettled)
        keys = ", ".join(dict.fromkeys(c.key for c in unsettled))
        raise ConfigError(f"{file}: {both}; set {keys} in {file.name} (or key=value on the command line) to choose")
    return layers


def settings(layers: list[Layer]) -> dict[str, Any]:
    """The layers merged, a higher one's keys over a lower one's; a method's options for a choice that a higher layer
    changed are dropped with it (`_drop_lost_options`)."""
    data: dict[str, Any] = {}
    for layer in layers:
        data = _merge(data, layer.data)
    _drop_lost_options(data, layers)
    return data


def _settled(conflict: _Conflict, layers: list[Layer]) -> bool:
    at = next(i for i, layer in enumerate(layers) if layer is conflict.owner)
    return any(layer.sets(conflict.key) for layer in layers[at:])


def _file_layers(path: Path, role: str, depth: int) -> tuple[list[Layer], list[_Conflict]]:
    """The layers of one config file, lowest first (its base's, its methods', its own keys) and its methods'
    conflicts. `role`: how it is named, "" for the file itself, `base: ` or `methods: <name> `."""
    if depth > 8:
        raise ConfigError(f"{path}: `base:` chain is too deep (a cycle?)")
    data = read_yaml(path)
    base = data.pop("base", None)
    methods = data.pop("methods", None)
    resolve_paths(data, path.parent.resolve())  # this file's paths, relative to itself
    layers: list[Layer] = []
    conflicts: list[_Conflict] = []
    if base is not None:
        if not isinstance(base, str) or not base:
            raise ConfigError(f"{path}: `base:` must be the path of another YAML config, got {short_repr(base)}")
        below, found = _file_layers(path.parent / base, "base", depth + 1)
        layers, conflicts = below, found
    own = Layer(_role_name(role, path), data, method=role.startswith("methods"), file=path)
    if methods is not None:  # between the base and the file's own keys
        above, found = _method_layers(methods, path, own, depth)
        layers, conflicts = layers + above, conflicts + found
    return layers + [own], conflicts


def _role_name(role: str, path: Path) -> str:
    if role == "base":
        return f"base: {display_path(path)}"
    if role.startswith("methods"):
        return f"{role} ({display_path(path)})"
    return display_path(path)


def _method_layers(methods: Any, path: Path, owner: Layer, depth: int) -> tuple[list[Layer], list[_Conflict]]:
    """The layers of `methods:` (names of shipped layers, or paths of YAML files relative to `path`), in order, and
    the keys two of them set to different values (settled, or refused, by `read_layers`)."""
    if isinstance(methods, str):
        methods = [methods]
    if not isinstance(methods, list) or not all(isinstance(m, str) and m for m in methods):
        raise ConfigError(f"{path}: `methods:` must be a list of method names ({', '.join(method_names())}) or "
                          f"YAML files, got {short_repr(methods)}")
    layers: list[Layer] = []
    conflicts: list[_Conflict] = []
    merged: dict = {}
    origin: dict[str, str] = {}
    for name in methods:
        file = path.parent / name if name.endswith((".yaml", ".yml")) else METHODS_DIR / f"{name}.yaml"
        if not file.exists():
            near = difflib.get_close_matches(name, method_names(), n=1)
            hint = f" Did you mean '{near[0]}'?" if near else ""
            raise ConfigError(f"{path}: methods: {name!r} is not a method layer.{hint} Shipped: "
                              f"{', '.join(method_names())}; or give a YAML file")
        own, found = _file_layers(file, f"methods: {name}", depth + 1)
        for layer in own:
            layer.method = True
        layer_data: dict = {}
        for layer in own:
            layer_data = _merge(layer_data, layer.data)
        for key, value in _leaves(layer_data):
            if key in origin and _get(merged, key) != value:
                conflicts.append(_Conflict(path, key, (origin[key], _get(merged, key)), (name, value), owner))
            origin[key] = name
        merged = _merge(merged, layer_data)
        layers += own
        conflicts += found
    return layers, conflicts


SELECTING_SECTIONS = ("algo", "sampling", "budget")
"""The sections whose entries have options under their names (`algo.clip_cov: {...}`, `budget.dapo: {...}`)."""


def _drop_lost_options(data: dict, layers: list[Layer]) -> None:
    """A method layer's options for an entry it selects (`budget: {policy: dapo, dapo: {max_rounds: 9}}`) are dropped
    when a higher layer chose another entry for that field (`budget.policy: e3`) and no layer but a method's set
    those options: they travel with the method's choice (validation refuses options of unselected entries)."""
    for layer in layers:
        if not layer.method:
            continue
        for section_name in SELECTING_SECTIONS:
            section = layer.data.get(section_name)
            final = data.get(section_name)
            if not isinstance(section, dict) or not isinstance(final, dict):
                continue
            for name, options in section.items():
                if not isinstance(options, dict) or name not in final:
                    continue
                chooser = [k for k, v in section.items() if v == name or (isinstance(v, list) and name in v)]
                still = any(final.get(k) == name or (isinstance(final.get(k), list) and name in final[k])
                            for k in chooser)
                by_others = any(not other.method and other.sets(f"{section_name}.{name}") for other in layers)
                if chooser and not still and not by_others:
                    del final[name]


def _leaves(data: dict, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, value) of every leaf of a nested mapping; an empty mapping is a leaf."""
    out = []
    for k, v in data.items():
        if isinstance(v, dict) and v:
            out += _leaves(v, f"{prefix}{k}.")
        else:
            out.append((f"{prefix}{k}", v))
    return out


def _get(data: dict, dotted: str) -> Any:
    for part in dotted.split("."):
        data = data.get(part) if isinstance(data, dict) else None
    return data


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out
