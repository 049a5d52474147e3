"""GMPO: the clipped objective on the geometric mean of each response's token ratios.

GMPO: Yuzhong Zhao, Yue Liu, Junpeng Liu, Jingye Chen, Xun Wu, Yaru Hao, Tengchao Lv, Shaohan Huang, Lei Cui,
Qixiang Ye et al. (2025), "Geometric-Mean Policy Optimization", arXiv 2507.20673.

Implements GMPO's objective as verl 0.9.1 computes it (`compute_policy_loss_geo_mean`, written by the paper's
authors); docs/methods.md §5k. Each token's log-ratio `x_t = log pi(y_t) - log pi_old(y_t)` is clipped one-sidedly
by the sign of its advantage, in log space (A > 0: `min(x_t, eps_high)`; A < 0: `max(x_t, -eps_low)`; A = 0: 0), and
the response's ratio is the geometric mean of the clipped token ratios, `r_i = exp(mean_t clipped x_t)`; its term is
`-A_i * r_i`, A_i the mean of its token advantages, and the loss the mean of the terms over responses. The clip range
is the core `algo.eps_low` / `algo.eps_high`, in log space: the paper's (e^-0.4, e^0.4) is 0.4 / 0.4 (method layer
`gmpo`). Policy loss `geo_mean` (verl's name), no options of its own.

Differences, said where they act: verl counts empty responses in its mean (as 0) and explorl leaves them out (the
`seq-mean-token-mean` aggregation, the only one the check accepts besides its per-question form); verl divides the
length sums by `length + 1e-8` and takes the log of the rollout weights plus 1e-10, explorl by the length and of the
weights themselves (a relative difference below 1e-9); explorl's token log-ratio is clamped at +-20 before the
mean (every loss's `importance_ratio`), verl's is not.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from explorl.algos.aggregation import Reduction, zero_padding
from explorl.algos.batch import RolloutBatch
from explorl.algos.core import as_constant, check_loss_inputs, importance_ratio, ratio_stats, valid_fraction
from explorl.algos.registry import Cite, register

GMPO_AGGREGATIONS = ("seq-mean-token-mean", "seq-mean-token-mean-per-question")
"""The aggregations that give GMPO's mean over responses (the per-question one weighs each question the same)."""


def _check_geo_mean(cfg) -> str | None:
    a = cfg.algo
    if a.loss_agg not in GMPO_AGGREGATIONS:
        return (f"algo.loss_agg={a.loss_agg}: GMPO's objective is the mean over responses of one term each (verl's "
                f"geo_mean takes that mean whatever its loss_agg_mode); set algo.loss_agg=seq-mean-token-mean")
    if a.token_filter != "none":
        return (f"algo.token_filter={a.token_filter}: GMPO has one ratio and one term per response, so a per-token "
                f"loss weight has no place in it; set algo.token_filter=none or use algo.loss=ppo")
    return None


def clipped_log_ratio(log_ratio: Tensor, advantages: Tensor, eps_low: float, eps_high: float) -> Tensor:
    """`[N, T]` GMPO's token log-ratio clipped one-sidedly in log space by the sign of its advantage:
    `sgn(A) * min(sgn(A) * x, sgn(A) * clip(x, -eps_low, eps_high))`, i.e. `min(x, eps_high)` for A > 0,
    `max(x, -eps_low)` for A < 0 and 0 for A = 0 (all `[N, T]`; advantages constant)."""
    sign = torch.sign(advantages)
    clipped = log_ratio.clamp(-eps_low, eps_high)
    return sign * torch.minimum(sign * log_ratio, sign * clipped)


def sequence_weights(is_weights: Tensor, valid: Tensor) -> Tensor:
    """`[N]` each response's token weights reduced to one, their geometric mean over its valid tokens (verl's
    reduction of its rollout weights for `geo_mean`); 1 for a response with no valid token. Detached."""
    with torch.no_grad():
        log_w = zero_padding(torch.log(is_weights.detach()), valid)
        return torch.exp(log_w.sum(-1) / valid.sum(-1).clamp(min=1))


