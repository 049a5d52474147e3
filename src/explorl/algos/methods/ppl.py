"""STILL's PPL-based advantage shaping.

STILL: Jia Deng, Jie Chen, Zhipeng Chen, Daixuan Cheng, Fei Bai, Beichen Zhang, Yinqian Min, Yanzipeng Gao, Wayne
  Xin Zhao, Ji-Rong Wen, "From Trial-and-Error to Improvement: A Systematic Analysis of LLM Exploration Mechanisms
  in RLVR" (no arXiv id recorded).

Implements section 4.4.2, eqs. 7 and 11: each response's advantage scaled by `1 - alpha * w`, w its
standardised log-perplexity within its group (docs/methods.md §7a), with the public code's IQR filter and clamp
as options. Shaper `ppl`, options `algo.ppl.<field>` (`PplOptions`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from explorl.algos.core import check_token_inputs, dense_ids, float_dtype, group_range_equal, segment_stats
from explorl.algos.registry import Cite, register

if TYPE_CHECKING:
    from explorl.algos.batch import RolloutBatch
    from explorl.config.schema import AlgoConfig


def _segment_quantile(values: Tensor, dense: Tensor, n_seg: int, counted: Tensor, q: float) -> Tensor:
    """Per-segment q-quantile of the counted 1-D `values`, linear interpolation between order statistics
    (position `q * (n - 1)`, as `torch.quantile` / numpy's default), broadcast back to every element.

    Vectorised: one stable sort by value, then one stable sort by segment (uncounted elements sort last within
    their segment and are not indexed). A segment with nothing counted gets 0.
    """
    v = values.to(torch.float64)
    key_v = torch.where(counted, v, torch.full_like(v, torch.inf))
    order = torch.sort(key_v, stable=True).indices
    order = order[torch.sort(dense[order], stable=True).indices]  # by segment, then value
    sorted_v = key_v[order]
    count = torch.zeros(n_seg, dtype=torch.long, device=v.device).index_add_(0, dense, counted.to(torch.long))
    size = torch.zeros(n_seg, dtype=torch.long, device=v.device).index_add_(0, dense, torch.ones_like(dense))
    start = torch.cumsum(size, 0) - size
    pos = q * (count - 1).clamp_min(0).to(torch.float64)
    lo = pos.floor().to(torch.long)
    hi = pos.ceil().to(torch.long)
    frac = pos - lo.to(torch.float64)
    last = (start + size - 1).clamp_min(0)
    v_lo = sorted_v[torch.minimum(start + lo, last)]
    v_hi = sorted_v[torch.minimum(start + hi, last)]
    qv = v_lo + frac * (v_hi - v_lo)
    qv = torch.where(count > 0, qv, torch.zeros_like(qv))
    return qv[dense]


def ppl_shaped(
    advantages: Tensor,
    logprobs: Tensor,
    group: Tensor,
    mask: Tensor,
    *,
    alpha: float = 0.01,
    iqr_filter: bool = False,
    clamp: tuple[float, float] | None = None,
) -> Tensor:
    """PPL-based advantage shaping (docs/methods.md §7a; Deng et al. 2025, "From Trial-and-Error to Improvement:
    A Systematic Analysis of LLM Exploration Mechanisms in RLVR", section 4.4.2, eqs. 7 and 11).

    `log_ppl_i = -mean_t logprobs_i` over the valid tokens of response i;
    `w_i = (log_ppl_i - mean_g) / std_g` with the mean and population std over the responses of the group
    (std 0 gives w = 0); `A~ = A * (1 - alpha * w_i)`. Low-perplexity responses get larger updates.

    Options reproducing the authors' public code (off by default):
      - `iqr_filter`: the group's mean and std are computed over its inliers only, the responses whose log-PPL
        lies in `[Q1 - 1.5 IQR, Q3 + 1.5 IQR]` (quantiles with linear interpolation, bounds inclusive); every
        response, outliers included, is then standardised with those statistics.
      - `clamp=(lo, hi)`: the factor `1 - alpha * w_i` is clamped to `[lo, hi]` (the public code uses (0.8, 1.2)).
    Readings: responses without valid tokens take no part in the group statistics (and get 0). "std 0" is
    decided exactly (all counted log-PPLs equal), so rounding in a constant group's mean cannot produce a w.

    Args:
        advantages: `[N, T]` token advantages.
        logprobs: `[N, T]` old-policy log-probabilities of the sampled tokens.
        group: `[N]` int64 prompt ids; arbitrary values, any order, any group sizes.
        mask: `[N, T]` 1 on response tokens, 0 on padding.
        alpha: shaping strength (paper: 0.01).
        iqr_filter: drop 1.5-IQR outliers from the group statistics.
        clamp: optional `(lo, hi)` bounds of the factor.
    Returns:
        `[N, T]` in the floating dtype of `advantages` (float32 otherwise), 0.0 where `mask == 0`.
    """
    check_token_inputs(mask, advantages=advantages, logprobs=logprobs)
    if group.shape != (mask.shape[0],) or group.dtype.is_floating_point or group.dtype == torch.bool:
        raise ValueError(f"expected integer group [N] with N = {mask.shape[0]}, got {group.dtype} {tuple(group.shape)}")
    out_dtype = float_dtype(advantages)
    f64 = torch.float64
    zero = torch.zeros((), dtype=f64, device=mask.device)
    valid = mask.bool()
    if mask.numel() == 0:
        return torch.zeros(mask.shape, dtype=out_dtype, device=mask.device)
    length = valid.sum(dim=1)
    has_tokens = length > 0
    log_ppl = -torch.where(valid, logprobs.detach().to(f64), zero).sum(dim=1) / length.clamp_min(1).to(f64)
    dense, n_groups = dense_ids(group)
    counted = has_tokens
    if iqr_filter:
        q1 = _segment_quantile(log_ppl, dense, n_groups, has_tokens, 0.25)
        q3 = _segment_quantile(log_ppl, dense, n_groups, has_tokens, 0.75)
        iqr = q3 - q1
        counted = has_tokens & (log_ppl >= q1 - 1.5 * iqr) & (log_ppl <= q3 + 1.5 * iqr)
    mean, std, _ = segment_stats(log_ppl, dense, counted)
    constant = group_range_equal(log_ppl, dense, n_groups, counted)
    w = torch.where(constant, zero, (log_ppl - mean) / torch.where(constant, torch.ones_like(std), std))
    factor = 1.0 - alpha * w
    if clamp is not None:
        factor = factor.clamp(clamp[0], clamp[1])
    out = torch.where(valid, advantages.detach().to(f64) * factor[:, None], zero)
    return out.to(out_dtype)


@dataclass
class PplOptions:
    """PPL shaping's options, `algo.ppl.<field>` (STILL section 4.4.2; docs/methods.md §7)."""

    alpha: float = 0.01
    """alpha in A * (1 - alpha * w_ppl)."""
    iqr_filter: bool = False
    """Drop 1.5-IQR outliers from the group statistics (as the public code does)."""
    clamp: list[float] | None = None
    """Optional [lo, hi] clamp of the factor 1 - alpha * w (the public code uses [0.8, 1.2])."""


def _check_ppl(cfg) -> str | None:
    c = cfg.algo.options["ppl"].clamp
    if c is None or (len(c) == 2 and 0 <= c[0] <= c[1]):
        return None
    return f"algo.ppl.clamp: expected [lo, hi] with 0 <= lo <= hi, got {c}"


@register("shaper", "ppl", options=PplOptions, check=_check_ppl, formula=ppl_shaped,
          cites=(Cite("STILL", "section 4.4.2, eq. 7, eq. 11", doc="7, 7a"),))
def _ppl_shaper(advantages: Tensor, batch: RolloutBatch, cfg: AlgoConfig, step: int, *,
                options: PplOptions) -> Tensor:
    """PPL shaping (STILL, section 4.4.2): favours low-perplexity responses of each group, every step."""
    batch.require("logprobs", by="shaper 'ppl'")
    clamp = None if options.clamp is None else tuple(options.clamp)
    return ppl_shaped(advantages, batch.logprobs, batch.group, batch.mask, alpha=options.alpha,
                      iqr_filter=options.iqr_filter, clamp=clamp)
