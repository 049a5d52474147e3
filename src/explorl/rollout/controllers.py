"""What steers sampling from step to step: the prompt order (`PromptStream`: shuffled passes over the training
prompts, explorl's own loop), and explorl's temperature schedules and budget policies, registered by name when this
module is imported (it re-exports them).

Every engine drives the configured schedule and policy through `rollout.schedule.ScheduleDriver` (begin a step, plan
each round's prompts, feed back rewards and entropy), which also keeps their state.
"""

from __future__ import annotations

import random

from explorl.rollout.budget_policies import (DAPOBudget, DAPOBudgetOptions, E3Budget, E3BudgetOptions,
                                             UniformBudget)
from explorl.rollout.fr3e import FR3EBranching, FR3EOptions
from explorl.rollout.temperature_schedules import (AdaptiveOptions, AdaptiveTemperature, E3Temperature,
                                                   E3TemperatureOptions, EADOptions, EADTemperature,
                                                   FixedTemperature, PromptTemperature, RevEADTemperature)

__all__ = ["AdaptiveOptions", "AdaptiveTemperature", "DAPOBudget", "DAPOBudgetOptions", "E3Budget",
           "E3BudgetOptions", "E3Temperature", "E3TemperatureOptions", "EADOptions", "EADTemperature",
           "FR3EBranching", "FR3EOptions", "FixedTemperature", "PromptStream", "PromptTemperature", "RevEADTemperature", "UniformBudget"]


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
