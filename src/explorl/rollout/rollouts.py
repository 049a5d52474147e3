"""`Rollouts`: what every sampling engine returns for a round (explorl's decoder, `rollout.engines.native`; the vLLM
engine, `rollout.engines.vllm`), so that neither engine imports the other for its type.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["Rollouts", "left_pad_prompts"]


@dataclass
class Rollouts:
    """Responses to a batch of prompts. N responses, prompts left-padded to P, responses right-padded to T."""

    prompt_ids: torch.Tensor  # [N, P] int64, left-padded
    prompt_mask: torch.Tensor  # [N, P] int64, 1 on real prompt tokens
    response_ids: torch.Tensor  # [N, T] int64, pad after EOS
    mask: torch.Tensor  # [N, T] float32, 1 on response tokens up to and including EOS
    behavior_logprobs: torch.Tensor  # [N, T] float32, log-prob under the distribution sampled from
    entropy: torch.Tensor  # [N, T] float32, entropy of softmax(logits / temperature)
    temperatures: torch.Tensor  # [N, T] float32, the temperature each token was sampled at (0 on padding)
    truncated: torch.Tensor  # [N] bool, hit the length limit without EOS
    group: torch.Tensor  # [N] int64, index of the prompt each response answers

    @property
    def lengths(self) -> torch.Tensor:
        return self.mask.sum(-1).long()

    def select(self, index: torch.Tensor) -> Rollouts:
        """Rows `index` of every field (mini-batching, dynamic sampling)."""
        return Rollouts(**{k: getattr(self, k)[index] for k in self.__dataclass_fields__})

    @staticmethod
    def cat(parts: Sequence[Rollouts], pad_token_id: int) -> Rollouts:
        """Stack rollouts of several sampling rounds (DAPO dynamic sampling): prompts re-left-padded to one width,
        responses re-right-padded to one length. Group ids are kept as they are: make them distinct first."""
        width = max(p.prompt_ids.shape[1] for p in parts)
        length = max(p.response_ids.shape[1] for p in parts)

        def pad(x: torch.Tensor, to: int, left: bool, value) -> torch.Tensor:
            extra = to - x.shape[1]
            if extra == 0:
                return x
            filler = torch.full((x.shape[0], extra), value, dtype=x.dtype, device=x.device)
            return torch.cat([filler, x] if left else [x, filler], dim=1)

        return Rollouts(
            prompt_ids=torch.cat([pad(p.prompt_ids, width, True, pad_token_id) for p in parts]),
            prompt_mask=torch.cat([pad(p.prompt_mask, width, True, 0) for p in parts]),
            response_ids=torch.cat([pad(p.response_ids, length, False, pad_token_id) for p in parts]),
            mask=torch.cat([pad(p.mask, length, False, 0.0) for p in parts]),
            behavior_logprobs=torch.cat([pad(p.behavior_logprobs, length, False, 0.0) for p in parts]),
            entropy=torch.cat([pad(p.entropy, length, False, 0.0) for p in parts]),
            temperatures=torch.cat([pad(p.temperatures, length, False, 0.0) for p in parts]),
            truncated=torch.cat([p.truncated for p in parts]),
            group=torch.cat([p.group for p in parts]))


def left_pad_prompts(prompts: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [B, P], mask [B, P]) of token-id lists left-padded with `pad_id` to the longest (mask 1 on tokens)."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        if len(p):
            ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p):] = 1
    return ids.to(device), mask.to(device)
