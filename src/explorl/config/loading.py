"""Building configs from YAML files, dicts and `key.sub=value` overrides, with errors that name the field.

`read_config` reads, overrides and builds the typed `Config` (`explorl.config.schema`); `load_config`
(`explorl.config.validation`) validates it too, so a typo or an impossible combination fails in milliseconds with
the field's dotted name, the reason and the valid choices.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from explorl.config.schema import (MOVED_KEYS, MOVED_SWITCHES, AlgoConfig, BudgetConfig, Config, ConfigError,
                                   SamplingConfig)

# the sections whose earlier flat keys moved (`MOVED_KEYS` names them by these)
SECTION_OF = {AlgoConfig: "algo", SamplingConfig: "sampling", BudgetConfig: "budget"}


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (list, tuple):
        return f"list of {_type_name(typing.get_args(tp)[0])}"
    if origin in (typing.Union, types.UnionType):
        return " or ".join("null" if a is type(None) else _type_name(a) for a in typing.get_args(tp))
    return getattr(tp, "__name__", str(tp))


def _scalar(text: str) -> Any:
    """`text` parsed as a YAML scalar (`4` -> 4, `1e-4` stays a string for `_coerce`), or itself if not YAML."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _coerce(value: Any, tp: Any, name: str) -> Any:
    """Check `value` against the annotation `tp` (after YAML parsing) and return it in canonical form."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            raise ConfigError(f"{name}: {value!r} is not a valid choice; valid choices: {', '.join(map(str, choices))}")
        return value
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None and len(args) < len(typing.get_args(tp)):
            return None
        if isinstance(value, (list, tuple)):  # `str | list[str]`: a list takes the list form
            args = [a for a in args if typing.get_origin(a) is list] or args
        return _coerce(value, args[0], name)
    if origin is dict:  # name -> a section's fields (run.eval_sets); the fields are checked by `validate`
        if not isinstance(value, dict) or not all(isinstance(v, dict) or v is None for v in value.values()):
            raise ConfigError(f"{name}: expected a mapping of names to mappings of fields, e.g. "
                              f"{{ood: {{difficulties: [8, 9]}}}}, got {value!r}")
        return {str(k): dict(v or {}) for k, v in value.items()}
    if origin is list:
        (inner,) = typing.get_args(tp)
        if isinstance(value, str):  # `a,b,c` on the command line; numbers are parsed as YAML scalars
            items = [v.strip() for v in value.split(",") if v.strip()]
            value = items if inner is str else [_scalar(v) for v in items]
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = [value]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{name}: expected a list, got {value!r}")
        return [_coerce(v, inner, f"{name}[{i}]") for i, v in enumerate(value)]
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{name}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{name}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, str):
            try:  # YAML 1.1 reads "1e-5" as a string
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value):
            return float(value)
        raise ConfigError(f"{name}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        if isinstance(value, str):
            return value
        raise ConfigError(f"{name}: expected a string, got {value!r}")
    raise ConfigError(f"{name}: unsupported field type {tp}")


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def from_dict(cls: type, data: dict[str, Any] | None, prefix: str = "") -> Any:
    """Build dataclass `cls` from a nested dict, validating keys and types.

    A section with an `options` field (algo, sampling, budget) takes every other mapping-valued key as the options
    of the entry of that name (`algo.erpo: {gamma: 5}`), kept raw here and checked against the registry by
    `explorl.config.validation.validate`; a key that earlier versions had as a flat field (`algo.erpo_gamma`) is
    refused with its new name (`MOVED_KEYS`), and a switch that became an entry's selection (`algo.tis: true`) with
    the selection that replaces it (`MOVED_SWITCHES`)."""
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a mapping, got {data!r}")
    data = dict(data or {})
    hints = _hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.name != "options"]
    has_options = "options" in hints
    options: dict[str, Any] = {}
    for key in list(data):
        if key in names:
            continue
        section = SECTION_OF.get(cls, prefix.rstrip('.'))
        _refuse_switch(MOVED_SWITCHES.get(f"{section}.{key}"), prefix, key, data[key])
        moved = MOVED_KEYS.get(f"{section}.{key}")
        if moved is not None:  # named as the caller names the section (an engine's prefix, e.g. verl's)
            moved = prefix + moved.split(".", 1)[1]
            raise ConfigError(f"'{prefix}{key}' is now '{moved}': each method's options live under its name "
                              f"(write {moved}={data[key]!r}, or in YAML `{moved.rsplit('.', 1)[0]}: "
                              f"{{{moved.rsplit('.', 1)[1]}: ...}}`)")
        if has_options and data[key] is None:  # `algo.erpo=null`: no options here (a layered recipe's dropped)
            data.pop(key)
            continue
        if has_options and isinstance(data[key], dict):
            options[str(key)] = dict(data.pop(key))
            continue
        near = difflib.get_close_matches(str(key), names, n=1)
        hint = f" Did you mean '{prefix}{near[0]}'?" if near else ""
        what = " (a method's options are a mapping: `<name>: {field: value}`)" if has_options else ""
        raise ConfigError(f"unknown key '{prefix}{key}'.{hint} Valid keys here: {', '.join(names)}{what}")
    kwargs: dict[str, Any] = {"options": options} if has_options else {}
    for f in dataclasses.fields(cls):
        if f.name not in data or f.name == "options":
            continue
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            value = data[f.name]
            if value is not None and not isinstance(value, dict):
                raise ConfigError(f"{prefix}{f.name}: expected a mapping of its fields, got {value!r}")
            kwargs[f.name] = from_dict(tp, value, f"{prefix}{f.name}.")
        else:
            kwargs[f.name] = _coerce(data[f.name], tp, f"{prefix}{f.name}")
    return cls(**kwargs)


def _refuse_switch(switch: dict[Any, str] | None, prefix: str, key: str, value: Any) -> None:
    """ConfigError for `prefix + key`, a switch of earlier versions (`MOVED_SWITCHES`), naming the selection that
    replaces `value`; nothing when `switch` is None or `value` is a mapping or null (the options of the entry of
    that name, `algo.tis: {cap: 2}`, or none)."""
    if switch is None or value is None or isinstance(value, dict):
        return
    new = {str(old).lower() if isinstance(old, bool) else old: prefix + to.split(".", 1)[1]
           for old, to in switch.items()}
    shown = str(value).lower() if isinstance(value, bool) else value
    if shown in new:
        name = new[shown].split("=", 1)[1].strip("[]")
        options = f" (`explorl methods {name}` shows the method and its options, `{prefix}{name}.<field>`)" \
            if name not in ("", "none") else ""
        raise ConfigError(f"'{prefix}{key}' is now the selection of a method: write {new[shown]} instead of "
                          f"{prefix}{key}={shown}{options}")
    raise ConfigError(f"'{prefix}{key}' is now the selection of a method: write "
                      + ", ".join(f"{to} for {prefix}{key}={old}" for old, to in new.items()))


def _inline_options(data: Any) -> Any:
    """`asdict` output with every section's `options` mapping written into the section itself (the YAML form)."""
    if not isinstance(data, dict):
        return data
    out = {k: _inline_options(v) for k, v in data.items() if k != "options"}
    for name, options in (data.get("options") or {}).items():
        out[name] = dataclasses.asdict(options) if dataclasses.is_dataclass(options) else dict(options)
    return out


