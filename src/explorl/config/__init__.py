"""Typed configuration: the schema (`schema`, its task section `task`, the keys of earlier versions `moved`), loading
and overrides (`loading`, built on `files`, `layers`, `paths` and `building`), checks against the registry
(`validation`, on `selection` and `held_out`), the reference table (`fields`), a run directory's config.yaml of an
earlier version (`recorded`), where each value came from (`explain`). Everything is importable from here."""

from explorl.config.loading import apply_override, dump_yaml, from_dict, read_config, to_dict
from explorl.config.moved import MOVED_KEYS, MOVED_SWITCHES
from explorl.config.schema import (AlgoConfig, BudgetConfig, Config, ConfigError, LoraConfig, ModelConfig,
                                   OptimConfig, RftConfig, RunConfig, SamplingConfig, SftConfig, TaskConfig,
                                   field_docs)
from explorl.config.validation import (DEVICES, EVAL_KEYS_RESERVED, command_task, eval_set_task, held_out_task,
                                       import_plugins, load_config, reference, resolve_options, selected_entries,
                                       valid_device, validate)

__all__ = ["AlgoConfig", "BudgetConfig", "Config", "ConfigError", "DEVICES", "EVAL_KEYS_RESERVED", "LoraConfig",
           "MOVED_KEYS", "MOVED_SWITCHES", "ModelConfig", "OptimConfig", "RftConfig", "RunConfig", "SamplingConfig",
           "SftConfig", "TaskConfig", "apply_override", "command_task", "dump_yaml", "eval_set_task", "field_docs",
           "from_dict", "held_out_task", "import_plugins", "load_config", "read_config", "reference",
           "resolve_options", "selected_entries", "to_dict", "valid_device", "validate"]
