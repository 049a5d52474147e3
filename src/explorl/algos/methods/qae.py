"""QAE: GRPO's group advantage with a K-quantile of the group's rewards as the baseline instead of their mean.

QAE: Junkang Wu, Kexin Huang, Jiancan Wu, An Zhang, Xiang Wang, Xiangnan He (2025), "Quantile Advantage Estimation for
  Entropy-Safe Reasoning", arXiv 2509.22611.

Implements QAE's advantage (docs/methods.md §5u): `A_i = (r_i - b_K(g)) / (std_g(r) + eps)` with
`b_K(g) = inf{x : F_g(x) >= K}`, the K-quantile of the empirical distribution F_g of the rewards of the group g of
response i (the paper's definition), and the unbiased std of the group (GRPO's, whose mean it replaces). With 0/1
rewards and success rate p of the group, `b_K = 0` when `p <= 1 - K` (only the rare correct responses get an
advantage, > 0) and `b_K = 1` when `p > 1 - K` (only the remaining wrong ones, < 0): the paper's two-regime gate
(eq. 4). Estimator `qae`, options `algo.qae.<field>` (`QaeOptions`): `k` 0.4 (the value the authors recommend and
run), `interpolation` (`inverse_cdf`, the paper's definition; `linear`, `torch.quantile`'s default, which the authors'
released one-line change calls), `scale` (the division by `std + algo.adv_eps`, true as in their DAPO/GRPO recipe).

Source: the paper's abstract; a third-party summary of the paper for the baseline's definition and eq. 4 (the
paper's own text was not available here, so its equation numbers are not checked); the authors' README of
junkangwu/QAE (the change to verl's `compute_grpo_outcome_advantage`: the group mean replaced by
`torch.quantile(scores, quantile_k)` when `0 < quantile_k < 1`, `quantile_k = 0.4` passed to verl's DAPO recipe).
The repository's code itself could not be fetched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from explorl.algos.core import (check_response_inputs, dense_ids, float_dtype, group_range_equal, on_response_tokens,
                                segment_stats)
from explorl.algos.registry import Cite, register

if TYPE_CHECKING:
    from explorl.algos.batch import RolloutBatch
    from explorl.config.schema import AlgoConfig

INTERPOLATIONS = ("inverse_cdf", "linear")


def group_quantile(rewards: Tensor, group: Tensor, k: float, *, interpolation: str = "inverse_cdf") -> Tensor:
    """`[N]` float64: the K-quantile of the rewards of each response's group, broadcast to the response.

    `inverse_cdf`: `inf{x : F(x) >= k}` with F the empirical CDF of the group's n rewards, i.e. the
    `ceil(k * n)`-th smallest reward (QAE's definition). `linear`: `torch.quantile`'s default, the value at
    fractional position `k * (n - 1)` of the sorted rewards, interpolated between its two neighbours.
    """
    if not 0.0 < k < 1.0:
        raise ValueError(f"k must be in (0, 1), got {k}")
    if interpolation not in INTERPOLATIONS:
        raise ValueError(f"interpolation must be one of {INTERPOLATIONS}, got {interpolation!r}")
    r = rewards.detach().to(torch.float64)
    dense, n_groups = dense_ids(group)
    # sort by (group, reward): each group's rewards become one ascending run
    order = torch.argsort(r, stable=True)
    order = order[torch.argsort(dense[order], stable=True)]
    sorted_r = r[order]
    count = torch.bincount(dense, minlength=n_groups)
    start = torch.cumsum(count, 0) - count  # first position of each group in the sorted order
    n = count.to(torch.float64)
    if interpolation == "inverse_cdf":
        # smallest 1-based rank j with j / n >= k; the tolerance keeps k * n = 3.0000000000000004 at rank 3
        rank = torch.ceil(k * n - 1e-9 * n).clamp(min=1.0)
        out = sorted_r[start + rank.long() - 1]
    else:
        pos = k * (n - 1.0)
        lo = torch.floor(pos)
        frac = pos - lo
        hi = torch.minimum(lo + 1.0, n - 1.0)
        out = sorted_r[start + lo.long()] * (1.0 - frac) + sorted_r[start + hi.long()] * frac
    return out[dense]


def qae(rewards: Tensor, group: Tensor, mask: Tensor, *, k: float = 0.4, interpolation: str = "inverse_cdf",
        scale: bool = True, eps: float = 1e-6) -> Tensor:
    """QAE's advantage (docs/methods.md §5u; Wu et al. 2025, "Quantile Advantage Estimation for Entropy-Safe
    Reasoning", the K-quantile baseline and its two-regime gate, eq. 4), broadcast over the response tokens.

    `A_i = (r_i - b_K(g)) / (std_g(r) + eps)`, `b_K(g)` the K-quantile of the rewards of the group g of response
    i (`group_quantile`), `std_g` their unbiased standard deviation (as `grpo`); `scale=False` drops the division.
    A group of one response, or one whose rewards all agree, gets exactly 0 (as `grpo`).

    Args:
        rewards: `[N]` one scalar reward per response.
        group: `[N]` int64 prompt ids; arbitrary values, any order, any group sizes.
        mask: `[N, T]` 1 on response tokens, 0 on padding.
        k: the quantile level K, in (0, 1).
        interpolation: `inverse_cdf` (the paper's definition) or `linear` (`torch.quantile`'s default).
        scale: divide by `std + eps`.
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
    adv = r - group_quantile(r, dense, k, interpolation=interpolation)
    if scale:
        adv = adv / (std + eps)
    degenerate = (count < 2) | group_range_equal(r, dense, n_groups, torch.ones_like(r, dtype=torch.bool))
    adv = torch.where(degenerate, torch.zeros_like(adv), adv)
    return on_response_tokens(adv, mask, out_dtype)


@dataclass
class QaeOptions:
    """QAE's options, `algo.qae.<field>` (Wu et al. 2025; docs/methods.md §5u)."""

    k: float = 0.4
    """The quantile level K in (0, 1) of the group baseline: larger K, fewer responses with a nonzero advantage
    (0.4: the authors' recommended and released value)."""
    interpolation: str = "inverse_cdf"
    """`inverse_cdf`: the paper's quantile inf{x : F(x) >= K} (a reward of the group); `linear`: torch.quantile's
    default interpolation, which the authors' released code calls."""
    scale: bool = True
    """Divide by the group's unbiased std + algo.adv_eps, as GRPO/DAPO (the authors change only the baseline)."""


def _check_qae(cfg) -> str | None:
    o = cfg.algo.options["qae"]
    if not 0.0 < o.k < 1.0:
        return f"algo.qae.k: must be in (0, 1), got {o.k}"
    if o.interpolation not in INTERPOLATIONS:
        return f"algo.qae.interpolation: must be one of {', '.join(INTERPOLATIONS)}, got {o.interpolation!r}"
    return None


@register("estimator", "qae", needs_old_logprobs=False, options=QaeOptions, check=_check_qae, reads=("adv_eps",),
          formula=(qae, group_quantile), cites=(Cite("QAE", "eq. 4", doc="5u"),))
def _qae_adapter(batch: RolloutBatch, cfg: AlgoConfig, *, options: QaeOptions) -> Tensor:
    """QAE (Wu et al. 2025): GRPO's advantage with the group's K-quantile reward as the baseline."""
    return qae(batch.rewards, batch.group, batch.mask, k=options.k, interpolation=options.interpolation,
               scale=options.scale, eps=cfg.adv_eps)
