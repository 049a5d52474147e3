"""Where each value of a config came from, and what the chosen methods cost: `explorl config FILE --explain` and the
summary `explorl train` prints before a run (`explain`, `format_explanation`).

Every key whose value differs from the schema's default is named with the layer that set it (`read_layers`: the
command line, the file, a `methods:` layer, a `base:` file) and the lower layers it overrode; then the settings that
multiply a step's cost (extra sampling rounds, several updates per batch, a reference model), each with its source.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from explorl.algos.registry import lookup
from explorl.algos.step import requirements
from explorl.config.building import to_dict
from explorl.config.layers import Layer, _get, _leaves, read_layers
from explorl.config.schema import Config
from explorl.config.validation import load_config


@dataclass
class Setting:
    """One key whose value is not the default."""

    key: str
    """The dotted key (`algo.loss_agg`)."""
    value: Any
    """Its value in the resolved config."""
    source: str
    """The layer that set it (`Layer.source`)."""
    overrides: list[tuple[str, Any]] = field(default_factory=list)
    """(source, value) of each lower layer that set the key to something else, highest first."""


@dataclass
class Explanation:
    """A resolved config with the source of each non-default value and the costly implications of its methods."""

    cfg: Config
    settings: list[Setting]
    implications: list[str]
    layers: list[Layer]


def explain(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> Explanation:
    """Load and validate the config (`load_config`) and say where each non-default value came from."""
    cfg = load_config(path, overrides)
    layers = read_layers(path, overrides)
    return Explanation(cfg, sources(cfg, layers), implications(cfg, layers), layers)


def sources(cfg: Config, layers: list[Layer]) -> list[Setting]:
    """Every key of `cfg` whose value is not `Config()`'s, in config order, with the layer that set it; a selected
    method's options that no layer set are at their own defaults and left out (`--resolved` shows them)."""
    default = dict(_leaves(to_dict(Config())))
    out = []
    for key, value in _leaves(to_dict(cfg)):
        if key in default and default[key] == value:
            continue
        setters = [layer for layer in layers if layer.sets(key)]
        if not setters:  # a selected method's option at its own default (validation filled it in)
            continue
        source = setters[-1].source
        overridden = [(layer.source, _get(layer.data, key)) for layer in reversed(setters[:-1])]
        overridden = [(s, v) for s, v in overridden if v != value]
        out.append(Setting(key, value, source, overridden))
    return out


def source_of(key: str, layers: list[Layer]) -> str:
    """The layer that set `key`, or `default` when none did."""
    setters = [layer.source for layer in layers if layer.sets(key)]
    return setters[-1] if setters else "default"


def implications(cfg: Config, layers: list[Layer]) -> list[str]:
    """What the chosen methods cost beyond one sampling round and one update per step, one line each, naming the
    keys and where they were set: extra sampling rounds (DAPO's dynamic sampling), per-prompt budgets, several
    optimizer updates per rollout batch, a frozen reference model, an extra forward pass for pi_old."""
    def src(*keys: str) -> str:
        named = [n for n in dict.fromkeys(source_of(k, layers) for k in keys) if n != "default"] or ["default"]
        return " <- " + ", ".join(named)

    out = []
    budget = lookup("budget_policy", cfg.budget.policy)
    options = budget.options_in(cfg.budget)
    rounds = getattr(options, "max_rounds", None)
    if budget.resamples and rounds:
        out.append(f"up to {rounds} extra sampling rounds per step (budget.policy={cfg.budget.policy}, dynamic "
                   f"sampling: groups whose rewards all agree are dropped and more prompts sampled, up to "
                   f"budget.{cfg.budget.policy}.max_rounds={rounds}); where most groups score all 0 or all 1, a step "
                   f"samples up to {rounds + 1}x as much" + src("budget.policy", f"budget.{cfg.budget.policy}"))
    if budget.per_prompt_budget:
        g = cfg.sampling.group_size
        limits = getattr(options, "limits", None)  # E3's curriculum: (G_min floor, G_max ceiling, step)
        spread = f"from {limits(g)[0]} to {limits(g)[1]}" if callable(limits) else "around"
        out.append(f"rollouts per prompt vary with difficulty (budget.policy={cfg.budget.policy}): {spread} "
                   f"per prompt instead of sampling.group_size={g}" + src("budget.policy"))
    a = cfg.algo
    updates = a.epochs * a.mini_batches
    if updates > 1:
        out.append(f"{updates} optimizer updates per rollout batch (algo.epochs={a.epochs} x "
                   f"algo.mini_batches={a.mini_batches}): the update costs about {updates}x one update, plus a "
                   f"forward pass for pi_old" + src("algo.epochs", "algo.mini_batches"))
    needs = requirements(a)
    weighs = lookup("importance_weights", a.importance_weights).needs_old_logprobs  # TIS reads pi_old
    if needs.ref:
        why = f"algo.kl_coef={a.kl_coef:g}" if a.kl_coef > 0 else "the chosen method reads reference log-probs"
        copy = "the base with adapters off (LoRA)" if cfg.model.lora.enabled else "a second copy of the weights"
        keys = ("algo.kl_coef",) if a.kl_coef > 0 else ("algo.advantage", "algo.loss", "algo.shapers")
        out.append(f"a frozen reference model ({why}): {copy}, and one more forward pass per step" + src(*keys))
    elif updates == 1 and needs.old_logprobs and not weighs:
        out.append(f"one more forward pass per step for pi_old's log-probs (algo.loss={a.loss}, "
                   f"algo.advantage={a.advantage} read them)" + src("algo.loss", "algo.advantage"))
    if weighs and updates == 1:
        out.append(f"importance weights (algo.importance_weights={a.importance_weights}): one more forward pass per "
                   f"step for pi_old" + src("algo.importance_weights"))
    return out


def format_explanation(explained: Explanation, *, title: str = "") -> list[str]:
    """The explanation as plain text lines: each non-default key `key = value  <- source` (with the values it
    overrode), then the costs."""
    lines = [title] if title else []
    width = max((len(s.key) for s in explained.settings), default=0)
    for s in explained.settings:
        value = _short(s.value)
        line = f"  {s.key.ljust(width)} = {value}  <- {s.source}"
        if s.overrides:
            line += " (over " + "; ".join(f"{src}: {_short(v)}" for src, v in s.overrides) + ")"
        lines.append(line)
    if not explained.settings:
        lines.append("  (every key at its default)")
    costs = explained.implications
    lines.append("what the chosen methods cost per step:" if costs else
                 "cost per step: one sampling round, one update, no reference model")
    lines += [f"  - {c}" for c in costs]
    return lines


def _short(value: Any, limit: int = 100) -> str:
    text = repr(value) if isinstance(value, str) and (value == "" or value.strip() != value) else str(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
