"""What steers sampling from step to step: the prompt order, the temperature schedule and the budget policy.

Temperature schedules (`sampling.schedule`) and budget policies (`budget.policy`) register in
`explorl.algos.registry` as factories `(cfg: Config, ...) -> object`; `Controllers` asks the registry for the
configured ones, so the loop never names one. Every object here keeps plain state with `state_dict`, saved in each
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

from explorl.algos.registry import lookup, register
from explorl.rollout import temperature as Tm
from explorl.rollout.budget import BudgetCurriculum, DifficultyTracker, allocate

if TYPE_CHECKING:
    from explorl.config import Config


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


@register("temperature_schedule", "fixed", reads=("sampling.temperature",))
class FixedTemperature(_Stateless):
    """`sampling.temperature` for sampling and training."""

    def __init__(self, cfg: Config, vocab_size: int):
        self.temperature = cfg.sampling.temperature

    def at(self, step: int):
        return self.temperature, self.temperature, {}


def _check_e3_temperature(cfg: Config) -> str | None:
    s = cfg.sampling
    if 0 < s.tau_floor <= s.temperature <= s.tau_ceil:
        return None
    return f"sampling.temperature={s.temperature} must lie in [tau_floor={s.tau_floor}, tau_ceil={s.tau_ceil}]"


@register("temperature_schedule", "e3", check=_check_e3_temperature,
          reads=("sampling.temperature", "sampling.e3_anneal", "sampling.e3_eta", "sampling.e3_anneal_frac",
                 "sampling.tau_floor", "sampling.tau_ceil", "run.steps"))
class E3Temperature(_Stateless):
    """The E3 controller (paper 000 eqs. 4-5): tau holds the entropy at its first-step value; the optimised
    policy uses the same tau."""

    def __init__(self, cfg: Config, vocab_size: int):
        s = cfg.sampling
        self.controller = Tm.E3TemperatureController(
            s.temperature, vocab_size, t_max=cfg.run.steps, anneal=s.e3_anneal, eta=s.e3_eta,
            anneal_frac=s.e3_anneal_frac, tau_floor=s.tau_floor, tau_ceil=s.tau_ceil)

    def at(self, step: int):
        tau = self.controller.tau
        return tau, tau, self.controller.stats()

    def observe(self, step: int, entropy: float) -> None:
        self.controller.observe(step, entropy)

    def state_dict(self) -> dict:
        return self.controller.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.controller.load_state_dict(state)


_EAD_READS = ("sampling.temperature", "sampling.max_new_tokens", "sampling.ead_tau_max", "sampling.ead_tau_min",
              "sampling.ead_d0", "sampling.ead_alpha", "sampling.ead_d_max", "sampling.ead_c", "sampling.ead_scale")


def _check_ead(cfg: Config) -> str | None:
    s = cfg.sampling
    if not (s.ead_tau_min > 0 and s.ead_tau_max >= s.ead_tau_min):
        return "sampling.ead_tau_min / ead_tau_max: need 0 < tau_min <= tau_max"
    if not (s.ead_d0 > 0 and s.ead_scale > 0):
        return "sampling.ead_d0 and sampling.ead_scale must be > 0"
    return None


class _AnnealedTemperature(_Stateless):
    """A per-token temperature table for the sampler (behaviour policy only: the optimised policy stays at the
    base temperature, docs/methods.md §6a)."""

    table_fn = None

    def __init__(self, cfg: Config, vocab_size: int):
        self.s = cfg.sampling

    def table(self, step: int, tau_max: float | None = None) -> Tensor:
        """`[max_new_tokens]` temperatures of generated tokens at 0-based step `step` (x the base temperature)."""
        s = self.s
        return type(self).table_fn(step, s.max_new_tokens, tau_max=s.ead_tau_max if tau_max is None else tau_max,
                                   tau_min=s.ead_tau_min, d0=s.ead_d0, alpha=s.ead_alpha, d_max=s.ead_d_max,
                                   c=s.ead_c, scale=s.ead_scale) * s.temperature

    def anneal_args(self, step: int, tau_max: float | None = None) -> dict:
        """`table`'s schedule as keyword arguments of `Tm.ead` / `Tm.revead` (`"schedule"`: which), for an
        engine that evaluates it per token (`explorl.integrations.vllm`)."""
        s = self.s
        return {"schedule": type(self).table_fn.__name__.removesuffix("_schedule"), "step": int(step),
                "tau_max": s.ead_tau_max if tau_max is None else float(tau_max), "tau_min": s.ead_tau_min,
                "d0": s.ead_d0, "alpha": s.ead_alpha, "d_max": s.ead_d_max, "c": s.ead_c, "scale": s.ead_scale}

    def per_prompt(self, step: int, temperature, prompt_ids: Sequence[int]) -> list[PromptTemperature]:
        return [PromptTemperature(self.s.temperature, self.anneal_args(step))] * len(prompt_ids)

    def at(self, step: int):
        s = self.s
        values = self.table(step).tolist()
        d_s = min(s.ead_d0 + s.ead_alpha * step, s.ead_d_max)
        return (lambda t: values[t]), s.temperature, {"temperature/ead_d": d_s, "temperature/ead_min": min(values)}

    def rollout_stats(self, ro) -> dict[str, float]:
        """`temperature/at_min_frac`: the share of generated tokens sampled at the floor tau_min (x the base
        temperature); with d0 = 25 and scale 1 most tokens past ~0.74 d_s are (docs/methods.md §6)."""
        floor = self.s.ead_tau_min * self.s.temperature
        valid = ro.mask > 0
        at_floor = (ro.temperatures <= floor * (1 + 1e-6)) & valid
        return {"temperature/at_min_frac": float(at_floor.sum()) / max(int(valid.sum()), 1)}


@register("temperature_schedule", "ead", behavior_is_policy=False, reads=_EAD_READS, check=_check_ead)
class EADTemperature(_AnnealedTemperature):
    """EAD (paper 003): annealed per-token temperature, hot early in the response."""

    table_fn = staticmethod(Tm.ead_schedule)


@register("temperature_schedule", "revead", behavior_is_policy=False, reads=_EAD_READS, check=_check_ead)
class RevEADTemperature(_AnnealedTemperature):
    """RevEAD (paper 003's ablation): the reversed schedule."""

    table_fn = staticmethod(Tm.revead_schedule)


def _check_adaptive(cfg: Config) -> str | None:
    s = cfg.sampling
    if s.adaptive_base == "adaptive":
        return "sampling.adaptive_base: the base schedule cannot itself be adaptive"
    try:
        base = lookup("temperature_schedule", s.adaptive_base)
    except KeyError as e:
        return f"sampling.adaptive_base: {e.args[0]}"
    if not 0 <= s.adaptive_target <= 1:
        return f"sampling.adaptive_target: a success rate in [0, 1], got {s.adaptive_target}"
    bound = 1.0 / max(s.adaptive_target, 1.0 - s.adaptive_target)
    if not 0 <= s.adaptive_gamma < bound:
        return (f"sampling.adaptive_gamma: must be in [0, {bound:g}) so every prompt's multiplier stays > 0, "
                f"got {s.adaptive_gamma}")
    check = base.extra.get("check")
    return check(cfg) if check is not None else None


@register("temperature_schedule", "adaptive", behavior_is_policy=False, check=_check_adaptive,
          reads=("sampling.adaptive_base", "sampling.adaptive_gamma", "sampling.adaptive_target",
                 "sampling.max_new_tokens"))
class AdaptiveTemperature(_Stateless):
    """Per-prompt temperature by difficulty (explorl's; papers 000 and 003 name it as future work; docs/methods.md
    §2c): the base schedule's temperature times `adaptive_factor` of the prompt's running success rate (hard
    prompts hotter, easy ones cooler). With an EAD base the factor scales each prompt's tau_max instead. The
    optimised policy stays at the base schedule's training temperature: the per-prompt temperatures belong to the
    behaviour policy (truncated importance sampling applies, `algo.tis`)."""

    def __init__(self, cfg: Config, vocab_size: int):
        s = cfg.sampling
        self.s = s
        self.base = lookup("temperature_schedule", s.adaptive_base).fn(cfg, vocab_size)
        self.success: dict[int, list[float]] = {}  # prompt id -> [reward sum, rollouts]
        self.step, self.factors = 0, torch.ones(0)

    def at(self, step: int):
        self.step = step
        return self.base.at(step)

    def for_prompts(self, temperature, prompt_ids: Sequence[int], budgets: Sequence[int]):
        rates = [self.success[p][0] / self.success[p][1] if p in self.success else None for p in prompt_ids]
        self.factors = Tm.adaptive_factor(rates, gamma=self.s.adaptive_gamma, target=self.s.adaptive_target)
        per_response = torch.repeat_interleave(self.factors, torch.as_tensor(list(budgets)))
        if isinstance(self.base, _AnnealedTemperature):  # per-prompt tau_max, one table per distinct factor
            tables = {f: self.base.table(self.step, tau_max=self.s.ead_tau_max * f) for f in set(per_response.tolist())}
            return torch.stack([tables[f] for f in per_response.tolist()])
        if callable(temperature):
            table = torch.tensor([temperature(t) for t in range(self.s.max_new_tokens)], dtype=torch.float32)
            return per_response[:, None] * table[None, :]
        return (self.factors * float(temperature)).tolist()  # one temperature per prompt

    def per_prompt(self, step: int, temperature, prompt_ids: Sequence[int]) -> list[PromptTemperature]:
        self.for_prompts(temperature, prompt_ids, [1] * len(prompt_ids))  # sets self.factors, one per prompt
        if isinstance(self.base, _AnnealedTemperature):
            return [PromptTemperature(self.s.temperature, self.base.anneal_args(step, self.s.ead_tau_max * f))
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


@register("budget_policy", "uniform", reads=("sampling.group_size",))
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


def _check_e3_budget(cfg: Config) -> str | None:
    s, b = cfg.sampling, cfg.budget
    if not 1 <= b.g_min_limit <= s.group_size <= b.g_max_limit:
        return (f"budget: need g_min_limit <= sampling.group_size <= g_max_limit, got {b.g_min_limit}, "
                f"{s.group_size}, {b.g_max_limit}")
    for name, value in (("g_min_start", b.g_min_start), ("g_max_start", b.g_max_start)):
        if value is not None and not b.curriculum:
            return (f"budget.{name}: a starting bound needs the curriculum; with budget.curriculum=false the bounds "
                    f"are g_min_limit/g_max_limit throughout. Set budget.{name}=null or budget.curriculum=true")
    if b.g_min_start is not None and not b.g_min_limit <= b.g_min_start <= s.group_size:
        return (f"budget.g_min_start: must lie in [budget.g_min_limit={b.g_min_limit}, sampling.group_size="
                f"{s.group_size}], got {b.g_min_start}")
    if b.g_max_start is not None and not s.group_size <= b.g_max_start <= b.g_max_limit:
        return (f"budget.g_max_start: must lie in [sampling.group_size={s.group_size}, budget.g_max_limit="
                f"{b.g_max_limit}], got {b.g_max_start}")
    return None if b.g_step >= 1 else "budget.g_step: must be >= 1"


@register("budget_policy", "e3", check=_check_e3_budget,
          reads=("sampling.group_size", "budget.g_min_limit", "budget.g_max_limit", "budget.g_step",
                 "budget.curriculum", "budget.g_min_start", "budget.g_max_start"))
class E3Budget(UniformBudget):
    """E3 dynamic budgets (paper 000 Algorithm 1): more rollouts for harder prompts, within a G_min/G_max
    curriculum that widens after each pass over the data (`budget.curriculum: false`: fixed at the limits)."""

    def __init__(self, cfg: Config, num_prompts: int):
        super().__init__(cfg, num_prompts)
        b = cfg.budget
        self.difficulty = DifficultyTracker(num_prompts)
        if b.curriculum:
            self.curriculum = BudgetCurriculum(self.group_size, b.g_min_limit, b.g_max_limit, b.g_step,
                                               b.g_min_start, b.g_max_start)
        else:  # no curriculum: the limits from the first step, never moved
            self.curriculum = BudgetCurriculum(self.group_size, b.g_min_limit, b.g_max_limit, 0,
                                               b.g_min_limit, b.g_max_limit)

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


def _check_dapo(cfg: Config) -> str | None:
    if cfg.budget.dapo_max_rounds < 0:
        return "budget.dapo_max_rounds: must be >= 0"
    if cfg.sampling.group_size < 2:
        return "budget.policy=dapo: groups of one response always have zero reward spread"
    return None


@register("budget_policy", "dapo", reads=("sampling.group_size", "budget.dapo_max_rounds"), check=_check_dapo)
class DAPOBudget(UniformBudget):
    """DAPO dynamic sampling: groups whose rewards all agree (zero GRPO advantage) are dropped, and more prompts
    are sampled until the batch is full or `budget.dapo_max_rounds` extra rounds are spent."""

    def __init__(self, cfg: Config, num_prompts: int):
        super().__init__(cfg, num_prompts)
        self.extra_rounds = cfg.budget.dapo_max_rounds

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
        self.schedule = entry.fn(cfg, vocab_size)
        self.budget = lookup("budget_policy", cfg.budget.policy).fn(cfg, num_prompts)

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