def to_dict(cfg: Any) -> dict[str, Any]:
    """A config (or one section) as nested plain data, in the form YAML and `from_dict` take: each method's options
    under its name in its section."""
    return _inline_options(dataclasses.asdict(cfg))


def _field_type(parts: list[str], cls: type = Config) -> Any:
    """The annotation of the dotted field `parts` of `cls`, or None when there is no such field."""
    for i, part in enumerate(parts):
        tp = _hints(cls).get(part) if dataclasses.is_dataclass(cls) else None
        if tp is None or i == len(parts) - 1:
            return tp
        cls = tp
    return None


def apply_override(data: dict[str, Any], override: str) -> None:
    """Apply one `a.b.c=value` override to a nested dict; the value is parsed as YAML (`1e-4`, `[1,2]`, `true`),
    except for plain string fields, which take the text verbatim (`task.prompt_template=Q: {question}`) unless
    it is quoted, and fields whose choices are strings (`task.chat_template=off` is `off`, not YAML's false)."""
    if "=" not in override:
        raise ConfigError(f"override {override!r} must look like key.sub=value (e.g. sampling.temperature=0.7)")
    key, raw = override.split("=", 1)
    key = key.strip()
    try:
        value = yaml.safe_load(raw) if raw.strip() != "" else ""
    except yaml.YAMLError:
        value = raw
    parts = key.split(".")
    quoted = len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"" and isinstance(value, str)
    tp = _field_type(parts)
    choices = typing.get_args(tp) if typing.get_origin(tp) is Literal else ()
    if (tp is str or (choices and all(isinstance(c, str) for c in choices))) and not quoted:
        value = raw.strip() if choices else raw
    node = data
    for p in parts[:-1]:
        if not isinstance(node.get(p, {}), dict):
            raise ConfigError(f"override {override!r}: '{p}' is not a section")
        node = node.setdefault(p, {})
    node[parts[-1]] = value


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def read_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read a YAML config (optional) and apply overrides into the typed `Config`, not yet checked against the
    registry (`explorl.config.validation.load_config` does both).

    A YAML file may name `base: other.yaml` (relative to itself) to inherit from another config, and `methods:
    [...]` to layer methods on it; the precedence is `read_layers`'.
    """
    layers = read_layers(path, overrides)
    try:
        return from_dict(Config, settings(layers))
    except ConfigError as e:  # a wrong type or an unknown key: say where it was written
        raise ConfigError(_located(str(e), layers)) from None


_ERROR_KEY = re.compile(r"(?:unknown key ')?([A-Za-z_][\w.]*)")


def _located(message: str, layers: list[Layer]) -> str:
    """`message` (which starts with the dotted key it concerns) prefixed with `file:line:` of the layer that set the
    key, when a YAML file did (`my.yaml:7: run.steps: expected an integer, got 'many'`)."""
    m = _ERROR_KEY.match(message)
    if m is None:
        return message
    key = m.group(1).rstrip(".")
    setter = next((layer for layer in reversed(layers) if layer.sets(key)), None)
    if setter is None or setter.file is None:
        return message
    line = _line_of(setter.file, key)
    return f"{_shown(setter.file)}:{line}: {message}" if line else f"{_shown(setter.file)}: {message}"


def _line_of(path: Path, key: str) -> int | None:
    """The 1-based line of the dotted `key` in the YAML file `path` (where its last part is written), or None."""
    try:
        node = yaml.compose(path.read_text(encoding="utf-8"), Loader=yaml.SafeLoader)
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return None
    line = None
    for part in key.split("."):
        if not isinstance(node, yaml.MappingNode):
            return line
        found = next(((k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == part), None)
        if found is None:
            return line
        line, node = found[0].start_mark.line + 1, found[1]
    return line


def _resolve_paths_of_overrides(data: dict) -> None:
    """Input paths still relative after the files were read came from the command line (or a config built in
    code): relative to the working directory, made absolute so that config.yaml records where they are."""
    _resolve_paths(data, Path.cwd(), modules=False)  # modules named on the command line: found from the cwd


def _refuse_duplicate_keys(node: Any, path: Path, prefix: str = "", seen: set | None = None) -> None:
    """ConfigError naming the dotted key and both lines when a YAML mapping writes a key twice (YAML itself keeps the
    last one silently, so a setting would change without a word). Keys a merge (`<<: *anchor`) brings in may be
    overridden, as YAML means."""
    seen = set() if seen is None else seen
    if id(node) in seen:
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        lines: dict[str, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            if key is None:
                continue
            line = key_node.start_mark.line + 1
            if key in lines:
                raise ConfigError(f"{prefix}{key}: written twice in {path} (lines {lines[key]} and {line}); YAML would "
                                  f"keep the last silently. Remove one of them")
            lines[key] = line
            _refuse_duplicate_keys(value_node, path, f"{prefix}{key}.", seen)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _refuse_duplicate_keys(item, path, f"{prefix.rstrip('.')}[{i}].", seen)


def _read_yaml(path: Path) -> dict[str, Any]:
    """One YAML file's mapping, as written (its `base:` and `methods:` still in it; `_file_layers` reads them)."""
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    try:
        loader = yaml.SafeLoader(path.read_text(encoding="utf-8"))
        loader.name = str(path)  # YAML's messages name the file (not "<unicode string>") and quote its line
        try:
            node = loader.get_single_node()
            _refuse_duplicate_keys(node, path)
            data = (loader.construct_document(node) if node is not None else None) or {}
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not a UTF-8 text file ({e})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections (model, task, ...)")
    return data


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


