"""The pieces every method shares: segment statistics, input checks, the k3 KL, importance ratios and the PPO clip,
the loss statistics, the token covariance of Clip-Cov / KL-Cov and top-k selection. Pure tensor functions, torch only;
the masked reductions, the loss aggregation (with E3's eq. 1 weights and the micro-batch accounting) and a policy
loss's per-token weights (`Reduction`) are `explorl.algos.aggregation`, the methods themselves
`explorl.algos.methods.<name>`, each one file.

Notation follows docs/methods.md: N responses padded to T tokens, `mask[N, T]` is 1 on response tokens, `group[N]`
(int64, arbitrary ids, any order) names the prompt of each response. Padding may hold any value (even inf or nan)
in the inputs: it is replaced before any arithmetic, so it reaches neither a statistic, the loss nor the gradient.

Deliberate difference from the bare formulas: the log-ratio `logp_new - logp_old` is clamped to [-20, 20] before
`exp` (as verl does), a numerical guard that only acts on ratios beyond 4.8e8 or below 2e-9.

Per-token multipliers never change the normaliser: `is_weights` and `token_weights` scale the token loss
(`explorl.algos.aggregation.Reduction`), and a token whose weight is 0 still counts in the `token-mean` denominator
(the number of valid tokens of `mask`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from explorl.algos.aggregation import LOSS_AGG_MODES, Reduction, masked_mean, zero_padding

__all__ = [
    "dense_ids", "segment_stats", "group_range_equal", "token_positions", "check_response_inputs",
    "check_token_inputs", "float_dtype", "on_response_tokens", "LOG_RATIO_BOUND", "kl_k3", "check_loss_inputs",
    "importance_ratio", "as_constant", "ppo_token_loss", "valid_fraction", "ratio_stats", "ppo_stats", "centered_cov",
    "top_k_mask",
]


# ----------------------------------------------------------------------------------------------------------------
# Segment statistics (per group, per bucket, ... without a Python loop over segments)


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


def group_range_equal(values: Tensor, dense: Tensor, n_seg: int, counted: Tensor) -> Tensor:
    """Per element: True when every counted element of its segment has the same value (or none is counted).

    Compared exactly (max == min), so a constant segment is recognised even where its float mean rounds.
    """
    v = values.reshape(-1).to(torch.float64)
    idx = dense.reshape(-1)
    c = counted.reshape(-1)
    hi = torch.full((n_seg,), -torch.inf, dtype=v.dtype, device=v.device).scatter_reduce(
        0, idx, torch.where(c, v, torch.full_like(v, -torch.inf)), "amax")
    lo = torch.full((n_seg,), torch.inf, dtype=v.dtype, device=v.device).scatter_reduce(
        0, idx, torch.where(c, v, torch.full_like(v, torch.inf)), "amin")
    same = (hi == lo) | torch.isinf(hi)  # isinf(hi): nothing counted in the segment
    return same[idx].reshape(values.shape)


def token_positions(valid: Tensor) -> tuple[Tensor, Tensor]:
    """1-based position `t` of each valid token among its response's valid tokens, and `|o_i|`.

    Counting valid tokens (a cumulative sum of the mask) rather than columns makes left padding harmless.
    Returns `(t[N, T] int64, length[N, 1] int64)`; `t` is meaningless where `valid` is False.
    """
    v = valid.to(torch.long)
    return v.cumsum(dim=1), v.sum(dim=1, keepdim=True)


# ----------------------------------------------------------------------------------------------------------------
# Input checks and the output dtype


def check_response_inputs(rewards: Tensor, group: Tensor, mask: Tensor) -> None:
    if mask.dim() != 2 or rewards.shape != (mask.shape[0],) or group.shape != (mask.shape[0],):
        raise ValueError(
            f"expected rewards [N], group [N] and mask [N, T]; got rewards {tuple(rewards.shape)}, "
            f"group {tuple(group.shape)}, mask {tuple(mask.shape)}"
        )
    if group.dtype.is_floating_point or group.dtype == torch.bool:
        raise ValueError(f"group must be an integer tensor of prompt ids, got dtype {group.dtype}")


def check_token_inputs(mask: Tensor, **token_tensors: Tensor) -> None:
    if mask.dim() != 2:
        raise ValueError(f"expected mask [N, T], got {tuple(mask.shape)}")
    for name, t in token_tensors.items():
        if t.shape != mask.shape:
            raise ValueError(f"expected {name} of shape {tuple(mask.shape)} like mask, got {tuple(t.shape)}")


def float_dtype(*tensors: Tensor) -> torch.dtype:
    """The output dtype: the first floating dtype among `tensors`, else float32."""
    for t in tensors:
        if t.dtype.is_floating_point:
            return t.dtype
    return torch.float32


def on_response_tokens(advantages: Tensor, mask: Tensor, dtype: torch.dtype) -> Tensor:
    """`[N, T]` advantages in `dtype` on the response tokens and 0.0 on padding: `advantages` is `[N]` (one per
    response, broadcast over its tokens, as the outcome estimators give it) or already `[N, T]`."""
    adv = (advantages[:, None] if advantages.dim() == 1 else advantages).to(dtype)
    return torch.where(mask.bool(), adv, torch.zeros((), dtype=dtype, device=adv.device))


# ----------------------------------------------------------------------------------------------------------------
# The k3 KL


LOG_RATIO_BOUND = 20.0


def kl_k3(logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor | None = None, *,
          clamp: float | None = None) -> Tensor:
    """Per-token k3 estimator of KL(pi || pi_ref) on sampled tokens: `exp(d) - d - 1`, `d = ref - logp`.

    Schulman 2020, "Approximating KL Divergence" (k3: unbiased, always >= 0); the GRPO KL term, Shao et al.
    2024 eq. 4. Computed as `expm1(d) - d`, accurate for small `d`.

    `clamp` (off by default; docs/methods.md §1 and §9) is verl 0.9's `low_var_kl` (`kl_penalty_forward` in
    verl/trainer/ppo/core_algos.py): the log-ratio is clamped to [-20, 20] before `exp`, and the estimate to
    `[-clamp, clamp]` (verl uses 10): `clip(exp(d') - d' - 1, -clamp, clamp)`, `d' = clip(d, -20, 20)`. The
    gradient is 0 on tokens where either clamp is active (so a token whose k3 exceeds `clamp` is not pulled back
    to the reference), as in verl. Since k3 >= 0 the lower bound never acts; the +-20 clamp changes the value only
    for `d < -20` when `clamp > 19` (k3(-20) = 19 + e^-20) or `d > 20` when `clamp > 4.85e8`. The one deliberate
    difference from verl's code is `expm1(d') - d'` for its `exp(d') - d' - 1` (equal up to rounding).

    Args:
        logprobs: `[N, T]` log-probabilities of the sampled tokens under the policy being optimised.
        ref_logprobs: `[N, T]` the same under the frozen reference model.
        mask: optional `[N, T]`; where 0 the output is exactly 0 (and padding values are never exponentiated).
        clamp: optional bound (> 0) of the estimate, with the +-20 log-ratio clamp; None: neither clamp.
    Returns:
        `[N, T]` non-negative per-token KL estimates (at most `clamp` when given).
    """
    if clamp is not None and not clamp > 0:
        raise ValueError(f"kl_k3: clamp must be > 0 (or None for no clamp), got {clamp!r}")
    d = ref_logprobs - logprobs
    if mask is not None:
        d = zero_padding(d, mask)
    if clamp is not None:
        d = d.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    kl = torch.expm1(d) - d
    if clamp is not None:
        kl = kl.clamp(-clamp, clamp)
    return kl if mask is None else zero_padding(kl, mask)


# ----------------------------------------------------------------------------------------------------------------
# Ratios, the PPO clip and the loss statistics


def check_loss_inputs(fn_name: str, logprobs_new: Tensor, logprobs_old: Tensor, advantages: Tensor, mask: Tensor,
                      reduction: Reduction) -> None:
    """ValueError naming `fn_name` unless the token inputs and the reduction's weights share one `[N, T]` shape and
    the reduction's `agg` is one of `LOSS_AGG_MODES`."""
    shapes = {"logprobs_new": logprobs_new, "logprobs_old": logprobs_old, "advantages": advantages, "mask": mask}
    if reduction.is_weights is not None:
        shapes["is_weights"] = reduction.is_weights
    if reduction.token_weights is not None:
        shapes["token_weights"] = reduction.token_weights
    if mask.dim() != 2 or any(t.shape != mask.shape for t in shapes.values()):
        raise ValueError(f"{fn_name}: all inputs must share one [N, T] shape; got "
                         + ", ".join(f"{k} {tuple(v.shape)}" for k, v in shapes.items()))
    if reduction.agg not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss aggregation {reduction.agg!r}; valid: {', '.join(LOSS_AGG_MODES)}")


