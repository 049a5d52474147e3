"""Policy losses: per-token objectives and their aggregation, as pure tensor functions.

The per-token objective and the aggregation over tokens are separate settings (as verl's `loss_agg_mode`):
`policy_loss` builds the clipped token loss and hands it to `aggregate`, which the trainer also uses for the
KL (`kl_k3`) and entropy terms, so every term of the objective is normalised the same way.

Notation follows METHODS.md: N responses padded to T tokens, `mask[N, T]` is 1 on response tokens.
Padding may hold any value (even inf or nan) in the inputs: it is replaced before any arithmetic, so it
reaches neither the loss nor the gradient.

Deliberate difference from the bare formula: the log-ratio `logp_new - logp_old` is clamped to [-20, 20]
before `exp` (as verl does), a numerical guard that only acts on ratios beyond 4.8e8 or below 2e-9.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["LOSS_AGG_MODES", "masked_sum", "masked_mean", "aggregate", "kl_k3", "policy_loss"]

LOSS_AGG_MODES: tuple[str, ...] = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
"""Valid values of `agg` (METHODS.md section 1)."""

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
    """Reduce per-token values `[N, T]` to a scalar, over the tokens where `mask != 0` (METHODS.md section 1).

    - `token-mean`: sum over all valid tokens / number of valid tokens. Every token weighs the same, so long
      responses weigh more (DAPO, Yu et al. 2025, section 3.3 "Token-Level Policy Gradient Loss").
    - `seq-mean-token-mean`: mean over responses of each response's mean over its tokens (the GRPO objective,
      Shao et al. 2024 eq. 3). Responses without valid tokens are left out of the outer mean.
    - `seq-mean-token-sum-norm`: sum over all valid tokens / (N * max_response_len), a constant that does not
      depend on the lengths (Dr.GRPO, Liu et al. 2025). `max_response_len` (the configured length limit) is
      required in this mode and ignored in the others.

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
    if agg == "seq-mean-token-mean":
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


def kl_k3(logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor | None = None) -> Tensor:
    """Per-token k3 estimator of KL(pi || pi_ref) on sampled tokens: `exp(d) - d - 1`, `d = ref - logp`.

    Schulman 2020, "Approximating KL Divergence" (k3: unbiased, always >= 0); the GRPO KL term, Shao et al.
    2024 eq. 4. Computed as `expm1(d) - d`, accurate for small `d`.

    Args:
        logprobs: `[N, T]` log-probabilities of the sampled tokens under the policy being optimised.
        ref_logprobs: `[N, T]` the same under the frozen reference model.
        mask: optional `[N, T]`; where 0 the output is exactly 0 (and padding values are never exponentiated).
    Returns:
        `[N, T]` non-negative per-token KL estimates.
    """
    d = ref_logprobs - logprobs
    if mask is not None:
        d = _zero_padding(d, mask)
    kl = torch.expm1(d) - d
    return kl if mask is None else _zero_padding(kl, mask)


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
) -> tuple[Tensor, dict[str, float]]:
    """Clipped surrogate policy-gradient loss (to minimise), aggregated by `agg` (METHODS.md section 1).

    Token loss `-min(rho * A, clip(rho, 1 - eps_low, 1 + eps_high) * A)`, `rho = exp(logp_new - logp_old)`:
    PPO, Schulman et al. 2017, eq. 7; decoupled bounds `eps_low` / `eps_high` ("clip-higher") and token-mean
    aggregation from DAPO, Yu et al. 2025, sections 3.1 and 3.3. Optional `is_weights` (e.g. the truncated
    importance weights of EAD, METHODS.md section 6) multiply the token loss and receive no gradient.

    Args:
        logprobs_new: `[N, T]` log-probs of the sampled tokens under the policy being optimised (differentiable).
        logprobs_old: `[N, T]` the same under the policy that produced the batch (treated as constant).
        advantages: `[N, T]` per-token advantages (treated as constant).
        mask: `[N, T]` 1 on response tokens.
        eps_low, eps_high: clip range `[1 - eps_low, 1 + eps_high]` of the ratio.
        agg: token aggregation, one of `LOSS_AGG_MODES` (see `aggregate`).
        max_response_len: the configured response length limit; required for `seq-mean-token-sum-norm`.
        is_weights: optional `[N, T]` per-token weights multiplying the token loss (detached).
    Returns:
        `(loss, stats)`: the scalar loss (0, not nan, when the mask is empty) and detached float statistics over
        valid tokens: `loss/pg` (the loss value), `loss/clip_frac` (the clipped term is active: it is strictly the
        larger loss), `loss/clip_frac_low` (rho < 1 - eps_low with A < 0), `loss/clip_frac_high`
        (rho > 1 + eps_high with A > 0), `loss/ratio_mean`, `loss/ratio_max`, `loss/ppo_kl` (mean of
        `logp_old - logp_new`), and `loss/is_weight_mean` when `is_weights` is given.
    """
    shapes = {"logprobs_new": logprobs_new, "logprobs_old": logprobs_old, "advantages": advantages, "mask": mask}
    if is_weights is not None:
        shapes["is_weights"] = is_weights
    if mask.dim() != 2 or any(t.shape != mask.shape for t in shapes.values()):
        raise ValueError("policy_loss: all inputs must share one [N, T] shape; got "
                         + ", ".join(f"{k} {tuple(v.shape)}" for k, v in shapes.items()))
    if agg not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss aggregation {agg!r}; valid: {', '.join(LOSS_AGG_MODES)}")
    valid = mask.bool()
    log_ratio = _zero_padding(logprobs_new - logprobs_old.detach(), valid)
    log_ratio = log_ratio.clamp(-_LOG_RATIO_BOUND, _LOG_RATIO_BOUND)
    ratio = torch.exp(log_ratio)
    adv = _zero_padding(advantages.detach().to(ratio.dtype), valid)
    loss_unclipped = -adv * ratio
    loss_clipped = -adv * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    token_loss = torch.maximum(loss_unclipped, loss_clipped)  # = -min(rho*A, clip(rho)*A)
    if is_weights is not None:
        token_loss = token_loss * _zero_padding(is_weights.detach().to(token_loss.dtype), valid)
    loss = aggregate(token_loss, valid, agg, max_response_len)

    with torch.no_grad():
        n_valid = int(valid.sum())

        def frac(flags: Tensor) -> float:
            return float((flags & valid).sum()) / max(n_valid, 1)

        stats = {
            "loss/pg": float(loss),
            "loss/clip_frac": frac(loss_clipped > loss_unclipped),
            "loss/clip_frac_low": frac((ratio < 1.0 - eps_low) & (adv < 0)),
            "loss/clip_frac_high": frac((ratio > 1.0 + eps_high) & (adv > 0)),
            "loss/ratio_mean": float(masked_mean(ratio, valid)) if n_valid else 1.0,
            "loss/ratio_max": float(ratio[valid].max()) if n_valid else 1.0,
            "loss/ppo_kl": float(masked_mean(-log_ratio, valid)),
        }
        if is_weights is not None:
            stats["loss/is_weight_mean"] = float(masked_mean(is_weights.to(ratio.dtype), valid))
    return loss, stats
