"""OPO: the length-weighted group baseline (the optimal reward baseline).

OPO: Hao et al. 2025, "On-Policy RL with Optimal Reward Baseline" (arXiv 2505.23585, as verl 0.9.1 cites it).

Implements OPO's advantage (docs/methods.md §5p): each reward minus the mean reward of its group weighted by the
responses' lengths. Estimator `opo`; no options (verl 0.9.1's `opo` has none).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from explorl.algos.core import check_response_inputs, dense_ids, float_dtype, on_response_tokens
from explorl.algos.registry import Cite, register

if TYPE_CHECKING:
    from explorl.algos.batch import RolloutBatch
    from explorl.config.schema import AlgoConfig


def opo(rewards: Tensor, group: Tensor, mask: Tensor) -> Tensor:
    """OPO advantage (docs/methods.md §5p; Hao et al. 2025, "On-Policy RL with Optimal Reward Baseline"), broadcast
    over the response tokens.

    `A_i = r_i - b_g`, `b_g = sum_j |o_j| r_j / sum_j |o_j|` over the responses j of the group of response i, with
    `|o_j|` the number of valid tokens of response j (`mask.sum(-1)`): the optimal baseline of the paper when each
    token's gradient norm is taken as constant, so a response's weight is its length.

    A group of one response gets 0 (its baseline is its own reward, as the formula gives; verl 0.9.1 takes the
    baseline of a group of one as 0, i.e. its raw reward). A group whose responses have no valid token at all has no
    weights and gets 0 (its rows are all padding anyway).

    Args:
        rewards: `[N]` one scalar reward per response.
        group: `[N]` int64 prompt ids; arbitrary values, any order, any group sizes.
        mask: `[N, T]` 1 on response tokens, 0 on padding.
    Returns:
        `[N, T]` advantages in the floating dtype of `rewards` (float32 otherwise), 0.0 where `mask == 0`.
    """
    check_response_inputs(rewards, group, mask)
    out_dtype = float_dtype(rewards)
    if rewards.numel() == 0:
        return torch.zeros(mask.shape, dtype=out_dtype, device=mask.device)
    r = rewards.detach().to(torch.float64)
    length = mask.bool().sum(-1).to(torch.float64)
    dense, n_groups = dense_ids(group)
    count = torch.zeros(n_groups, dtype=torch.float64, device=r.device).index_add_(0, dense, torch.ones_like(r))
    weight = torch.zeros_like(count).index_add_(0, dense, length)
    total = torch.zeros_like(count).index_add_(0, dense, length * r)
    baseline = total / weight.clamp_min(1.0)
    keep = (count > 1) & (weight > 0)
    adv = torch.where(keep[dense], r - baseline[dense], torch.zeros_like(r)).to(out_dtype)
    return on_response_tokens(adv, mask, out_dtype)


@register("estimator", "opo", needs_old_logprobs=False, formula=opo, cites=(Cite("OPO", doc="5p"),))
def _opo_adapter(batch: RolloutBatch, cfg: AlgoConfig) -> Tensor:
    """OPO (Hao et al. 2025): reward minus the length-weighted mean reward of its group."""
    return opo(batch.rewards, batch.group, batch.mask)