def geo_mean_loss(
    logprobs_new: Tensor,
    logprobs_old: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 0.4,
    eps_high: float = 0.4,
    reduction: Reduction = Reduction("seq-mean-token-mean"),
) -> tuple[Tensor, dict[str, float]]:
    """GMPO's objective as a loss to minimise (Zhao et al. 2025; docs/methods.md §5k), as verl 0.9.1 computes it.

    Response term `L_i = -A_i * w_i * exp(mean_t clipped_log_ratio_t)`, `A_i` the mean of its token advantages, `w_i`
    the geometric mean of the reduction's `is_weights` (`sequence_weights`; 1 without them). `L_i` stands on each of
    the response's valid tokens, the reduction's `token_weights` multiply it there, and its `agg` reduces:
    `seq-mean-token-mean` gives the mean of the terms over the non-empty responses (GMPO's objective; `token-mean`
    would weigh each response by its length).

    Args:
        logprobs_new: `[N, T]` log-probs under the policy being optimised (differentiable).
        logprobs_old: `[N, T]` log-probs under the policy that produced the batch (constant).
        advantages: `[N, T]` per-token advantages (constant); one per response in GMPO.
        mask: `[N, T]` 1 on response tokens.
        eps_low, eps_high: the clip range of the token log-ratio, `[-eps_low, eps_high]` (ratios in
            `[e^-eps_low, e^eps_high]`).
        reduction: the aggregation (`aggregate`) and the length limit it may need; its optional `[N, T]` detached
            `is_weights` are reduced to one per response, its `token_weights` multiply the response term on each
            token (the per-question weights of `seq-mean-token-mean-per-question`).
    Returns:
        `(loss, stats)`: the scalar loss and detached statistics over valid tokens: `loss/pg`, `loss/ratio_*` of the
        responses' ratios on their tokens, `loss/ppo_kl` of the token ratios, `loss/clip_frac_high` (A > 0 and the
        log-ratio above eps_high), `loss/clip_frac_low` (A < 0 and below -eps_low), `loss/clip_frac` (either), and
        the weights' statistics.
    """
    check_loss_inputs("geo_mean_loss", logprobs_new, logprobs_old, advantages, mask, reduction)
    valid = mask.bool()
    log_ratio, _ = importance_ratio(logprobs_new, logprobs_old, valid)
    adv = as_constant(advantages, valid, log_ratio.dtype)
    lengths = valid.sum(-1).clamp(min=1)
    x = zero_padding(clipped_log_ratio(log_ratio, adv, eps_low, eps_high), valid)
    seq_ratio = torch.exp(x.sum(-1) / lengths)  # [N]
    seq_adv = adv.sum(-1) / lengths  # [N]
    seq_loss = -seq_adv * seq_ratio
    if reduction.is_weights is not None:
        seq_loss = seq_loss * sequence_weights(reduction.is_weights, valid).to(seq_loss.dtype)
    token_loss = zero_padding(seq_loss[:, None].expand_as(log_ratio), valid)
    # the importance weights are in the response term already: only the token weights multiply the token loss
    loss = dataclasses.replace(reduction, is_weights=None)(token_loss, valid)
    with torch.no_grad():
        n_valid = int(valid.sum())
        ratio = zero_padding(seq_ratio[:, None].expand_as(log_ratio), valid)
        stats = ratio_stats(loss, ratio, log_ratio, valid, n_valid)
        high, low = (adv > 0) & (log_ratio > eps_high), (adv < 0) & (log_ratio < -eps_low)
        stats["loss/clip_frac"] = valid_fraction(high | low, valid, n_valid)
        stats["loss/clip_frac_high"] = valid_fraction(high, valid, n_valid)
        stats["loss/clip_frac_low"] = valid_fraction(low, valid, n_valid)
        reduction.record(stats, valid, n_valid, log_ratio.dtype)
    return loss, stats


@register("policy_loss", "geo_mean", needs_old_logprobs=False, rowwise=True, check=_check_geo_mean,
          reads=("eps_low", "eps_high", "loss_agg", "token_filter"),
          formula=(geo_mean_loss, clipped_log_ratio, sequence_weights), cites=(Cite("GMPO", doc="5k"),))
def _geo_mean_adapter(logprobs_new: Tensor, batch: RolloutBatch, cfg) -> tuple[Tensor, dict[str, float]]:
    """GMPO (`geo_mean_loss`) with the log-space clip range `algo.eps_low` / `algo.eps_high` and the aggregation
    `algo.loss_agg`."""
    return geo_mean_loss(logprobs_new, batch.logprobs, batch.advantages, batch.loss_mask, eps_low=cfg.eps_low,
                         eps_high=cfg.eps_high, reduction=Reduction.of(batch, cfg.loss_agg))
