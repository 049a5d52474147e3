"""SAPO: a smooth, temperature-controlled gate on the token ratio in place of PPO's hard clip.

SAPO: Chang Gao, Chujie Zheng, Xiong-Hui Chen, Kai Dang, Shixuan Liu, Bowen Yu, An Yang, Shuai Bai, Jingren Zhou,
Junyang Lin (2025), "Soft Adaptive Policy Optimization", arXiv 2511.20347.

Implements the SAPO objective, as verl 0.9.1 (`compute_policy_loss_sapo`) and TRL 1.16 (`loss_type: sapo`) compute
it; docs/methods.md §5i. Each token's ratio `r_t = pi(y_t) / pi_old(y_t)` passes through the soft gate
`f(r) = (4 / tau) * sigmoid(tau * (r - 1))`, with `tau = tau_pos` where the token's advantage is positive and
`tau_neg` where it is not, and the token loss is `-f(r_t) * A_t`. The gate's slope `f'(r) = 4 s (1 - s)`,
`s = sigmoid(tau * (r - 1))`, is 1 at `r = 1` (the plain policy gradient on the first update) and falls smoothly as
the ratio leaves 1, faster for a larger tau: a continuous trust region instead of PPO's clip, which cuts a token's
gradient to 0 at the bound. The paper sets `tau_neg > tau_pos` (1.05 and 1.0), so negative-advantage tokens, whose
updates spread over the whole vocabulary, are damped sooner. Policy loss `sapo`, options `algo.sapo.<field>`
(`SapoOptions`: verl's `tau_pos` / `tau_neg`, TRL's `sapo_temperature_pos` / `_neg`).

Differences, said where they act: the aggregation is `algo.loss_agg` (the paper's objective is the sequence mean of
token means, `seq-mean-token-mean`, the recipe's; verl's `sapo` always aggregates so, whatever its
`loss_agg_mode`, and TRL's `loss_type: sapo` does too); the token log-ratio is clamped to +-20 before `exp` (verl's
too, TRL's not). The loss's value is not PPO's: on the first update (`r = 1`) it is `-(2 / tau) * A`, while its
gradient is PPO's `-A * grad log pi`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from explorl.algos.aggregation import Reduction, masked_mean
from explorl.algos.batch import RolloutBatch
from explorl.algos.core import as_constant, check_loss_inputs, importance_ratio, ratio_stats
from explorl.algos.registry import Cite, register


@dataclass
class SapoOptions:
    """SAPO's options, `algo.sapo.<field>` (Gao et al. 2025; docs/methods.md §5i)."""

    tau_pos: float = 1.0
    """Temperature of the gate on tokens with a positive advantage (verl 0.9.1's `actor.tau_pos`, TRL's
    `sapo_temperature_pos`; the paper's 1.0). Larger: the gate's slope falls faster as the ratio leaves 1. Must be
    > 0."""
    tau_neg: float = 1.05
    """Temperature of the gate on tokens whose advantage is <= 0 (verl 0.9.1's `actor.tau_neg`, TRL's
    `sapo_temperature_neg`; the paper's 1.05, above `tau_pos` so negative updates are damped sooner). Must be > 0."""


def _check_sapo(cfg) -> str | None:
    opts = cfg.algo.options["sapo"]
    for field in ("tau_pos", "tau_neg"):
        value = getattr(opts, field)
        if not value > 0:
            return (f"algo.sapo.{field}: must be > 0 (the gate divides by it; verl's and the paper's tau_pos is 1.0, "
                    f"tau_neg 1.05), got {value}")
    return None


def sapo_gate(ratio: Tensor, advantages: Tensor, tau_pos: float, tau_neg: float) -> tuple[Tensor, Tensor]:
    """`(gate, slope)`, `[N, T]`: SAPO's soft gate `f(r) = (4 / tau) * sigmoid(tau * (r - 1))` and its slope
    `f'(r) = 4 s (1 - s)` (`s` the sigmoid), with `tau = tau_pos` where `advantages > 0` and `tau_neg` elsewhere;
    the gate is differentiable in `ratio`, the slope detached."""
    tau = torch.where(advantages > 0, torch.as_tensor(tau_pos, dtype=ratio.dtype, device=ratio.device),
                      torch.as_tensor(tau_neg, dtype=ratio.dtype, device=ratio.device))
    s = torch.sigmoid(tau * (ratio - 1.0))
    return s * (4.0 / tau), (4.0 * s * (1.0 - s)).detach()


