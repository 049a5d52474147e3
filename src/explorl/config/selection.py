"""The registry as a config sees it: the modules that fill it (explorl's own, `run.plugins` after `run.python_path`),
the entries a config selects (`selected_entries`) and their typed options (`resolve_options`, which refuses the
options of entries that are not selected), and the core fields whose valid values the algorithms define (`CHOICES`).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import os
import sys
from typing import Any

from explorl.algos.aggregation import LOSS_AGG_MODES
from explorl.algos.registry import SECTIONS, SELECTED_BY, Entry, entries, lookup, names
from explorl.config.building import from_dict
from explorl.config.schema import Config, ConfigError, short_repr

CHOICES: dict[str, tuple[str, ...]] = {"algo.loss_agg": LOSS_AGG_MODES}
"""Core fields whose valid values the algorithms define (their one source): the schema types them `str` (it imports
nothing of explorl), `validate` refuses any other value and `reference` shows them as the field's type."""


def use_python_path(dirs: list[str]) -> None:
    """Put `run.python_path` at the front of sys.path (once each), so plugins and reward modules next to the config
    are found first; worker processes inherit it."""
    for d in reversed(dirs):
        if d not in sys.path:
            sys.path.insert(0, d)


def import_plugins(modules: list[str]) -> None:
    """Import `run.plugins` (after `use_python_path`; the working directory is searched too, as for
    `task.reward: module:function`)."""
    if modules and "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    for i, name in enumerate(modules):
        try:
            importlib.import_module(name)
        except Exception as e:  # the module's own error, named with the field
            raise ConfigError(f"run.plugins[{i}]: cannot import {name!r}: {type(e).__name__}: {e}") from None


def _check_choices(cfg: Config) -> None:
    """ConfigError naming the first field of `CHOICES` whose value is not one of its choices."""
    for key, choices in CHOICES.items():
        value = _get(cfg, key)
        if value not in choices:
            raise ConfigError(f"{key}: {short_repr(value)} is not a valid choice; valid choices: "
                              f"{', '.join(choices)}")


def fill_registry() -> None:
    """Import the modules that register explorl's own entries (estimators, losses, schedules, budgets, tasks)."""
    # imported for their registrations when a registry is first read: `import explorl.config` loads no method or
    # task (~40 ms, not ~90)
    import explorl.algos  # noqa: F401
    import explorl.rollout.controllers  # noqa: F401
    import explorl.tasks  # noqa: F401


def _registered(kind: str, name: str, field_name: str) -> Entry:
    """The registry entry `name` of `kind`, or ConfigError naming `field_name` and the valid names."""
    try:
        return lookup(kind, name)
    except KeyError:
        raise ConfigError(f"{field_name}: unknown {kind.replace('_', ' ')} {short_repr(name)}; valid: "
                          f"{', '.join(names(kind))} (your own: register it in a module named in run.plugins)") from None


def selected_entries(cfg: Config) -> dict[str, list[Entry]]:
    """The entries a config selects, per section (`algo`, `sampling`, `budget`), in config order, including those
    an entry selects in turn (`Entry.selects`, e.g. the adaptive schedule's base)."""
    fill_registry()
    a, s, b = cfg.algo, cfg.sampling, cfg.budget
    chosen = {"algo": [*(("reward_shaper", x) for x in a.reward_shapers), ("estimator", a.advantage),
                       *(("shaper", x) for x in a.shapers), ("policy_loss", a.loss), ("token_filter", a.token_filter),
                       ("importance_weights", a.importance_weights)],
              "sampling": [("temperature_schedule", s.schedule)], "budget": [("budget_policy", b.policy)]}
    out: dict[str, list[Entry]] = {}
    for section_name, queue in chosen.items():
        section, found = getattr(cfg, section_name), []
        queue = [(kind, name, SELECTED_BY[kind]) for kind, name in queue]
        while queue:
            kind, name, field_name = queue.pop(0)
            entry = _registered(kind, name, field_name)
            if entry in found:
                continue
            found.append(entry)
            if entry.selects is not None:
                owner = lookup(kind, entry.options_owner)
                raw = section.options.get(owner.name)
                options = raw if owner.options is None or isinstance(raw, owner.options) else \
                    from_dict(owner.options, raw, f"{section_name}.{owner.name}.")
                queue += [(kind, n, f"{section_name}.{owner.name}.{f}") for f, n in entry.selects(options).items()]
        out[section_name] = found
    return out


def resolve_options(cfg: Config) -> None:
    """Replace each section's raw `options` by the typed options of its selected entries, defaults filled in (so
    a run's config.yaml records every selected method's options); refuse options of entries that are not selected,
    unknown fields (with the full key and a "did you mean") and wrong types (naming the key)."""
    for section_name, chosen in selected_entries(cfg).items():
        section = getattr(cfg, section_name)
        raw, typed = dict(section.options), {}
        for entry in chosen:
            owner = lookup(entry.kind, entry.options_owner)
            if owner.options is None or owner.name in typed:
                continue
            value = raw.get(owner.name)
            typed[owner.name] = value if isinstance(value, owner.options) else \
                from_dict(owner.options, value, f"{section_name}.{owner.name}.")
        for key in raw:
            if key not in typed:
                raise ConfigError(_stray_options_message(cfg, section_name, key))
        section.options = typed


def _stray_options_message(cfg: Config, section_name: str, key: str) -> str:
    """Why `section.key` (options of no selected entry) is refused, and the fix."""
    where = f"{section_name}.{key}"
    kinds = [k for k, s in SECTIONS.items() if s == section_name]
    for kind in kinds:
        entry = entries(kind).get(key)
        if entry is None:
            continue
        if entry.options_from is not None:
            return (f"{where}: the {kind.replace('_', ' ')} {key!r} reads the options of {entry.options_from!r}; "
                    f"write them under {section_name}.{entry.options_from}")
        if entry.options is None:
            return f"{where}: the {kind.replace('_', ' ')} {key!r} has no options"
        field_name = SELECTED_BY[kind]
        value = _get(cfg, field_name)
        return (f"{where}: options of the {kind.replace('_', ' ')} {key!r}, which is not selected ({field_name} is "
                f"{short_repr(value)}); select it with {field_name}, or remove {where} (on the command line: {where}=null)")
    core = [f.name for f in dataclasses.fields(getattr(cfg, section_name)) if f.name != "options"]
    with_options = sorted({e.options_owner for k in kinds for e in entries(k).values() if e.options or e.options_from})
    near = difflib.get_close_matches(key, core + with_options, n=1)
    hint = f" Did you mean '{section_name}.{near[0]}'?" if near else ""
    return (f"unknown key '{where}'.{hint} Valid keys here: {', '.join(core)}, and the options of a selected "
            f"method under its name ({', '.join(with_options)})")


def _get(cfg: Config, dotted: str) -> Any:
    value: Any = cfg
    for part in dotted.split("."):
        value = getattr(value, part)
    return value
