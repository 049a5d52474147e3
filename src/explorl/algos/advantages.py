"""Advantage estimators: pure tensor functions from rewards (and per-token statistics) to `advantages[N, T]`.

Notation follows docs/methods.md: N responses padded to T tokens, `mask[N, T]` is 1 on response tokens,
`group[N]` (int64, arbitrary ids, any order) names the prompt of each response, `rewards[N]` one float
per response. Groups may have different sizes; nothing here assumes `N = B * G`. Every per-token output is
exactly 0.0 where `mask == 0`.

Each estimator is also registered by config name (`explorl.algos.registry`, kind `estimator`:
`fn(batch: RolloutBatch, cfg: AlgoConfig[, *, options]) -> Tensor[N, T]`) through a thin adapter that reads the
batch, the core config and the method's own options (a dataclass declared beside it: `ErpoOptions`, ...,
configured as `algo.<name>.<field>`); shapers, which map an advantage tensor to a new one (covariance weighting,
PPL, position, entropy), are kind `shaper`: `fn(advantages, batch, cfg, step[, *, options])`, applied in the order
of `cfg.shapers`. Each entry records what it needs (a reference model, pi_old's log-probs).
No gradient flows through any of these functions: they detach their inputs and compute in float64.

Shared pieces for estimators that need group statistics (ERPO's per-group token gates, PPL shaping, ...):
`dense_ids` turns arbitrary ids into 0..S-1 and `segment_stats` gives per-segment mean / std / count,
broadcast back to every element, without a Python loop over groups.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch
from torch import Tensor

from explorl.algos.registry import Cite, get, register

if TYPE_CHECKING:
    from explorl.algos.batch import RolloutBatch
    from explorl.config.schema import AlgoConfig

__all__ = [
    "dense_ids", "segment_stats", "grpo", "erpo", "cov_weights", "cov_weighted", "ppl_shaped", "position_shaped",
    "entropy_shaped", "passk", "cov_weights_grouped", "cov_weights_balanced", "token_covariance",
    "register_shaper", "get_shaper", "ErpoOptions", "PasskOptions", "CwOptions", "PplOptions", "PositionOptions",
    "EntropyAdvOptions",
]


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
    """Group-relative advantage of GRPO, broadcast over the response tokens (docs/methods.md §1a).

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


@register("estimator", "grpo", needs_old_logprobs=False, reads=("adv_eps",),
          cites=(Cite("GRPO", "section 4.1.2, eq. 3", doc="1, 1a"), Cite("E3", "eq. 2", doc="1a")))
def _grpo_adapter(batch: RolloutBatch, cfg: AlgoConfig) -> Tensor:
    """GRPO (Shao et al. 2024): group z-score with unbiased std."""
    return grpo(batch.rewards, batch.group, batch.mask, eps=cfg.adv_eps)


@register("estimator", "dr_grpo", needs_old_logprobs=False, reads=("adv_eps",), cites=(Cite("Dr.GRPO", doc="1a"),))
def _dr_grpo_adapter(batch: RolloutBatch, cfg: AlgoConfig) -> Tensor:
    """Dr.GRPO (Liu et al. 2025): group mean baseline, no std division."""
    return grpo(batch.rewards, batch.group, batch.mask, scale=False, eps=cfg.adv_eps)


# ------------------------------------------------------------------------------------------------------------
# token-level estimators and shapers (docs/methods.md §3, §4, §5, §7)


def _float_dtype(*tensors: Tensor) -> torch.dtype:
    """The output dtype: the first floating dtype among `tensors`, else float32."""
    for t in tensors:
        if t.dtype.is_floating_point:
            return t.dtype
    return torch.float32


def _check_token_inputs(mask: Tensor, **token_tensors: Tensor) -> None:
    if mask.dim() != 2:
        raise ValueError(f"expected mask [N, T], got {tuple(mask.shape)}")
    for name, t in token_tensors.items():
        if t.shape != mask.shape:
            raise ValueError(f"expected {name} of shape {tuple(mask.shape)} like mask, got {tuple(t.shape)}")


