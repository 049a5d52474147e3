"""Config files as YAML: reading one (`read_yaml`: a mapping, a key written twice refused with both lines), finding
the line a key is written on (`line_of`, for errors that say `file:line:`), and writing a config (`dump_yaml`, what
a run records as its config.yaml).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from explorl.config.building import to_dict
from explorl.config.schema import Config, ConfigError


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


def _shown(path: Path) -> str:
    """A path as `explain` shows it: relative to the working directory when it lies below it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def dump_yaml(cfg: Config) -> str:
    """The config as YAML (`to_dict`): what a run writes to its config.yaml."""
    return yaml.safe_dump(to_dict(cfg), sort_keys=False, default_flow_style=None, width=120)
