"""REINFORCE++ and REINFORCE++-baseline: returns (or group-centred rewards) whitened over the whole batch.

REINFORCE++: Hu 2025, "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models" (arXiv
  2501.03262, as verl 0.9.1 cites it).

Implements the two outcome-reward estimators verl 0.9.1 ships under these names (docs/methods.md §5o):
`reinforce_plus_plus`, the discounted reward-to-go of each token whitened over every valid token of the batch, and
`reinforce_plus_plus_baseline`, each reward minus its group's mean, whitened the same way. Options
`algo.reinforce_plus_plus.gamma` (`ReinforcePlusPlusOptions`); the baseline variant has none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from explorl.algos.core import check_response_inputs, float_dtype, on_response_tokens, segment_stats
from explorl.algos.registry import Cite, register

if TYPE_CHECKING:
    from explorl.algos.batch import RolloutBatch
    from explorl.config.schema import AlgoConfig

WHITEN_EPS = 1e-8
"""Added to the batch variance before the square root (verl's `masked_whiten`)."""


def batch_whiten(values: Tensor, mask: Tensor, eps: float = WHITEN_EPS) -> Tensor:
    """`(x - mean) / sqrt(var + eps)` with the mean and the **unbiased** variance over every token where
    `mask == 1` in the whole batch (verl's `masked_whiten`), in float64; 0.0 where `mask == 0`.

    Fewer than two valid tokens: the variance is undefined and every valid value equals the mean, so the result is 0
    (verl raises an error there).

    Args:
        values: `[N, T]` floating values.
        mask: `[N, T]` 1 on response tokens, 0 on padding.
    Returns:
        `[N, T]` float64.
    """
    valid = mask.bool()
    v = torch.where(valid, values.detach().to(torch.float64), torch.zeros((), dtype=torch.float64,
                                                                          device=values.device))
    n = int(valid.sum())
    if n < 2:
        return torch.zeros_like(v)
    mean = v.sum() / n
    centred = torch.where(valid, v - mean, torch.zeros_like(v))
    var = (centred * centred).sum() / (n - 1)
    return centred / torch.sqrt(var + eps)


def reinforce_plus_plus(rewards: Tensor, mask: Tensor, *, gamma: float = 1.0) -> Tensor:
    """REINFORCE++ advantage (docs/methods.md §5o; Hu 2025, "REINFORCE++"), as verl 0.9.1 computes it for outcome
    rewards.

    The outcome reward `r_i` sits on the last valid token of response i; the return of valid token t is
    `G_i,t = gamma^k * r_i`, k the number of valid tokens of response i after t (`G = r_i` everywhere for
    `gamma = 1`); `A = (G - mean(G)) / sqrt(var(G) + 1e-8)` with the mean and the unbiased variance over every valid
    token of the batch (a longer response weighs more). Groups play no part: a group of one response is treated as
    any other. The paper's per-token KL penalty in the reward is not part of this estimator (explorl's KL is the
    loss term `algo.kl_coef`).

    Args:
        rewards: `[N]` one scalar reward per response.
        mask: `[N, T]` 1 on response tokens, 0 on padding.
        gamma: the discount (verl's `algorithm.gamma`).
    Returns:
        `[N, T]` advantages in the floating dtype of `rewards` (float32 otherwise), 0.0 where `mask == 0`.
    """
    if mask.dim() != 2 or rewards.shape != (mask.shape[0],):
        raise ValueError(f"expected rewards [N] and mask [N, T]; got rewards {tuple(rewards.shape)}, "
                         f"mask {tuple(mask.shape)}")
    out_dtype = float_dtype(rewards)
    valid = mask.bool()
    after = valid.flip(-1).long().cumsum(-1).flip(-1) - valid.long()  # valid tokens after t
    discount = torch.pow(torch.full((), float(gamma), dtype=torch.float64, device=mask.device), after.double())
    returns = rewards.detach().to(torch.float64)[:, None] * discount
    return on_response_tokens(batch_whiten(returns, valid), valid, out_dtype)


def reinforce_plus_plus_baseline(rewards: Tensor, group: Tensor, mask: Tensor) -> Tensor:
    """REINFORCE++-baseline advantage (docs/methods.md §5o; Hu 2025, "REINFORCE++"), as verl 0.9.1 computes it.

    `A_i = r_i - mean_g(r)` (the mean over the responses of the group of response i), broadcast over the response's
    tokens, then whitened over every valid token of the batch: `(A - mean(A)) / sqrt(var(A) + 1e-8)` with the
    unbiased variance (a longer response weighs more).

    A group of one response: explorl subtracts its group's mean as for any group, so it enters the whitening with 0
    (and leaves it with `-mean(A) / sqrt(var(A) + 1e-8)`, like every zero); verl 0.9.1 takes the mean of a group of
    one as 0, so it enters with its raw reward.

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
    mean, _, _ = segment_stats(r, group)
    centred = (r - mean)[:, None].expand(mask.shape)
    return on_response_tokens(batch_whiten(centred, mask), mask, out_dtype)


@dataclass
class ReinforcePlusPlusOptions:
    """REINFORCE++'s options, `algo.reinforce_plus_plus.<field>` (docs/methods.md §5o)."""

    gamma: float = 1.0
    """Discount of the reward-to-go, in [0, 1] (verl 0.9.1's `algorithm.gamma`, default 1.0: every token of a
    response gets its reward)."""


def _check_reinforce_plus_plus(cfg) -> str | None:
    gamma = cfg.algo.options["reinforce_plus_plus"].gamma
    return None if 0.0 <= gamma <= 1.0 else f"algo.reinforce_plus_plus.gamma: must be in [0, 1], got {gamma}"


@register("estimator", "reinforce_plus_plus", needs_old_logprobs=False, options=ReinforcePlusPlusOptions,
          check=_check_reinforce_plus_plus, formula=(reinforce_plus_plus, batch_whiten),
          cites=(Cite("REINFORCE++", doc="5o"),))
def _reinforce_plus_plus_adapter(batch: RolloutBatch, cfg: AlgoConfig, *,
                                 options: ReinforcePlusPlusOptions) -> Tensor:
    """REINFORCE++ (Hu 2025): discounted returns whitened over the batch's tokens."""
    return reinforce_plus_plus(batch.rewards, batch.mask, gamma=options.gamma)


@register("estimator", "reinforce_plus_plus_baseline", needs_old_logprobs=False,
          formula=(reinforce_plus_plus_baseline, batch_whiten), cites=(Cite("REINFORCE++", doc="5o"),))
def _reinforce_plus_plus_baseline_adapter(batch: RolloutBatch, cfg: AlgoConfig) -> Tensor:
    """REINFORCE++-baseline (Hu 2025): group-centred rewards whitened over the batch's tokens."""
    return reinforce_plus_plus_baseline(batch.rewards, batch.group, batch.mask)
