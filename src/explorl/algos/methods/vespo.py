"""VESPO: a smooth gamma-shaped kernel on each response's sequence-level importance weight, in place of a clip.

VESPO: Guobin Shen, Chenxiao Zhao, Xiang Cheng, Lei Huang, Xing Yu (2026), "VESPO: Variational Sequence-Level Soft
Policy Optimization for Stable Off-Policy LLM Training", arXiv 2602.10693.

Implements VESPO's loss as TRL 1.16 computes it (`GRPOTrainer.get_gamma_weights` and `_compute_loss` with
`loss_type: vespo`); docs/methods.md §5y. Each response's importance weight is the full sequence ratio, with no
length normalisation: `W_i = pi(y_i) / pi_old(y_i) = exp(sum_t (log pi(y_i,t) - log pi_old(y_i,t)))`. The paper
derives, from a variational problem over proposal distributions with a variance budget, the kernel
`phi(W) = W^k * exp(lambda * (1 - W))` (1 at `W = 1`, largest there, falling smoothly to 0 as `W -> 0` and
`W -> inf`), with `(k, lambda) = (k_pos, lambda_pos)` where the advantage is >= 0 and `(k_neg, lambda_neg)` where it
is negative. The kernel is a detached coefficient of the REINFORCE term: token loss `-sg[phi(W_i)] * A_t * log pi(y_t)`,
so every token of response i gets the gradient `-phi(W_i) * A_t * grad log pi(y_t)`: the plain policy gradient on
the first update (`W = 1`), damped smoothly as the response drifts off-policy either way. Policy loss `vespo`,
options `algo.vespo.<field>` (`VespoOptions`: TRL's `vespo_k_pos`, `vespo_lambda_pos`, `vespo_k_neg`,
`vespo_lambda_neg`, with its defaults, which are those of the paper's released training scripts).

Differences, said where they act: the aggregation is `algo.loss_agg` (TRL's `vespo` is normalised by the tokens of
the batch, `token-mean`, the recipe's). Explorl's importance weights (`algo.importance_weights`, the sampler's
distribution against the trainer's) multiply the token loss, as for every policy loss; TRL instead folds its
token-level vLLM importance ratios into `W` (it refuses sequence-level ones with VESPO). The clamps are TRL's: each
token log-ratio to +-20 and `log W` to `[log 1e-8, 20]`, `lambda` at least 1e-4, and a kernel that overflows to
inf or nan is 0. The loss's value carries `log pi` itself (as CISPO's), so it is not the PPO loss's value even where
the gradients agree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from explorl.algos.aggregation import Reduction, masked_mean, zero_padding
from explorl.algos.batch import RolloutBatch
from explorl.algos.core import as_constant, check_loss_inputs, importance_ratio, ratio_stats
from explorl.algos.registry import Cite, register

LOG_W_MIN = math.log(1e-8)
"""Lower clamp of `log W` (TRL 1.16's `log(1e-8)`, about -18.42)."""
LOG_W_MAX = 20.0
"""Upper clamp of `log W` (TRL 1.16's)."""
LAMBDA_MIN = 1e-4
"""Lower clamp of the kernel's decay `lambda` (TRL 1.16's)."""


@dataclass
class VespoOptions:
    """VESPO's options, `algo.vespo.<field>` (Shen et al. 2026; docs/methods.md §5y)."""

    k_pos: float = 2.0
    """Power `k` of the kernel `W^k * exp(lambda * (1 - W))` for responses whose advantage is >= 0 (TRL 1.16's
    `vespo_k_pos`): larger damps responses with `W < 1` harder. Must be >= 0."""
    lambda_pos: float = 3.0
    """Decay `lambda` of the kernel for advantages >= 0 (TRL's `vespo_lambda_pos`): larger damps responses with
    `W > 1` harder. Must be >= 0 (values below 1e-4 act as 1e-4, as in TRL)."""
    k_neg: float = 3.0
    """Power `k` of the kernel for negative advantages (TRL's `vespo_k_neg`). Must be >= 0."""
    lambda_neg: float = 2.0
    """Decay `lambda` of the kernel for negative advantages (TRL's `vespo_lambda_neg`). Must be >= 0 (values below
    1e-4 act as 1e-4)."""


def _check_vespo(cfg) -> str | None:
    opts = cfg.algo.options["vespo"]
    for field in ("k_pos", "lambda_pos", "k_neg", "lambda_neg"):
        value = getattr(opts, field)
        if not (value >= 0 and math.isfinite(value)):
            return (f"algo.vespo.{field}: must be a finite number >= 0 (TRL's and the paper's k_pos 2, lambda_pos 3, "
                    f"k_neg 3, lambda_neg 2), got {value}")
    return None


def vespo_kernel(log_w: Tensor, advantages: Tensor, *, k_pos: float = 2.0, lambda_pos: float = 3.0,
                 k_neg: float = 3.0, lambda_neg: float = 2.0) -> Tensor:
    """VESPO's kernel `phi(W) = exp(lambda + k * log W - lambda * W)` = `W^k * exp(lambda * (1 - W))`, detached.

    `log_w` is clamped to `[log 1e-8, 20]` first; `(k, lambda)` is `(k_pos, lambda_pos)` where `advantages >= 0`,
    `(k_neg, lambda_neg)` elsewhere, `lambda` clamped to >= 1e-4; a kernel that is nan or inf is 0 (TRL 1.16's).
    Shapes: `log_w` and `advantages` broadcast together (`[N, 1]` and `[N, T]` give `[N, T]`)."""
    with torch.no_grad():
        log_w = log_w.detach().clamp(LOG_W_MIN, LOG_W_MAX)
        nonneg = advantages.detach() >= 0
        k = torch.where(nonneg, torch.as_tensor(k_pos, dtype=log_w.dtype, device=log_w.device),
                        torch.as_tensor(k_neg, dtype=log_w.dtype, device=log_w.device))
        lam = torch.where(nonneg, torch.as_tensor(lambda_pos, dtype=log_w.dtype, device=log_w.device),
                          torch.as_tensor(lambda_neg, dtype=log_w.dtype, device=log_w.device)).clamp(min=LAMBDA_MIN)
        phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w))
        return phi.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def vespo_loss(
    logprobs_new: Tensor,
    logprobs_old: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    options: VespoOptions = VespoOptions(),
    reduction: Reduction = Reduction("token-mean"),
) -> tuple[Tensor, dict[str, float]]:
    """VESPO's loss to minimise (Shen et al. 2026; TRL 1.16's `loss_type: vespo`; docs/methods.md §5y).

    Token loss `-phi_it * A_t * logp_new_t` with `phi_it = vespo_kernel(log W_i, A_t)` detached and
    `log W_i = sum_t clamp(logp_new_t - logp_old_t, -20, 20)` over response i's valid tokens (the sequence ratio,
    not length-normalised). Its gradient with respect to `logp_new_t` is `-phi_it * A_t` (times the aggregation's
    normaliser). Weights multiply the token loss as in `explorl.algos.methods.ppo.policy_loss`; aggregated by the
    reduction's `agg`.

    Args:
        logprobs_new: `[N, T]` log-probs under the policy being optimised (differentiable).
        logprobs_old: `[N, T]` log-probs under the policy that produced the batch (constant).
        advantages: `[N, T]` per-token advantages (constant); their sign picks the kernel's `(k, lambda)` per token.
        mask: `[N, T]` 1 on response tokens.
        options: the kernel's power and decay for advantages >= 0 and < 0 (`k_pos`, `lambda_pos`, `k_neg`,
            `lambda_neg`).
        reduction: the aggregation (`aggregate`), the length limit it may need and the optional `[N, T]` detached
            `is_weights` / `token_weights` multiplying the token loss (`Reduction`).
    Returns:
        `(loss, stats)`: the scalar loss and detached statistics over valid tokens: `loss/pg`, `loss/ratio_mean`,
        `loss/ratio_max`, `loss/ratio_min`, `loss/ppo_kl` (of the token ratios, as `policy_loss`),
        `loss/vespo_phi_mean` (the mean kernel over valid tokens: 1 on the first update; TRL's
        `vespo/phi_seq_mean` is its mean over responses), `loss/vespo_log_w_mean` (the mean over responses of the
        clamped `log W`), and the weight statistics of `policy_loss` when weights are given.
    """
    check_loss_inputs("vespo_loss", logprobs_new, logprobs_old, advantages, mask, reduction)
    valid = mask.bool()
    log_ratio, ratio = importance_ratio(logprobs_new, logprobs_old, valid)
    log_w = log_ratio.detach().sum(-1, keepdim=True)  # [N, 1]; padding is 0 in log_ratio
    adv = as_constant(advantages, valid, ratio.dtype)
    phi = vespo_kernel(log_w, adv, k_pos=options.k_pos, lambda_pos=options.lambda_pos, k_neg=options.k_neg,
                       lambda_neg=options.lambda_neg)
    loss = reduction(-phi * adv * zero_padding(logprobs_new, valid), valid)
    with torch.no_grad():
        n_valid = int(valid.sum())
        stats = ratio_stats(loss, ratio, log_ratio, valid, n_valid)
        stats["loss/vespo_phi_mean"] = float(masked_mean(phi, valid)) if n_valid else 1.0
        rows = valid.any(-1)
        stats["loss/vespo_log_w_mean"] = (float(log_w[rows].clamp(LOG_W_MIN, LOG_W_MAX).mean()) if bool(rows.any())
                                          else 0.0)
        reduction.record(stats, valid, n_valid, ratio.dtype)
    return loss, stats


@register("policy_loss", "vespo", needs_old_logprobs=False, rowwise=True, options=VespoOptions, check=_check_vespo,
          reads=("loss_agg",), formula=(vespo_loss, vespo_kernel), cites=(Cite("VESPO", doc="5y"),))
def _vespo_adapter(logprobs_new: Tensor, batch: RolloutBatch, cfg, *,
                   options: VespoOptions) -> tuple[Tensor, dict[str, float]]:
    """VESPO (`vespo_loss`) with the kernel's `algo.vespo.k_pos` / `lambda_pos` / `k_neg` / `lambda_neg` and the
    aggregation `algo.loss_agg`."""
    return vespo_loss(logprobs_new, batch.logprobs, batch.advantages, batch.loss_mask, options=options,
                      reduction=Reduction.of(batch, cfg.loss_agg))
