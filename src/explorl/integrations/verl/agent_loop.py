"""verl agent loop `explorl_single_turn`: verl's single-turn loop with explorl's per-prompt sampling.

`ExplorlTrainer` gives each prompt of a training batch the fields `__explorl_temperature__` (the request
temperature of the prompt) and `__explorl_anneal__` (EAD / RevEAD arguments or None), and selects this loop for the
batch. The loop takes them out of the prompt and samples with them (`rollout.request_sampling_params`); everything
else is verl's `SingleTurnAgentLoop`. Validation batches do not carry the fields and keep verl's sampling.

Imported only where verl's agent loop imports (it registers with verl's agent-loop registry on import).
"""

from __future__ import annotations

from typing import Any

from verl.experimental.agent_loop.agent_loop import register
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

from explorl.integrations.verl.rollout import AGENT_LOOP, ANNEAL_FIELD, TEMPERATURE_FIELD, request_sampling_params


def prompt_sampling(kwargs: dict[str, Any]) -> tuple[float | None, dict | None]:
    """Take a prompt's explorl fields out of the agent loop's keyword arguments: (temperature, anneal)."""
    temperature = kwargs.pop(TEMPERATURE_FIELD, None)
    anneal = kwargs.pop(ANNEAL_FIELD, None)
    if temperature is not None:
        temperature = float(temperature)  # a 0-dim tensor from the batch's TensorDict
    anneal = getattr(anneal, "data", anneal)  # tensordict's NonTensorData wraps a plain dict
    return temperature, (dict(anneal) if anneal else None)


@register(AGENT_LOOP)
class ExplorlAgentLoop(SingleTurnAgentLoop):
    """verl's single-turn agent loop sampling each prompt at explorl's temperature (and EAD annealing)."""

    async def run(self, sampling_params: dict[str, Any], priority: int = 0, **kwargs):
        temperature, anneal = prompt_sampling(kwargs)
        params = request_sampling_params(sampling_params, temperature, anneal)
        return await super().run(params, priority=priority, **kwargs)
