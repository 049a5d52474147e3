"""GSPO: the clipped objective with one length-normalised importance ratio per response.

GSPO: Chujie Zheng, Shixuan Liu, Mingze Li, Xiong-Hui Chen, Bowen Yu, Chang Gao, Kai Dang, Yuqiong Liu, Rui Men, An
Yang, Jingren Zhou, Junyang Lin (2025), "Group Sequence Policy Optimization", arXiv 2507.18071.

Implements the GSPO objective, eq. 5, in its GSPO-token form (section 4.3), as verl 0.9.1 (`compute_policy_loss_
gspo`) and TRL 1.16 (`importance_sampling_level: sequence`) compute it; docs/methods.md §5g. The ratio of response
i is the geometric mean of its token ratios, s_i = exp(mean_t (log pi(y_i,t) - log pi_old(y_i,t))), one number per
response, and the PPO-clip term is taken on it. In the GSPO-token form each token's ratio is s_i,t = sg[s_i] *
pi(y_i,t) / sg[pi(y_i,t)]: its value is s_i at every token, and its gradient that of token t's own log-prob scaled
by s_i, so token-level advantages (explorl's shapers) weight tokens as they do in GRPO, while with one advantage per
response (GRPO's) the gradient is GSPO's own. Policy loss `gspo`, options `algo.gspo.<field>` (`GspoOptions`); the
clip range is the core `algo.eps_low` / `algo.eps_high` (the paper's 3e-4 / 4e-4, recipe `gspo`).

Differences, said where they act: the aggregation is `algo.loss_agg` (the paper's sequence mean of eq. 5 is
`seq-mean-token-mean`, the recipe's), and the log of the sequence ratio is capped at `max_log_ratio` (verl's 10).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from explorl.algos.aggregation import Reduction, zero_padding
from explorl.algos.batch import RolloutBatch
from explorl.algos.core import as_constant, check_loss_inputs, importance_ratio, ppo_stats, ppo_token_loss
from explorl.algos.registry import Cite, register


@dataclass
class GspoOptions:
    """GSPO's options, `algo.gspo.<field>` (Zheng et al. 2025; docs/methods.md §5g)."""

    max_log_ratio: float = 10.0
    """Cap on the log of each token's combined ratio log s_i,t (verl 0.9.1's, for numerical safety; a ratio above
    e^10 is far outside any clip range, so the cap changes no clipped loss). Must be > 0."""


def _check_gspo(cfg) -> str | None:
    cap = cfg.algo.options["gspo"].max_log_ratio
    return None if cap > 0 else f"algo.gspo.max_log_ratio: must be > 0 (verl's is 10.0), got {cap}"


def sequence_log_ratio(logprobs_new: Tensor, logprobs_old: Tensor, valid: Tensor) -> Tensor:
    """`[N]` log s_i = the mean over response i's tokens of `logp_new - logp_old` (GSPO's length-normalised
    sequence ratio, in log space); 0 for a response with no valid token."""
    log_ratio, _ = importance_ratio(logprobs_new, logprobs_old, valid)
    lengths = valid.sum(-1).clamp(min=1)
    return log_ratio.sum(-1) / lengths


def sequence_token_ratio(logprobs_new: Tensor, logprobs_old: Tensor, valid: Tensor,
                         max_log_ratio: float) -> tuple[Tensor, Tensor]:
    """`(s_it [N, T], the token log-ratios [N, T])`: GSPO-token's ratio `s_it = exp(min(sg[log s_i] + logp_new_t -
    sg[logp_new_t], max_log_ratio))` (section 4.3; value the sequence ratio, gradient the token's), 1 on padding,
    and `importance_ratio`'s token log-ratios for the statistics."""
    log_ratio, _ = importance_ratio(logprobs_new, logprobs_old, valid)
    log_s = sequence_log_ratio(logprobs_new, logprobs_old, valid)
    new = zero_padding(logprobs_new, valid)
    log_s_t = (log_s.detach()[:, None] + new - new.detach()).clamp(max=max_log_ratio)
    return torch.exp(zero_padding(log_s_t, valid)), log_ratio


def gspo_loss(
    logprobs_new: Tensor,
    logprobs_old: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
    max_log_ratio: float = 10.0,
    reduction: Reduction = Reduction("seq-mean-token-mean"),
) -> tuple[Tensor, dict[str, float]]:
    """GSPO's clipped objective as a loss to minimise (Zheng et al. 2025, eq. 5; GSPO-token, section 4.3).

    Token loss `max(-A * s_it, -A * clip(s_it, 1 - eps_low, 1 + eps_high))` with
    `s_it = exp(min(sg[log s_i] + logp_new_t - sg[logp_new_t], max_log_ratio))`, `log s_i` the mean over the
    response's valid tokens of `logp_new - logp_old` (`sequence_log_ratio`). Weights multiply the token loss as in
    `explorl.algos.methods.ppo.policy_loss`; aggregated by the reduction's `agg`.

    Args:
        logprobs_new: `[N, T]` log-probs under the policy being optimised (differentiable).
        logprobs_old: `[N, T]` log-probs under the policy that produced the batch (constant).
        advantages: `[N, T]` per-token advantages (constant).
        mask: `[N, T]` 1 on response tokens.
        eps_low, eps_high: clip range `[1 - eps_low, 1 + eps_high]` of the sequence ratio.
        max_log_ratio: cap on `log s_it`.
        reduction: the aggregation (`aggregate`), the length limit it may need and the optional `[N, T]` detached
            `is_weights` / `token_weights` multiplying the token loss (`Reduction`).
    Returns:
        `(loss, stats)`: the scalar loss and detached statistics over valid tokens, as `policy_loss` gives them,
        with `loss/ratio_*` and the clip fractions of the sequence ratio and `loss/ppo_kl` of the token ratios.
    """
    check_loss_inputs("gspo_loss", logprobs_new, logprobs_old, advantages, mask, reduction)
    valid = mask.bool()
    ratio, log_ratio = sequence_token_ratio(logprobs_new, logprobs_old, valid, max_log_ratio)
    adv = as_constant(advantages, valid, ratio.dtype)
    token_loss, loss_unclipped, loss_clipped = ppo_token_loss(ratio, adv, eps_low, eps_high)
    loss = reduction(token_loss, valid)
    with torch.no_grad():
        n_valid = int(valid.sum())
        stats = ppo_stats(loss, ratio, log_ratio, adv, loss_clipped > loss_unclipped, valid, n_valid,
                          (eps_low, eps_high))
        reduction.record(stats, valid, n_valid, ratio.dtype)
    return loss, stats


@register("policy_loss", "gspo", needs_old_logprobs=False, rowwise=True, options=GspoOptions, check=_check_gspo,
          reads=("eps_low", "eps_high", "loss_agg"), formula=gspo_loss,
          cites=(Cite("GSPO", "eq. 5, section 4.3", doc="5g"),))
def _gspo_adapter(logprobs_new: Tensor, batch: RolloutBatch, cfg, *,
                  options: GspoOptions) -> tuple[Tensor, dict[str, float]]:
    """GSPO (`gspo_loss`) with the clip range `algo.eps_low` / `algo.eps_high` and the aggregation
    `algo.loss_agg`."""
    return gspo_loss(logprobs_new, batch.logprobs, batch.advantages, batch.loss_mask, eps_low=cfg.eps_low,
                     eps_high=cfg.eps_high, max_log_ratio=options.max_log_ratio,
                     reduction=Reduction.of(batch, cfg.loss_agg))
