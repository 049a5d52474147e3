"""DRO: the policy gradient with a quadratic penalty on the log-ratio to the sampling policy.

DRO: Richemond et al. 2024, "Offline Regularised Reinforcement Learning for Large Language Models Alignment", arXiv
  2405.19107 (Direct Reward Optimisation; the form below is also the one of Kimi k1.5's policy update).

Implements the DRO-style objective verl 0.9.1 registers as `dro` (`compute_policy_loss_dro`; Tinker's `dro` loss is
the same); docs/methods.md §5l: per token `log pi(y_t) * A_t - (beta / 2) * (log pi(y_t) - log pi_old(y_t))^2`,
maximised, so its gradient is `(A_t - beta * (log pi - log pi_old)) * grad log pi`: the advantage pulls and the
penalty pulls back towards the policy that sampled. Policy loss `dro`, options `algo.dro.<field>` (`DroOptions`):
the coefficient beta, which verl requires and has no default for.

Differences, said where they act: the aggregation is `algo.loss_agg` (the paper's objective is a mean over samples);
the penalty acts on every valid token, advantage 0 or not, so the loss is not `rowwise` (responses with all-zero
advantages stay in the update).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from explorl.algos.aggregation import Reduction, masked_mean, zero_padding
from explorl.algos.batch import RolloutBatch
from explorl.algos.core import as_constant, check_loss_inputs, importance_ratio, ratio_stats
from explorl.algos.registry import Cite, register


@dataclass
class DroOptions:
    """DRO's options, `algo.dro.<field>` (Richemond et al. 2024; docs/methods.md §5l)."""

    beta: float | None = None
    """beta, the coefficient of the quadratic log-ratio penalty `(beta / 2) * (log pi - log pi_old)^2`: verl's
    `policy_loss.dro_beta`, required (verl's default is None, and its `dro` refuses it); must be > 0. verl's and
    Tinker's documentation use 0.05 in their examples."""


def _check_dro(cfg) -> str | None:
    beta = cfg.algo.options["dro"].beta
    if beta is None or not beta > 0:
        return (f"algo.dro.beta: DRO needs its penalty coefficient, > 0 (verl's policy_loss.dro_beta has no default "
                f"either; its examples use 0.05), got {beta}")
    return None


def dro_loss(
    logprobs_new: Tensor,
    logprobs_old: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    beta: float,
    reduction: Reduction = Reduction("token-mean"),
) -> tuple[Tensor, dict[str, float]]:
    """DRO's objective as a loss to minimise (docs/methods.md §5l), as verl 0.9.1 computes it.

    Token loss `-(logp_new * A - (beta / 2) * (logp_new - logp_old)^2)`; weights multiply it as in
    `explorl.algos.methods.ppo.policy_loss`; aggregated by the reduction's `agg`. The log-ratio is not clamped (verl's
    is not; the penalty is what bounds it).

    Args:
        logprobs_new: `[N, T]` log-probs under the policy being optimised (differentiable).
        logprobs_old: `[N, T]` log-probs under the policy that produced the batch (constant).
        advantages: `[N, T]` per-token advantages (constant).
        mask: `[N, T]` 1 on response tokens.
        beta: the penalty coefficient, > 0.
        reduction: the aggregation (`aggregate`), the length limit it may need and the optional `[N, T]` detached
            `is_weights` / `token_weights` multiplying the token loss (`Reduction`).
    Returns:
        `(loss, stats)`: the scalar loss and detached statistics over valid tokens: `loss/pg`, `loss/ratio_*`,
        `loss/ppo_kl`, `loss/dro_penalty` (the mean over valid tokens of `(beta / 2) * log-ratio^2`), and the
        weights' statistics.
    """
    check_loss_inputs("dro_loss", logprobs_new, logprobs_old, advantages, mask, reduction)
    if beta is None or not beta > 0:
        raise ValueError(f"dro_loss: beta must be > 0 (algo.dro.beta, verl's policy_loss.dro_beta), got {beta!r}")
    valid = mask.bool()
    new = zero_padding(logprobs_new, valid)
    old = as_constant(logprobs_old, valid, new.dtype)
    adv = as_constant(advantages, valid, new.dtype)
    penalty = 0.5 * beta * (new - old).square()
    loss = reduction(-(new * adv - penalty), valid)
    with torch.no_grad():
        n_valid = int(valid.sum())
        log_ratio, ratio = importance_ratio(logprobs_new, logprobs_old, valid)
        stats = ratio_stats(loss, ratio, log_ratio, valid, n_valid)
        stats["loss/dro_penalty"] = float(masked_mean(penalty, valid))
        reduction.record(stats, valid, n_valid, new.dtype)
    return loss, stats


@register("policy_loss", "dro", needs_old_logprobs=False, options=DroOptions, check=_check_dro, reads=("loss_agg",),
          formula=dro_loss, cites=(Cite("DRO", doc="5l"),))
def _dro_adapter(logprobs_new: Tensor, batch: RolloutBatch, cfg, *,
                 options: DroOptions) -> tuple[Tensor, dict[str, float]]:
    """DRO (`dro_loss`) with the coefficient `algo.dro.beta` and the aggregation `algo.loss_agg`."""
    return dro_loss(logprobs_new, batch.logprobs, batch.advantages, batch.loss_mask, beta=options.beta,
                    reduction=Reduction.of(batch, cfg.loss_agg))
