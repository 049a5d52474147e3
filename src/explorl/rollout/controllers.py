"""What steers sampling from step to step: the prompt order, and the temperature schedule and budget policy by name.

- `PromptStream`: shuffled passes over the training prompts (explorl's own loop).
- `Controllers`: the configured temperature schedule (`sampling.schedule`, `rollout.temperature_schedules`) and
  budget policy (`budget.policy`, `rollout.budget_policies`), looked up in `explorl.algos.registry`, so no loop names
  one; one state dict, saved in each checkpoint, so a resumed run continues exactly.

Every engine drives them through `rollout.schedule.ScheduleDriver` (begin a step, plan each round's prompts, feed
back rewards and entropy); importing this module registers explorl's schedules and policies (it re-exports them).
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from explorl.algos.registry import lookup
from explorl.rollout.budget_policies import (DAPOBudget, DAPOBudgetOptions, E3Budget, E3BudgetOptions,
                                             UniformBudget)
from explorl.rollout.temperature_schedules import (AdaptiveOptions, AdaptiveTemperature, E3Temperature,
                                                   E3TemperatureOptions, EADOptions, EADTemperature,
                                                   FixedTemperature, PromptTemperature, RevEADTemperature)

if TYPE_CHECKING:
    from explorl.config.schema import Config

__all__ = ["AdaptiveOptions", "AdaptiveTemperature", "Controllers", "DAPOBudget", "DAPOBudgetOptions", "E3Budget",
           "E3BudgetOptions", "E3Temperature", "E3TemperatureOptions", "EADOptions", "EADTemperature",
           "FixedTemperature", "PromptStream", "PromptTemperature", "RevEADTemperature", "UniformBudget"]


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
