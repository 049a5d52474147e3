"""What steers sampling from step to step: the prompt order, the temperature schedule and the budget policy.

Temperature schedules (`sampling.schedule`) and budget policies (`budget.policy`) register in
`explorl.algos.registry` as factories `(cfg: Config, ...[, *, options]) -> object`, each with its options dataclass
(`sampling.<schedule>.<field>`, `budget.<policy>.<field>`); `Controllers` asks the registry for the configured
ones, so the loop never names one. Every object here keeps plain state with `state_dict`, saved in each
checkpoint, so a resumed run continues exactly.

A temperature schedule has `at(step) -> (sampler temperature, training temperature, stats)` for the 0-based step
(the sampler temperature may be a function of the token position: EAD), `rollout_stats(rollouts)` (metrics of the
sampled batch), `observe(step, entropy)` with the 1-based step and the batch's mean token entropy at the training
temperature, `per_prompt(step, temperature, prompt_ids)` (the same sampling described for an inference engine:
a request temperature and annealing arguments per prompt), `state_dict` / `load_state_dict`. Its registry
entry says whether the sampled distribution is the optimised policy (`behavior_is_policy`).

A budget policy has `budgets(prompt_ids) -> rollouts per prompt`, `observe_rewards`, `end_of_pass`,
`extra_rounds` (generation rounds allowed beyond the first to fill the batch), `keep(per_prompt, room)` (which
groups of a round enter the batch), `stats(rounds, kept_frac)`, and state.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import torch
from torch import Tensor

from explorl.algos.registry import Cite, lookup, register
from explorl.rollout import temperature as Tm
from explorl.rollout.budget import BudgetCurriculum, DifficultyTracker, allocate

if TYPE_CHECKING:
    from explorl.config.schema import Config


class PromptStream:
    """Shuffled passes over the training prompts; its state is two integers, so resume is exact."""

    def __init__(self, size: int, seed: int):
        self.size, self.seed = size, seed
        self.epoch, self.pos = 0, 0
        self._order = self._permutation()

    def _permutation(self) -> list[int]:
        order = list(range(self.size))
        random.Random(self.seed * 1_000_003 + self.epoch).shuffle(order)
        return order

    def next(self, k: int) -> list[int]:
        out = []
        while len(out) < k:
            if self.pos == self.size:
                self.epoch, self.pos = self.epoch + 1, 0
                self._order = self._permutation()
            take = min(k - len(out), self.size - self.pos)
            out.extend(self._order[self.pos:self.pos + take])
            self.pos += take
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.pos = state["epoch"], state["pos"]
        self._order = self._permutation()


# ----------------------------------------------------------------------------------------------------------------
# temperature schedules


@dataclass(frozen=True)
class PromptTemperature:
    """How one prompt's rollouts are sampled, in the terms an inference engine takes: a request temperature and,
    for an annealed schedule, the keyword arguments of `rollout.temperature.ead` / `revead` (`anneal`, with the
    schedule's name under `"schedule"`), whose per-token value multiplies `temperature` (docs/methods.md §6a)."""

    temperature: float
    anneal: dict | None = None


class _Stateless:
    def observe(self, step: int, entropy: float) -> None:
        pass

    def rollout_stats(self, ro) -> dict[str, float]:
        """Metrics of what the schedule did to a sampled batch (`Rollouts`)."""
        return {}

    def for_prompts(self, temperature, prompt_ids: Sequence[int], budgets: Sequence[int]):
        """The sampler's temperature for these prompts (with `budgets[j]` rollouts each): `at`'s, unless the
        schedule sets it per prompt."""
        return temperature

    def per_prompt(self, step: int, temperature, prompt_ids: Sequence[int]) -> list[PromptTemperature]:
        """The same sampling as `for_prompts`, described for an inference engine (verl + vLLM): one
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
          reads=("sampling.temperature", "run.steps"), cites=(Cite("E3", "eq. 4, eq. 5, section 4.2", doc="2b"),))
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


@dataclass
class EADOptions:
    """EAD's options, `sampling.ead.<field>`, shared by `ead` and `revead` (EAD; docs/methods.md §6)."""

    tau_max: float = 1.2
    """Starting temperature tau_max."""
    tau_min: float = 0.1
    """Floor tau_min."""
    d0: float = 25.0
    """Initial decay constant d_0."""
    alpha: float = 5.0
    """Growth of the decay constant per training step (d_s = min(d0 + alpha * s, d_max))."""
    d_max: float = 40000.0
    """Cap of the decay constant."""
    c: int = 10
    """The first c generated tokens are sampled at temperature 1."""
    scale: float = 1.0
    """Divisor scale of the exponent (1 = the paper's formula; the public code uses 20)."""


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
        return type(self).table_fn(step, s.max_new_tokens, tau_max=o.tau_max if tau_max is None else tau_max,
                                   tau_min=o.tau_min, d0=o.d0, alpha=o.alpha, d_max=o.d_max, c=o.c,
                                   scale=o.scale) * s.temperature

    def anneal_args(self, step: int, tau_max: float | None = None) -> dict:
        """`table`'s schedule as keyword arguments of `Tm.ead` / `Tm.revead` (`"schedule"`: which), for an
        engine that evaluates it per token (`explorl.integrations.vllm`)."""
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
    check = base.extra.get("check")
    return check(cfg) if check is not None else None


@register("temperature_schedule", "adaptive", behavior_is_policy=False, check=_check_adaptive,
          options=AdaptiveOptions, selects=lambda o: {"base": o.base}, reads=("sampling.max_new_tokens",),
          per_prompt_temperature=True, cites=(Cite("explorl", doc="2c"),))
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
        self.step, self.factors = 0, torch.ones(0)

    def at(self, step: int):
        self.step = step
        return self.base.at(step)

    def for_prompts(self, temperature, prompt_ids: Sequence[int], budgets: Sequence[int]):
        rates = [self.success[p][0] / self.success[p][1] if p in self.success else None for p in prompt_ids]
        self.factors = Tm.adaptive_factor(rates, gamma=self.o.gamma, target=self.o.target)
        per_response = torch.repeat_interleave(self.factors, torch.as_tensor(list(budgets)))
        if isinstance(self.base, _AnnealedTemperature):  # per-prompt tau_max, one table per distinct factor
            tau_max = self.base.o.tau_max
            tables = {f: self.base.table(self.step, tau_max=tau_max * f) for f in set(per_response.tolist())}
            return torch.stack([tables[f] for f in per_response.tolist()])
        if callable(temperature):
            table = torch.tensor([temperature(t) for t in range(self.s.max_new_tokens)], dtype=torch.float32)
            return per_response[:, None] * table[None, :]
        return (self.factors * float(temperature)).tolist()  # one temperature per prompt

    def per_prompt(self, step: int, temperature, prompt_ids: Sequence[int]) -> list[PromptTemperature]:
        self.for_prompts(temperature, prompt_ids, [1] * len(prompt_ids))  # sets self.factors, one per prompt
        if isinstance(self.base, _AnnealedTemperature):
            return [PromptTemperature(self.s.temperature, self.base.anneal_args(step, self.base.o.tau_max * f))
                    for f in self.factors.tolist()]
        return [PromptTemperature(t) for t in (self.factors * float(temperature)).tolist()]  # as for_prompts

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


# ----------------------------------------------------------------------------------------------------------------
# budget policies


@register("budget_policy", "uniform", reads=("sampling.group_size",), static=True,
          cites=(Cite("explorl", doc="9"),))
class UniformBudget:
    """`sampling.group_size` rollouts for every prompt; every sampled group trains."""

    extra_rounds = 0

    def __init__(self, cfg: Config, num_prompts: int):
        self.group_size = cfg.sampling.group_size

    def budgets(self, prompt_ids: Sequence[int]) -> list[int]:
        return [self.group_size] * len(prompt_ids)

    def observe_rewards(self, prompt_ids: Sequence[int], rewards_per_prompt: Sequence[Sequence[float]]) -> None:
        pass

    def end_of_pass(self) -> None:
        pass

    def keep(self, rewards_per_prompt: Sequence[Sequence[float]], room: int) -> list[int]:
        """Indices of the round's groups that enter the batch (`room`: prompts still missing)."""
        return [j for j, r in enumerate(rewards_per_prompt) if r]

    def stats(self, rounds: int, kept_frac: float) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


@dataclass
class E3BudgetOptions:
    """E3's dynamic budget options, `budget.e3.<field>` (E3 Algorithm 1; docs/methods.md §2a)."""

    g_min_limit: int | None = None
    """G_min never goes below this. null: sampling.group_size / 2 (rounded down, at least 1), the paper's ratio
    (4 with G = 8), so the policy keeps its paper setting at any group size."""
    g_max_limit: int | None = None
    """G_max never goes above this. null: 3 * sampling.group_size / 2 (rounded down), the paper's 12 with G = 8."""
    g_step: int | None = None
    """G_min decreases and G_max increases by this after each pass over the data. null: sampling.group_size / 4
    (rounded down, at least 1), the paper's 2 with G = 8."""

    def limits(self, group_size: int) -> tuple[int, int, int]:
        """(g_min_limit, g_max_limit, g_step) with the nulls resolved for `group_size`."""
        return (max(group_size // 2, 1) if self.g_min_limit is None else self.g_min_limit,
                3 * group_size // 2 if self.g_max_limit is None else self.g_max_limit,
                max(group_size // 4, 1) if self.g_step is None else self.g_step)
    curriculum: bool = True
    """The curriculum on (E3 section 4.1: the bounds start at G and widen after each pass). false: the
    bounds are g_min_limit / g_max_limit from the first step (Algorithm 1 without the curriculum; as ranks exist
    only after the first pass, that pass still gives every prompt G). docs/methods.md §2a."""
    g_min_start: int | None = None
    """G_min during the first pass; null = sampling.group_size (the paper's). Must lie in [g_min_limit,
    group_size]; only with `curriculum: true`."""
    g_max_start: int | None = None
    """G_max during the first pass; null = sampling.group_size (the paper's). Must lie in [group_size,
    g_max_limit]; only with `curriculum: true`."""


def _check_e3_budget(cfg: Config) -> str | None:
    s, b = cfg.sampling, cfg.budget.options["e3"]
    g_min_limit, g_max_limit, g_step = b.limits(s.group_size)
    if not 1 <= g_min_limit <= s.group_size <= g_max_limit:
        return (f"budget.e3: need 1 <= g_min_limit <= sampling.group_size <= g_max_limit, got {g_min_limit}, "
                f"{s.group_size}, {g_max_limit}")
    for name, value in (("g_min_start", b.g_min_start), ("g_max_start", b.g_max_start)):
        if value is not None and not b.curriculum:
            return (f"budget.e3.{name}: a starting bound needs the curriculum; with budget.e3.curriculum=false the "
                    f"bounds are g_min_limit/g_max_limit throughout. Set budget.e3.{name}=null or "
                    f"budget.e3.curriculum=true")
    if b.g_min_start is not None and not g_min_limit <= b.g_min_start <= s.group_size:
        return (f"budget.e3.g_min_start: must lie in [budget.e3.g_min_limit={g_min_limit}, sampling.group_size="
                f"{s.group_size}], got {b.g_min_start}")
    if b.g_max_start is not None and not s.group_size <= b.g_max_start <= g_max_limit:
        return (f"budget.e3.g_max_start: must lie in [sampling.group_size={s.group_size}, budget.e3.g_max_limit="
                f"{g_max_limit}], got {b.g_max_start}")
    return None if g_step >= 1 else "budget.e3.g_step: must be >= 1"


@register("budget_policy", "e3", check=_check_e3_budget, options=E3BudgetOptions, reads=("sampling.group_size",),
          per_prompt_budget=True, cites=(Cite("E3", "Algorithm 1, section 4.1, section 5.2", doc="2a"),))
class E3Budget(UniformBudget):
    """E3 dynamic budgets (E3 Algorithm 1): more rollouts for harder prompts, within a G_min/G_max
    curriculum that widens after each pass over the data (`budget.e3.curriculum: false`: fixed at the limits)."""

    def __init__(self, cfg: Config, num_prompts: int, *, options: E3BudgetOptions):
        super().__init__(cfg, num_prompts)
        b = options
        g_min_limit, g_max_limit, g_step = b.limits(self.group_size)
        self.difficulty = DifficultyTracker(num_prompts)
        if b.curriculum:
            self.curriculum = BudgetCurriculum(self.group_size, g_min_limit, g_max_limit, g_step,
                                               b.g_min_start, b.g_max_start)
        else:  # no curriculum: the limits from the first step, never moved
            self.curriculum = BudgetCurriculum(self.group_size, g_min_limit, g_max_limit, 0, g_min_limit, g_max_limit)

    def budgets(self, prompt_ids: Sequence[int]) -> list[int]:
        g_min, g_max = self.curriculum.bounds()
        return allocate(self.difficulty.k(prompt_ids), self.group_size, g_min, g_max)

    def observe_rewards(self, prompt_ids: Sequence[int], rewards_per_prompt: Sequence[Sequence[float]]) -> None:
        self.difficulty.update(prompt_ids, rewards_per_prompt)

    def end_of_pass(self) -> None:
        self.difficulty.end_of_pass()
        self.curriculum.end_of_pass()

    def state_dict(self) -> dict:
        return {"difficulty": self.difficulty.state_dict(), "curriculum": self.curriculum.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.difficulty.load_state_dict(state["difficulty"])
        self.curriculum.load_state_dict(state["curriculum"])


@dataclass
class DAPOBudgetOptions:
    """DAPO dynamic sampling's options, `budget.dapo.<field>` (docs/methods.md §5)."""

    max_rounds: int = 3
    """Extra generation rounds allowed per step to fill the batch."""


def _check_dapo(cfg: Config) -> str | None:
    if cfg.budget.options["dapo"].max_rounds < 0:
        return "budget.dapo.max_rounds: must be >= 0"
    if cfg.sampling.group_size < 2:
        return "budget.policy=dapo: groups of one response always have zero reward spread"
    return None


@register("budget_policy", "dapo", options=DAPOBudgetOptions, reads=("sampling.group_size",), check=_check_dapo,
          resamples=True, drops_uniform_groups=True, cites=(Cite("DAPO", "section 3.2", doc="5c"),))
class DAPOBudget(UniformBudget):
    """DAPO dynamic sampling: groups whose rewards all agree (zero GRPO advantage) are dropped, and more prompts
    are sampled until the batch is full or `budget.dapo.max_rounds` extra rounds are spent."""

    def __init__(self, cfg: Config, num_prompts: int, *, options: DAPOBudgetOptions):
        super().__init__(cfg, num_prompts)
        self.extra_rounds = options.max_rounds

    def keep(self, rewards_per_prompt: Sequence[Sequence[float]], room: int) -> list[int]:
        return [j for j, r in enumerate(rewards_per_prompt) if r and max(r) > min(r)][:room]

    def stats(self, rounds: int, kept_frac: float) -> dict[str, float]:
        return {"rollouts/dapo_rounds": rounds, "rollouts/dapo_kept_frac": kept_frac}


# ----------------------------------------------------------------------------------------------------------------


class Controllers:
    """The configured temperature schedule and budget policy, looked up in the registry; one state dict."""

    def __init__(self, cfg: Config, vocab_size: int, num_prompts: int):
        entry = lookup("temperature_schedule", cfg.sampling.schedule)
        self.behavior_is_policy = entry.behavior_is_policy
        self.schedule = entry.bind(cfg.sampling)(cfg, vocab_size)
        self.budget = lookup("budget_policy", cfg.budget.policy).bind(cfg.budget)(cfg, num_prompts)

    def state_dict(self) -> dict:
        # the layout of earlier versions' checkpoints: {"temperature": ..., "difficulty": ..., "curriculum": ...}
        state = dict(self.budget.state_dict())
        schedule = self.schedule.state_dict()
        if schedule is not None:
            state["temperature"] = schedule
        return state

    def load_state_dict(self, state: dict) -> None:
        state = dict(state)
        if "temperature" in state:
            self.schedule.load_state_dict(state.pop("temperature"))
        if state:
            self.budget.load_state_dict(state)
