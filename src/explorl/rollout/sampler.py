"""The sampler, built once per run from `SamplingConfig` and the model, then handed around (vLLM's `LLM(...)`
beside its per-request `SamplingParams`): which decoder (the fused fast path or the generic one), whether its steps
are compiled, whether the static batch is replayed as a CUDA graph and which engine samples (explorl's own or a
vLLM engine) are decided here, once; each round then calls `sample(prompts, plan, generator)` with the round's
`rollout.schedule.Plan`, and the evaluations, the probes and RFT call `sample_fixed(prompts, n, temperature,
generator)` (the same request for every prompt).

A plan says a temperature one way whatever the engine: per prompt a `PromptTemperature` (a request temperature and
the annealing arguments of a per-token schedule). explorl's decoder gets it as a `[N, max_new_tokens]` table, one row
per response (`PromptTemperature.table`, repeated over the prompt's rollouts); the vLLM engine sends it with each
request.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from explorl.algos.batch import RolloutBatch
from explorl.rollout.engines.native import sample
from explorl.rollout.forward import supports_fused_forward
from explorl.rollout.schedule import Plan
from explorl.rollout.temperature_schedules import PromptTemperature

if TYPE_CHECKING:
    from explorl.config.schema import SamplingConfig

__all__ = ["Sampler", "per_response_table"]


def per_response_table(requests: Sequence[PromptTemperature], rollouts: Sequence[int], length: int) -> torch.Tensor:
    """`[N, length]` float32 temperatures, N = sum(rollouts): prompt j's `requests[j].table(length)` repeated for
    its `rollouts[j]` responses (the layout of a sampled `RolloutBatch`'s rows)."""
    if len(requests) != len(rollouts):
        raise ValueError(f"{len(requests)} prompt temperatures for {len(rollouts)} prompts")
    if not requests:
        return torch.zeros((0, length))
    tables: dict[int, torch.Tensor] = {}  # a schedule's requests are often one object repeated
    for r in requests:
        if id(r) not in tables:
            tables[id(r)] = r.table(length)
    rows = torch.stack([tables[id(r)] for r in requests])
    return rows.repeat_interleave(torch.as_tensor(list(rollouts), dtype=torch.long), dim=0)


@dataclass
class Sampler:
    """Samples rounds of rollouts for `model`; built once (`from_config`), its settings fixed for the run."""

    model: torch.nn.Module
    eos_token_id: int | Sequence[int]
    pad_token_id: int
    max_new_tokens: int
    top_p: float = 1.0
    fast_path: bool = True
    """Use the fused Llama-family decoder (`sampling.fast_path`); `fused` says whether it applies to `model`."""
    compile: bool = False
    """Compile the fused decoder's step and draw (`sampling.compile`)."""
    cuda_graph: bool = False
    """Decode a static batch replayed as a CUDA graph (`sampling.cuda_graph`; needs the fused decoder)."""
    engine: object | None = None
    """A `rollout.engines.vllm.VllmRollouts` that samples instead of explorl's decoder (`sampling.engine: vllm`)."""
    fused: bool = field(init=False)
    """Whether explorl's decoder takes the fused path for `model` (decided once, at construction)."""

    def __post_init__(self) -> None:
        self.fused = self.engine is None and self.fast_path and supports_fused_forward(self.model)
        if self.cuda_graph and self.engine is None and not self.fused:
            warnings.warn("explorl: sampling.cuda_graph needs the fused decoder (sampling.fast_path: true and a "
                          "Llama-family model without LoRA, sliding window or rotary scaling); decoding without the "
                          "graph", RuntimeWarning, stacklevel=3)
        self.cuda_graph = self.cuda_graph and self.fused
        self.compile = self.compile and self.fused

    @classmethod
    def from_config(cls, model, tok, s: SamplingConfig, engine=None) -> Sampler:
        """The run's sampler: `sampling.*` settings, the tokenizer's EOS and padding ids, `engine` (vLLM) or None."""
        return cls(model, tok.eos_token_id, tok.pad_token_id, s.max_new_tokens, top_p=s.top_p,
                   fast_path=s.fast_path, compile=s.compile, cuda_graph=s.cuda_graph, engine=engine)

    def sample(self, prompts: Sequence[Sequence[int]], plan: Plan, generator: torch.Generator) -> RolloutBatch:
        """`plan.rollouts[j]` responses to prompt j (token ids), each sampled as `plan.requests[j]` says.

        `generator` draws explorl's tokens; for the vLLM engine it draws the round's request seed, so a resumed
        step samples the same."""
        return self._sample(prompts, plan.rollouts, plan.requests, generator)

    def sample_fixed(self, prompts: Sequence[Sequence[int]], n: int | Sequence[int],
                     temperature: float | PromptTemperature, generator: torch.Generator) -> RolloutBatch:
        """`n` responses to each prompt (an int, or one count per prompt), every one sampled at `temperature`: a
        number, or one `PromptTemperature` (a request temperature with a per-token schedule's arguments, e.g. EAD
        at inference, `evaluation.settings.inference_schedule`). What the evaluations, the probes and RFT sample:
        one plan of the same request for every prompt, sampled as `sample` samples a round's."""
        counts = [int(n)] * len(prompts) if isinstance(n, int) else [int(k) for k in n]
        if len(counts) != len(prompts):
            raise ValueError(f"n has {len(counts)} entries for {len(prompts)} prompts")
        request = temperature if isinstance(temperature, PromptTemperature) else PromptTemperature(float(temperature))
        return self._sample(prompts, counts, [request] * len(prompts), generator)

    def _sample(self, prompts: Sequence[Sequence[int]], rollouts: Sequence[int],
                requests: Sequence[PromptTemperature], generator: torch.Generator) -> RolloutBatch:
        if self.engine is None:
            return sample(self, prompts, rollouts, per_response_table(requests, rollouts, self.max_new_tokens),
                          generator)
        seed = int(torch.randint(2**31 - 1, (1,), generator=generator, device=generator.device))
        return self.engine.sample(self, prompts, rollouts, requests, seed)
