"""LUSPO: GSPO's clipped sequence-level objective with each response's loss scaled by its length.

LUSPO: Fanfan Liu, Youyang Yin, Peng Shi, Siqi Yang, Zhixiong Zeng, Haibo Qiu (2026), "Length-Unbiased Sequence
Policy Optimization: Revealing and Controlling Response Length Variation in RLVR", arXiv 2602.05261.

Implements LUSPO as TRL 1.16 computes it (`GRPOTrainer._compute_loss` with `loss_type: luspo` and
`importance_sampling_level: sequence`, the setting TRL's docstring and the paper ask for); docs/methods.md §5y. GSPO
(`explorl.algos.methods.gspo`, docs/methods.md §5g) takes one length-normalised ratio per response,
`s_i = exp(mean_t (log pi(y_i,t) - log pi_old(y_i,t)))`, and the PPO-clip term on it; averaged over responses, each
response then weighs the same whatever its length, so a long response's tokens each get a smaller share of the
gradient than a short one's, which the paper finds drives GSPO's response lengths down. LUSPO multiplies each
response's clipped term by its length `|y_i|`: TRL's loss is `(1 / N) * sum_i |y_i| * l_i`, `l_i` GSPO's sequence
term, whose gradient gives every token the same weight `s_i * A_i` (unclipped) whatever its response's length.
Token loss `|y_i| * max(-A * s_it, -A * clip(s_it, 1 - eps_low, 1 + eps_high))` in GSPO's token form
(`s_it = sg[s_i] * pi(y_t) / sg[pi(y_t)]`); policy loss `luspo`, options `algo.luspo.<field>` (`LuspoOptions`); the
clip range is the core `algo.eps_low` / `algo.eps_high`.

Differences, said where they act: the aggregation is `algo.loss_agg`, and the length factor is defined against
`seq-mean-token-mean` (the recipe's): the mean over responses of each response's token mean of `|y_i| * l_it` is
TRL's `(per_token_loss * mask).sum(-1).mean()` (a response without valid tokens leaves explorl's mean, TRL counts
it as 0); under `token-mean` the length would enter twice. The log of the sequence ratio is capped at
`max_log_ratio` (GSPO's, verl's 10; TRL has no cap) and each token log-ratio clamped to +-20 (TRL's is not). With
token-level advantages (explorl's shapers) each token keeps its own advantage, as in `gspo`; with one advantage per
response (GRPO's) the value and gradient are TRL's sequence-level ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from explorl.algos.aggregation import Reduction
from explorl.algos.batch import RolloutBatch
from explorl.algos.core import as_constant, check_loss_inputs, ppo_stats, ppo_token_loss
from explorl.algos.methods.gspo import sequence_token_ratio
from explorl.algos.registry import Cite, register


@dataclass
class LuspoOptions:
    """LUSPO's options, `algo.luspo.<field>` (Liu et al. 2026; docs/methods.md §5y)."""

    max_log_ratio: float = 10.0
    """Cap on the log of each token's combined ratio log s_i,t, as `algo.gspo.max_log_ratio` (verl's GSPO cap, for
    numerical safety; TRL 1.16 has none: a ratio above e^10 is far outside any clip range, so the cap changes no
    clipped loss). Must be > 0."""


def _check_luspo(cfg) -> str | None:
    cap = cfg.algo.options["luspo"].max_log_ratio
    return None if cap > 0 else f"algo.luspo.max_log_ratio: must be > 0 (GSPO's in verl is 10.0), got {cap}"


def luspo_loss(
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
    """LUSPO's objective as a loss to minimise (Liu et al. 2026: GSPO's loss, each response's scaled by its length).

    Token loss `|y_i| * max(-A * s_it, -A * clip(s_it, 1 - eps_low, 1 + eps_high))`, `|y_i|` the number of valid
    tokens of response i, `s_it = exp(min(sg[log s_i] + logp_new_t - sg[logp_new_t], max_log_ratio))` with `log s_i`
    the mean over the response's valid tokens of `logp_new - logp_old` (`gspo.sequence_token_ratio`). Under
    `seq-mean-token-mean` the loss is `(1 / N) * sum_i |y_i| * l_i` (`l_i` GSPO's sequence term, for one advantage per
    response), TRL 1.16's `loss_type: luspo`; its gradient with respect to `logp_new_t` is `-A_i * s_i / N` at every
    unclipped token, whatever the length of its response. Weights multiply the token loss as in
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
        `(loss, stats)`: the scalar loss and detached statistics over valid tokens, as `gspo_loss` gives them (the
        ratio statistics and clip fractions of the sequence ratio, `loss/ppo_kl` of the token ratios).
    """
    check_loss_inputs("luspo_loss", logprobs_new, logprobs_old, advantages, mask, reduction)
    valid = mask.bool()
    ratio, log_ratio = sequence_token_ratio(logprobs_new, logprobs_old, valid, max_log_ratio)
    adv = as_constant(advantages, valid, ratio.dtype)
    gspo_term, loss_unclipped, loss_clipped = ppo_token_loss(ratio, adv, eps_low, eps_high)
    lengths = valid.sum(-1, keepdim=True).to(ratio.dtype)  # [N, 1]: |y_i|
    loss = reduction(lengths * gspo_term, valid)
    with torch.no_grad():
        n_valid = int(valid.sum())
        stats = ppo_stats(loss, ratio, log_ratio, adv, loss_clipped > loss_unclipped, valid, n_valid,
                          (eps_low, eps_high))
        reduction.record(stats, valid, n_valid, ratio.dtype)
    return loss, stats


@register("policy_loss", "luspo", needs_old_logprobs=False, rowwise=True, options=LuspoOptions, check=_check_luspo,
          reads=("eps_low", "eps_high", "loss_agg"), formula=luspo_loss, cites=(Cite("LUSPO", doc="5y"),))
def _luspo_adapter(logprobs_new: Tensor, batch: RolloutBatch, cfg, *,
                   options: LuspoOptions) -> tuple[Tensor, dict[str, float]]:
    """LUSPO (`luspo_loss`) with the clip range `algo.eps_low` / `algo.eps_high` and the aggregation
    `algo.loss_agg`."""
    return luspo_loss(logprobs_new, batch.logprobs, batch.advantages, batch.loss_mask, eps_low=cfg.eps_low,
                      eps_high=cfg.eps_high, max_log_ratio=options.max_log_ratio,
                      reduction=Reduction.of(batch, cfg.loss_agg))