def _positions(valid: Tensor) -> tuple[Tensor, Tensor]:
    """1-based position `t` of each valid token among its response's valid tokens, and `|o_i|`.

    Counting valid tokens (a cumulative sum of the mask) rather than columns makes left padding harmless.
    Returns `(t[N, T] int64, length[N, 1] int64)`; `t` is meaningless where `valid` is False.
    """
    v = valid.to(torch.long)
    return v.cumsum(dim=1), v.sum(dim=1, keepdim=True)


def _group_range_equal(values: Tensor, dense: Tensor, n_seg: int, counted: Tensor) -> Tensor:
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


def erpo(
    rewards: Tensor,
    group: Tensor,
    mask: Tensor,
    entropy: Tensor,
    logprobs: Tensor,
    ref_logprobs: Tensor,
    *,
    beta_progress: float = 0.1,
    gamma: float = 5.0,
    eta: float = 0.2,
    num_buckets: int = 10,
    sigma_target: float = 1.0,
    delta: float = 1e-6,
) -> Tensor:
    """ERPO token-level advantage (docs/methods.md §3; Yu et al. 2026, "ERPO: Token-Level Entropy-Regulated
    Policy Optimization for Large Reasoning Models", eqs. 7-10 and Algorithm 1).

    Per group G (all valid tokens of all responses of one prompt), with population std throughout:
      1. `s = beta_progress * (logprobs - ref_logprobs)`                                        (eq. 7)
      2. `W = sigmoid(gamma * (H - mean_G(H)) / (std_G(H) + delta))`                            (eq. 8)
      3. token t (1-based) of response i: `k = min(floor(K * t / |o_i|), K - 1)`;
         `s~ = (s - mean_{k,G}(s)) / (std_{k,G}(s) + delta)`, stats over the group's valid tokens in bucket k (eq. 9)
      4. `raw = W * sign(A_group) * s~`; `Psi = sigma_target * raw / (std_active(raw) + delta)`, the std over the
         group's *active* tokens (valid, `A_group != 0`)                                          (eq. 10)
      5. `A_final = (X - mean_G(X)) / (std_G(X) + delta)` with `X = A_group + eta * Psi`, over the group's valid
         tokens (eq. 10's Norm_G), so each group has mean 0 and variance ~1 over its valid tokens (eq. 16).
    `A_group` is `grpo(rewards, group, ...)` (unbiased std, `eps = delta`). A group whose rewards are all equal
    (including a group of one response) gets 0 everywhere, as does a response without valid tokens.

    Readings: the paper writes `log pi_theta` in eq. 7; the statistics are computed once per batch from the
    old policy (section 4.5.3), so `logprobs` (old policy) is used. `t / |o_i|` counts valid tokens, so left
    padding is harmless; the bucket index is computed in integers (`(t * K) // |o_i|`), free of float rounding.
    If the active raw values of a group have std 0, `Psi = raw / delta` literally (bounded again by step 5).
    No gradient flows through the result.

    Args:
        rewards: `[N]` one scalar reward per response.
        group: `[N]` int64 prompt ids; arbitrary values, any order, any group sizes.
        mask: `[N, T]` 1 on response tokens, 0 on padding.
        entropy: `[N, T]` token entropy H of the old policy.
        logprobs: `[N, T]` old-policy log-probabilities of the sampled tokens.
        ref_logprobs: `[N, T]` reference-model log-probabilities of the sampled tokens.
        beta_progress, gamma, eta, num_buckets (K), sigma_target, delta: as in the steps above.
    Returns:
        `[N, T]` advantages in the floating dtype of `logprobs` (float32 otherwise), 0.0 where `mask == 0`.
    """
    _check_response_inputs(rewards, group, mask)
    _check_token_inputs(mask, entropy=entropy, logprobs=logprobs, ref_logprobs=ref_logprobs)
    if num_buckets < 1:
        raise ValueError(f"num_buckets must be >= 1, got {num_buckets}")
    out_dtype = _float_dtype(logprobs, entropy, rewards)
    n, t_len = mask.shape
    if n == 0 or t_len == 0:
        return torch.zeros(mask.shape, dtype=out_dtype, device=mask.device)
    valid = mask.bool()
    f64 = torch.float64
    zero = torch.zeros((), dtype=f64, device=mask.device)

    dense, n_groups = dense_ids(group)
    # A_group per response: grpo on a one-token mask gives [N, 1]
    a_group = grpo(rewards.detach().to(f64), group, torch.ones(n, 1, device=mask.device), eps=delta)[:, 0]
    degenerate = _group_range_equal(rewards, dense, n_groups, torch.ones(n, dtype=torch.bool, device=mask.device))

    gid = dense[:, None].expand(n, t_len)
    h = torch.where(valid, entropy.detach().to(f64), zero)
    s = torch.where(valid, beta_progress * (logprobs.detach().to(f64) - ref_logprobs.detach().to(f64)), zero)

    # 2. entropy gate, eq. 8
    h_mean, h_std, _ = segment_stats(h, gid, valid)
    w = torch.sigmoid(gamma * (h - h_mean) / (h_std + delta))

    # 3. relative-position buckets, eq. 9
    pos, length = _positions(valid)
    k = torch.clamp((pos * num_buckets) // length.clamp_min(1), max=num_buckets - 1)
    bucket = gid * num_buckets + k
    s_mean, s_std, _ = segment_stats(s, bucket, valid)
    s_tilde = (s - s_mean) / (s_std + delta)

    # 4. outcome-anchored, rescaled process term, eq. 10
    raw = w * torch.sign(a_group)[:, None] * s_tilde
    active = valid & (a_group != 0)[:, None]
    _, raw_std, _ = segment_stats(raw, gid, active)
    psi = sigma_target * raw / (raw_std + delta)

    # 5. group z-score over valid tokens
    x = torch.where(valid, a_group[:, None] + eta * psi, zero)
    x_mean, x_std, _ = segment_stats(x, gid, valid)
    out = (x - x_mean) / (x_std + delta)
    out = torch.where(valid & ~degenerate[:, None], out, zero)
    return out.to(out_dtype)


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
    _check_token_inputs(mask, advantages=advantages, logprobs=logprobs)
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


def _group_kernel(advantages: Tensor, logprobs: Tensor, group: Tensor, mask: Tensor,
                  bandwidth: float = 1.0) -> Tensor:
    """CW-GRPO's unnormalised kernel `w = exp(-c^2 / (2 (bandwidth * sigma)^2))` with `c`, its means and sigma
    taken over each group's valid tokens (sigma 0 gives w = 1); float64 `[N, T]`, 0 on padding."""
    valid = mask.bool()
    f64 = torch.float64
    zero = torch.zeros((), dtype=f64, device=mask.device)
    ids = group[:, None].expand(mask.shape)
    c = token_covariance(advantages, logprobs, mask, group)
    _, c_std, _ = segment_stats(c, ids, valid)
    sigma2 = c_std.to(f64) ** 2 * (bandwidth * bandwidth)  # bandwidth 1: exactly sigma^2 (x * 1.0 == x)
    w = torch.where(sigma2 > 0, torch.exp(-(c * c) / (2.0 * sigma2.clamp_min(1e-300))), torch.ones_like(c))
    return torch.where(valid, w, zero)


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
    f64 = torch.float64
    zero = torch.zeros((), dtype=f64, device=mask.device)
    n_valid = int(valid.sum())
    c = token_covariance(advantages, logprobs, mask)
    if n_valid == 0:
        return torch.zeros(mask.shape, dtype=f64, device=mask.device)
    c_mean = c.sum() / n_valid
    sigma2 = (torch.where(valid, c - c_mean, zero) ** 2).sum() / n_valid * (bandwidth * bandwidth)
    if float(sigma2) > 0.0:
        w = torch.exp(-(c * c) / (2.0 * sigma2))
    else:
        w = torch.ones_like(c)
    w = torch.where(valid, w, zero)
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
    out_dtype = _float_dtype(advantages)
    w = cov_weights(advantages, logprobs, mask, bandwidth=bandwidth)
    zero = torch.zeros((), dtype=torch.float64, device=mask.device)
    out = torch.where(mask.bool(), w * advantages.detach().to(torch.float64), zero)
    return out.to(out_dtype)


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
    _check_token_inputs(mask, advantages=advantages, logprobs=logprobs)
    if group.shape != (mask.shape[0],) or group.dtype.is_floating_point or group.dtype == torch.bool:
        raise ValueError(f"expected integer group [N] with N = {mask.shape[0]}, got {group.dtype} {tuple(group.shape)}")
    out_dtype = _float_dtype(advantages)
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
    constant = _group_range_equal(log_ppl, dense, n_groups, counted)
    w = torch.where(constant, zero, (log_ppl - mean) / torch.where(constant, torch.ones_like(std), std))
    factor = 1.0 - alpha * w
    if clamp is not None:
        factor = factor.clamp(clamp[0], clamp[1])
    out = torch.where(valid, advantages.detach().to(f64) * factor[:, None], zero)
    return out.to(out_dtype)


def position_shaped(
    advantages: Tensor,
    mask: Tensor,
    *,
    gamma: float = 0.1,
    m: float = 15.0,
    d: float = 1.0,
    n: float = 0.5,
    cap_frac: float | None = None,
) -> Tensor:
    """Position-based advantage shaping (docs/methods.md §7b; STILL, section 4.4.2, eqs. 8 and 12).

    For token t (1-based, counted over valid tokens) of response i: `l = (t - 1) / |o_i|`,
    `b = gamma * sigmoid(d * m * (l - n))`, `A~ = A + sign(A) * b`. The bonus pushes each advantage further
    in its own direction (sign(0) = 0, so a zero advantage stays zero); with d = +1 it grows with position.
    `cap_frac` (optional, as the public code with 0.5) caps the bonus: `b <= cap_frac * |A|`.

    Reading: the paper prints the shift n = -0.5 (`r = m * (l - n)`), under which the sigmoid is saturated for
    every l in [0, 1]; explorl's default (docs/methods.md §7b) and the public code centre it at n = 0.5; `n=-0.5`
    gives the printed formula. The step window of the
    recipe (from step 200 for 100 steps) is applied by the registry adapter, not here.

    Args:
        advantages: `[N, T]` token advantages.
        mask: `[N, T]` 1 on response tokens, 0 on padding.
        gamma: bonus scale (paper: 0.1). m: sigmoid steepness (15). d: direction (+1 later tokens, -1 earlier).
        n: centre of the sigmoid in relative position (0.5; the paper prints -0.5).
        cap_frac: optional cap of the bonus as a fraction of |A|.
    Returns:
        `[N, T]` in the floating dtype of `advantages` (float32 otherwise), 0.0 where `mask == 0`.
    """
    _check_token_inputs(mask, advantages=advantages)
    out_dtype = _float_dtype(advantages)
    f64 = torch.float64
    zero = torch.zeros((), dtype=f64, device=mask.device)
    valid = mask.bool()
    pos, length = _positions(valid)
    rel = (pos - 1).to(f64) / length.clamp_min(1).to(f64)
    bonus = gamma * torch.sigmoid(d * m * (rel - n))
    a = advantages.detach().to(f64)
    if cap_frac is not None:
        bonus = torch.minimum(bonus, cap_frac * a.abs())
    out = torch.where(valid, a + torch.sign(a) * bonus, zero)
    return out.to(out_dtype)


def entropy_shaped(
    advantages: Tensor, entropy: Tensor, mask: Tensor, *, alpha: float = 0.4, kappa: float = 2.0
) -> Tensor:
    """Entropy-based advantage (docs/methods.md §5e; Cheng et al. 2025, "Reasoning with Exploration: An Entropy
    Perspective", the clipped entropy term psi(H) added to the advantage).

    `A' = A + min(alpha * H.detach(), |A| / kappa)`. Taken literally, as the paper writes it (docs/methods.md §5e): the
    term is added whatever the sign of A, so for a negative advantage it *reduces the penalty* of high-entropy
    tokens (it never flips the sign, since it is at most |A| / kappa with kappa > 1). A zero advantage stays
    zero for H >= 0.

    Args:
        advantages: `[N, T]` token advantages.
        entropy: `[N, T]` token entropy of the old policy.
        mask: `[N, T]` 1 on response tokens, 0 on padding.
        alpha: entropy coefficient (0.4). kappa: the term is at most |A| / kappa (2).
    Returns:
        `[N, T]` in the floating dtype of `advantages` (float32 otherwise), 0.0 where `mask == 0`.
    """
    _check_token_inputs(mask, advantages=advantages, entropy=entropy)
    out_dtype = _float_dtype(advantages)
    f64 = torch.float64
    a = advantages.detach().to(f64)
    h = entropy.detach().to(f64)
    out = a + torch.minimum(alpha * h, a.abs() / kappa)
    out = torch.where(mask.bool(), out, torch.zeros((), dtype=f64, device=mask.device))
    return out.to(out_dtype)


def _log_comb(a: Tensor, b: Tensor) -> Tensor:
    """log C(a, b) for float64 tensors with 0 <= b <= a (caller masks the other entries)."""
    return torch.lgamma(a + 1) - torch.lgamma(b + 1) - torch.lgamma(a - b + 1)


def passk(rewards: Tensor, group: Tensor, mask: Tensor, *, k: int) -> Tensor:
    """Pass@k training advantage (docs/methods.md §5f; Chen et al. 2025, "Pass@k Training for Adaptively
    Balancing Exploration and Exploitation of Large Reasoning Models", the analytic group advantage).

    Binary rewards (`reward > 0.5` counts as correct); per group, n responses of which c are correct:
      `rho = 1 - C(n-c, k) / C(n, k)` (the unbiased pass@k of the group), `s = sqrt(rho * (1 - rho))`;
      correct response: `(1 - rho) / (s + 1e-6)`;
      wrong response: `(1 - rho - C(n-c-1, k-1) / C(n-1, k-1)) / (s + 1e-6)`.
    All-correct and all-wrong groups get 0. Over a group the advantages sum to 0 (up to the 1e-6).

    Groups smaller than k (explorl's reading, docs/methods.md §5f): `k_eff = min(k, n)`. With k_eff = n every k-subset
    is the whole group, so `rho = 1` whenever c >= 1 and both numerators vanish: groups with `n <= k` get
    advantage 0 (they carry no pass@k signal), consistent with `metrics.pass_at_k` being 1 when n - c < k.

    Args:
        rewards: `[N]` rewards; > 0.5 is correct.
        group: `[N]` int64 prompt ids; arbitrary values, any order, any group sizes.
        mask: `[N, T]` 1 on response tokens, 0 on padding.
        k: the k of the pass@k objective (>= 1).
    Returns:
        `[N, T]` advantages broadcast over tokens, in the floating dtype of `rewards` (float32 otherwise),
        0.0 where `mask == 0`.
    """
    _check_response_inputs(rewards, group, mask)
    if int(k) < 1:
        raise ValueError(f"passk: k must be >= 1, got {k}")
    out_dtype = _float_dtype(rewards)
    f64 = torch.float64
    if rewards.numel() == 0:
        return torch.zeros(mask.shape, dtype=out_dtype, device=mask.device)
    correct = rewards.detach() > 0.5
    dense, n_groups = dense_ids(group)
    n_g = torch.zeros(n_groups, dtype=f64, device=rewards.device).index_add_(
        0, dense, torch.ones(dense.shape, dtype=f64, device=rewards.device))
    c_g = torch.zeros_like(n_g).index_add_(0, dense, correct.to(f64))
    n, c = n_g[dense], c_g[dense]
    ke = torch.minimum(torch.full_like(n, float(k)), n)
    wrong_n = n - c
    # C(n-c, k) / C(n, k), zero when n - c < k
    fail = torch.where(wrong_n >= ke, torch.exp(_log_comb(wrong_n.clamp_min(ke), ke) - _log_comb(n, ke)),
                       torch.zeros_like(n))
    rho = 1.0 - fail
    s = torch.sqrt((rho * (1.0 - rho)).clamp_min(0.0))
    # C(n-c-1, k-1) / C(n-1, k-1), zero when n - c - 1 < k - 1
    a1, b1 = wrong_n - 1, ke - 1  # b1 >= 0 since ke >= 1
    tail = torch.where(a1 >= b1, torch.exp(_log_comb(a1.clamp_min(b1), b1) - _log_comb(n - 1, b1)),
                       torch.zeros_like(n))
    adv = torch.where(correct, (1.0 - rho) / (s + 1e-6), (1.0 - rho - tail) / (s + 1e-6))
    degenerate = (c == 0) | (c == n)
    adv = torch.where(degenerate, torch.zeros_like(adv), adv).to(out_dtype)
    return torch.where(mask.bool(), adv[:, None], torch.zeros((), dtype=out_dtype, device=adv.device))


@dataclass
class ErpoOptions:
    """ERPO's options, `algo.erpo.<field>` (ERPO; docs/methods.md §3)."""

    beta_progress: float = 0.1
    """beta of the implicit progress signal s = beta * (logp - ref_logp) (eq. 7)."""
    gamma: float = 5.0
    """Sharpness gamma of the entropy gate (eq. 8)."""
    eta: float = 0.2
    """Weight eta of the token-level term in A_group + eta * Psi."""
    num_buckets: int = 10
    """Relative-position buckets K of the progress normalisation (eq. 9)."""
    sigma_target: float = 1.0
    """Target scale of the token-level term."""


def _check_erpo(cfg) -> str | None:
    o = cfg.algo.options["erpo"]
    return None if o.num_buckets >= 1 else f"algo.erpo.num_buckets: must be >= 1, got {o.num_buckets}"


@register("estimator", "erpo", needs_ref=True, options=ErpoOptions, check=_check_erpo,
          cites=(Cite("ERPO", "eq. 7, eq. 8, eq. 9, eq. 10, eq. 16", doc="3"),))
def _erpo_adapter(batch: RolloutBatch, cfg: AlgoConfig, *, options: ErpoOptions) -> Tensor:
    """ERPO: GRPO plus the entropy-gated, bucket-normalised implicit progress term; needs a reference."""
    batch.require("entropy", "logprobs", "ref_logprobs", by="advantage 'erpo' (it compares the policy with a frozen "
                  "reference model)")
    return erpo(batch.rewards, batch.group, batch.mask, batch.entropy, batch.logprobs, batch.ref_logprobs,
                beta_progress=options.beta_progress, gamma=options.gamma, eta=options.eta,
                num_buckets=options.num_buckets, sigma_target=options.sigma_target)


@dataclass
class PasskOptions:
    """Pass@k training's options, `algo.passk.<field>` (Chen et al.; docs/methods.md §5)."""

    k: int = 4
    """The k of the pass@k objective (binary rewards); at most sampling.group_size."""


def _check_passk(cfg) -> str | None:
    k, g = cfg.algo.options["passk"].k, cfg.sampling.group_size
    return None if 1 <= k <= g else f"algo.passk.k: must be in [1, sampling.group_size={g}], got {k}"


@register("estimator", "passk", needs_old_logprobs=False, options=PasskOptions, check=_check_passk,
          cites=(Cite("pass@k training", doc="5f"),))
def _passk_adapter(batch: RolloutBatch, cfg: AlgoConfig, *, options: PasskOptions) -> Tensor:
    """Pass@k training (Chen et al.): analytic group advantage of the pass@k objective, binary rewards."""
    return passk(batch.rewards, batch.group, batch.mask, k=options.k)


# ------------------------------------------------------------------------------------------------------------
# shapers: fn(advantages[N, T], batch, cfg, step) -> advantages[N, T], applied in `cfg.shapers` order

def register_shaper(name: str, **needs) -> Callable:
    """Register `fn(advantages: Tensor[N, T], batch: RolloutBatch, cfg: AlgoConfig, step: int[, *, options]) ->
    Tensor[N, T]` under `name` (`register("shaper", name, ...)`); `step` is the 1-based training step."""
    return register("shaper", name, **needs)


def get_shaper(name: str) -> Callable[..., Tensor]:
    """The shaper registered under `name`; KeyError listing the valid names otherwise."""
    return get("shaper", name)


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


@register_shaper("cw", options=CwOptions, check=_check_cw,  # the paper's kernel over the batch: explorl's reading
                 cites=(Cite("CW-GRPO", "section 2.3", doc="4"), Cite("explorl", doc="4")))
def _cw_shaper(advantages: Tensor, batch: RolloutBatch, cfg: AlgoConfig, step: int, *, options: CwOptions) -> Tensor:
    """Covariance-weighted advantages (CW-GRPO), batch-wide statistics; kernel width `bandwidth` * sigma."""
    batch.require("logprobs", by="shaper 'cw'")
    return cov_weighted(advantages, batch.logprobs, batch.mask, bandwidth=options.bandwidth)


def _masked(weights: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """`weights * advantages` on valid tokens (computed in float64), exactly 0 elsewhere."""
    return torch.where(mask.bool(), (weights * advantages.detach().to(torch.float64)).to(advantages.dtype),
                       torch.zeros((), dtype=advantages.dtype, device=advantages.device))


@register_shaper("cw_group", options_from="cw", check=_check_cw, cites=(Cite("CW-GRPO", "section 2.3", doc="4"),))
def _cw_group_shaper(advantages: Tensor, batch: RolloutBatch, cfg: AlgoConfig, step: int, *,
                     options: CwOptions) -> Tensor:
    """Covariance-weighted advantages with CW-GRPO's per-group statistics (`cov_weights_grouped`)."""
    batch.require("logprobs", by="shaper 'cw_group'")
    w = cov_weights_grouped(advantages, batch.logprobs, batch.group, batch.mask, bandwidth=options.bandwidth)
    return _masked(w, advantages, batch.mask)


@register_shaper("cw_balanced", options_from="cw", check=_check_cw,  # explorl's variant of the paper's kernel
                 cites=(Cite("explorl", doc="4"), Cite("CW-GRPO", "section 2.3", doc="4")))
def _cw_balanced_shaper(advantages: Tensor, batch: RolloutBatch, cfg: AlgoConfig, step: int, *,
                        options: CwOptions) -> Tensor:
    """Sign-balanced covariance weights (`cov_weights_balanced`): explorl's variant of CW-GRPO, not the paper's."""
    batch.require("logprobs", by="shaper 'cw_balanced'")
    w = cov_weights_balanced(advantages, batch.logprobs, batch.group, batch.mask, bandwidth=options.bandwidth)
    return _masked(w, advantages, batch.mask)


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


@register_shaper("ppl", options=PplOptions, check=_check_ppl,
                 cites=(Cite("STILL", "section 4.4.2, eq. 7, eq. 11", doc="7, 7a"),))
def _ppl_shaper(advantages: Tensor, batch: RolloutBatch, cfg: AlgoConfig, step: int, *,
                options: PplOptions) -> Tensor:
    """PPL shaping (STILL, section 4.4.2): favours low-perplexity responses of each group, every step."""
    batch.require("logprobs", by="shaper 'ppl'")
    clamp = None if options.clamp is None else tuple(options.clamp)
    return ppl_shaped(advantages, batch.logprobs, batch.group, batch.mask, alpha=options.alpha,
                      iqr_filter=options.iqr_filter, clamp=clamp)


@dataclass
class PositionOptions:
    """Position shaping's options, `algo.position.<field>` (STILL section 4.4.2; docs/methods.md §7)."""

    gamma: float = 0.1
    """Bonus scale gamma."""
    m: float = 15.0
    """Sigmoid steepness m."""
    d: float = 1.0
    """Direction d (+1 favours later tokens)."""
    n: float = 0.5
    """Centre shift n of the sigmoid, r = m * (l - n) (docs/methods.md §7b). 0.5 (explorl and the public code)
    centres it mid-response; -0.5 is the value STILL prints (section 4.4.2), which saturates the sigmoid so
    that every token gets about the full bonus gamma."""
    start: int = 0
    """First training step (1-based) of its window."""
    steps: int = 0
    """Length of its window in steps (0 = every step)."""
    cap_frac: float | None = None
    """Optional cap of the bonus as a fraction of |A| (the public code uses 0.5)."""


def _check_position(cfg) -> str | None:
    o = cfg.algo.options["position"]
    if o.cap_frac is not None and o.cap_frac < 0:
        return f"algo.position.cap_frac: must be >= 0, got {o.cap_frac}"
    if not math.isfinite(o.n):
        return (f"algo.position.n: must be a finite number (0.5 centres the bonus mid-response; the paper prints "
                f"-0.5), got {o.n}")
    return None if o.steps >= 0 else f"algo.position.steps: must be >= 0 (0 = every step), got {o.steps}"


@register_shaper("position", needs_old_logprobs=False, options=PositionOptions, check=_check_position,
                 needs_step=lambda o: o.steps > 0, cites=(Cite("STILL", "section 4.4.2, eq. 8, eq. 12", doc="7b"),))
def _position_shaper(advantages: Tensor, batch: RolloutBatch, cfg: AlgoConfig, step: int, *,
                     options: PositionOptions) -> Tensor:
    """Position shaping (STILL, section 4.4.2) inside its step window: `start <= step < start + steps`, or
    every step when `steps == 0`; the identity outside it."""
    start, steps = options.start, options.steps
    if steps > 0 and not (start <= step < start + steps):
        return advantages
    return position_shaped(advantages, batch.mask, gamma=options.gamma, m=options.m, d=options.d, n=options.n,
                           cap_frac=options.cap_frac)


@dataclass
class EntropyAdvOptions:
    """Entropy-based advantage's options, `algo.entropy_adv.<field>` (Cheng et al.; docs/methods.md §5)."""

    alpha: float = 0.4
    """alpha in A + min(alpha * H, |A| / kappa)."""
    kappa: float = 2.0
    """kappa."""


@register_shaper("entropy_adv", needs_old_logprobs=False, options=EntropyAdvOptions,
                 cites=(Cite("entropy advantage", doc="5e"),))
def _entropy_adv_shaper(advantages: Tensor, batch: RolloutBatch, cfg: AlgoConfig, step: int, *,
                        options: EntropyAdvOptions) -> Tensor:
    """Entropy-based advantage (Cheng et al.): A + min(alpha * H, |A| / kappa)."""
    batch.require("entropy", by="shaper 'entropy_adv'")
    return entropy_shaped(advantages, batch.entropy, batch.mask, alpha=options.alpha, kappa=options.kappa)
