"""Typed configuration: the schema (`schema`, its task section `task`), loading and overrides (`loading`, built on
`files`, `layers`, `paths` and `building`), checks against the registry (`validation`, on `selection` and
`held_out`), the reference table (`fields`), a run directory's config.yaml (`recorded`), where each value came from
(`explain`). The public names are importable from here."""

from explorl.config.building import apply_override, from_dict, to_dict
from explorl.config.fields import field_docs, reference
from explorl.config.files import dump_yaml
from explorl.config.held_out import EVAL_KEYS_RESERVED, command_task, eval_set_task, held_out_task
from explorl.config.loading import read_config
from explorl.config.schema import (AlgoConfig, BudgetConfig, Config, ConfigError, LoraConfig, ModelConfig,
                                   OptimConfig, RftConfig, RunConfig, SamplingConfig, SftConfig, TaskConfig)
from explorl.config.selection import import_plugins, resolve_options, selected_entries
from explorl.config.validation import DEVICES, load_config, valid_device, validate

__all__ = ["AlgoConfig", "BudgetConfig", "Config", "ConfigError", "DEVICES", "EVAL_KEYS_RESERVED", "LoraConfig",
           "ModelConfig", "OptimConfig", "RftConfig", "RunConfig", "SamplingConfig", "SftConfig", "TaskConfig",
           "apply_override", "command_task", "dump_yaml", "eval_set_task", "field_docs", "from_dict",
           "held_out_task", "import_plugins", "load_config", "read_config", "reference", "resolve_options",
           "selected_entries", "to_dict", "valid_device", "validate"]
