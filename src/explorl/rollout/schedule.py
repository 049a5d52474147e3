"""The schedule driver: the one object through which every engine steers sampling from step to step.

explorl's own loop (`rollout.collect`, `train.loop`), TRL's adapter (`integrations.trl`), verl's
(`integrations.verl.rollout`) and the vLLM engine (`rollout.engines.vllm`, given the plan's requests) drive the
configured temperature schedule (`sampling.schedule`, `rollout.temperature_schedules`) and budget policy
(`budget.policy`, `rollout.budget_policies`), looked up in the registry so that no loop names one, through
`ScheduleDriver`, in this order:

    temps = driver.begin(step)              # 0-based step: the schedule's sampler and training temperatures
    plan = driver.plan(prompt_ids)          # each round: rollouts per prompt, each prompt's `PromptTemperature`
    driver.observe_rewards(ids, rewards)    # each round: each prompt's rewards (E3's ranks, success rates)
    driver.end(entropy)                     # the batch's mean token entropy at the training temperature (E3)

Step numbers: `begin` takes the 0-based step (EAD's s: the optimiser steps before the batch); `end` hands the
schedule the 1-based step (E3's t), so no caller converts. Passes over the data (after each, E3's difficulty ranks
are recomputed and its curriculum widens) are counted from the prompts planned, unless the caller's prompt stream
says (`plan(..., new_pass=)`: explorl's `PromptStream`). An entropy measured piecewise (TRL's update forwards, on
several processes) is summed with `defer_entropy` / `add_entropy` and fed back by `end(reduce=...)`.

Where a per-token temperature (EAD, RevEAD, a user's `per_token` schedule) acts, per engine: a plan says it one
way whatever the engine, `plan(...).requests` (`PromptTemperature` per prompt: a request temperature and the
annealing arguments of the schedule's per-token function); explorl's sampler turns each into its per-token table
(`PromptTemperature.table`, `rollout.sampler.Sampler.sample`), explorl's vLLM engine and verl's agent loop send it
with each request (`integrations.vllm.EADLogitsProcessor` evaluates it per token); `begin` gives the step's sampler
temperature as a function of the token position (`StepTemperatures.sampler`, `table`), and TRL's transformers
generation divides token t's scores by `table[t]`
(`integrations.trl.generation.PerTokenTemperature`) and TRL's vLLM generation sends the requests' arguments. The
optimised policy stays at `StepTemperatures.train` (docs/methods.md §6a).

`state_dict` is plain data (JSON), saved in each checkpoint so that a resumed run continues exactly: the schedule's
state, the budget policy's, the prompts planned, the step begun and an entropy sum not yet fed back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

import explorl.rollout.budget_policies  # noqa: F401  (registers explorl's budget policies)
from explorl.algos.registry import lookup
from explorl.rollout.temperature_schedules import PromptTemperature

if TYPE_CHECKING:
    from explorl.config.schema import Config

__all__ = ["Plan", "ScheduleDriver", "StepTemperatures"]


@dataclass(frozen=True)
class StepTemperatures:
    """The temperature schedule's word on one step (`schedule.at(step)`)."""

    step: int
    """0-based step."""
    sampler: float | Callable[[int], float]
    """The sampler temperature: a number, or a function of the generated token's 0-based position (EAD)."""
    train: float
    """The temperature of the optimised policy (E3's tau; the base temperature under EAD and per-prompt ones)."""
    stats: dict[str, float]
    """The schedule's metrics for the step (`temperature/...`)."""

    @property
    def per_token(self) -> bool:
        return callable(self.sampler)

    def table(self, length: int) -> Tensor:
        """`[length]` float32 sampler temperatures of generated tokens 0..length-1."""
        at = self.sampler if callable(self.sampler) else (lambda t: self.sampler)
        return torch.tensor([float(at(t)) for t in range(length)], dtype=torch.float32)


@dataclass
class Plan:
    """What one round samples, per prompt of `prompt_ids` (in that order)."""

    step: int
    prompt_ids: list[int]
    rollouts: list[int]
    """Responses per prompt (E3: by difficulty; otherwise `sampling.group_size`)."""
    train_temperature: float
    stats: dict[str, float]
    """The schedule's metrics for the step."""
    requests: list[PromptTemperature]
    """How each prompt is sampled (a request temperature and annealing arguments), the one temperature form every
    engine takes: explorl's sampler turns it into its per-token table, vLLM and verl's agent loop send it."""

    @property
    def rollout_n(self) -> list[int]:
        """verl's name for `rollouts` (its agent loop reads `__rollout_n__`)."""
        return self.rollouts

    @property
    def temperature(self) -> list[float]:
        """Each prompt's request temperature."""
        return [r.temperature for r in self.requests]

    @property
    def anneal(self) -> list[dict | None]:
        """Each prompt's annealing arguments (`integrations.vllm`), or None."""
        return [r.anneal for r in self.requests]


