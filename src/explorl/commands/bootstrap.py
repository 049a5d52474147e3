"""`explorl bootstrap --out DIR`: train a tiny default model as the shipped embedded one was
(`explorl.finetune.bootstrap`)."""

from __future__ import annotations

from pathlib import Path

import yaml
from rich.text import Text

import explorl.commands.common as common
from explorl.config import ConfigError, from_dict
from explorl.finetune.bootstrap import BootstrapConfig, bootstrap


def add_parser(sub) -> None:
    b = sub.add_parser("bootstrap", help="train a tiny default model as the shipped embedded one was trained")
    b.add_argument("--out", required=True, help="directory to write (the shipped model lies in explorl/embedded/)")
    b.add_argument("--force", action="store_true", help="retrain even if cached")
    b.add_argument("overrides", nargs="*", metavar="key=value",
                   help="bootstrap settings (explorl.finetune.bootstrap.BootstrapConfig), e.g. heads=2 kv_heads=1 "
                        "for head size 32, which vLLM's CPU attention needs")
    b.set_defaults(fn=cmd_bootstrap)


def bootstrap_config(overrides: list[str]):
    """A `BootstrapConfig` from `key=value` arguments (values parsed as YAML); an unknown key or a malformed
    argument raises ConfigError naming it."""
    fields = {}
    for item in overrides:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise ConfigError(f"bootstrap: {item!r} is not key=value (e.g. heads=2)")
        fields[key] = yaml.safe_load(value)
    return from_dict(BootstrapConfig, fields, "bootstrap.")


def cmd_bootstrap(args) -> int:
    console = common.console
    target = Path(args.out)
    if (target / "config.json").exists() and not args.force:
        console.print(f"a model is already at {target} (use --force to retrain)")
        return 0
    bootstrap(target, bootstrap_config(args.overrides), console=console)
    console.print(Text(f"use it with EXPLORL_EMBEDDED={target} (model.path=embedded) or model.path={target}; the "
                       f"embedded default that ships with explorl is unchanged"))
    return 0
