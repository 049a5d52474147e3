"""CISPO: the policy gradient weighted by the clipped, stop-gradient importance ratio.

MiniMax-M1: MiniMax, Aili Chen, Aonian Li, Bangwei Gong et al. (2025), "MiniMax-M1: Scaling Test-Time Compute
Efficiently with Lightning Attention", arXiv 2506.13585.

Implements CISPO, the objective of section 3.1 (eq. 4, with the clipped importance-sampling weight of eq. 5), as
verl 0.9.1 (`compute_policy_loss_cispo`) computes it; docs/methods.md §5h. Where PPO clips the token update (a token
whose ratio leaves the clip range in the advantage's direction gets no gradient), CISPO clips the weight: every token
keeps the gradient of `A * log pi(y_t)`, scaled by `sg[clip(r_t, 1 - eps_low, 1 + eps_high)]` with
`r_t = pi(y_t) / pi_old(y_t)`, so the low-probability tokens PPO's clip drops (the paper's "However", "Wait") still
get theirs. Token loss `-sg[clip(r_t)] * A_t * log pi(y_t)`; policy loss `cispo`. The clip range is the core
`algo.eps_low` / `algo.eps_high` (verl's `clip_ratio_low` / `clip_ratio_high`); the paper sets no lower bound
(`eps_low` 1: the weight is never clipped from below, recipe `cispo`) and tunes only the upper one. CISPO has no
options of its own (`algo.cispo` does not exist).

Differences, said where they act: the aggregation is `algo.loss_agg` (the paper's eq. 4 divides by the batch's
tokens: `token-mean`, the recipe's); the token log-ratio is clamped to +-20 before `exp` (verl's too). The loss's
value carries `log pi` itself (verl's does too), so it is not the PPO loss's value even where the gradients agree
(on the first update, `r = 1`: both are `-A * grad log pi`). TRL 1.16's `loss_type: cispo` caps the weight at
`epsilon_high` itself (`min(r, epsilon_high)`, no lower bound, no clamp of the log-ratio), where verl and explorl
cap it at `1 + eps_high`: TRL's `epsilon_high` 5 is explorl's `eps_high` 4 with `eps_low` 1.
"""

from __future__ import annotations

import torch
from torch import Tensor

from explorl.algos.aggregation import Reduction, masked_mean, zero_padding
from explorl.algos.batch import RolloutBatch
from explorl.algos.core import as_constant, check_loss_inputs, importance_ratio, ratio_stats, valid_fraction
from explorl.algos.registry import Cite, register


def cispo_weight(ratio: Tensor, eps_low: float, eps_high: float) -> Tensor:
    """`[N, T]` CISPO's importance-sampling weight `sg[clip(ratio, 1 - eps_low, 1 + eps_high)]` (eq. 5): detached,
    so no gradient flows through the ratio or its clip."""
    return ratio.detach().clamp(1.0 - eps_low, 1.0 + eps_high)


def cispo_loss(
    logprobs_new: Tensor,
    logprobs_old: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    reduction: Reduction = Reduction("token-mean"),
) -> tuple[Tensor, dict[str, float]]:
    """CISPO's objective as a loss to minimise (MiniMax-M1, section 3.1, eq. 4 and eq. 5).

    Token loss `-w_t * A_t * logp_new_t` with `w_t = sg[clip(r_t, 1 - eps_low, 1 + eps_high)]`,
    `r_t = exp(logp_new_t - logp_old_t)` (log-ratio clamped to +-20, `importance_ratio`). Its gradient with respect
    to `logp_new_t` is `-w_t * A_t` at every valid token: the clip bounds the weight and never removes the token.
    Weights multiply the token loss as in `explorl.algos.methods.ppo.policy_loss`; aggregated by the reduction's `agg`.

    Args:
        logprobs_new: `[N, T]` log-probs under the policy being optimised (differentiable).
        logprobs_old: `[N, T]` log-probs under the policy that produced the batch (constant).
        advantages: `[N, T]` per-token advantages (constant).
        mask: `[N, T]` 1 on response tokens.
        eps_low, eps_high: the weight's clip range `[1 - eps_low, 1 + eps_high]` (verl's defaults 0.2 / 0.2;
            `eps_low` 1: no lower bound, the paper's).
        reduction: the aggregation (`aggregate`), the length limit it may need and the optional `[N, T]` detached
            `is_weights` / `token_weights` multiplying the token loss (`Reduction`).
    Returns:
        `(loss, stats)`: the scalar loss and detached statistics over valid tokens: `loss/pg`, `loss/ratio_mean`,
        `loss/ratio_max`, `loss/ratio_min`, `loss/ppo_kl` (as `policy_loss`), `loss/clip_frac` (tokens whose weight
        is clipped, verl's `pg_clipfrac`), `loss/clip_frac_low` / `loss/clip_frac_high` (clipped at `1 - eps_low` /
        `1 + eps_high`, whatever the advantage's sign: CISPO's clip acts on both), `loss/cispo_weight_mean` (the
        mean weight `w`), and the weight statistics of `policy_loss` when weights are given.
    """
    check_loss_inputs("cispo_loss", logprobs_new, logprobs_old, advantages, mask, reduction)
    valid = mask.bool()
    log_ratio, ratio = importance_ratio(logprobs_new, logprobs_old, valid)
    weight = cispo_weight(ratio, eps_low, eps_high)
    adv = as_constant(advantages, valid, ratio.dtype)
    loss = reduction(-weight * adv * zero_padding(logprobs_new, valid), valid)
    with torch.no_grad():
        n_valid = int(valid.sum())
        stats = ratio_stats(loss, ratio, log_ratio, valid, n_valid)
        low, high = ratio < 1.0 - eps_low, ratio > 1.0 + eps_high
        stats["loss/clip_frac"] = valid_fraction(low | high, valid, n_valid)
        stats["loss/clip_frac_low"] = valid_fraction(low, valid, n_valid)
        stats["loss/clip_frac_high"] = valid_fraction(high, valid, n_valid)
        stats["loss/cispo_weight_mean"] = float(masked_mean(weight, valid)) if n_valid else 1.0
        reduction.record(stats, valid, n_valid, ratio.dtype)
    return loss, stats


@register("policy_loss", "cispo", needs_old_logprobs=False, rowwise=True, reads=("eps_low", "eps_high", "loss_agg"),
          formula=cispo_loss, cites=(Cite("MiniMax-M1", "eq. 4, eq. 5, section 3.1", doc="5h"),))
def _cispo_adapter(logprobs_new: Tensor, batch: RolloutBatch, cfg) -> tuple[Tensor, dict[str, float]]:
    """CISPO (`cispo_loss`) with the weight's clip range `algo.eps_low` / `algo.eps_high` and the aggregation
    `algo.loss_agg`."""
    return cispo_loss(logprobs_new, batch.logprobs, batch.advantages, batch.loss_mask, eps_low=cfg.eps_low,
                      eps_high=cfg.eps_high, reduction=Reduction.of(batch, cfg.loss_agg))