class ScheduleDriver:
    """The configured temperature schedule and budget policy, looked up in the registry, driven one step at a time.

    `num_prompts`: the training set's size; prompt ids are its row indices, `[0, num_prompts)`.
    """

    def __init__(self, cfg: Config, vocab_size: int, num_prompts: int):
        entry = lookup("temperature_schedule", cfg.sampling.schedule)
        self.schedule = entry.bind(cfg.sampling)(cfg, vocab_size)
        """The temperature schedule (`sampling.schedule`)."""
        self.behavior_is_policy: bool = entry.behavior_is_policy
        """Whether the sampled distribution is the optimised policy (the schedule's registry entry)."""
        self.budget = lookup("budget_policy", cfg.budget.policy).bind(cfg.budget)(cfg, num_prompts)
        """The budget policy (`budget.policy`): rollouts per prompt."""
        self.num_prompts = int(num_prompts)
        self.planned = 0
        """Prompts planned so far (passes over the data are counted from it)."""
        self.step: int | None = None
        """The 0-based step begun last."""
        self.temperatures: StepTemperatures | None = None
        self._entropy: list[float] | None = None

    def begin(self, step: int) -> StepTemperatures:
        """Begin the 0-based step `step`: the schedule's sampler and training temperatures and metrics for it."""
        sampler, train, stats = self.schedule.at(step)
        self.step = int(step)
        self.temperatures = StepTemperatures(self.step, sampler, train, dict(stats))
        return self.temperatures

    def _begun(self) -> StepTemperatures:
        if self.temperatures is None:
            raise RuntimeError("ScheduleDriver: begin(step) first")
        return self.temperatures

    def plan(self, prompt_ids: Sequence[int], *, new_pass: bool | None = None) -> Plan:
        """The round's plan for `prompt_ids` in the step begun: rollouts per prompt and each prompt's temperature
        (`requests`), whatever the engine.

        A pass over the data ends (the budget policy's `end_of_pass`) before the prompt that crosses one: by the
        count of prompts planned, or where `new_pass` (the caller's prompt stream began a new pass) says."""
        temps = self._begun()
        ids = [int(i) for i in prompt_ids]
        passes = int(new_pass) if new_pass is not None else self._pass_of(self.planned + len(ids)) - \
            self._pass_of(self.planned)
        self.planned += len(ids)
        for _ in range(passes):
            self.budget.end_of_pass()
        rollouts = self.budget.budgets(ids)
        return Plan(temps.step, ids, rollouts, float(temps.train), dict(temps.stats), self.requests(ids))

    def _pass_of(self, count: int) -> int:
        """The pass the `count`-th planned prompt belongs to (as `PromptStream` passes over the data)."""
        return (count - 1) // self.num_prompts if count > 0 else 0

    def requests(self, prompt_ids: Sequence[int]) -> list[PromptTemperature]:
        """Each prompt's sampling in the step begun, as every engine takes it (the schedule's `per_prompt`)."""
        temps = self._begun()
        return self.schedule.per_prompt(temps.step, temps.sampler, prompt_ids)

    def observe_rewards(self, prompt_ids: Sequence[int], rewards_per_prompt: Sequence[Sequence[float]]) -> None:
        """Each prompt's rewards (`rewards_per_prompt[j]`: the rewards of prompt `prompt_ids[j]`'s responses)."""
        self.budget.observe_rewards(prompt_ids, rewards_per_prompt)
        self.schedule.observe_rewards(prompt_ids, rewards_per_prompt)

    def rollout_stats(self, rollouts) -> dict[str, float]:
        """The schedule's metrics of the sampled batch (a sampled `RolloutBatch`, or anything with `mask` and `temperatures`)."""
        return self.schedule.rollout_stats(rollouts)

    def defer_entropy(self) -> None:
        """The step's entropy comes in pieces (`add_entropy`), fed back by `end()`."""
        self._entropy = [0.0, 0.0]

    @property
    def entropy_pending(self) -> bool:
        return self._entropy is not None

    def add_entropy(self, total: float, count: float) -> None:
        """Add `total` (token entropies times the mask, summed) over `count` tokens to the deferred sum."""
        self._entropy[0] += float(total)
        self._entropy[1] += float(count)

    def end(self, entropy: float | None = None, *, reduce: Callable[[Tensor], Tensor] | None = None,
            step: int | None = None) -> None:
        """End the step begun (or the 0-based `step`): the schedule observes the batch's mean token entropy at the
        training temperature, with the 1-based step. `entropy=None`: the deferred sum's mean; `reduce` sums its
        `[2]` float64 tensor (entropy, tokens) over processes first."""
        step = self.step if step is None else int(step)
        if step is None:
            raise RuntimeError("ScheduleDriver: end() without a step begun")
        if entropy is None:
            total = torch.tensor(self._entropy, dtype=torch.float64)
            if reduce is not None:
                total = reduce(total)
            entropy = float(total[0] / total[1].clamp_min(1))
            self._entropy = None
        self.schedule.observe(step + 1, float(entropy))

    def state_dict(self) -> dict:
        """Plain data (JSON- and torch.save-safe). `schedule`: None for a stateless schedule; `budget`: {} for a
        stateless policy."""
        return {"schedule": self.schedule.state_dict(), "budget": self.budget.state_dict(), "planned": self.planned,
                "step": self.step, "entropy_sum": None if self._entropy is None else list(self._entropy)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what `state_dict` returned."""
        if state["schedule"] is not None:
            self.schedule.load_state_dict(state["schedule"])
        if state["budget"]:
            self.budget.load_state_dict(state["budget"])
        self.planned = int(state["planned"])
        self.step = None if state["step"] is None else int(state["step"])
        pending = state["entropy_sum"]
        self._entropy = None if pending is None else [float(x) for x in pending]
