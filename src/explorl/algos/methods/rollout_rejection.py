"""Rollout correction's rejection sampling: tokens or responses whose rollout/trainer divergence is out of bounds
leave the loss mask.

When Speed Kills Stability: Liu, Li, Fu, Wang, Liu, Shen 2025, "When Speed Kills Stability: Demystifying RL Collapse
  from the Training-Inference Mismatch" (a blog post, https://richardli.xyz/rl-collapse, that verl 0.9.1's
  `verl/trainer/ppo/rollout_corr_helper.py` cites; no arXiv id recorded).

Implements verl 0.9.1's `rollout_rs` (`compute_rollout_rejection_mask`; docs/methods.md §6d) as the reward shaper
`rollout_rs` (`algo.reward_shapers=[rollout_rs]`, options `algo.rollout_rs.<field>`). With `x = clamp(log pi_old -
log mu, -20, 20)` per token (`mu` the distribution sampled, `RolloutBatch.behavior_logprobs`) the divergences are
`k1 = -x`, `k2 = x^2 / 2`, `k3 = exp(x) - 1 - x`; a mode `<level>_<k>` takes one per token (`token`) or their sum,
mean or max over the response (`seq_sum`, `seq_mean`, `seq_max`), and keeps a token (a response) when it is within
its bound: `log(lower) <= k1 <= log(upper)` for k1 (bounds on the ratio `mu / pi_old`, as verl compares `-log r`),
`k <= upper` for k2 and k3. `seq_mean_k1` is verl's geometric rejection (Geo-RS: the geometric mean of the token
ratios within the bounds). Several modes: a token is kept when every one keeps it (verl's comma-separated
`rollout_rs`). As a reward shaper it acts before the estimator on the loss mask, where verl edits `response_mask`
before `compute_advantage`, so a rejected token gets advantage 0 and no aggregation counts it. It composes with the
importance weights `rollout_is` (`explorl.algos.methods.rollout_correction`) as verl's `rollout_rs` with
`rollout_is`.

verl's spelling: `rollout_rs: "token_k1,seq_mean_k3"` = `algo.rollout_rs.modes=[token_k1,seq_mean_k3]`;
`rollout_rs_threshold: "0.5_2.0,0.01"` = `threshold=[2.0,0.01] threshold_lower=[0.5]`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import torch
from torch import Tensor

from explorl.algos.aggregation import masked_mean, masked_sum, zero_padding
from explorl.algos.core import LOG_RATIO_BOUND, check_token_inputs
from explorl.algos.registry import Cite, register

if TYPE_CHECKING:
    from explorl.algos.batch import RolloutBatch

RS_MODES: tuple[str, ...] = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
                             "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")
"""verl 0.9.1's `SUPPORTED_ROLLOUT_RS_OPTIONS`: `<level>_<divergence>`."""


def _divergence(x: Tensor, k: str) -> Tensor:
    return -x if k == "k1" else (0.5 * x * x if k == "k2" else torch.expm1(x) - x)


def _statistic(x: Tensor, valid: Tensor, mode: str) -> Tensor:
    """`[N, T]` mode `mode`'s statistic of each token: its own divergence, or its response's sum, mean or max of
    them over the valid tokens (0 for a response without any)."""
    level, k = mode.rsplit("_", 1)
    d = zero_padding(_divergence(x, k), valid)
    if level == "token":
        return d
    if level == "seq_sum":
        s = masked_sum(d, valid, dim=-1)
    elif level == "seq_mean":
        s = masked_mean(d, valid, dim=-1)
    else:
        s = torch.where(valid, d, torch.full((), -math.inf, dtype=d.dtype, device=d.device)).amax(-1)
        s = torch.where(valid.any(-1), s, torch.zeros((), dtype=d.dtype, device=d.device))
    return s[:, None].expand_as(d)


def rs_bounds(modes: list[str], upper: list[float], lower: list[float]) -> list[tuple[float | None, float]]:
    """(lower or None, upper) of each mode: `upper` one shared or one per mode; `lower` for the k1 modes only, none
    (then 1 / upper), one shared or one per k1 mode. ValueError naming what does not fit."""
    k1 = [m for m in modes if m.endswith("k1")]
    if not modes or len(set(modes)) != len(modes) or any(m not in RS_MODES for m in modes):
        raise ValueError(f"rollout_rs: modes must be distinct values of {', '.join(RS_MODES)}, got {modes}")
    if len(upper) not in (1, len(modes)) or len(lower) not in (0, 1, len(k1)) or (lower and not k1):
        raise ValueError(f"rollout_rs: {len(modes)} modes ({len(k1)} k1) need 1 or {len(modes)} thresholds and "
                         f"0, 1 or {len(k1)} lower thresholds; got {len(upper)} and {len(lower)}")
    ups = upper * len(modes) if len(upper) == 1 else list(upper)
    lows = iter(lower * len(k1) if len(lower) == 1 else list(lower))
    out = [(next(lows, 1.0 / u) if m.endswith("k1") else None, u) for m, u in zip(modes, ups)]
    if any(u <= 0 or (lo is not None and not 0 < lo <= u) for lo, u in out):
        raise ValueError(f"rollout_rs: thresholds must be > 0 with lower <= upper, got {out}")
    return out


