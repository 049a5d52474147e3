"""GPG: the group-centred reward scaled by the batch's share of nonzero rewards.

GPG: Chu et al. 2025, "GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning" (arXiv
  2504.02546).

Implements the advantage of verl 0.9.1's `gpg` estimator (docs/methods.md §5q): `alpha * (r_i - mean_g(r)) /
f_norm`, alpha the batch size over the number of nonzero rewards. Estimator `gpg`, options `algo.gpg.<field>`
(`GpgOptions`). GPG's loss (verl's `gpg` policy loss, a plain policy gradient) is the policy loss `gpg`
(`algo.loss: gpg`, gpg_loss.py).
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


def gpg(rewards: Tensor, group: Tensor, mask: Tensor, *, f_norm: float = 1.0) -> Tensor:
    """GPG advantage (docs/methods.md §5q; Chu et al. 2025, "GPG"), as verl 0.9.1 computes it, broadcast over the
    response tokens.

    `A_i = alpha * (r_i - mean_g(r)) / f_norm`, `alpha = N / max(1, #{j : r_j != 0})` over the whole batch of N
    responses (verl's reading of the paper's correction factor: the batch over its responses that carry a nonzero
    reward).

    A group of one response gets 0 (its own reward is its group's mean; verl 0.9.1 takes that mean as 0, giving
    `alpha * r_i / f_norm`); it still counts in alpha.

    Args:
        rewards: `[N]` one scalar reward per response.
        group: `[N]` int64 prompt ids; arbitrary values, any order, any group sizes.
        mask: `[N, T]` 1 on response tokens, 0 on padding.
        f_norm: the divisor (verl's default 1.0).
    Returns:
        `[N, T]` advantages in the floating dtype of `rewards` (float32 otherwise), 0.0 where `mask == 0`.
    """
    check_response_inputs(rewards, group, mask)
    out_dtype = float_dtype(rewards)
    if rewards.numel() == 0:
        return torch.zeros(mask.shape, dtype=out_dtype, device=mask.device)
    r = rewards.detach().to(torch.float64)
    alpha = r.numel() / max(1, int(torch.count_nonzero(r)))
    mean, _, count = segment_stats(r, group)
    adv = torch.where(count > 1, alpha * (r - mean) / f_norm, torch.zeros_like(r)).to(out_dtype)
    return on_response_tokens(adv, mask, out_dtype)


@dataclass
class GpgOptions:
    """GPG's options, `algo.gpg.<field>` (docs/methods.md §5q)."""

    f_norm: float = 1.0
    """Divisor of the advantage, > 0 (verl 0.9.1's `compute_gpg_outcome_advantage` default 1.0)."""


def _check_gpg(cfg) -> str | None:
    f_norm = cfg.algo.options["gpg"].f_norm
    return None if f_norm > 0 else f"algo.gpg.f_norm: must be > 0, got {f_norm}"


@register("estimator", "gpg", needs_old_logprobs=False, options=GpgOptions, check=_check_gpg, formula=gpg,
          cites=(Cite("GPG", doc="5q"),))
def _gpg_adapter(batch: RolloutBatch, cfg: AlgoConfig, *, options: GpgOptions) -> Tensor:
    """GPG (Chu et al. 2025): group-centred reward times the batch's share of nonzero rewards."""
    return gpg(batch.rewards, batch.group, batch.mask, f_norm=options.f_norm)
