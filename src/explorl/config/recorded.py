"""A run directory's config.yaml: how the commands that read a run recognise it, and its model read as data.

explorl records every field of a run's config, resolved, in RUN/config.yaml, and `explorl train --resume`, `explorl
eval` (of RUN, RUN/final or a checkpoint), `explorl export`, `explorl probe --run` and the engines read it back with
`load_config`, as any config file: there is one config version, so a key today's schema does not have is refused as
in a user's YAML, naming the keys valid there. Before the code a run's config names runs, `explorl.config.trust`
asks for the user's word (`is_recorded_config` tells it which file is a run's).
"""

from __future__ import annotations

from pathlib import Path

from explorl.config.building import from_dict
from explorl.config.layers import read_layers, settings
from explorl.config.schema import ModelConfig


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
    return from_dict(ModelConfig, settings(read_layers(Path(path))).get("model") or {}, "model.")
