"""Prompts as the sampling engines take them (explorl's decoder, `rollout.engines.native`; the vLLM engine,
`rollout.engines.vllm`): token-id lists left-padded into one tensor. What the engines return is the step's
`explorl.algos.batch.RolloutBatch`."""

from __future__ import annotations

import torch

__all__ = ["left_pad_prompts"]


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
