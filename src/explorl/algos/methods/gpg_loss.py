"""GPG's loss: the plain policy gradient, no ratio, no clip, no KL.

GPG: Chu et al. 2025, "GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning" (arXiv
  2504.02546).

Implements the policy loss verl 0.9.1 registers as `gpg` (`compute_policy_loss_gpg`, adapted from the GPG authors'
trainer); docs/methods.md §5m: per token `-A_t * log pi(y_t)`, whose gradient is the REINFORCE gradient
`-A_t * grad log pi(y_t)` with the advantage as its weight. GPG pairs it with its own advantage (the estimator `gpg`,
docs/methods.md §5q); explorl's other estimators compose with it as well. Policy loss `gpg`, no options of its own.

Differences, said where they act: the aggregation is `algo.loss_agg` (GPG's objective divides the batch's token sum
by its tokens: `token-mean`). The loss has no importance ratio, so every update of a batch takes the gradient at the
current policy as if it had sampled the batch (GPG updates once per batch).
"""

from __future__ import annotations

import torch
from torch import Tensor

from explorl.algos.aggregation import Reduction, zero_padding
from explorl.algos.batch import RolloutBatch
from explorl.algos.core import as_constant, check_loss_inputs, importance_ratio, ratio_stats
from explorl.algos.registry import Cite, register


def gpg_loss(
    logprobs_new: Tensor,
    logprobs_old: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    reduction: Reduction = Reduction("token-mean"),
) -> tuple[Tensor, dict[str, float]]:
    """GPG's policy loss (docs/methods.md §5m), as verl 0.9.1 computes it: token loss `-A * logp_new`, weights
    multiplying it as in `explorl.algos.methods.ppo.policy_loss`, aggregated by the reduction's `agg`.

    Args:
        logprobs_new: `[N, T]` log-probs under the policy being optimised (differentiable).
        logprobs_old: `[N, T]` log-probs under the policy that produced the batch (only for the statistics).
        advantages: `[N, T]` per-token advantages (constant).
        mask: `[N, T]` 1 on response tokens.
        reduction: the aggregation (`aggregate`), the length limit it may need and the optional `[N, T]` detached
            `is_weights` / `token_weights` multiplying the token loss (`Reduction`).
    Returns:
        `(loss, stats)`: the scalar loss and detached statistics over valid tokens: `loss/pg`, `loss/ratio_*` and
        `loss/ppo_kl` (how far the policy has moved from the one that sampled; the loss does not use them), and the
        weights' statistics.
    """
    check_loss_inputs("gpg_loss", logprobs_new, logprobs_old, advantages, mask, reduction)
    valid = mask.bool()
    new = zero_padding(logprobs_new, valid)
    adv = as_constant(advantages, valid, new.dtype)
    loss = reduction(-adv * new, valid)
    with torch.no_grad():
        n_valid = int(valid.sum())
        log_ratio, ratio = importance_ratio(logprobs_new, logprobs_old, valid)
        stats = ratio_stats(loss, ratio, log_ratio, valid, n_valid)
        reduction.record(stats, valid, n_valid, new.dtype)
    return loss, stats


@register("policy_loss", "gpg", needs_old_logprobs=False, rowwise=True, reads=("loss_agg",), formula=gpg_loss,
          cites=(Cite("GPG", doc="5m"),))
def _gpg_loss_adapter(logprobs_new: Tensor, batch: RolloutBatch, cfg) -> tuple[Tensor, dict[str, float]]:
    """GPG's loss (`gpg_loss`) with the aggregation `algo.loss_agg`."""
    return gpg_loss(logprobs_new, batch.logprobs, batch.advantages, batch.loss_mask,
                    reduction=Reduction.of(batch, cfg.loss_agg))
