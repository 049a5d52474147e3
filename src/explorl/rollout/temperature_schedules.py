"""Temperature schedules, registered in `explorl.algos.registry` as `sampling.schedule` (fixed, E3, EAD, RevEAD,
the per-prompt adaptive schedule); the maths they call is `rollout.temperature` (torch only).

Each is a factory `(cfg: Config, vocab_size[, *, options]) -> schedule` with its options dataclass
(`sampling.<schedule>.<field>`). A schedule has `at(step) -> (sampler temperature, training temperature, stats)` for
the 0-based step (the sampler temperature may be a function of the token position: EAD), `per_prompt(step,
temperature, prompt_ids)` (how each prompt of a round is sampled, the one form every engine takes: a request
temperature and annealing arguments per prompt, `PromptTemperature`, which explorl's sampler turns into its per-token
table with `PromptTemperature.table`), `rollout_stats(rollouts)` (metrics of
the sampled batch), `observe_rewards(prompt_ids, rewards_per_prompt)`, `observe(step, entropy)` with the 1-based
step and the batch's mean token entropy at the training temperature, and `state_dict` / `load_state_dict` (plain
data, saved in each checkpoint, so a resumed run continues exactly). Its registry entry says whether the sampled
distribution is the optimised policy (`behavior_is_policy`) and, for a per-token temperature, the function an
engine evaluates per token (`per_token`).

Nothing calls these methods but `rollout.schedule.ScheduleDriver`, the one driver of every engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any, Sequence

import torch
from torch import Tensor

from explorl.algos.registry import Cite, lookup, register
from explorl.rollout import temperature as Tm
from explorl.rollout.temperature import EADOptions

if TYPE_CHECKING:
    from explorl.config.schema import Config

__all__ = ["AdaptiveOptions", "AdaptiveTemperature", "E3Temperature", "E3TemperatureOptions", "EADOptions",
           "EADTemperature", "FixedTemperature", "PromptTemperature", "RevEADTemperature", "anneal_fields",
           "anneal_options"]


def _options_class(schedule: str) -> type | None:
    """The options dataclass of a registered temperature schedule: its own, or that of the entry it reads them from
    (`options_from`: RevEAD reads EAD's); None for a schedule without options."""
    entry = lookup("temperature_schedule", schedule)
    return lookup("temperature_schedule", entry.options_owner).options


def anneal_fields(schedule: str) -> tuple[str, ...]:
    """The annealing arguments a per-token schedule takes besides `schedule` and `step`: its options' fields."""
    options = _options_class(schedule)
    return () if options is None else tuple(f.name for f in fields(options))


def anneal_options(anneal: Mapping[str, Any]) -> Any:
    """The options a request's annealing arguments (`PromptTemperature.anneal`) give its per-token schedule, the third
    argument of its registered `per_token(t, step, options)`: the schedule's options dataclass built from the
    arguments besides `schedule` and `step` (a field missing keeps its default; an unknown one is a TypeError); None
    for a schedule without options."""
    options = _options_class(anneal["schedule"])
    if options is None:
        return None
    return options(**{k: v for k, v in anneal.items() if k not in ("schedule", "step")})


@dataclass(frozen=True)
class PromptTemperature:
    """How one prompt's rollouts are sampled, in the terms an inference engine takes: a request temperature and,
    for an annealed schedule, its arguments (`anneal`: the schedule's name under `"schedule"`, the 0-based training
    step under `"step"` and the fields of its options, `anneal_options`, e.g. those of `rollout.temperature.ead` /
    `revead`'s `EADOptions`), whose per-token value multiplies `temperature` (docs/methods.md §6a)."""

    temperature: float
    anneal: dict | None = None

    def table(self, length: int) -> Tensor:
        """`[length]` float32 temperatures of generated tokens 0..length-1: `temperature` times the annealing
        schedule's per-token factor (its registry entry's `per_token` function at positions 0..length-1), or
        `temperature` throughout."""
        if self.anneal is None:
            return torch.full((length,), float(self.temperature), dtype=torch.float32)
        per_token = lookup("temperature_schedule", self.anneal["schedule"]).per_token
        return per_token(torch.arange(length), self.anneal["step"], anneal_options(self.anneal)) * self.temperature


class _Stateless:
    def observe(self, step: int, entropy: float) -> None:
        pass

    def rollout_stats(self, ro) -> dict[str, float]:
        """Metrics of what the schedule did to a sampled batch (`RolloutBatch`)."""
        return {}

    def per_prompt(self, step: int, temperature, prompt_ids: Sequence[int]) -> list[PromptTemperature]:
        """How each prompt is sampled, as every engine takes it (explorl's sampler, vLLM, verl, TRL): one
        `PromptTemperature` per prompt. `temperature` is `at(step)`'s sampler temperature."""
        if callable(temperature):
            raise TypeError(f"{type(self).__name__}: a per-token temperature needs the schedule's own per_prompt")
        return [PromptTemperature(float(temperature))] * len(prompt_ids)

    def observe_rewards(self, prompt_ids: Sequence[int], rewards_per_prompt: Sequence[Sequence[float]]) -> None:
        pass

    def state_dict(self) -> dict | None:
        return None

    def load_state_dict(self, state: dict) -> None:
        pass


@register("temperature_schedule", "fixed", reads=("sampling.temperature",), static=True,
          cites=(Cite("explorl", doc="1"),))
class FixedTemperature(_Stateless):
    """`sampling.temperature` for sampling and training."""

    def __init__(self, cfg: Config, vocab_size: int):
        self.temperature = cfg.sampling.temperature

    def at(self, step: int):
        return self.temperature, self.temperature, {}


@dataclass
class E3TemperatureOptions:
    """The E3 temperature scheduler's options, `sampling.e3.<field>` (E3 eqs. 4-5; docs/methods.md §2b)."""

    anneal: bool = False
    """Entropy-target annealing (eq. 5, the `AN` of TS+AN) from step floor(anneal_frac * run.steps)."""
    eta: float = 0.9
    """Annealing floor: the target ends at eta * H_init."""
    anneal_frac: float = 0.6
    """Annealing start as a fraction of run.steps."""
    tau_floor: float = 0.05
    """Lower clamp of the temperature (explorl's safety bound; the public code has none, docs/methods.md §2b)."""
    tau_ceil: float = 4.0
    """Upper clamp of the temperature."""


def _check_e3_temperature(cfg: Config) -> str | None:
    s, o = cfg.sampling, cfg.sampling.options["e3"]
    if 0 < o.tau_floor <= s.temperature <= o.tau_ceil:
        return None
    return (f"sampling.temperature={s.temperature} must lie in [sampling.e3.tau_floor={o.tau_floor}, "
            f"sampling.e3.tau_ceil={o.tau_ceil}]")


@register("temperature_schedule", "e3", check=_check_e3_temperature, options=E3TemperatureOptions,
          reads=("sampling.temperature", "run.steps"), formula=(Tm.e3_update, Tm.e3_target),
          cites=(Cite("E3", "eq. 4, eq. 5, section 4.2", doc="2b"),))
class E3Temperature(_Stateless):
    """The E3 controller (E3 eqs. 4-5): tau holds the entropy at its first-step value; the optimised
    policy uses the same tau."""

    def __init__(self, cfg: Config, vocab_size: int, *, options: E3TemperatureOptions):
        o = options
        self.controller = Tm.E3TemperatureController(
            cfg.sampling.temperature, vocab_size, t_max=cfg.run.steps, anneal=o.anneal, eta=o.eta,
            anneal_frac=o.anneal_frac, tau_floor=o.tau_floor, tau_ceil=o.tau_ceil)

    def at(self, step: int):
        tau = self.controller.tau
        return tau, tau, self.controller.stats()

    def observe(self, step: int, entropy: float) -> None:
        self.controller.observe(step, entropy)

    def state_dict(self) -> dict:
        return self.controller.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.controller.load_state_dict(state)


def _check_ead(cfg: Config) -> str | None:
    o = cfg.sampling.options["ead"]
    if not (o.tau_min > 0 and o.tau_max >= o.tau_min):
        return f"sampling.ead.tau_min / tau_max: need 0 < tau_min <= tau_max, got {o.tau_min}, {o.tau_max}"
    if not (o.d0 > 0 and o.scale > 0):
        return f"sampling.ead.d0 and sampling.ead.scale must be > 0, got {o.d0}, {o.scale}"
    return None


class _AnnealedTemperature(_Stateless):
    """A per-token temperature table for the sampler (behaviour policy only: the optimised policy stays at the
    base temperature, docs/methods.md §6a)."""

    table_fn = None

    def __init__(self, cfg: Config, vocab_size: int, *, options: EADOptions):
        self.s, self.o = cfg.sampling, options

    def table(self, step: int, tau_max: float | None = None) -> Tensor:
        """`[max_new_tokens]` temperatures of generated tokens at 0-based step `step` (x the base temperature)."""
        s, o = self.s, self.o
        options = o if tau_max is None else replace(o, tau_max=tau_max)
        return type(self).table_fn(step, s.max_new_tokens, options) * s.temperature

    def anneal_args(self, step: int, tau_max: float | None = None) -> dict:
        """`table`'s schedule as annealing arguments (`"schedule"`: `Tm.ead` or `Tm.revead`, `"step"`, and the
        fields of its `EADOptions`), for an engine that evaluates it per token (`explorl.integrations.vllm`)."""
        o = self.o
        return {"schedule": self.name, "step": int(step),
                "tau_max": o.tau_max if tau_max is None else float(tau_max), "tau_min": o.tau_min,
                "d0": o.d0, "alpha": o.alpha, "d_max": o.d_max, "c": o.c, "scale": o.scale}

    def per_prompt(self, step: int, temperature, prompt_ids: Sequence[int]) -> list[PromptTemperature]:
        return [PromptTemperature(self.s.temperature, self.anneal_args(step))] * len(prompt_ids)

    def at(self, step: int):
        s, o = self.s, self.o
        values = self.table(step).tolist()
        d_s = min(o.d0 + o.alpha * step, o.d_max)
        return (lambda t: values[t]), s.temperature, {"temperature/ead_d": d_s, "temperature/ead_min": min(values)}

    def rollout_stats(self, ro) -> dict[str, float]:
        """`temperature/at_min_frac`: the share of generated tokens sampled at the floor tau_min (x the base
        temperature); with d0 = 25 and scale 1 most tokens past ~0.74 d_s are (docs/methods.md §6)."""
        floor = self.o.tau_min * self.s.temperature
        valid = ro.mask > 0
        at_floor = (ro.temperatures <= floor * (1 + 1e-6)) & valid
        return {"temperature/at_min_frac": float(at_floor.sum()) / max(int(valid.sum()), 1)}


@register("temperature_schedule", "ead", behavior_is_policy=False, options=EADOptions, check=_check_ead,
          reads=("sampling.temperature", "sampling.max_new_tokens"), per_token=Tm.ead,
          cites=(Cite("EAD", "section 4", doc="6a"),))
class EADTemperature(_AnnealedTemperature):
    """EAD: annealed per-token temperature, hot early in the response."""

    name = "ead"

    table_fn = staticmethod(Tm.ead_schedule)


@register("temperature_schedule", "revead", behavior_is_policy=False, options_from="ead", check=_check_ead,
          reads=("sampling.temperature", "sampling.max_new_tokens"), per_token=Tm.revead,
          cites=(Cite("EAD", "section 5.5", doc="6b"),))
class RevEADTemperature(_AnnealedTemperature):
    """RevEAD (EAD's ablation): the reversed schedule."""

    name = "revead"

    table_fn = staticmethod(Tm.revead_schedule)


@dataclass
class AdaptiveOptions:
    """The per-prompt temperature schedule's options, `sampling.adaptive.<field>` (explorl's; docs/methods.md §2c).
    The base schedule's own options stay under its name (`sampling.ead.tau_max`, ...)."""

    base: str = "fixed"
    """The schedule whose temperature is scaled per prompt (`fixed`, `e3`, `ead`, `revead`; with EAD the factor
    scales each prompt's tau_max)."""
    gamma: float = 0.5
    """Slope of the per-prompt multiplier 1 + gamma * (target - success rate) (explorl's choice; no paper gives a
    formula): 1.25 for a never-solved prompt, 0.75 for an always-solved one."""
    target: float = 0.5
    """The running success rate that keeps the base temperature."""


def _check_adaptive(cfg: Config) -> str | None:
    o = cfg.sampling.options["adaptive"]
    if o.base == "adaptive":
        return "sampling.adaptive.base: the base schedule cannot itself be adaptive"
    base = lookup("temperature_schedule", o.base)  # registered: the config validation resolved it (`selects`)
    if not 0 <= o.target <= 1:
        return f"sampling.adaptive.target: a success rate in [0, 1], got {o.target}"
    bound = 1.0 / max(o.target, 1.0 - o.target)
    if not 0 <= o.gamma < bound:
        return (f"sampling.adaptive.gamma: must be in [0, {bound:g}) so every prompt's multiplier stays > 0, "
                f"got {o.gamma}")
    return base.check(cfg) if base.check is not None else None


@register("temperature_schedule", "adaptive", behavior_is_policy=False, check=_check_adaptive,
          options=AdaptiveOptions, selects=lambda o: {"base": o.base}, reads=("sampling.max_new_tokens",),
          per_prompt_temperature=True, formula=Tm.adaptive_factor, cites=(Cite("explorl", doc="2c"),))
class AdaptiveTemperature(_Stateless):
    """Per-prompt temperature by difficulty (explorl's; E3 and EAD name it as future work; docs/methods.md
    §2c): the base schedule's temperature times `adaptive_factor` of the prompt's running success rate (hard
    prompts hotter, easy ones cooler). With an EAD base the factor scales each prompt's tau_max instead. The
    optimised policy stays at the base schedule's training temperature: the per-prompt temperatures belong to the
    behaviour policy (truncated importance sampling applies, `algo.importance_weights=tis`)."""

    def __init__(self, cfg: Config, vocab_size: int, *, options: AdaptiveOptions):
        self.s, self.o = cfg.sampling, options
        self.base = lookup("temperature_schedule", options.base).bind(cfg.sampling)(cfg, vocab_size)
        self.success: dict[int, list[float]] = {}  # prompt id -> [reward sum, rollouts]
        self.factors = torch.ones(0)

    def at(self, step: int):
        return self.base.at(step)

    def per_prompt(self, step: int, temperature, prompt_ids: Sequence[int]) -> list[PromptTemperature]:
        rates = [self.success[p][0] / self.success[p][1] if p in self.success else None for p in prompt_ids]
        self.factors = Tm.adaptive_factor(rates, gamma=self.o.gamma, target=self.o.target)
        if isinstance(self.base, _AnnealedTemperature):  # per-prompt tau_max
            return [PromptTemperature(self.s.temperature, self.base.anneal_args(step, self.base.o.tau_max * f))
                    for f in self.factors.tolist()]
        if callable(temperature):  # a user's per-token base: its own requests, each prompt's temperature scaled
            return [PromptTemperature(r.temperature * f, r.anneal)
                    for r, f in zip(self.base.per_prompt(step, temperature, prompt_ids), self.factors.tolist())]
        return [PromptTemperature(t) for t in (self.factors * float(temperature)).tolist()]

    def observe_rewards(self, prompt_ids: Sequence[int], rewards_per_prompt: Sequence[Sequence[float]]) -> None:
        for pid, rewards in zip(prompt_ids, rewards_per_prompt):
            total = self.success.setdefault(int(pid), [0.0, 0])
            total[0] += float(sum(rewards))
            total[1] += len(rewards)

    def observe(self, step: int, entropy: float) -> None:
        self.base.observe(step, entropy)

    def rollout_stats(self, ro) -> dict[str, float]:
        out = dict(self.base.rollout_stats(ro))
        if len(self.factors):
            out.update({"temperature/adaptive_factor_min": float(self.factors.min()),
                        "temperature/adaptive_factor_max": float(self.factors.max())})
        return out

    def state_dict(self) -> dict:
        return {"base": self.base.state_dict(), "success": {str(k): v for k, v in self.success.items()}}

    def load_state_dict(self, state: dict) -> None:
        if state.get("base") is not None:
            self.base.load_state_dict(state["base"])
        self.success = {int(k): [float(v[0]), int(v[1])] for k, v in state["success"].items()}
