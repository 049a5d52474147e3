"""verl's pass@k estimator: per group, only the best response gets an advantage, the best reward minus the second.

inference-time objectives: Yunhao Tang, Kunhao Zheng, Gabriel Synnaeve, Rémi Munos (2025), "Optimizing Language
Models for Inference Time Objectives using Reinforcement Learning", arXiv 2503.19595 (as verl 0.9.1 cites it).

Implements verl 0.9.1's `grpo_passk` (`verl.trainer.ppo.core_algos.compute_grpo_passk_outcome_advantage`);
docs/methods.md §5z. The paper trains for pass@k (`E[max_j r_j]` over k samples) with the leave-one-out control
variate: sample i's advantage is the objective on all k samples minus the objective on the other k - 1,
`max_j r_j - max_{j != i} r_j`, which is 0 for every response but the best, and `r_max - r_second_max` for it. verl
takes the group as the k samples and, as GRPO does, divides by the group's (unbiased) reward std + eps. Estimator
`grpo_passk`, options `algo.grpo_passk.<field>` (`GrpoPasskOptions`); eps is the core `algo.adv_eps` (verl's
`epsilon`, 1e-6). Not explorl's `passk` (docs/methods.md §5f: Chen et al.'s analytic pass@k advantage, every
response of a mixed group non-zero).

Differences, said where they act: a group of one response gets 0 (explorl's convention, as `grpo`); verl raises an
error. A tie for the best reward gives every response 0 (`r_max - r_second_max` = 0; verl gives its 0 to one of the
tied responses, which is the same).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from explorl.algos.core import check_response_inputs, dense_ids, float_dtype, on_response_tokens, segment_stats
from explorl.algos.registry import Cite, register

if TYPE_CHECKING:
    from explorl.algos.batch import RolloutBatch
    from explorl.config.schema import AlgoConfig


def grpo_passk(rewards: Tensor, group: Tensor, mask: Tensor, *, scale: bool = True, eps: float = 1e-6) -> Tensor:
    """verl 0.9.1's `grpo_passk` advantage (Tang et al. 2025, the leave-one-out pass@k advantage with k the group
    size; docs/methods.md §5z), broadcast over the response tokens.

    Per group g: the response with the largest reward gets `A = (r_max - r_second_max) / (std_g(r) + eps)`
    (`std_g` the unbiased standard deviation of the group's rewards; without the division when `scale` is False),
    every other response 0. A group whose largest reward is shared by two or more responses, or a group of one
    response, gets 0 everywhere.

    Args:
        rewards: `[N]` one scalar reward per response (any real values).
        group: `[N]` int64 prompt ids; arbitrary values, any order, any group sizes.
        mask: `[N, T]` 1 on response tokens, 0 on padding.
        scale: divide by `std + eps` (verl's `norm_adv_by_std_in_grpo`).
        eps: added to the standard deviation.
    Returns:
        `[N, T]` advantages in the floating dtype of `rewards` (float32 otherwise), 0.0 where `mask == 0`.
    """
    check_response_inputs(rewards, group, mask)
    out_dtype = float_dtype(rewards)
    if rewards.numel() == 0:
        return torch.zeros(mask.shape, dtype=out_dtype, device=mask.device)
    r = rewards.detach().to(torch.float64)
    dense, n_groups = dense_ids(group)
    _, std, count = segment_stats(r, dense, unbiased=True)
    lowest = torch.full((n_groups,), -torch.inf, dtype=r.dtype, device=r.device)
    best = lowest.scatter_reduce(0, dense, r, "amax")  # [G] r_max
    at_best = r == best[dense]
    n_best = torch.zeros(n_groups, dtype=r.dtype, device=r.device).index_add_(0, dense, at_best.to(r.dtype))
    second = lowest.scatter_reduce(0, dense, torch.where(at_best, -torch.inf, r), "amax")  # [G] below r_max
    unique_best = (n_best == 1) & (second > -torch.inf)  # a best response and another to compare it with
    gap = torch.where(unique_best, best - second, torch.zeros_like(best))
    adv = torch.where(at_best & (count > 1), gap[dense], torch.zeros_like(r))
    if scale:
        adv = adv / (std + eps)
    return on_response_tokens(adv.to(out_dtype), mask, out_dtype)


@dataclass
class GrpoPasskOptions:
    """verl's pass@k estimator's options, `algo.grpo_passk.<field>` (docs/methods.md §5z)."""

    norm_adv_by_std: bool = True
    """Divide the best response's `r_max - r_second_max` by its group's reward std + `algo.adv_eps` (verl 0.9.1's
    `algorithm.norm_adv_by_std_in_grpo`, default true)."""


def _check_grpo_passk(cfg) -> str | None:
    g = cfg.sampling.group_size
    return None if g >= 2 else (f"sampling.group_size: grpo_passk compares each group's best reward with its second "
                                f"best and needs at least 2 responses per prompt (verl refuses fewer), got {g}")


@register("estimator", "grpo_passk", needs_old_logprobs=False, reads=("adv_eps",), options=GrpoPasskOptions,
          check=_check_grpo_passk, formula=grpo_passk, cites=(Cite("inference-time objectives", doc="5z"),))
def _grpo_passk_adapter(batch: RolloutBatch, cfg: AlgoConfig, *, options: GrpoPasskOptions) -> Tensor:
    """verl's `grpo_passk` (Tang et al. 2025): each group's best response gets r_max - r_second_max, over the group's
    std + eps; every other response 0."""
    return grpo_passk(batch.rewards, batch.group, batch.mask, scale=options.norm_adv_by_std, eps=cfg.adv_eps)