def rejection_keep(log_ratio: Tensor, mask: Tensor, modes: list[str], upper: list[float],
                   lower: list[float] = ()) -> Tensor:
    """Which tokens rejection sampling keeps (verl 0.9.1's `compute_rollout_rejection_mask`; docs/methods.md §6d).

    Args:
        log_ratio: `[N, T]` `log pi_old - log mu` (`rollout_correction.rollout_log_ratio`); clamped to +-20 here.
        mask: `[N, T]` 1 on the tokens the loss counts.
        modes: the criteria (`RS_MODES`), all of which must keep a token.
        upper: the upper bounds, one shared or one per mode (k1: of the ratio `mu / pi_old`; k2, k3: of the
            divergence).
        lower: the lower bounds of the k1 modes' ratio: none (the reciprocal of the upper), one shared or one per
            k1 mode.
    Returns:
        `[N, T]` bool, True on the valid tokens kept, False on padding.
    """
    check_token_inputs(mask, log_ratio=log_ratio)
    bounds = rs_bounds(list(modes), list(upper), list(lower))
    valid = mask.bool()
    with torch.no_grad():
        x = zero_padding(log_ratio.detach(), valid).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
        keep = valid.clone()
        for mode, (lo, up) in zip(modes, bounds):
            stat = _statistic(x, valid, mode)
            if lo is not None:  # k1: bounds of the ratio, compared in log space
                keep &= (stat >= math.log(lo)) & (stat <= math.log(up))
            else:
                keep &= stat <= up
        return keep


@dataclass
class RolloutRsOptions:
    """Rejection sampling's options, `algo.rollout_rs.<field>` (verl 0.9.1's `algorithm.rollout_correction.
    rollout_rs*`; the defaults are its `decoupled_geo_rs` preset; docs/methods.md §6d)."""

    modes: list[Literal[RS_MODES]] = field(default_factory=lambda: ["seq_mean_k1"])
    """verl's `rollout_rs`: the criteria, each `<level>_<divergence>` (`RS_MODES`); a token is kept when every one
    keeps it. Default `seq_mean_k1`, the geometric-mean ratio (verl's Geo-RS)."""
    threshold: list[float] = field(default_factory=lambda: [1.001])
    """verl's `rollout_rs_threshold` (the upper of a `"lower_upper"` entry): one shared or one per mode; for k1 the
    upper bound of the ratio mu / pi_old, for k2 and k3 of the divergence. Each > 0."""
    threshold_lower: list[float] = field(default_factory=list)
    """The k1 modes' lower bounds of the ratio (the lower of verl's `"lower_upper"`): empty (then 1 / threshold,
    as verl; by default [1 / 1.001, 1.001], verl's preset's "0.999_1.001" within 1e-6), one shared or one per k1
    mode. Each in (0, its upper]; refused when no mode is k1."""


def _check_rollout_rs(cfg) -> str | None:
    o = cfg.algo.options["rollout_rs"]
    try:
        rs_bounds(list(o.modes), list(o.threshold), list(o.threshold_lower))
    except ValueError as e:
        return (f"algo.rollout_rs: {str(e).removeprefix('rollout_rs: ')} (modes {o.modes}, threshold "
                f"{o.threshold}, threshold_lower {o.threshold_lower})")
    bounds = rs_bounds(list(o.modes), list(o.threshold), list(o.threshold_lower))
    out = [m for m, (lo, up) in zip(o.modes, bounds) if lo is not None and not lo <= 1 <= up]
    if out:
        return (f"algo.rollout_rs: the ratio bounds of {', '.join(out)} leave out 1, so a token sampled exactly as "
                f"the trainer computes it is rejected; use threshold_lower <= 1 <= threshold")
    return None


@register("reward_shaper", "rollout_rs", needs_behavior=True, options=RolloutRsOptions, check=_check_rollout_rs,
          formula=rejection_keep, cites=(Cite("When Speed Kills Stability", doc="6d"),))
def rollout_rejection(batch: RolloutBatch, cfg, *, options: RolloutRsOptions) -> tuple[Tensor, Tensor]:
    """The loss mask less the tokens (responses) that verl's rejection sampling rejects (`rejection_keep`)."""
    batch.require("logprobs", "behavior_logprobs", by="algo.reward_shapers=[rollout_rs]")
    log_ratio = zero_padding(batch.logprobs.detach() - batch.behavior_logprobs.detach(), batch.mask)
    keep = rejection_keep(log_ratio, batch.mask, options.modes, options.threshold, options.threshold_lower)
    return batch.rewards, batch.mask * keep.to(batch.mask.dtype)
