"""Config files as YAML: reading one (`read_yaml`: a mapping, a key written twice refused with both lines; a file
too large, nested too deep or whose aliases expand to too many values refused before it is built), finding the line
a key is written on (`line_of`, for errors that say `file:line:`), and writing a config (`dump_yaml`, what a run
records as its config.yaml). A config file may come from anyone (a run directory someone sent), so reading one is
bounded in time and memory, and an error quotes a value at most `config.schema.SHOWN_CHARS` long (`short_repr`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from explorl.config.building import to_dict
from explorl.config.schema import Config, ConfigError


MAX_CONFIG_BYTES = 2**20
"""The largest config file read (1 MiB; explorl's own configs are a few KiB): a larger one is refused before it is
parsed, which in pure-Python YAML would take minutes."""

MAX_CONFIG_DEPTH = 64
"""The deepest nesting of mappings and lists in a config file (explorl's deepest setting is about 5 levels down)."""

MAX_CONFIG_VALUES = 100_000
"""The most values (mappings, lists and scalars) a config file may describe, an alias counted again each time it is
used: a few aliases nested in each other (the "billion laughs") otherwise describe billions."""

def _refuse_unbounded(text: str, path: Path) -> None:
    """ConfigError naming the file and the limit when its YAML nests deeper than `MAX_CONFIG_DEPTH` or describes
    more than `MAX_CONFIG_VALUES` values, an alias counted with everything its anchor holds each time it is used, or
    uses an alias inside its own anchor (a value that contains itself). Read from YAML's events, without recursion
    and before any node is composed (composing recurses once per level; building expands every alias)."""
    sizes: dict[str, int] = {}  # anchor -> values it stands for
    open_: list[tuple[str | None, int]] = []  # (anchor, count when it opened) of each mapping and list open now
    count = 0
    loader = yaml.SafeLoader(text)
    loader.name = str(path)  # YAML's own errors name the file
    try:
        while loader.check_event():
            count = _count_event(loader.get_event(), path, sizes, open_, count)
    finally:
        loader.dispose()


def _count_event(event: yaml.Event, path: Path, sizes: dict, open_: list, count: int) -> int:
    """`_refuse_unbounded` for one event: the values counted so far, after it."""
    if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
        count += 1
        open_.append((event.anchor, count))
        if len(open_) > MAX_CONFIG_DEPTH:
            raise ConfigError(f"{path}: nested more than {MAX_CONFIG_DEPTH} levels deep (line "
                              f"{event.start_mark.line + 1}); a config is a few levels of sections and settings")
    elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
        anchor, opened = open_.pop()
        if anchor is not None:
            sizes[anchor] = count - opened + 1
    elif isinstance(event, yaml.ScalarEvent):
        count += 1
        if event.anchor is not None:
            sizes[event.anchor] = 1
    elif isinstance(event, yaml.AliasEvent):
        if any(anchor == event.anchor for anchor, _ in open_):
            raise ConfigError(f"{path}: line {event.start_mark.line + 1}: alias *{event.anchor} is used inside "
                              f"its own anchor &{event.anchor}, a value that contains itself; write it out")
        count += sizes.get(event.anchor, 1)  # an undefined alias: YAML's own error follows when composing
    if count > MAX_CONFIG_VALUES:
        raise ConfigError(f"{path}: describes more than {MAX_CONFIG_VALUES:,} values (line "
                          f"{event.start_mark.line + 1}; an alias counts everything its anchor holds each time "
                          f"it is used), more than any config needs; write the values out, or use fewer aliases")
    return count


def _config_text(path: Path) -> str:
    """The text of config file `path`; ConfigError naming the file and its size when it is over `MAX_CONFIG_BYTES`
    (never more than that read, whatever the file is: a pipe has no size to ask first)."""
    with open(path, "rb") as f:
        data = f.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        size = path.stat().st_size
        said = f"{size:,} bytes" if size > MAX_CONFIG_BYTES else "a stream of more bytes"
        raise ConfigError(f"{path}: {said}, more than a config file may be ({MAX_CONFIG_BYTES:,} bytes, 1 MiB); is "
                          f"it a config? Keep data in task.path files, not in the config")
    return data.decode("utf-8")


def line_of(path: Path, key: str) -> int | None:
    """The 1-based line of the dotted `key` in the YAML file `path` (where its last part is written), or None."""
    try:
        text = _config_text(path)
        _refuse_unbounded(text, path)
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except (OSError, yaml.YAMLError, UnicodeDecodeError, ConfigError, RecursionError):
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


def read_yaml(path: Path) -> dict[str, Any]:
    """One YAML file's mapping, as written (its `base:` and `methods:` still in it; `_file_layers` reads them)."""
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    try:
        text = _config_text(path)
        _refuse_unbounded(text, path)  # before composing: bounded depth, values and time
        loader = yaml.SafeLoader(text)
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
    except RecursionError:  # not expected past `_refuse_unbounded`'s depth limit; never a traceback
        raise ConfigError(f"{path}: nested too deeply to read (more than {MAX_CONFIG_DEPTH} levels)") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections (model, task, ...)")
    return data


def display_path(path: Path) -> str:
    """A path as `explain` shows it: relative to the working directory when it lies below it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def dump_yaml(cfg: Config) -> str:
    """The config as YAML (`to_dict`): what a run writes to its config.yaml."""
    return yaml.safe_dump(to_dict(cfg), sort_keys=False, default_flow_style=None, width=120)
