"""What only explorl's own loop can run, asked of the registry (no method is named here): shared by the TRL and verl
integrations, which refuse it naming the field and the fix."""

from __future__ import annotations

from explorl.algos.registry import lookup, names
from explorl.config import ConfigError


def refuse_loop_only_shapers(shapers: list[str], engine: str, prefix: str = "algo.") -> None:
    """ConfigError for a shaper of `shapers` that reads `RolloutBatch.outcomes` (`needs_outcomes`: each response's
    final answer, filled where explorl's loop scores the rewards) or keeps a state across steps (`state`: counts
    that explorl's loop passes to it and keeps in its checkpoints), which `engine` ("TRL's trainer") does not.
    Unknown names are left to the validation, which lists the valid ones."""
    for name in shapers:
        entry = lookup("shaper", name) if name in names("shaper") else None
        if entry is not None and (entry.needs_outcomes or entry.state is not None):
            raise ConfigError(f"{prefix}shapers: shaper {name!r} reads RolloutBatch.outcomes (each response's final "
                              f"answer, filled where explorl's loop scores the rewards) and keeps its counts across "
                              f"steps in explorl's checkpoints, which {engine} fills and keeps neither of; run it with "
                              f"explorl train, or remove it from {prefix}shapers")
