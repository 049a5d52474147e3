"""A user's own per-token temperature schedule, registered from outside explorl (as `run.plugins` would import it):
hot for the first tokens of a response, cooling linearly to the base temperature. The engines learn what it needs
from its registry entry (`per_token`), so explorl's loop, TRL and the vLLM processor run it unchanged."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from explorl.algos.registry import register
from explorl.rollout.controllers import PromptTemperature


@dataclass(frozen=True)
class WarmStartOptions:
    hot: float = 2.0
    """Temperature factor of the first generated token."""
    until: int = 8
    """Output position from which the factor is 1."""


def warm_start(t, step: int, options: WarmStartOptions = WarmStartOptions()) -> torch.Tensor:
    """Factor `max(hot - (hot - 1) * t / until, 1)` at output position t (the training step is not used)."""
    t = torch.as_tensor(t, dtype=torch.float32)
    return torch.clamp(options.hot - (options.hot - 1.0) * t / options.until, min=1.0)


@register("temperature_schedule", "test_warm_start", behavior_is_policy=False, options=WarmStartOptions,
          per_token=warm_start, reads=("sampling.temperature", "sampling.max_new_tokens"))
class WarmStartTemperature:
    """Samples at T * warm_start(t); the optimised policy stays at T (a behaviour-policy schedule, as EAD)."""

    def __init__(self, cfg, vocab_size: int, *, options: WarmStartOptions):
        self.s, self.o = cfg.sampling, options

    def anneal(self, step: int) -> dict:
        return {"schedule": "test_warm_start", "step": int(step), "hot": self.o.hot, "until": self.o.until}

    def at(self, step: int):
        table = (warm_start(torch.arange(self.s.max_new_tokens), step, self.o) * self.s.temperature).tolist()
        return (lambda t: table[t]), self.s.temperature, {}

    def per_prompt(self, step: int, temperature, prompt_ids) -> list[PromptTemperature]:
        return [PromptTemperature(self.s.temperature, self.anneal(step))] * len(prompt_ids)

    def rollout_stats(self, ro) -> dict:
        return {}

    def observe(self, step: int, entropy: float) -> None:
        pass

    def observe_rewards(self, prompt_ids, rewards_per_prompt) -> None:
        pass

    def state_dict(self):
        return None

    def load_state_dict(self, state) -> None:
        pass
