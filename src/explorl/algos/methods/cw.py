"""Covariance-weighted advantages: CW-GRPO's Gaussian-kernel reweighting and explorl's two readings.

CW-GRPO: Cheng Wang, Qin Liu, Wenxuan Zhou, Muhao Chen, "Taming Extreme Tokens: Covariance-Aware GRPO with
  Gaussian-Kernel Advantage Reweighting" (arXiv 2605.11538).

Implements the token covariance (section 2.2, Figure 3 and Table 1) and the Gaussian-kernel weights with
bandwidth sigma (section 2.3); docs/methods.md §4. Shapers `cw` (statistics over the whole batch: explorl's
reading), `cw_group` (per group, as section 2.3 writes it) and `cw_balanced` (explorl's sign-balanced variant,
in no paper), sharing the options `algo.cw.<field>` (`CwOptions`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from explorl.algos.core import check_token_inputs, dense_ids, float_dtype, segment_stats
from explorl.algos.registry import Cite, register

if TYPE_CHECKING:
    from explorl.algos.batch import RolloutBatch
    from explorl.config.schema import AlgoConfig


def token_covariance(advantages: Tensor, logprobs: Tensor, mask: Tensor, group: Tensor | None = None) -> Tensor:
    """Token covariance `c = (logprobs - mean(logprobs)) * (A - mean(A))` of CW-GRPO (section 2.2, Figure 3 and
    Table 1; docs/methods.md §4): the per-token term whose extremes covariance weighting suppresses.

    Both means are over the valid tokens of the whole batch (`group` None: `cw`'s reading) or of each prompt's
    group (`group` given: the paper's per-group form, `cw_group`). `cov_weights` and `cov_weights_grouped` build
    their kernels on this `c`; `experiments.probes` reports its distribution.

    Args:
        advantages, logprobs, mask: `[N, T]` (old-policy log-probs of the sampled tokens; 1 on response tokens).
        group: `[N]` prompt ids, or None for batch-wide means.
    Returns:
        `[N, T]` float64, 0.0 where `mask == 0`.
    """
    check_token_inputs(mask, advantages=advantages, logprobs=logprobs)
    valid = mask.bool()
    f64 = torch.float64
    zero = torch.zeros((), dtype=f64, device=mask.device)
    lp = torch.where(valid, logprobs.detach().to(f64), zero)
    a = torch.where(valid, advantages.detach().to(f64), zero)
    if group is None:
        n_valid = int(valid.sum())
        if n_valid == 0:
            return torch.zeros(mask.shape, dtype=f64, device=mask.device)
        lp_c = torch.where(valid, lp - lp.sum() / n_valid, zero)
        a_c = torch.where(valid, a - a.sum() / n_valid, zero)
        return lp_c * a_c
    ids = group[:, None].expand(mask.shape)
    lp_mean, _, _ = segment_stats(lp, ids, valid)
    a_mean, _, _ = segment_stats(a, ids, valid)
    return torch.where(valid, (lp - lp_mean) * (a - a_mean), zero)


def _kernel(c: Tensor, var: Tensor, valid: Tensor, bandwidth: float) -> Tensor:
    """CW-GRPO's unnormalised Gaussian kernel `w = exp(-c^2 / (2 (bandwidth * sigma)^2))` (section 2.3), the one
    place it is written: `c` the token covariance `[N, T]` float64, `var` = sigma^2 its population variance over
    the tokens the statistics cover (0-d for the whole batch, `[N, T]` per group); sigma 0 gives w = 1.
    Returns float64 `[N, T]`, 0 on padding."""
    sigma2 = var * (bandwidth * bandwidth)  # bandwidth 1: exactly sigma^2 (x * 1.0 == x)
    # where sigma2 == 0 the division gives inf or nan, which `where` never selects (no gradient flows here)
    w = torch.where(sigma2 > 0, torch.exp(-(c * c) / (2.0 * sigma2)), torch.ones_like(c))
    return torch.where(valid, w, torch.zeros((), dtype=c.dtype, device=c.device))


def _group_kernel(advantages: Tensor, logprobs: Tensor, group: Tensor, mask: Tensor,
                  bandwidth: float = 1.0) -> Tensor:
    """`_kernel` with `c`, its means and sigma taken over each group's valid tokens; float64 `[N, T]`, 0 on
    padding."""
    valid = mask.bool()
    c = token_covariance(advantages, logprobs, mask, group)
    _, c_std, _ = segment_stats(c, group[:, None].expand(mask.shape), valid)
    return _kernel(c, c_std.to(torch.float64) ** 2, valid, bandwidth)


def _normalise_per_segment(w: Tensor, ids: Tensor, valid: Tensor) -> Tensor:
    """`w` divided by its mean over the valid tokens of each segment `ids` (weights average 1 per segment)."""
    zero = torch.zeros((), dtype=w.dtype, device=w.device)
    w_mean, _, _ = segment_stats(w, ids, valid)
    return torch.where(valid, w / w_mean.to(w.dtype).clamp_min(1e-300), zero)


def cov_weights_grouped(advantages: Tensor, logprobs: Tensor, group: Tensor, mask: Tensor, *,
                        bandwidth: float = 1.0) -> Tensor:
    """`cov_weights` computed within each prompt's group, as CW-GRPO section 2.3 writes it: means, sigma and the
    normaliser `N / sum w` over the valid tokens of the group's G responses (N = that group's token count).
    `cov_weights` takes them over the whole batch instead, explorl's reading (`cw`; docs/methods.md §4).
    `group`: [N] prompt ids; `bandwidth`: the kernel's width as a multiple of sigma (as in `cov_weights`).
    Returns [N, T] float64 weights averaging 1 over each group's valid tokens."""
    w = _group_kernel(advantages, logprobs, group, mask, bandwidth)
    return _normalise_per_segment(w, group[:, None].expand(mask.shape), mask.bool())


def cov_weights_balanced(advantages: Tensor, logprobs: Tensor, group: Tensor, mask: Tensor, *,
                         bandwidth: float = 1.0) -> Tensor:
    """Sign-balanced covariance weights: explorl's variant of CW-GRPO's, not the paper's (docs/methods.md §4).

    The kernel is the paper's per-group one (`cov_weights_grouped`), but the normaliser is taken separately over
    the group's positive-, zero- and negative-advantage valid tokens, so the weights average 1 within each
    (group, sign). Why: with the paper's single normaliser the rare outcome's low-probability tokens carry the
    extreme covariance, so `w~ * A` loses mass of the minority sign and the token advantages drift toward the
    common outcome's sign (measured: bench/cw_weights.py). Here, when the advantage is constant within each
    (group, sign) (GRPO with binary rewards), `sum w~ * A` over each sign of each group equals `sum A`: the
    down-weighting only moves credit between tokens of one sign.

    Args:
        advantages, logprobs, mask: `[N, T]`; group: `[N]` prompt ids.
        bandwidth: the kernel's width as a multiple of sigma (as in `cov_weights`).
    Returns:
        `[N, T]` float64 weights, 0 on padding, averaging 1 over the valid tokens of each (group, advantage sign).
    """
    w = _group_kernel(advantages, logprobs, group, mask, bandwidth)
    dense, _ = dense_ids(group)
    sign = torch.sign(advantages.detach()).to(torch.long) + 1  # 0, 1, 2 for A < 0, = 0, > 0
    return _normalise_per_segment(w, dense[:, None] * 3 + sign, mask.bool())


def cov_weights(advantages: Tensor, logprobs: Tensor, mask: Tensor, *, bandwidth: float = 1.0) -> Tensor:
    """Normalised Gaussian-kernel covariance weights `w~` of covariance-weighted GRPO (docs/methods.md §4;
    Wang et al. 2026, "Taming Extreme Tokens: Covariance-Aware GRPO with Gaussian-Kernel Advantage Reweighting",
    section 2.3).

    `c = (logprobs - mean(logprobs)) * (A - mean(A))`, both means over all valid tokens of the batch;
    `w = exp(-c^2 / (2 (bandwidth * sigma)^2))` with sigma the population std of c over the valid tokens
    (sigma == 0 gives w = 1); `w~ = w * n_valid / sum(w)`, so `w~` averages exactly 1 over the valid tokens.
    `bandwidth` 1 is the paper's kernel (its bandwidth is sigma); larger values suppress fewer tokens, smaller more.

    Readings: the paper's means are "over responses" and its normaliser sums over one group's tokens; this
    function (`cw`, explorl's reading, docs/methods.md §4) takes both over the valid tokens of the whole batch;
    `cov_weights_grouped` is the paper's per-group form. The paper writes the current policy's `log pi_theta`;
    the weights are computed once from the old policy's `logprobs`, before the update.

    Args:
        advantages: `[N, T]` token advantages (e.g. GRPO's, broadcast over tokens).
        logprobs: `[N, T]` old-policy log-probabilities of the sampled tokens.
        mask: `[N, T]` 1 on response tokens, 0 on padding.
        bandwidth: the kernel's width as a multiple of sigma (> 0; CW-GRPO: 1).
    Returns:
        `[N, T]` float64 weights `w~`, 0.0 where `mask == 0` (all zeros when no token is valid).
    """
    valid = mask.bool()
    n_valid = int(valid.sum())
    c = token_covariance(advantages, logprobs, mask)
    if n_valid == 0:
        return torch.zeros(mask.shape, dtype=torch.float64, device=mask.device)
    c_mean = c.sum() / n_valid
    var = (torch.where(valid, c - c_mean, torch.zeros((), dtype=c.dtype, device=c.device)) ** 2).sum() / n_valid
    w = _kernel(c, var, valid, bandwidth)
    return w * (n_valid / w.sum())


def cov_weighted(advantages: Tensor, logprobs: Tensor, mask: Tensor, *, bandwidth: float = 1.0) -> Tensor:
    """Covariance-weighted GRPO advantage `w~ * A` (docs/methods.md §4; CW-GRPO, section 2.3, the
    reweighted token loss). See `cov_weights` for `w~`; the paper's only setting is its bandwidth (sigma).

    Args:
        advantages: `[N, T]` token advantages.
        logprobs: `[N, T]` old-policy log-probabilities of the sampled tokens.
        mask: `[N, T]` 1 on response tokens, 0 on padding.
        bandwidth: the kernel's width as a multiple of sigma (CW-GRPO: 1).
    Returns:
        `[N, T]` in the floating dtype of `advantages` (float32 otherwise), 0.0 where `mask == 0`.
    """
    out_dtype = float_dtype(advantages)
    w = cov_weights(advantages, logprobs, mask, bandwidth=bandwidth)
    zero = torch.zeros((), dtype=torch.float64, device=mask.device)
    out = torch.where(mask.bool(), w * advantages.detach().to(torch.float64), zero)
    return out.to(out_dtype)


@dataclass
class CwOptions:
    """Covariance weighting's options, `algo.cw.<field>`, shared by `cw`, `cw_group` and `cw_balanced` (CW-GRPO;
    docs/methods.md §4)."""

    bandwidth: float = 1.0
    """Width of the Gaussian kernel as a multiple of sigma, w = exp(-c^2 / (2 (bandwidth * sigma)^2)). 1 =
    CW-GRPO's (section 2.3 sets the bandwidth to sigma); larger suppresses fewer tokens, smaller more."""


def _check_cw(cfg) -> str | None:
    b = cfg.algo.options["cw"].bandwidth
    return None if 0 < b < math.inf else (f"algo.cw.bandwidth: must be > 0 and finite (a multiple of sigma; 1 = "
                                          f"CW-GRPO's kernel), got {b}")


@register("shaper", "cw", options=CwOptions, check=_check_cw,  # the paper's kernel over the batch: explorl's reading
          formula=cov_weighted, cites=(Cite("CW-GRPO", "section 2.3", doc="4"), Cite("explorl", doc="4")))
def _cw_shaper(advantages: Tensor, batch: RolloutBatch, cfg: AlgoConfig, step: int, *, options: CwOptions) -> Tensor:
    """Covariance-weighted advantages (CW-GRPO), batch-wide statistics; kernel width `bandwidth` * sigma."""
    batch.require("logprobs", by="shaper 'cw'")
    return cov_weighted(advantages, batch.logprobs, batch.mask, bandwidth=options.bandwidth)


def _masked(weights: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """`weights * advantages` on valid tokens (computed in float64), exactly 0 elsewhere."""
    return torch.where(mask.bool(), (weights * advantages.detach().to(torch.float64)).to(advantages.dtype),
                       torch.zeros((), dtype=advantages.dtype, device=advantages.device))


@register("shaper", "cw_group", options_from="cw", check=_check_cw, formula=cov_weights_grouped,
          cites=(Cite("CW-GRPO", "section 2.3", doc="4"),))
def _cw_group_shaper(advantages: Tensor, batch: RolloutBatch, cfg: AlgoConfig, step: int, *,
                     options: CwOptions) -> Tensor:
    """Covariance-weighted advantages with CW-GRPO's per-group statistics (`cov_weights_grouped`)."""
    batch.require("logprobs", by="shaper 'cw_group'")
    w = cov_weights_grouped(advantages, batch.logprobs, batch.group, batch.mask, bandwidth=options.bandwidth)
    return _masked(w, advantages, batch.mask)


@register("shaper", "cw_balanced", options_from="cw", check=_check_cw,  # explorl's variant of the paper's kernel
          formula=cov_weights_balanced, cites=(Cite("explorl", doc="4"), Cite("CW-GRPO", "section 2.3", doc="4")))
def _cw_balanced_shaper(advantages: Tensor, batch: RolloutBatch, cfg: AlgoConfig, step: int, *,
                        options: CwOptions) -> Tensor:
    """Sign-balanced covariance weights (`cov_weights_balanced`): explorl's variant of CW-GRPO, not the paper's."""
    batch.require("logprobs", by="shaper 'cw_balanced'")
    w = cov_weights_balanced(advantages, batch.logprobs, batch.group, batch.mask, bandwidth=options.bandwidth)
    return _masked(w, advantages, batch.mask)