def _shown(path: Path) -> str:
    """A path as `explain` shows it: relative to the working directory when it lies below it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


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
        _resolve_paths_of_overrides(command_line)
        layers.append(Layer("command line", command_line))
    unsettled = [c for c in conflicts if not _settled(c, layers)]
    if unsettled:
        file = unsettled[0].file
        both = "; ".join(f"methods {c.first[0]!r} and {c.second[0]!r} both set {c.key} ({c.first[1]!r} vs "
                         f"{c.second[1]!r})" for c in unsettled)
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
    data = _read_yaml(path)
    base = data.pop("base", None)
    methods = data.pop("methods", None)
    _resolve_paths(data, path.parent.resolve())  # this file's paths, relative to itself
    layers: list[Layer] = []
    conflicts: list[_Conflict] = []
    if base is not None:
        if not isinstance(base, str) or not base:
            raise ConfigError(f"{path}: `base:` must be the path of another YAML config, got {base!r}")
        below, found = _file_layers(path.parent / base, "base", depth + 1)
        layers, conflicts = below, found
    own = Layer(_role_name(role, path), data, method=role.startswith("methods"), file=path)
    if methods is not None:  # between the base and the file's own keys
        above, found = _method_layers(methods, path, own, depth)
        layers, conflicts = layers + above, conflicts + found
    return layers + [own], conflicts


def _role_name(role: str, path: Path) -> str:
    if role == "base":
        return f"base: {_shown(path)}"
    if role.startswith("methods"):
        return f"{role} ({_shown(path)})"
    return _shown(path)


def _method_layers(methods: Any, path: Path, owner: Layer, depth: int) -> tuple[list[Layer], list[_Conflict]]:
    """The layers of `methods:` (names of shipped layers, or paths of YAML files relative to `path`), in order, and
    the keys two of them set to different values (settled, or refused, by `read_layers`)."""
    if isinstance(methods, str):
        methods = [methods]
    if not isinstance(methods, list) or not all(isinstance(m, str) and m for m in methods):
        raise ConfigError(f"{path}: `methods:` must be a list of method names ({', '.join(method_names())}) or "
                          f"YAML files, got {methods!r}")
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


# the fields that name files or directories a run reads: resolved relative to the config file that sets them
# (command-line overrides: relative to the working directory), so a config runs from any directory
PATH_FIELDS = (("model", "path"), ("task", "path"), ("task", "eval_path"))


HUB_NAME = re.compile(r"[A-Za-z0-9][\w-]*(?:/[A-Za-z0-9][\w.-]*)?")
"""A dataset name as the Hub writes them (`gsm8k`, `openai/gsm8k`, `HuggingFaceH4/MATH-500`)."""


def _hub_name(value: str, base: Path) -> bool:
    """Whether a relative `task.path` is a dataset name rather than a path: shaped like one, with no file suffix,
    and nothing of that name next to the config (a local directory or file always wins, as in `load_dataset`)."""
    return bool(HUB_NAME.fullmatch(value)) and not Path(value).suffix and not (base / value).exists()


def _resolve_paths(data: dict, base: Path, modules: bool = True) -> None:
    """Make the input paths of one config file's mapping absolute, relative to `base` (its directory): model.path
    (not `embedded`), task.path, task.eval_path, each `run.eval_sets` entry's path and eval_path; and with `modules`,
    when the file names modules (`run.plugins`, a `module:function` in `task.reward`) and says no `run.python_path`
    of its own (a run's recorded config.yaml does), put `base` on `run.python_path`."""
    def resolve(section: Any, key: str) -> None:
        value = section.get(key) if isinstance(section, dict) else None
        shipped = ("embedded", "embedded:testbed")  # the models shipped with explorl, not directories
        if isinstance(value, str) and value and value not in shipped and not Path(value).expanduser().is_absolute():
            if section is data.get("task") and key == "path" and _hub_name(value, base):
                return  # a dataset name for `task.name: hf` (`openai/gsm8k`), kept as written
            section[key] = str(base / value)

    for section, key in PATH_FIELDS:
        resolve(data.get(section), key)
    run = data.get("run") if isinstance(data.get("run"), dict) else None
    sets = (run or {}).get("eval_sets")
    for entry in sets.values() if isinstance(sets, dict) else ():
        for key in ("path", "eval_path"):
            resolve(entry, key)
    if not modules or (isinstance(run, dict) and "python_path" in run):
        return
    task = data.get("task") if isinstance(data.get("task"), dict) else {}
    rewards = task.get("reward")
    modules = [r for r in (rewards if isinstance(rewards, list) else [rewards]) if isinstance(r, str) and ":" in r]
    if modules or (run or {}).get("plugins"):
        data.setdefault("run", {})
        if isinstance(data["run"], dict):
            dirs = list(data["run"].get("python_path") or [])
            data["run"]["python_path"] = dirs + [str(base)] if str(base) not in dirs else dirs


def dump_yaml(cfg: Config) -> str:
    """The config as YAML (`to_dict`): what a run writes to its config.yaml."""
    return yaml.safe_dump(to_dict(cfg), sort_keys=False, default_flow_style=None, width=120)
