"""Policy losses: per-token objectives and their aggregation, as pure tensor functions.

The per-token objective and the aggregation over tokens are separate settings (as verl's `loss_agg_mode`):
`policy_loss` builds the clipped token loss and hands it to `aggregate`, which the trainer also uses for the
KL (`kl_k3`) and entropy terms, so every term of the objective is normalised the same way.

Notation follows docs/methods.md: N responses padded to T tokens, `mask[N, T]` is 1 on response tokens.
Padding may hold any value (even inf or nan) in the inputs: it is replaced before any arithmetic, so it
reaches neither the loss nor the gradient.

Deliberate difference from the bare formula: the log-ratio `logp_new - logp_old` is clamped to [-20, 20]
before `exp` (as verl does), a numerical guard that only acts on ratios beyond 4.8e8 or below 2e-9.

Besides the PPO-clip loss (`policy_loss`), this module holds the loss variants of the baselines in docs/methods.md
§5 (`clip_cov_loss`, `kl_cov_loss`, registered as kind `policy_loss`), the token selection of the forking-token
baseline (`forking_mask`, fed to the losses as `token_weights`), the truncated importance weights of EAD
(`tis_weights`, docs/methods.md §6c, fed as `is_weights`) and DAPO's soft overlong punishment (`overlong_penalty`).

Three conventions of the engines and of EAD are options, all off by default, so the defaults reproduce the
functions exactly as before (docs/methods.md §9): verl's dual-clip PPO (`policy_loss(dual_clip_c=...)`, verl's
`clip_ratio_c`), verl's clamp of the k3 KL (`kl_k3(clamp=...)`, its `low_var_kl`) and the sequence-level truncated
importance ratio that EAD writes (`tis_weights(level="sequence")`, App. B.2; docs/methods.md §6).
Every loss variant takes `(logprobs_new, logprobs_old, advantages, mask, *, agg, max_response_len, is_weights,
token_weights, ...)`, so the trainer can call any of them the same way.

Per-token multipliers never change the normaliser: `is_weights` and `token_weights` scale the token loss, and a
token whose weight is 0 still counts in the `token-mean` denominator (the number of valid tokens of `mask`). This is
the forking-token objective of Wang et al. 2025 ("Beyond the 80/20 rule", the DAPO objective with an indicator
inside the sum and the normaliser `1 / sum_i |o_i|` unchanged), and it is also how Clip-Cov removes a token's
gradient (Cui et al. 2025; the token's term becomes 0, the denominator stays).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from explorl.algos.registry import Cite, get, register

__all__ = [
    "LOSS_AGG_MODES", "masked_sum", "masked_mean", "aggregate", "kl_k3", "policy_loss",
    "tis_weights", "tis_stats", "TIS_LEVELS", "forking_mask", "clip_cov_loss", "kl_cov_loss", "overlong_penalty",
    "get_policy_loss", "aggregation_count", "micro_batch_share", "PpoOptions", "ClipCovOptions", "KlCovOptions",
    "ForkingOptions", "PER_QUESTION", "question_weights",
]

LOSS_AGG_MODES: tuple[str, ...] = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm",
                                   "seq-mean-token-mean-per-question")
"""Valid values of `agg` (docs/methods.md §1d)."""
PER_QUESTION = "seq-mean-token-mean-per-question"
"""E3 eq. 1 with a group size per question: the mean over questions of the mean over the question's responses
of each response's token mean. Aggregated as `seq-mean-token-mean` of token losses weighted per response by
`question_weights` (the step passes them as token weights), which is the same number (docs/methods.md §1d)."""


def question_weights(group: Tensor, valid_rows: Tensor) -> Tensor:
    """Per-response weights `[N]` that turn `seq-mean-token-mean` into E3's eq. 1 with a group size per
    question: `w_i = n / (Q * G_q(i))`, n the responses with valid tokens, Q their questions, G_q the question's
    responses with valid tokens; so that (1/n) sum_i w_i m_i = (1/Q) sum_q (1/G_q) sum_{i in q} m_i for any response
    means m_i. Equal groups give every weight 1. Responses without valid tokens get 0.

    Args:
        group: `[N]` int64 question ids; valid_rows: `[N]` bool, responses with at least one valid token.
    """
    ids = torch.unique(group, return_inverse=True)[1]
    sizes = torch.zeros(int(ids.max()) + 1 if len(ids) else 0, dtype=torch.float64, device=group.device)
    sizes.index_add_(0, ids, valid_rows.to(torch.float64))
    n, q = float(valid_rows.sum()), float((sizes > 0).sum())
    w = n / (q * sizes[ids].clamp_min(1.0)) if q > 0 else torch.zeros(len(ids), dtype=torch.float64)
    return torch.where(valid_rows, w, torch.zeros((), dtype=torch.float64, device=group.device))

_LOG_RATIO_BOUND = 20.0


def _zero_padding(x: Tensor, mask: Tensor) -> Tensor:
    """`x` with exactly 0 where `mask == 0` (a `where`, so nan/inf in the padding cannot leak, nor its gradient)."""
    return torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device))


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of `x` over the elements where `mask != 0` (all of them, or along `dim`). Shapes: x, mask `[...]`."""
    x = _zero_padding(x, mask)
    return x.sum() if dim is None else x.sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of `x` over the elements where `mask != 0`; 0 (not nan) where there are none. Shapes: x, mask `[...]`."""
    count = mask.bool().sum() if dim is None else mask.bool().sum(dim)
    return masked_sum(x, mask, dim) / count.clamp_min(1).to(x.dtype)


def aggregate(
    token_values: Tensor, mask: Tensor, agg: str = "token-mean", max_response_len: int | None = None
) -> Tensor:
    """Reduce per-token values `[N, T]` to a scalar, over the tokens where `mask != 0` (docs/methods.md §1d).

    - `token-mean`: sum over all valid tokens / number of valid tokens. Every token weighs the same, so long
      responses weigh more (DAPO, Yu et al. 2025, section 3.3 "Token-Level Policy Gradient Loss").
    - `seq-mean-token-mean`: mean over responses of each response's mean over its tokens (the GRPO objective,
      Shao et al. 2024 eq. 3). Responses without valid tokens are left out of the outer mean.
    - `seq-mean-token-sum-norm`: sum over all valid tokens / (N * max_response_len), a constant that does not
      depend on the lengths (Dr.GRPO, Liu et al. 2025). `max_response_len` (the configured length limit) is
      required in this mode and ignored in the others.
    - `seq-mean-token-mean-per-question` (E3 eq. 1 with per-question group sizes): reduced here as
      `seq-mean-token-mean`; the per-question weights come in the token values (`question_weights`).

    Args:
        token_values: `[N, T]` per-token values (differentiable).
        mask: `[N, T]` 1 on the tokens that count.
        agg: one of `LOSS_AGG_MODES`.
        max_response_len: the configured response length limit (`seq-mean-token-sum-norm` only).
    Returns:
        Scalar tensor; 0 (with a graph back to `token_values`) when no token is valid.
    """
    if agg not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss aggregation {agg!r}; valid: {', '.join(LOSS_AGG_MODES)}")
    if token_values.dim() != 2 or mask.shape != token_values.shape:
        raise ValueError(
            f"aggregate: expected token_values and mask of the same shape [N, T]; "
            f"got {tuple(token_values.shape)} and {tuple(mask.shape)}"
        )
    if agg == "token-mean":
        return masked_mean(token_values, mask)
    if agg in ("seq-mean-token-mean", PER_QUESTION):
        per_seq = masked_mean(token_values, mask, dim=-1)  # [N]; 0 for empty responses
        has_tokens = mask.bool().any(dim=-1)  # [N]
        return masked_mean(per_seq, has_tokens)
    if max_response_len is None or max_response_len < 1:
        raise ValueError(
            f"loss aggregation 'seq-mean-token-sum-norm' needs max_response_len >= 1 (the configured "
            f"length limit, e.g. sampling.max_new_tokens), got {max_response_len!r}"
        )
    n = token_values.shape[0]
    return masked_sum(token_values, mask) / float(max(n, 1) * max_response_len)


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
        d = _zero_padding(d, mask)
    if clamp is not None:
        d = d.clamp(-_LOG_RATIO_BOUND, _LOG_RATIO_BOUND)
    kl = torch.expm1(d) - d
    if clamp is not None:
        kl = kl.clamp(-clamp, clamp)
    return kl if mask is None else _zero_padding(kl, mask)


# ----------------------------------------------------------------------------------------------------------------
# Shared pieces of the loss variants


def _check_loss_inputs(
    fn_name: str,
    logprobs_new: Tensor,
    logprobs_old: Tensor,
    advantages: Tensor,
    mask: Tensor,
    agg: str,
    is_weights: Tensor | None,
    token_weights: Tensor | None,
) -> None:
    shapes = {"logprobs_new": logprobs_new, "logprobs_old": logprobs_old, "advantages": advantages, "mask": mask}
    if is_weights is not None:
        shapes["is_weights"] = is_weights
    if token_weights is not None:
        shapes["token_weights"] = token_weights
    if mask.dim() != 2 or any(t.shape != mask.shape for t in shapes.values()):
        raise ValueError(f"{fn_name}: all inputs must share one [N, T] shape; got "
                         + ", ".join(f"{k} {tuple(v.shape)}" for k, v in shapes.items()))
    if agg not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss aggregation {agg!r}; valid: {', '.join(LOSS_AGG_MODES)}")


def _ratio(logprobs_new: Tensor, logprobs_old: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
    """`(log_ratio, ratio)`, `[N, T]`: `logp_new - logp_old` (old detached), 0 on padding, clamped to +-20; its exp."""
    log_ratio = _zero_padding(logprobs_new - logprobs_old.detach(), valid)
    log_ratio = log_ratio.clamp(-_LOG_RATIO_BOUND, _LOG_RATIO_BOUND)
    return log_ratio, torch.exp(log_ratio)


def _constant(x: Tensor, valid: Tensor, dtype: torch.dtype) -> Tensor:
    """`x` detached, cast to `dtype`, exactly 0 on padding."""
    return _zero_padding(x.detach().to(dtype), valid)


def _ppo_token_loss(ratio: Tensor, adv: Tensor, eps_low: float, eps_high: float) -> tuple[Tensor, Tensor, Tensor]:
    """`(token_loss, loss_unclipped, loss_clipped)`: `-min(rho*A, clip(rho, 1-eps_low, 1+eps_high)*A)` and its terms."""
    loss_unclipped = -adv * ratio
    loss_clipped = -adv * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    return torch.maximum(loss_unclipped, loss_clipped), loss_unclipped, loss_clipped


def _dual_clip(token_loss: Tensor, adv: Tensor, dual_clip_c: float) -> tuple[Tensor, Tensor]:
    """verl's dual clip of the PPO token loss: `(token_loss', active)`, `active` where the bound acts.

    For A < 0: `min(-A * c, token_loss)`; A >= 0 unchanged (verl `compute_policy_loss_vanilla`: `pg_losses3 =
    -A * clip_ratio_c`, `where(A < 0, min(pg_losses3, max(pg_losses1, pg_losses2)), ...)`). Where the bound is
    active the token loss is the constant `-A * c` (A detached), so the token gets no gradient. Ties keep the PPO
    term (same value; its gradient is the PPO one).
    """
    bound = -adv * dual_clip_c
    active = (adv < 0) & (token_loss > bound)
    return torch.where(active, bound, token_loss), active


def _apply_weights(token_loss: Tensor, valid: Tensor, is_weights: Tensor | None,
                   token_weights: Tensor | None) -> Tensor:
    """Multiply the token loss by the (detached) per-token weights; the aggregation mask is left alone."""
    for w in (is_weights, token_weights):
        if w is not None:
            token_loss = token_loss * _constant(w, valid, token_loss.dtype)
    return token_loss


def _frac(flags: Tensor, valid: Tensor, n_valid: int) -> float:
    """Fraction of the valid tokens where `flags` holds (0.0 when there are none)."""
    return float((flags & valid).sum()) / max(n_valid, 1)


def _ratio_stats(loss: Tensor, ratio: Tensor, log_ratio: Tensor, valid: Tensor, n_valid: int) -> dict[str, float]:
    return {
        "loss/pg": float(loss),
        "loss/ratio_mean": float(masked_mean(ratio, valid)) if n_valid else 1.0,
        "loss/ratio_max": float(ratio[valid].max()) if n_valid else 1.0,
        "loss/ratio_min": float(ratio[valid].min()) if n_valid else 1.0,
        "loss/ppo_kl": float(masked_mean(-log_ratio, valid)),
    }


def _weight_stats(stats: dict[str, float], valid: Tensor, n_valid: int, dtype: torch.dtype,
                  is_weights: Tensor | None, token_weights: Tensor | None) -> dict[str, float]:
    if is_weights is not None:
        stats["loss/is_weight_mean"] = float(masked_mean(is_weights.detach().to(dtype), valid))
    if token_weights is not None:
        stats["loss/masked_frac"] = _frac(token_weights.detach() == 0, valid, n_valid)
    return stats


def _centered_cov(advantages: Tensor, logprobs: Tensor, valid: Tensor) -> Tensor:
    """`(A - mean A) * (logp - mean logp)`, `[N, T]`, both means over the valid tokens; detached, 0 on padding.

    The token-level covariance term of Cui et al. 2025 ("The Entropy Mechanism of Reinforcement Learning for
    Reasoning Language Models", section 4, the `Cov(y_i)` of the Clip-Cov and KL-Cov objectives), as docs/methods.md
    section 5 fixes it. `logprobs` are those of the policy being optimised (the paper's `log pi_theta`).
    """
    with torch.no_grad():
        lp = _constant(logprobs, valid, logprobs.dtype)
        adv = _constant(advantages, valid, logprobs.dtype)
        cov = (adv - masked_mean(adv, valid)) * (lp - masked_mean(lp, valid))
        return _zero_padding(cov, valid)


def _top_k_mask(scores: Tensor, valid: Tensor, k: int) -> Tensor:
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


# ----------------------------------------------------------------------------------------------------------------
# PPO-clip (GRPO / DAPO / Dr.GRPO token loss)


def policy_loss(
    logprobs_new: Tensor,
    logprobs_old: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    agg: str = "token-mean",
    max_response_len: int | None = None,
    is_weights: Tensor | None = None,
    token_weights: Tensor | None = None,
    dual_clip_c: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Clipped surrogate policy-gradient loss (to minimise), aggregated by `agg` (docs/methods.md §1b).

    Token loss `-min(rho * A, clip(rho, 1 - eps_low, 1 + eps_high) * A)`, `rho = exp(logp_new - logp_old)`:
    PPO, Schulman et al. 2017, eq. 7; decoupled bounds `eps_low` / `eps_high` ("clip-higher") and token-mean
    aggregation from DAPO, Yu et al. 2025, sections 3.1 and 3.3. Optional `is_weights` (e.g. the truncated
    importance weights of EAD, docs/methods.md §6c, from `tis_weights`) multiply the token loss and receive no
    gradient. Optional `token_weights` do the same (e.g. `forking_mask`, the 80/20 forking-token baseline of
    Wang et al. 2025, docs/methods.md §5d); tokens they zero still count in the aggregation's normaliser.

    Dual clip (`dual_clip_c`, off by default; docs/methods.md §1 and §9): verl 0.9's dual-clip PPO (Ye et al. 2020,
    arXiv:1912.09729; verl's `clip_ratio_c`, default 3, always on in verl). For tokens with A < 0 the token loss becomes
    `min(-A * c, max(-A * rho, -A * clip(rho, 1 - eps_low, 1 + eps_high)))`, so a token whose ratio has run far
    above 1 cannot push a negative-advantage loss beyond `|A| * c`; there it is a constant (no gradient). Tokens
    with A >= 0 are unchanged. The weights multiply after the dual clip, as in verl.

    Args:
        logprobs_new: `[N, T]` log-probs of the sampled tokens under the policy being optimised (differentiable).
        logprobs_old: `[N, T]` the same under the policy that produced the batch (treated as constant).
        advantages: `[N, T]` per-token advantages (treated as constant).
        mask: `[N, T]` 1 on response tokens.
        eps_low, eps_high: clip range `[1 - eps_low, 1 + eps_high]` of the ratio.
        agg: token aggregation, one of `LOSS_AGG_MODES` (see `aggregate`).
        max_response_len: the configured response length limit; required for `seq-mean-token-sum-norm`.
        is_weights: optional `[N, T]` per-token weights multiplying the token loss (detached).
        token_weights: optional `[N, T]` per-token multipliers of the token loss (detached), e.g. a 0/1 token
            selection; the normaliser of `agg` is still computed from `mask`.
        dual_clip_c: the dual-clip constant `c` (> 1), or None (default) for no dual clip.
    Returns:
        `(loss, stats)`: the scalar loss (0, not nan, when the mask is empty) and detached float statistics over
        valid tokens: `loss/pg` (the loss value), `loss/clip_frac` (the clipped term is active: it is strictly the
        larger loss), `loss/clip_frac_low` (rho < 1 - eps_low with A < 0), `loss/clip_frac_high`
        (rho > 1 + eps_high with A > 0), `loss/ratio_mean`, `loss/ratio_min`, `loss/ratio_max`, `loss/ppo_kl` (mean of
        `logp_old - logp_new`), `loss/is_weight_mean` when `is_weights` is given, and `loss/masked_frac` (the
        fraction of valid tokens whose token weight is 0) when `token_weights` is given; with `dual_clip_c`,
        `loss/dual_clip_frac` (fraction of valid tokens where the bound `-A * c` is the active term; verl's
        `pg_clipfrac_lower`).
    """
    _check_loss_inputs("policy_loss", logprobs_new, logprobs_old, advantages, mask, agg, is_weights, token_weights)
    if dual_clip_c is not None and not dual_clip_c > 1.0:
        raise ValueError(f"policy_loss: dual_clip_c must be > 1 (or None for no dual clip), got {dual_clip_c!r}")
    valid = mask.bool()
    log_ratio, ratio = _ratio(logprobs_new, logprobs_old, valid)
    adv = _constant(advantages, valid, ratio.dtype)
    token_loss, loss_unclipped, loss_clipped = _ppo_token_loss(ratio, adv, eps_low, eps_high)
    dual_active = None
    if dual_clip_c is not None:
        token_loss, dual_active = _dual_clip(token_loss, adv, dual_clip_c)
    token_loss = _apply_weights(token_loss, valid, is_weights, token_weights)
    loss = aggregate(token_loss, valid, agg, max_response_len)

    with torch.no_grad():
        n_valid = int(valid.sum())
        stats = _ppo_stats(loss, ratio, log_ratio, adv, loss_unclipped, loss_clipped, valid, n_valid,
                           eps_low, eps_high)
        if dual_active is not None:
            stats["loss/dual_clip_frac"] = _frac(dual_active, valid, n_valid)
        _weight_stats(stats, valid, n_valid, ratio.dtype, is_weights, token_weights)
    return loss, stats


def _ppo_stats(loss: Tensor, ratio: Tensor, log_ratio: Tensor, adv: Tensor, loss_unclipped: Tensor,
               loss_clipped: Tensor, valid: Tensor, n_valid: int, eps_low: float,
               eps_high: float) -> dict[str, float]:
    base = _ratio_stats(loss, ratio, log_ratio, valid, n_valid)
    return {
        "loss/pg": base["loss/pg"],
        "loss/clip_frac": _frac(loss_clipped > loss_unclipped, valid, n_valid),
        "loss/clip_frac_low": _frac((ratio < 1.0 - eps_low) & (adv < 0), valid, n_valid),
        "loss/clip_frac_high": _frac((ratio > 1.0 + eps_high) & (adv > 0), valid, n_valid),
        "loss/ratio_mean": base["loss/ratio_mean"],
        "loss/ratio_max": base["loss/ratio_max"],
        "loss/ratio_min": base["loss/ratio_min"],
        "loss/ppo_kl": base["loss/ppo_kl"],
    }


# ----------------------------------------------------------------------------------------------------------------
# Clip-Cov and KL-Cov (Cui et al. 2025; docs/methods.md §5a, §5b)


def clip_cov_loss(
    logprobs_new: Tensor,
    logprobs_old: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    clip_ratio: float = 2e-4,
    lb: float = 1.0,
    ub: float = 5.0,
    agg: str = "token-mean",
    max_response_len: int | None = None,
    generator: torch.Generator | None = None,
    is_weights: Tensor | None = None,
    token_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Clip-Cov: the PPO-clip loss with the gradient of a few random high-covariance tokens removed.

    Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models", section 4.2
    (the Clip-Cov objective); docs/methods.md §5a. Per call:

    1. `cov = (A - mean A) * (logp_new - mean logp_new)`, both means over all valid tokens (`_centered_cov`).
    2. Candidates: valid tokens the PPO clip has not already clipped (the clipped term is not strictly the larger
       loss, as `loss/clip_frac` counts) with `lb < cov < ub` (open interval).
    3. `n = max(int(clip_ratio * n_valid), 1)` of them (all when there are fewer), drawn uniformly without
       replacement with `generator` (the global torch RNG when None), have their token term set to 0.
    4. Every other valid token has the PPO-clip token loss of `policy_loss`; then `is_weights` / `token_weights`
       multiply and `agg` aggregates with the normaliser of `mask` (a selected token still counts in it).

    Reading fixed here: the paper writes the selected tokens' term as 0 (and its public code multiplies their
    loss by 0), so their value leaves the loss as well as their gradient; the gradient equals a detach. Because the
    normaliser is unchanged, every other token gets exactly the gradient `policy_loss` gives it. Selection is per
    call: the trainer's micro-batches each select their own tokens.

    No dual clip: this loss shares the PPO token loss of `policy_loss` (`_ppo_token_loss`) but not its optional
    dual clip, because verl's Clip-Cov loss (`compute_policy_loss_clip_cov`) has none; the dual clip is an option of
    the `ppo` loss only (`algo.ppo.dual_clip_c`), refused with `algo.loss=clip_cov` (docs/methods.md §9).

    Args:
        logprobs_new, logprobs_old, advantages, mask: `[N, T]`, as in `policy_loss`.
        eps_low, eps_high: PPO clip range of the ratio.
        clip_ratio: fraction of the valid tokens whose gradient is removed, in (0, 1] (paper: 2e-4).
        lb, ub: covariance bounds of the candidates, `lb < ub` (paper: 1 and 5).
        agg, max_response_len, is_weights, token_weights: as in `policy_loss`.
        generator: random source of the selection (its device must suit `torch.randperm`); drawn from only when
            there are candidates.
    Returns:
        `(loss, stats)`: the stats of `policy_loss` plus `loss/clip_cov_frac` (fraction of valid tokens whose
        gradient was removed) and `loss/clip_cov_candidate_frac` (fraction of valid tokens that were candidates).
    """
    _check_loss_inputs("clip_cov_loss", logprobs_new, logprobs_old, advantages, mask, agg, is_weights,
                       token_weights)
    if not 0.0 < clip_ratio <= 1.0:
        raise ValueError(f"clip_cov_loss: clip_ratio must be in (0, 1], got {clip_ratio!r}")
    if not lb < ub:
        raise ValueError(f"clip_cov_loss: need lb < ub, got lb={lb!r}, ub={ub!r}")
    valid = mask.bool()
    log_ratio, ratio = _ratio(logprobs_new, logprobs_old, valid)
    adv = _constant(advantages, valid, ratio.dtype)
    token_loss, loss_unclipped, loss_clipped = _ppo_token_loss(ratio, adv, eps_low, eps_high)

    with torch.no_grad():
        n_valid = int(valid.sum())
        cov = _centered_cov(advantages, logprobs_new, valid)
        candidates = valid & ~(loss_clipped > loss_unclipped) & (cov > lb) & (cov < ub)
        cand_idx = torch.nonzero(candidates.reshape(-1)).squeeze(1)
        n_clip = min(max(int(clip_ratio * n_valid), 1), cand_idx.numel()) if n_valid else 0
        selected = torch.zeros_like(candidates.reshape(-1))
        if n_clip > 0:
            device = generator.device if generator is not None else torch.device("cpu")
            perm = torch.randperm(cand_idx.numel(), generator=generator, device=device)
            selected[cand_idx[perm[:n_clip].to(cand_idx.device)]] = True
        selected = selected.reshape(valid.shape)

    token_loss = torch.where(selected, torch.zeros((), dtype=token_loss.dtype, device=token_loss.device),
                             token_loss)
    token_loss = _apply_weights(token_loss, valid, is_weights, token_weights)
    loss = aggregate(token_loss, valid, agg, max_response_len)

    with torch.no_grad():
        stats = _ppo_stats(loss, ratio, log_ratio, adv, loss_unclipped, loss_clipped, valid, n_valid,
                           eps_low, eps_high)
        stats["loss/clip_cov_frac"] = _frac(selected, valid, n_valid)
        stats["loss/clip_cov_candidate_frac"] = _frac(candidates, valid, n_valid)
        _weight_stats(stats, valid, n_valid, ratio.dtype, is_weights, token_weights)
    return loss, stats


def kl_cov_loss(
    logprobs_new: Tensor,
    logprobs_old: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    k_percent: float = 0.2,
    kl_coef: float = 1.0,
    agg: str = "token-mean",
    max_response_len: int | None = None,
    is_weights: Tensor | None = None,
    token_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """KL-Cov: the unclipped policy-gradient loss with a KL penalty on the highest-covariance tokens.

    Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models", section 4.2
    (the KL-Cov objective); docs/methods.md §5b. Per call:

    1. `cov = (A - mean A) * (logp_new - mean logp_new)` over the valid tokens (`_centered_cov`).
    2. The top `k = max(1, int(n_valid * k_percent / 100))` valid tokens by `cov` (signed, largest first; ties to
       the first in row-major order) get the token loss `-A * rho + kl_coef * |logp_new - logp_old|`.
    3. All other valid tokens get `-A * rho` (no PPO clip).
    4. `is_weights` / `token_weights` multiply the whole token loss (penalty included); `agg` aggregates with the
       normaliser of `mask`.

    `k_percent` is a percentage: the default 0.2 selects 0.2% of the tokens (the paper's k = 2e-3).
    `|logp_new - logp_old|` uses the log-ratio after the module's +-20 clamp, so its gradient vanishes beyond it.

    Args:
        logprobs_new, logprobs_old, advantages, mask: `[N, T]`, as in `policy_loss`.
        k_percent: percentage of the valid tokens penalised, in (0, 100].
        kl_coef: coefficient of the `|log ratio|` penalty (paper: 1), >= 0.
        agg, max_response_len, is_weights, token_weights: as in `policy_loss`.
    Returns:
        `(loss, stats)`: `loss/pg`, `loss/ratio_mean`, `loss/ratio_min`, `loss/ratio_max`, `loss/ppo_kl`,
        `loss/kl_cov_frac` (fraction of valid tokens penalised), `loss/kl_cov_abs_kl` (mean `|log ratio|` over them),
        `loss/kl_cov_penalty_share` (the aggregated penalty over |policy-gradient part| + penalty: how much the
        penalty acts; 0 at ratio 1, i.e. with one update per batch), and the weight statistics of `policy_loss`
        when weights are given.
    """
    _check_loss_inputs("kl_cov_loss", logprobs_new, logprobs_old, advantages, mask, agg, is_weights,
                       token_weights)
    if not 0.0 < k_percent <= 100.0:
        raise ValueError(f"kl_cov_loss: k_percent is a percentage in (0, 100], got {k_percent!r}")
    if kl_coef < 0:
        raise ValueError(f"kl_cov_loss: kl_coef must be >= 0, got {kl_coef!r}")
    valid = mask.bool()
    log_ratio, ratio = _ratio(logprobs_new, logprobs_old, valid)
    adv = _constant(advantages, valid, ratio.dtype)
    with torch.no_grad():
        n_valid = int(valid.sum())
        k = max(1, int(n_valid * k_percent / 100.0)) if n_valid else 0
        selected = _top_k_mask(_centered_cov(advantages, logprobs_new, valid), valid, k)
    pg = -adv * ratio
    token_loss = torch.where(selected, pg + kl_coef * log_ratio.abs(), pg)
    token_loss = _apply_weights(token_loss, valid, is_weights, token_weights)
    loss = aggregate(token_loss, valid, agg, max_response_len)

    with torch.no_grad():
        stats = _ratio_stats(loss, ratio, log_ratio, valid, n_valid)
        stats["loss/kl_cov_frac"] = _frac(selected, valid, n_valid)
        stats["loss/kl_cov_abs_kl"] = float(masked_mean(log_ratio.abs(), selected))
        # how much of the objective the penalty is: its aggregate over |pg| + it (0 with one update: |log 1| = 0)
        penalty = aggregate(_apply_weights(torch.where(selected, kl_coef * log_ratio.abs(), 0.0), valid, is_weights,
                                           token_weights), valid, agg, max_response_len)
        pg_part = aggregate(_apply_weights(pg, valid, is_weights, token_weights), valid, agg, max_response_len)
        stats["loss/kl_cov_penalty_share"] = float(penalty / (pg_part.abs() + penalty).clamp_min(1e-12))
        _weight_stats(stats, valid, n_valid, ratio.dtype, is_weights, token_weights)
    return loss, stats


# ----------------------------------------------------------------------------------------------------------------
# Token selection and importance weights


def forking_mask(entropy: Tensor, mask: Tensor, *, top_frac: float = 0.2) -> Tensor:
    """0/1 selection of the highest-entropy ("forking") valid tokens of the batch, for `token_weights`.

    Wang et al. 2025, "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive Effective Reinforcement Learning
    for LLM Reasoning" (the DAPO objective restricted by the indicator `H >= tau_rho`, the batch's entropy
    quantile); docs/methods.md §5d. Exactly `k = max(1, int(n_valid * top_frac))` tokens are selected (the count
    convention of Clip-Cov), the highest entropies first, ties to the token first in row-major order. This differs
    from the paper's quantile threshold only in how ties and rounding at the threshold are resolved.

    Pass the result as `token_weights`: the unselected tokens contribute 0 but still count in the `token-mean`
    normaliser, as the paper's objective keeps `1 / sum_i |o_i|`.

    Args:
        entropy: `[N, T]` token entropies of the old policy (any value on padding; nan counts as lowest).
        mask: `[N, T]` 1 on response tokens.
        top_frac: fraction of the valid tokens kept, in (0, 1] (paper: 0.2).
    Returns:
        `[N, T]` float tensor (entropy's dtype when floating, else float32), 1.0 on the selected tokens, 0.0 elsewhere
        (always 0 where `mask == 0`; all zeros when no token is valid). No gradient.
    """
    if entropy.shape != mask.shape or mask.dim() != 2:
        raise ValueError(f"forking_mask: expected entropy and mask of one [N, T] shape; got "
                         f"{tuple(entropy.shape)} and {tuple(mask.shape)}")
    if not 0.0 < top_frac <= 1.0:
        raise ValueError(f"forking_mask: top_frac must be in (0, 1], got {top_frac!r}")
    valid = mask.bool()
    n_valid = int(valid.sum())
    k = max(1, int(n_valid * top_frac)) if n_valid else 0
    dtype = entropy.dtype if entropy.is_floating_point() else torch.float32
    return _top_k_mask(entropy, valid, k).to(dtype)


TIS_LEVELS: tuple[str, ...] = ("token", "sequence")
"""Valid values of `level` in `tis_weights` / `tis_stats` (docs/methods.md §6)."""


def _tis_log_ratio(logprobs: Tensor, behavior_logprobs: Tensor, valid: Tensor, level: str) -> Tensor:
    """Detached `[N, T]` log importance ratio of each token's weight: its own `logprobs - behavior_logprobs`
    (`token`), or the sum of those over the valid tokens of its response, broadcast to them (`sequence`, in at
    least float32); 0 on padding."""
    d = _zero_padding(logprobs.detach() - behavior_logprobs.detach(), valid)
    if level == "token":
        return d
    d = d.to(torch.promote_types(d.dtype, torch.float32))
    log_seq = d.sum(dim=-1, keepdim=True)  # [N, 1]: log pi_old(y|x) - log mu(y|x)
    return _zero_padding(log_seq.expand_as(d), valid)


def _tis_raw(logprobs: Tensor, behavior_logprobs: Tensor, valid: Tensor, level: str = "token") -> Tensor:
    """`exp(log_ratio)` of `_tis_log_ratio`, detached, 1 on padding, in the inputs' dtype; the log-ratio is capped
    at +20 before `exp`."""
    raw = torch.exp(_tis_log_ratio(logprobs, behavior_logprobs, valid, level).clamp(max=_LOG_RATIO_BOUND))
    return raw.to(torch.promote_types(logprobs.dtype, behavior_logprobs.dtype))


def _check_tis(logprobs: Tensor, behavior_logprobs: Tensor, mask: Tensor, cap: float, level: str) -> None:
    if logprobs.shape != mask.shape or behavior_logprobs.shape != mask.shape:
        raise ValueError(f"tis_weights: logprobs, behavior_logprobs and mask must share one shape; got "
                         f"{tuple(logprobs.shape)}, {tuple(behavior_logprobs.shape)}, {tuple(mask.shape)}")
    if not cap > 0:
        raise ValueError(f"tis_weights: cap must be > 0, got {cap!r}")
    if level not in TIS_LEVELS:
        raise ValueError(f"tis_weights: unknown level {level!r}; valid: {', '.join(TIS_LEVELS)}")
    if level == "sequence" and mask.dim() != 2:
        raise ValueError(f"tis_weights: level 'sequence' needs [N, T] inputs, got {tuple(mask.shape)}")


def tis_weights(logprobs: Tensor, behavior_logprobs: Tensor, mask: Tensor, *, cap: float = 2.0,
                level: str = "token") -> Tensor:
    """Truncated importance weights `w = min(exp(logprobs - behavior_logprobs), cap)`, per token or per sequence.

    EAD (appendix B.2, the truncated-IS loss): the samples come from the annealed behaviour policy,
    the optimised policy stays at the base temperature, so each token's loss is multiplied by
    `min(pi_old(y) / pi_old^EAD(y), C)`; docs/methods.md §6c (C = 2.0 by default; the paper names no value).
    Pass the result as `is_weights`.

    `level` (docs/methods.md §6 and §9): `token` (default) weighs each token by its own truncated ratio, as above.
    `sequence` is the ratio EAD App. B.2 writes, of whole sequences, `min(pi_old(y|x) / pi_EAD(y|x), C)`:
    every valid token of response i gets `min(exp(S_i), cap)`, `S_i = sum_t mask * (logprobs - behavior_logprobs)`,
    computed in log space as `min(exp(min(S_i, 20)), cap)` so a long response cannot overflow (the +20 guard
    only matters for `cap > 4.8e8`); `S_i` is summed in at least float32.

    Args:
        logprobs: `[N, T]` old-policy log-probs of the sampled tokens at the training temperature.
        behavior_logprobs: `[N, T]` log-probs of the same tokens under the distribution they were drawn from.
        mask: `[N, T]` 1 on response tokens.
        cap: the truncation `C` (> 0; `math.inf` disables it).
        level: `token` or `sequence` (`TIS_LEVELS`).
    Returns:
        `[N, T]` detached weights in `[0, cap]`, exactly 0 where `mask == 0` (so all 0 for a response without
        valid tokens). Numerical guard: the log-ratio is capped at 20 before `exp` (only matters for
        `cap > 4.8e8`).
    """
    _check_tis(logprobs, behavior_logprobs, mask, cap, level)
    with torch.no_grad():
        valid = mask.bool()
        return _zero_padding(_tis_raw(logprobs, behavior_logprobs, valid, level).clamp(max=cap), valid)


def tis_stats(logprobs: Tensor, behavior_logprobs: Tensor, mask: Tensor, cap: float = 2.0, *,
              level: str = "token") -> dict[str, float]:
    """Statistics of `tis_weights` (with the same `cap` and `level`) over the valid tokens (shapes as there).

    Returns:
        `is/weight_mean` and `is/weight_max` of the truncated weights (1.0 when no token is valid, the neutral
        weight) and `is/truncated_frac`, the fraction of valid tokens whose untruncated ratio exceeds `cap`
        (`exp(logprobs - behavior_logprobs)` per token; at level `sequence` their response's ratio, so every
        statistic is token-weighted, as the loss sees the weights).
    """
    _check_tis(logprobs, behavior_logprobs, mask, cap, level)
    with torch.no_grad():
        valid = mask.bool()
        n_valid = int(valid.sum())
        if level == "token":
            raw = _tis_raw(logprobs, behavior_logprobs, valid)
            truncated = raw > cap
        else:  # compare in log space: the response's ratio itself may overflow
            raw = _tis_raw(logprobs, behavior_logprobs, valid, level)
            truncated = _tis_log_ratio(logprobs, behavior_logprobs, valid, level) > math.log(cap)
        w = raw.clamp(max=cap)
        return {
            "is/weight_mean": float(masked_mean(w, valid)) if n_valid else 1.0,
            "is/weight_max": float(w[valid].max()) if n_valid else 1.0,
            "is/truncated_frac": _frac(truncated, valid, n_valid),
        }


# ----------------------------------------------------------------------------------------------------------------
# DAPO soft overlong punishment


def overlong_penalty(
    lengths: Tensor,
    truncated: Tensor | None,
    max_len: int,
    *,
    buffer: int,
    penalty: float = 1.0,
) -> Tensor:
    """Length-aware reward term for overlong responses, to add to the reward (DAPO soft overlong punishment).

    Yu et al. 2025 (DAPO), section 3.4, eq. 13, with `L_max = max_len`, `L_cache = buffer`, scaled by `penalty`:
    `0` if `L <= max_len - buffer`; `((max_len - buffer) - L) / buffer * penalty` if `max_len - buffer < L <= max_len`
    (falling linearly to `-penalty` at `L = max_len`); `-penalty` if `L > max_len`. A response flagged `truncated`
    (cut at the length limit without EOS) counts as exceeding: `-penalty`. As in DAPO, `max_len` is the generation
    limit and the soft zone is its last `buffer` tokens.

    Args:
        lengths: `[N]` response lengths in tokens.
        truncated: `[N]` bool, True where the response hit the limit without ending; None for no flags.
        max_len: `L_max`, >= 1.
        buffer: `L_cache`, `0 <= buffer <= max_len` (0 gives a hard step at `max_len`).
        penalty: the magnitude of the full penalty (DAPO: 1).
    Returns:
        `[N]` float tensor of values in `[-penalty, 0]` (lengths' dtype when floating, else float32).
    """
    if max_len < 1 or not 0 <= buffer <= max_len:
        raise ValueError(f"overlong_penalty: need max_len >= 1 and 0 <= buffer <= max_len; "
                         f"got max_len={max_len!r}, buffer={buffer!r}")
    lengths = torch.as_tensor(lengths)
    dtype = lengths.dtype if lengths.is_floating_point() else torch.float32
    length = lengths.to(dtype)
    start = float(max_len - buffer)
    zero = torch.zeros((), dtype=dtype, device=length.device)
    inside = (start - length) / buffer * penalty if buffer > 0 else torch.zeros_like(length)
    out = torch.where(length <= start, zero, inside)
    over = length > max_len
    if truncated is not None:
        truncated = torch.as_tensor(truncated, device=length.device)
        if truncated.shape != length.shape:
            raise ValueError(f"overlong_penalty: lengths {tuple(length.shape)} and truncated "
                             f"{tuple(truncated.shape)} differ in shape")
        over = over | truncated.bool()
    return torch.where(over, torch.full((), -float(penalty), dtype=dtype, device=length.device), out)


def aggregation_count(mask: Tensor, agg: str) -> float:
    """What aggregation `agg` divides a batch's summed loss by: its valid tokens (token-mean), non-empty responses
    (seq-mean-token-mean) or responses (seq-mean-token-sum-norm). `mask`: `[N, T]` the batch's loss mask."""
    if agg == "token-mean":
        return float(mask.sum())
    if agg in ("seq-mean-token-mean", PER_QUESTION):
        return float((mask.sum(-1) > 0).sum())
    return float(mask.shape[0])


def micro_batch_share(mask: Tensor, rows: Tensor, agg: str) -> float:
    """Share of micro-batch `rows` in the normaliser of its mini-batch under aggregation `agg`.

    Weighting each micro-batch's aggregated loss by this share and summing the gradients gives exactly the
    gradient of the whole mini-batch's loss (gradient accumulation): the micro-batch's `aggregation_count` over
    the mini-batch's.

    Args:
        mask: `[M, T]` the mini-batch's loss mask; rows: indices into its rows.
    """
    return aggregation_count(mask[rows], agg) / max(aggregation_count(mask, agg), 1.0)


# ----------------------------------------------------------------------------------------------------------------
# Registry: kind `policy_loss`; `kwargs` maps each keyword to the option (or core `algo` field) supplying it


@dataclass
class PpoOptions:
    """The PPO-clip loss's options, `algo.ppo.<field>` (docs/methods.md §1, §9)."""

    dual_clip_c: float | None = None
    """Dual-clip PPO as verl 0.9 applies it (its `actor.clip_ratio_c`, default 3.0, always on; Ye et al. 2020): for
    tokens with A < 0 the token loss is min(-A * c, PPO-clip loss), so a huge ratio cannot drive it further. Must be
    > 1. null (explorl's default): off. verl's Clip-Cov has none, so `clip_cov` has no such option."""


def _check_ppo(cfg) -> str | None:
    c = cfg.algo.options["ppo"].dual_clip_c
    return None if c is None or c > 1 else (f"algo.ppo.dual_clip_c: must be > 1 (verl's clip_ratio_c is 3.0) or null "
                                            f"for no dual clip, got {c}")


@dataclass
class ClipCovOptions:
    """Clip-Cov's options, `algo.clip_cov.<field>` (Cui et al. 2025; docs/methods.md §5a)."""

    ratio: float = 2e-4
    """Fraction of tokens whose gradient is removed."""
    lb: float = 1.0
    """Lower covariance bound of the candidates."""
    ub: float = 5.0
    """Upper covariance bound of the candidates."""


@dataclass
class KlCovOptions:
    """KL-Cov's options, `algo.kl_cov.<field>` (Cui et al. 2025; docs/methods.md §5b)."""

    k_percent: float = 0.2
    """Percentage (not fraction) of tokens with the largest covariance that get the KL penalty."""
    coef: float = 1.0
    """Coefficient of |logp - logp_old| on the selected tokens."""


_PPO_KWARGS = {"eps_low": "eps_low", "eps_high": "eps_high"}
# `verl_fields`: option -> (key of verl's actor config, factor, verl's default), how verl 0.9 spells each option
# (`explorl.integrations.verl` reads them from there; verl applies its dual clip always, at 3.0 by default)
register("policy_loss", "ppo", needs_old_logprobs=False, rowwise=True, options=PpoOptions, check=_check_ppo,
         kwargs={**_PPO_KWARGS, "dual_clip_c": "dual_clip_c"},
         verl_fields={"dual_clip_c": ("clip_ratio_c", 1.0, 3.0)}, cites=(Cite("PPO", "eq. 7", doc="1b"),))(policy_loss)
register("policy_loss", "clip_cov", needs_old_logprobs=False, needs_generator=True, options=ClipCovOptions,
         kwargs={**_PPO_KWARGS, "clip_ratio": "ratio", "lb": "lb", "ub": "ub"},
         verl_fields={"ratio": ("policy_loss.clip_cov_ratio", 1.0, 2e-4), "lb": ("policy_loss.clip_cov_lb", 1.0, 1.0),
                      "ub": ("policy_loss.clip_cov_ub", 1.0, 5.0)},
         cites=(Cite("Clip-Cov/KL-Cov", "section 4.2", doc="5a"),))(clip_cov_loss)
register("policy_loss", "kl_cov", needs_old_logprobs=False, options=KlCovOptions,
         kwargs={"k_percent": "k_percent", "kl_coef": "coef"},  # verl's kl_cov_ratio is a fraction, ours a percentage
         verl_fields={"k_percent": ("policy_loss.kl_cov_ratio", 100.0, 2e-3),
                      "coef": ("policy_loss.ppo_kl_coef", 1.0, 1.0)},
         cites=(Cite("Clip-Cov/KL-Cov", "section 4.2", doc="5b"),))(kl_cov_loss)


def get_policy_loss(name: str) -> Callable[..., tuple[Tensor, dict[str, float]]]:
    """The policy loss registered as `name`, called as `fn(logprobs_new, logprobs_old, advantages, mask, agg=...,
    max_response_len=..., is_weights=..., token_weights=..., **variant_kwargs) -> (loss, stats)`; KeyError listing
    the valid names otherwise."""
    return get("policy_loss", name)


# Token filters: kind `token_filter`, fn(batch, loss_mask, cfg[, *, options]) -> per-token weights [N, T] or None

@register("token_filter", "none", needs_old_logprobs=False, cites=(Cite("explorl", doc="1b"),))
def _no_token_filter(batch, loss_mask: Tensor, cfg) -> None:
    """Every valid token trains."""
    return None


@dataclass
class ForkingOptions:
    """The forking-token filter's options, `algo.forking.<field>` (Wang et al. 80/20; docs/methods.md §5)."""

    top_frac: float = 0.2
    """Fraction of the batch's valid tokens kept: those of highest entropy."""


def _check_forking(cfg) -> str | None:
    f = cfg.algo.options["forking"].top_frac
    return None if 0 < f <= 1 else f"algo.forking.top_frac: must be in (0, 1], got {f}"


@register("token_filter", "forking", needs_old_logprobs=False, options=ForkingOptions, check=_check_forking,
          cites=(Cite("forking tokens", doc="5d"),))
def _forking_filter(batch, loss_mask: Tensor, cfg, *, options: ForkingOptions) -> Tensor:
    """Only the top `top_frac` highest-entropy tokens of the batch train (Wang et al., 80/20)."""
    batch.require("entropy", by="token_filter 'forking'")
    return forking_mask(batch.entropy, loss_mask, top_frac=options.top_frac)