def importance_ratio(logprobs_new: Tensor, logprobs_old: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
    """`(log_ratio, ratio)`, `[N, T]`: `logp_new - logp_old` (old detached), 0 on padding, clamped to +-20; its exp."""
    log_ratio = zero_padding(logprobs_new - logprobs_old.detach(), valid)
    log_ratio = log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    return log_ratio, torch.exp(log_ratio)


def as_constant(x: Tensor, valid: Tensor, dtype: torch.dtype) -> Tensor:
    """`x` detached, cast to `dtype`, exactly 0 on padding."""
    return zero_padding(x.detach().to(dtype), valid)


def ppo_token_loss(ratio: Tensor, adv: Tensor, eps_low: float, eps_high: float) -> tuple[Tensor, Tensor, Tensor]:
    """`(token_loss, loss_unclipped, loss_clipped)`: `-min(rho*A, clip(rho, 1-eps_low, 1+eps_high)*A)` and its terms."""
    loss_unclipped = -adv * ratio
    loss_clipped = -adv * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    return torch.maximum(loss_unclipped, loss_clipped), loss_unclipped, loss_clipped


def valid_fraction(flags: Tensor, valid: Tensor, n_valid: int) -> float:
    """Fraction of the valid tokens where `flags` holds (0.0 when there are none)."""
    return float((flags & valid).sum()) / max(n_valid, 1)


def ratio_stats(loss: Tensor, ratio: Tensor, log_ratio: Tensor, valid: Tensor, n_valid: int) -> dict[str, float]:
    return {
        "loss/pg": float(loss),
        "loss/ratio_mean": float(masked_mean(ratio, valid)) if n_valid else 1.0,
        "loss/ratio_max": float(ratio[valid].max()) if n_valid else 1.0,
        "loss/ratio_min": float(ratio[valid].min()) if n_valid else 1.0,
        "loss/ppo_kl": float(masked_mean(-log_ratio, valid)),
    }


def ppo_stats(loss: Tensor, ratio: Tensor, log_ratio: Tensor, adv: Tensor, clipped: Tensor, valid: Tensor,
              n_valid: int, clip_range: tuple[float, float]) -> dict[str, float]:
    """PPO-clip's statistics: `ratio_stats` and the clip fractions. `clipped` `[N, T]` bool: the clipped term was
    the larger loss; `clip_range`: (eps_low, eps_high)."""
    eps_low, eps_high = clip_range
    base = ratio_stats(loss, ratio, log_ratio, valid, n_valid)
    return {
        "loss/pg": base["loss/pg"],
        "loss/clip_frac": valid_fraction(clipped, valid, n_valid),
        "loss/clip_frac_low": valid_fraction((ratio < 1.0 - eps_low) & (adv < 0), valid, n_valid),
        "loss/clip_frac_high": valid_fraction((ratio > 1.0 + eps_high) & (adv > 0), valid, n_valid),
        "loss/ratio_mean": base["loss/ratio_mean"],
        "loss/ratio_max": base["loss/ratio_max"],
        "loss/ratio_min": base["loss/ratio_min"],
        "loss/ppo_kl": base["loss/ppo_kl"],
    }


# ----------------------------------------------------------------------------------------------------------------
# Token covariance and top-k selection (Clip-Cov, KL-Cov, the forking-token filter)


def centered_cov(advantages: Tensor, logprobs: Tensor, valid: Tensor) -> Tensor:
    """`(A - mean A) * (logp - mean logp)`, `[N, T]`, both means over the valid tokens; detached, 0 on padding.

    The token-level covariance term of Cui et al. 2025 ("The Entropy Mechanism of Reinforcement Learning for
    Reasoning Language Models", section 4, the `Cov(y_i)` of the Clip-Cov and KL-Cov objectives), as docs/methods.md
    section 5 fixes it. `logprobs` are those of the policy being optimised (the paper's `log pi_theta`).
    """
    with torch.no_grad():
        lp = as_constant(logprobs, valid, logprobs.dtype)
        adv = as_constant(advantages, valid, logprobs.dtype)
        cov = (adv - masked_mean(adv, valid)) * (lp - masked_mean(lp, valid))
        return zero_padding(cov, valid)


def top_k_mask(scores: Tensor, valid: Tensor, k: int) -> Tensor:
    """Bool `[N, T]`: the `k` valid positions with the largest `scores` (nan counts as lowest).

    Ties go to the position that comes first in row-major order (a stable descending sort), so the choice is
    deterministic.
    """
    flat_valid = valid.reshape(-1)
    out = torch.zeros_like(flat_valid)
    idx = torch.nonzero(flat_valid).squeeze(1)  # ascending row-major positions of the valid tokens
    if k > 0 and idx.numel() > 0:
        vals = torch.nan_to_num(scores.detach().reshape(-1)[idx], nan=-math.inf)
        order = torch.sort(vals, descending=True, stable=True).indices[:k]
        out[idx[order]] = True
    return out.reshape(valid.shape)
