"""Reading a config into the typed `Config`, with errors that name the field and the `file:line:` that set it.

`read_config` reads, overrides and builds the typed `Config` (`explorl.config.schema`); `load_config`
(`explorl.config.validation`) validates it too, so a typo or an impossible combination fails in milliseconds with
the field's dotted name, the reason and the valid choices. The pieces: `explorl.config.files` (YAML in and out),
`explorl.config.layers` (base, methods, command line and their precedence), `explorl.config.paths` (input paths
relative to the file that names them), `explorl.config.building` (typed sections from plain data and back).
"""

from __future__ import annotations

import re
from pathlib import Path

from explorl.config.building import from_dict
from explorl.config.files import display_path, line_of
from explorl.config.layers import Layer, read_layers, settings
from explorl.config.schema import Config, ConfigError


def read_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read a YAML config (optional) and apply overrides into the typed `Config`, not yet checked against the
    registry (`explorl.config.validation.load_config` does both).

    A YAML file may name `base: other.yaml` (relative to itself) to inherit from another config, and `methods:
    [...]` to layer methods on it; the precedence is `explorl.config.layers.read_layers`'.
    """
    return config_from_layers(read_layers(path, overrides))


def config_from_layers(layers: list[Layer]) -> Config:
    """The typed `Config` of `read_layers`' layers merged (`settings`); a wrong type or an unknown key is refused
    with the `file:line:` where it was written."""
    try:
        return from_dict(Config, settings(layers))
    except ConfigError as e:
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
    line = line_of(setter.file, key)
    return f"{display_path(setter.file)}:{line}: {message}" if line else f"{display_path(setter.file)}: {message}"
