"""Building configs from YAML files, dicts and `key.sub=value` overrides, with errors that name the field.

`read_config` reads, overrides and builds the typed `Config` (`explorl.config.schema`); `load_config`
(`explorl.config.validation`) validates it too, so a typo or an impossible combination fails in milliseconds with
the field's dotted name, the reason and the valid choices.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from explorl.config.schema import MOVED_KEYS, AlgoConfig, BudgetConfig, Config, ConfigError, SamplingConfig

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
    refused with its new name (`MOVED_KEYS`)."""
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
        moved = MOVED_KEYS.get(f"{SECTION_OF.get(cls, prefix.rstrip('.'))}.{key}")
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

    A YAML file may name `base: other.yaml` (relative to itself) to inherit from another config.
    """
    data: dict[str, Any] = {}
    if path is not None:
        data = _read_yaml(Path(path))
    for ov in overrides:
        apply_override(data, ov)
    _resolve_paths_of_overrides(data)
    return from_dict(Config, data)


def _resolve_paths_of_overrides(data: dict) -> None:
    """Input paths still relative after the files were read came from the command line (or a config built in
    code): relative to the working directory, made absolute so that config.yaml records where they are."""
    _resolve_paths(data, Path.cwd(), modules=False)  # modules named on the command line: found from the cwd


def _read_yaml(path: Path, depth: int = 0) -> dict[str, Any]:
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    try:
        loader = yaml.SafeLoader(path.read_text(encoding="utf-8"))
        loader.name = str(path)  # YAML's messages name the file (not "<unicode string>") and quote its line
        try:
            data = loader.get_single_data() or {}
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not a UTF-8 text file ({e})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections (model, task, ...)")
    base = data.pop("base", None)
    methods = data.pop("methods", None)
    _resolve_paths(data, path.parent.resolve())  # this file's paths, before a base's are merged in
    if methods is not None:  # between the base and the file's own keys: a method's layer, the file's choices on top
        data = _merge(_method_layers(methods, path), data)
    if base is not None:
        if not isinstance(base, str) or not base:
            raise ConfigError(f"{path}: `base:` must be the path of another YAML config, got {base!r}")
        if depth > 8:
            raise ConfigError(f"{path}: `base:` chain is too deep (a cycle?)")
        data = _merge(_read_yaml(path.parent / base, depth + 1), data)
    return data


METHODS_DIR = Path(__file__).resolve().parents[1] / "methods"
"""The method layers shipped with explorl (`methods: [e3]`): each a method's settings as its paper gives them
(algo, sampling, budget, and an optimizer setting the paper fixes), and nothing of a model's scale."""


def method_names() -> list[str]:
    """The names of the method layers shipped with explorl."""
    return sorted(p.stem for p in METHODS_DIR.glob("*.yaml"))


def _method_layers(methods: Any, path: Path) -> dict:
    """The settings of `methods:` (names of shipped layers, or paths of YAML files relative to `path`), merged in
    order; ConfigError when two set the same key to different values (choose one, or set the key yourself)."""
    if isinstance(methods, str):
        methods = [methods]
    if not isinstance(methods, list) or not all(isinstance(m, str) and m for m in methods):
        raise ConfigError(f"{path}: `methods:` must be a list of method names ({', '.join(method_names())}) or "
                          f"YAML files, got {methods!r}")
    merged: dict = {}
    origin: dict[str, str] = {}
    for name in methods:
        file = path.parent / name if name.endswith((".yaml", ".yml")) else METHODS_DIR / f"{name}.yaml"
        if not file.exists():
            near = difflib.get_close_matches(name, method_names(), n=1)
            hint = f" Did you mean '{near[0]}'?" if near else ""
            raise ConfigError(f"{path}: methods: {name!r} is not a method layer.{hint} Shipped: "
                              f"{', '.join(method_names())}; or give a YAML file")
        layer = _read_yaml(file)
        for key, value in _leaves(layer):
            if key in origin and _get(merged, key) != value:
                raise ConfigError(f"{path}: methods {origin[key]!r} and {name!r} both set {key} "
                                  f"({_get(merged, key)!r} vs {value!r}); set {key} in {path.name} to choose")
            origin[key] = name
        merged = _merge(merged, layer)
    return merged


def _leaves(data: dict, prefix: str = "") -> list[tuple[str, Any]]:
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


def _resolve_paths(data: dict, base: Path, modules: bool = True) -> None:
    """Make the input paths of one config file's mapping absolute, relative to `base` (its directory): model.path
    (not `embedded`), task.path, task.eval_path, each `run.eval_sets` entry's path and eval_path; and with `modules`,
    when the file names modules (`run.plugins`, a `module:function` in `task.reward`) and says no `run.python_path`
    of its own (a run's recorded config.yaml does), put `base` on `run.python_path`."""
    def resolve(section: Any, key: str) -> None:
        value = section.get(key) if isinstance(section, dict) else None
        if isinstance(value, str) and value and value != "embedded" and not Path(value).expanduser().is_absolute():
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