def sapo_loss(
    logprobs_new: Tensor,
    logprobs_old: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    reduction: Reduction = Reduction("seq-mean-token-mean"),
) -> tuple[Tensor, dict[str, float]]:
    """SAPO's objective as a loss to minimise (Gao et al. 2025; docs/methods.md §5i).

    Token loss `-f(r_t) * A_t`, `f(r) = (4 / tau) * sigmoid(tau * (r - 1))` (`sapo_gate`), `tau = tau_pos` where
    `A_t > 0` and `tau_neg` elsewhere, `r_t = exp(logp_new_t - logp_old_t)` (log-ratio clamped to +-20,
    `importance_ratio`). Its gradient with respect to `logp_new_t` is `-A_t * r_t * 4 s_t (1 - s_t)`: the policy
    gradient of the unclipped PPO term, times the gate's slope, 1 at `r = 1`. Weights multiply the token loss as in
    `explorl.algos.methods.ppo.policy_loss`; aggregated by the reduction's `agg`.

    Args:
        logprobs_new: `[N, T]` log-probs under the policy being optimised (differentiable).
        logprobs_old: `[N, T]` log-probs under the policy that produced the batch (constant).
        advantages: `[N, T]` per-token advantages (constant).
        mask: `[N, T]` 1 on response tokens.
        tau_pos, tau_neg: the gate's temperatures for positive and non-positive advantages, > 0.
        reduction: the aggregation (`aggregate`), the length limit it may need and the optional `[N, T]` detached
            `is_weights` / `token_weights` multiplying the token loss (`Reduction`).
    Returns:
        `(loss, stats)`: the scalar loss and detached statistics over valid tokens: `loss/pg`, `loss/ratio_mean`,
        `loss/ratio_max`, `loss/ratio_min`, `loss/ppo_kl` (as `policy_loss`), `loss/sapo_slope_mean` (the mean
        gate slope `4 s (1 - s)`: 1 on the first update, lower the more the gate damps), and the weight statistics
        of `policy_loss` when weights are given.
    """
    check_loss_inputs("sapo_loss", logprobs_new, logprobs_old, advantages, mask, reduction)
    if not (tau_pos > 0 and tau_neg > 0):
        raise ValueError(f"sapo_loss: tau_pos and tau_neg must be > 0, got {tau_pos!r} and {tau_neg!r}")
    valid = mask.bool()
    log_ratio, ratio = importance_ratio(logprobs_new, logprobs_old, valid)
    adv = as_constant(advantages, valid, ratio.dtype)
    gate, slope = sapo_gate(ratio, adv, tau_pos, tau_neg)
    loss = reduction(-gate * adv, valid)
    with torch.no_grad():
        n_valid = int(valid.sum())
        stats = ratio_stats(loss, ratio, log_ratio, valid, n_valid)
        stats["loss/sapo_slope_mean"] = float(masked_mean(slope, valid)) if n_valid else 1.0
        reduction.record(stats, valid, n_valid, ratio.dtype)
    return loss, stats


@register("policy_loss", "sapo", needs_old_logprobs=False, rowwise=True, options=SapoOptions, check=_check_sapo,
          reads=("loss_agg",), formula=sapo_loss, cites=(Cite("SAPO", "", doc="5i"),))
def _sapo_adapter(logprobs_new: Tensor, batch: RolloutBatch, cfg, *,
                  options: SapoOptions) -> tuple[Tensor, dict[str, float]]:
    """SAPO (`sapo_loss`) with the temperatures `algo.sapo.tau_pos` / `tau_neg` and the aggregation
    `algo.loss_agg`."""
    return sapo_loss(logprobs_new, batch.logprobs, batch.advantages, batch.loss_mask, tau_pos=options.tau_pos,
                     tau_neg=options.tau_neg, reduction=Reduction.of(batch, cfg.loss_agg))
