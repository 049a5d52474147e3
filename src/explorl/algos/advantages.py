"""Advantage estimators: pure tensor functions from rewards (and per-token statistics) to `advantages[N, T]`.

Notation follows METHODS.md: N responses padded to T tokens, `mask[N, T]` is 1 on response tokens,
`group[N]` (int64, arbitrary ids, any order) names the prompt of each response, `rewards[N]` one float
per response. Groups may have different sizes; nothing here assumes `N = B * G`. Every per-token output is
exactly 0.0 where `mask == 0`.

Each estimator is also registered by config name (`ADVANTAGES[name](batch, cfg)`, see `explorl.algos`),
through a thin adapter that reads the batch dict and `AlgoConfig`.

Shared pieces for estimators that need group statistics (ERPO's per-group token gates, PPL shaping, ...):
`dense_ids` turns arbitrary ids into 0..S-1 and `segment_stats` gives per-segment mean / std / count,
broadcast back to every element, without a Python loop over groups.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from explorl.algos import register_advantage

if TYPE_CHECKING:
    from explorl.config import AlgoConfig

__all__ = ["dense_ids", "segment_stats", "grpo"]


def dense_ids(ids: Tensor) -> tuple[Tensor, int]:
    """Map arbitrary integer ids to dense ids 0..S-1 (in sorted order of the original ids).

    Args:
        ids: integer tensor of any shape `[...]`.
    Returns:
        `(dense[...] int64, S)`, where S is the number of distinct ids.
    """
    if ids.numel() == 0:
        return torch.zeros_like(ids, dtype=torch.long), 0
    uniq, inverse = torch.unique(ids, return_inverse=True)
    return inverse.reshape(ids.shape), int(uniq.numel())


def segment_stats(
    values: Tensor, ids: Tensor, mask: Tensor | None = None, *, unbiased: bool = False
) -> tuple[Tensor, Tensor, Tensor]:
    """Mean, standard deviation and count of `values` within each segment, broadcast back to every element.

    A segment is the set of elements sharing an id (e.g. `group[:, None].expand(N, T)` with `mask` gives
    per-group statistics over valid tokens; `group` alone gives per-group statistics over responses).
    Elements with `mask == 0` do not count, but still receive their segment's statistics.
    The variance is two-pass (mean first, then squared deviations), computed in float64.

    Args:
        values: `[...]` floating tensor (not differentiated through).
        ids: `[...]` integer segment ids, arbitrary values and order.
        mask: optional `[...]` 0/1 (or bool) tensor selecting the elements that count.
        unbiased: divide by `count - 1` instead of `count` (Bessel's correction).
    Returns:
        `(mean, std, count)`, each `[...]` in float64. A segment with no counted element has mean 0;
        one with `count <= 1` (unbiased) or `count == 0` has std 0.
    """
    if values.shape != ids.shape or (mask is not None and mask.shape != values.shape):
        raise ValueError(
            f"segment_stats: values {tuple(values.shape)}, ids {tuple(ids.shape)} and mask "
            f"{None if mask is None else tuple(mask.shape)} must have the same shape"
        )
    dense, n_seg = dense_ids(ids)
    idx = dense.reshape(-1)
    v = values.detach().reshape(-1).to(torch.float64)
    w = torch.ones_like(v) if mask is None else mask.reshape(-1).bool().to(torch.float64)
    v = torch.where(w > 0, v, torch.zeros_like(v))  # padding may hold anything, even nan
    count = torch.zeros(n_seg, dtype=torch.float64, device=v.device).index_add_(0, idx, w)
    total = torch.zeros_like(count).index_add_(0, idx, v * w)
    mean = total / count.clamp_min(1.0)
    dev = (v - mean[idx]) * w
    sq = torch.zeros_like(count).index_add_(0, idx, dev * dev)
    dof = count - (1.0 if unbiased else 0.0)
    std = torch.where(dof > 0, sq / dof.clamp_min(1.0), torch.zeros_like(sq)).sqrt()
    shape = values.shape
    return mean[idx].reshape(shape), std[idx].reshape(shape), count[idx].reshape(shape)


def _check_response_inputs(rewards: Tensor, group: Tensor, mask: Tensor) -> None:
    if mask.dim() != 2 or rewards.shape != (mask.shape[0],) or group.shape != (mask.shape[0],):
        raise ValueError(
            f"expected rewards [N], group [N] and mask [N, T]; got rewards {tuple(rewards.shape)}, "
            f"group {tuple(group.shape)}, mask {tuple(mask.shape)}"
        )
    if group.dtype.is_floating_point or group.dtype == torch.bool:
        raise ValueError(f"group must be an integer tensor of prompt ids, got dtype {group.dtype}")


def grpo(rewards: Tensor, group: Tensor, mask: Tensor, *, scale: bool = True, eps: float = 1e-6) -> Tensor:
    """Group-relative advantage of GRPO, broadcast over the response tokens (METHODS.md section 1).

    `A_i = (r_i - mean_g(r)) / (std_g(r) + eps)` with the mean and the **unbiased** standard deviation over
    the responses of group g (as verl and TRL compute it). GRPO: Shao et al. 2024, "DeepSeekMath", section 4.1.2
    (outcome supervision). `scale=False` drops the division, `A_i = r_i - mean_g(r)`: Dr.GRPO, Liu et al. 2025,
    "Understanding R1-Zero-like Training: A Critical Perspective" ("GRPO Done Right").

    A group of size 1, or one whose rewards are all equal, gets advantage exactly 0 (compared exactly, so that
    rounding in the mean cannot leak a tiny deviation that `/ (std + eps)` would blow up).

    Args:
        rewards: `[N]` one scalar reward per response.
        group: `[N]` int64 prompt ids; arbitrary values, any order, any group sizes.
        mask: `[N, T]` 1 on response tokens, 0 on padding.
        scale: divide by `std + eps` (GRPO) or not (Dr.GRPO).
        eps: added to the standard deviation.
    Returns:
        `[N, T]` advantages in the floating dtype of `rewards` (float32 for integer rewards), 0.0 where `mask == 0`.
    """
    _check_response_inputs(rewards, group, mask)
    out_dtype = rewards.dtype if rewards.dtype.is_floating_point else torch.float32
    if rewards.numel() == 0:
        return torch.zeros(mask.shape, dtype=out_dtype, device=mask.device)
    r = rewards.detach().to(torch.float64)
    dense, n_groups = dense_ids(group)
    mean, std, count = segment_stats(r, dense, unbiased=True)
    hi = torch.full((n_groups,), -torch.inf, dtype=r.dtype, device=r.device).scatter_reduce(0, dense, r, "amax")
    lo = torch.full((n_groups,), torch.inf, dtype=r.dtype, device=r.device).scatter_reduce(0, dense, r, "amin")
    adv = r - mean
    if scale:
        adv = adv / (std + eps)
    degenerate = (count < 2) | (hi == lo)[dense]
    adv = torch.where(degenerate, torch.zeros_like(adv), adv).to(out_dtype)
    return torch.where(mask.bool(), adv[:, None], torch.zeros((), dtype=out_dtype, device=adv.device))


# ------------------------------------------------------------------------------------------------------------
# registry adapters: (batch, cfg) -> advantages[N, T]


@register_advantage("grpo")
def _grpo_adapter(batch: dict[str, Tensor], cfg: AlgoConfig) -> Tensor:
    """GRPO (Shao et al. 2024): group z-score with unbiased std."""
    return grpo(batch["rewards"], batch["group"], batch["mask"], eps=cfg.adv_eps)


@register_advantage("dr_grpo")
def _dr_grpo_adapter(batch: dict[str, Tensor], cfg: AlgoConfig) -> Tensor:
    """Dr.GRPO (Liu et al. 2025): group mean baseline, no std division."""
    return grpo(batch["rewards"], batch["group"], batch["mask"], scale=False, eps=cfg.adv_eps)
