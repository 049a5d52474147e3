"""Building typed configs from plain data and back: `from_dict` (a nested dict, as YAML gives it, into a dataclass,
each value checked against the field's annotation and coerced to its canonical form; unknown keys refused with a
"did you mean"), `to_dict` (the inverse, each method's options under
its name) and `apply_override` (one `key.sub=value` of the command line into a nested dict).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from typing import Any, Literal

import yaml

from explorl.config.schema import Config, ConfigError, short_repr


def type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (list, tuple):
        return f"list of {type_name(typing.get_args(tp)[0])}"
    if origin in (typing.Union, types.UnionType):
        return " or ".join("null" if a is type(None) else type_name(a) for a in typing.get_args(tp))
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
            raise ConfigError(f"{name}: {short_repr(value)} is not a valid choice; valid choices: "
                              f"{', '.join(map(str, choices))}")
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
                              f"{{ood: {{difficulties: [8, 9]}}}}, got {short_repr(value)}")
        return {str(k): dict(v or {}) for k, v in value.items()}
    if origin is list:
        (inner,) = typing.get_args(tp)
        if isinstance(value, str):  # `a,b,c` on the command line; numbers are parsed as YAML scalars
            items = [v.strip() for v in value.split(",") if v.strip()]
            value = items if inner is str else [_scalar(v) for v in items]
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = [value]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{name}: expected a list, got {short_repr(value)}")
        return [_coerce(v, inner, f"{name}[{i}]") for i, v in enumerate(value)]
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{name}: expected true or false, got {short_repr(value)}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{name}: expected an integer, got {short_repr(value)}")
    if tp is float:
        if isinstance(value, str):
            try:  # YAML 1.1 reads "1e-5" as a string
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value):
            return float(value)
        raise ConfigError(f"{name}: expected a number, got {short_repr(value)}")
    if tp is str:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        if isinstance(value, str):
            return value
        raise ConfigError(f"{name}: expected a string, got {short_repr(value)}")
    raise ConfigError(f"{name}: unsupported field type {tp}")


def type_hints(cls: type) -> dict[str, Any]:
    """The annotations of the dataclass `cls`, resolved."""
    return typing.get_type_hints(cls)


def from_dict(cls: type, data: dict[str, Any] | None, prefix: str = "") -> Any:
    """Build dataclass `cls` from a nested dict, validating keys and types.

    A section with an `options` field (algo, sampling, budget) takes every other mapping-valued key as the options
    of the entry of that name (`algo.erpo: {gamma: 5}`), kept raw here and checked against the registry by
    `explorl.config.validation.validate`. Any other unknown key is refused with the keys valid there,
    the nearest suggested."""
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a mapping, got {short_repr(data)}")
    data = dict(data or {})
    hints = type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.name != "options"]
    has_options = "options" in hints
    options: dict[str, Any] = {}
    for key in list(data):
        if key in names:
            continue
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
                raise ConfigError(f"{prefix}{f.name}: expected a mapping of its fields, got {short_repr(value)}")
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
        tp = type_hints(cls).get(part) if dataclasses.is_dataclass(cls) else None
        if tp is None or i == len(parts) - 1:
            return tp
        cls = tp
    return None


_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\\\"}


def _shell_escapes(text: str) -> str:
    """`\\n` and `\\t` typed on a command line as a newline and a tab (a shell passes them as two characters); `\\\\`
    stays as written, so `\\\\n` is a backslash and an n. A regex means the same by `\\n` and a newline, so
    `task.answer_pattern` reads alike either way; every other backslash is kept."""
    return re.sub(r"\\([nt\\])", lambda m: _ESCAPES[m.group(1)], text)


def apply_override(data: dict[str, Any], override: str) -> None:
    """Apply one `a.b.c=value` override to a nested dict; the value is parsed as YAML (`1e-4`, `[1,2]`, `true`),
    except for plain string fields, which take the text verbatim (`task.prompt_template=Q: {question}`, with `\\n`
    and `\\t` read as a newline and a tab: `_shell_escapes`) unless it is quoted, and fields whose choices are
    strings (`task.chat_template=off` is `off`, not YAML's false)."""
    if "=" not in override:
        raise ConfigError(f"override {short_repr(override)} must look like key.sub=value (e.g. "
                          f"sampling.temperature=0.7)")
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
        value = raw.strip() if choices else _shell_escapes(raw)
    node = data
    for p in parts[:-1]:
        if not isinstance(node.get(p, {}), dict):
            raise ConfigError(f"override {short_repr(override)}: '{p}' is not a section")
        node = node.setdefault(p, {})
    node[parts[-1]] = value
