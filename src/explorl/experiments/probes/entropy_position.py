"""Mean token entropy at each absolute output position (EAD, Figure 1: entropy shrinks with the position)."""

from __future__ import annotations

import torch
from torch import Tensor


def entropy_by_absolute_position(entropy: Tensor, mask: Tensor, *, bin_size: int = 1) -> dict:
    """Mean token entropy at each absolute output position (EAD, Figure 1: entropy shrinks with the
    position), pooled over responses; `analysis.measures.entropy_by_position` bins relative positions instead.

    The t-th valid token (0-based, counting valid tokens, so padding anywhere is skipped) falls in bin
    `t // bin_size`. There are `ceil(L_max / bin_size)` bins, L_max the longest response.

    Args:
        entropy: `[N, T]` token entropies; mask: `[N, T]` 1 / True on response tokens.
        bin_size: positions per bin (>= 1).
    Returns:
        `{"start": [B] first position of each bin, "mean": [B] float64 (NaN for an empty bin), "count": [B] int64
        tokens per bin}` (tensors on the CPU).
    """
    if entropy.dim() != 2 or entropy.shape != mask.shape:
        raise ValueError(f"entropy_by_absolute_position: need [N, T] entropy and mask, got {tuple(entropy.shape)} "
                         f"and {tuple(mask.shape)}")
    if bin_size < 1:
        raise ValueError(f"bin_size must be >= 1, got {bin_size}")
    valid = (mask > 0).cpu()
    rank = valid.long().cumsum(-1) - 1
    longest = int(valid.sum(-1).max()) if valid.numel() else 0
    bins = -(-longest // bin_size)
    b = (rank // bin_size)[valid]
    vals = entropy.detach().cpu().double()[valid]
    sums = torch.zeros(bins, dtype=torch.float64).index_add_(0, b, vals)
    counts = torch.zeros(bins, dtype=torch.long).index_add_(0, b, torch.ones_like(b))
    mean = torch.where(counts > 0, sums / counts.clamp_min(1), torch.full_like(sums, float("nan")))
    return {"start": (torch.arange(bins) * bin_size).tolist(), "mean": mean, "count": counts}
