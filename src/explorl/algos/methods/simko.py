"""SimKO: on correct responses, share the sampled token's update with its top-K alternatives; on wrong ones, penalise
the top-1 token harder; both only at the high-entropy tokens.

SimKO: Ruotian Peng, Yi Ren, Zhouliang Yu, Weiyang Liu, Yandong Wen (2025), "SimKO: Simple Pass@K Policy
  Optimization", arXiv 2510.14807.

Implements SimKO's policy loss (docs/methods.md §5w) as the authors' public code computes it (CLR-Lab/SimKO,
`verl/trainer/ppo/core_algos.py`, `compute_policy_loss_simko`; `verl/workers/actor/dp_actor.py` for its inputs). The
paper's own text was not available here (only its abstract, in the repository's README), so no equation of it is
cited and the defaults are those of the authors' script `run_qwen2.5-math-7b_SimKO.sh`: K = 3 (`top_k`), the entropy
quantile tau 0.8, alpha 0.01 (`mix_topk_coef`), and the factor 1.1 on the wrong responses' top-1 tokens (hard-coded
there). Its inputs, as the authors' `dp_actor.py` computes them: the current policy's log-probs of its own K most
probable tokens (chosen on the detached logits), its entropies (detached) and whether the sampled token is its top-1,
all from the update's forward (`TopK`, `explorl.rollout.logprobs.LogprobOptions.top_k`); pi_old's log-probs of *its
own* K most probable tokens from pi_old's forward (`RolloutBatch.topk_logprobs`: after an update the two K sets may
differ, as in the authors' code, and the ratio compares the k-th most probable tokens); `RolloutBatch.correct`, the
task's rule (the authors': the score is 1). explorl's loop and TRL's trainer compute them (the entry declares
`needs_topk`); verl's integration refuses it. Options `algo.simko.<field>` (`SimkoOptions`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from explorl.algos.aggregation import Reduction, zero_padding
from explorl.algos.batch import RolloutBatch, TopK
from explorl.algos.core import (LOG_RATIO_BOUND, as_constant, check_loss_inputs, importance_ratio, ppo_token_loss,
                                valid_fraction)
from explorl.algos.registry import Cite, Site, register


@dataclass
class SimkoOptions:
    """SimKO's options, `algo.simko.<field>` (Peng et al. 2025; docs/methods.md §5w). The defaults are the authors'
    script's."""

    top_k: int = 3
    """K, the number of most probable candidates whose probabilities a correct response raises."""
    tau: float = 0.8
    """The quantile of a response's token entropies above which a token is gated in."""
    alpha: float = 0.01
    """The share of a gated token's update moved onto its top-K candidates (the authors' `mix_topk_coef`)."""
    neg_scale: float = 1.1
    """The factor on the advantage of a wrong response's gated top-1 tokens."""


@dataclass(frozen=True)
class SimkoInputs:
    """What `simko_loss` reads of a micro-batch besides the current policy's log-probs, all constant in the loss.

    Its own dataclass rather than `RolloutBatch`: the batch's `entropy` is pi_old's where SimKO gates on the current
    policy's, and `is_top1` comes from the update's forward (`TopK`); seven tensors in one object keep the loss's
    signature short."""

    logprobs_old: Tensor
    """`[N, T]` the sampled tokens' log-probs under pi_old."""
    topk_logprobs_old: Tensor
    """`[N, T, K]` log-probs under pi_old of its own K most probable tokens (the authors' `old_log_probs_topk`)."""
    advantages: Tensor
    """`[N, T]` per-token advantages (GRPO's in the authors' runs)."""
    mask: Tensor
    """`[N, T]` 1 on response tokens."""
    correct: Tensor
    """`[N]` bool, the response is verified correct (explorl's loop: by the task's rule; the authors': its score is
    1)."""
    entropy: Tensor
    """`[N, T]` token entropy of the current policy (detached)."""
    is_top1: Tensor
    """`[N, T]` bool, the sampled token is the current policy's most probable token."""


def entropy_gate(entropy: Tensor, mask: Tensor, tau: float) -> Tensor:
    """`[N, T]` bool: the tokens whose entropy exceeds the tau-quantile (`torch.quantile`, linear interpolation) of
    the entropies of their own response's valid tokens (the authors' `row_quantile_masked`). tau 1 selects none."""
    valid = mask.bool()
    h = entropy.detach()
    rows = []
    for i in range(h.shape[0]):
        x = h[i][valid[i]] if valid[i].any() else h[i]
        rows.append(torch.quantile(x.to(torch.float64), tau) if x.numel() else torch.zeros((), dtype=torch.float64))
    threshold = torch.stack(rows).to(h.device) if rows else torch.zeros(0, dtype=torch.float64, device=h.device)
    return (h.to(torch.float64) > threshold[:, None]) & valid


def _check_inputs(logprobs_new: Tensor, topk_new: Tensor, inputs: SimkoInputs, reduction: Reduction) -> None:
    x = inputs
    check_loss_inputs("simko_loss", logprobs_new, x.logprobs_old, x.advantages, x.mask, reduction)
    n, t = x.mask.shape
    if topk_new.dim() != 3 or topk_new.shape[:2] != (n, t) or x.topk_logprobs_old.shape != topk_new.shape:
        raise ValueError(f"simko_loss: expected top-K log-probs [N, T, K] with [N, T] = {(n, t)}, got "
                         f"{tuple(topk_new.shape)} and {tuple(x.topk_logprobs_old.shape)}")
    if x.correct.shape != (n,) or x.entropy.shape != (n, t) or x.is_top1.shape != (n, t):
        raise ValueError("simko_loss: expected correct [N], entropy [N, T] and is_top1 [N, T]")


def simko_loss(
    logprobs_new: Tensor,
    topk_logprobs_new: Tensor,
    inputs: SimkoInputs,
    *,
    options: SimkoOptions = SimkoOptions(),
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    reduction: Reduction = Reduction("token-mean"),
) -> tuple[Tensor, dict[str, float]]:
    """SimKO's loss (docs/methods.md §5w; Peng et al. 2025, "SimKO: Simple Pass@K Policy Optimization", as the
    authors' `compute_policy_loss_simko` computes it).

    `alpha`, `tau` and `neg_scale` are the fields of `options` (its `top_k` is not read: K is the last dimension of
    the top-K log-probs). Gate `w_t`: token t's entropy is above the tau-quantile of its response's
    (`entropy_gate`). PPO's clipped token
    loss `max(-A' rho', -A' clip(rho', 1 - eps_low, 1 + eps_high))` with
    - on a correct response (`correct`): `rho'_t = (1 - alpha w_t) r_t + (alpha w_t / K) sum_k sg(r_t / r_t,k) r_t,k`,
      `r_t = pi(y_t) / pi_old(y_t)`, `r_t,k = pi(v_k) / pi_old(v_k)` for the K candidates v_k. Its value is `r_t`;
      its gradient moves the share `alpha w_t` of the sampled token's update onto the K candidates, each weighted
      by `r_t / r_t,k` (raising the top-K alternatives where the response is right);
    - elsewhere `rho' = r`, and on a response whose advantages sum below 0, `A' = neg_scale * A` at the gated
      tokens whose sampled token is the policy's top-1 (`is_top1`): the wrong top-1 token is penalised harder.
    Weights multiply the token loss as in `explorl.algos.methods.ppo.policy_loss` (the authors' have none);
    aggregated by the reduction's `agg`.

    Args:
        logprobs_new: `[N, T]` log-probs of the sampled tokens under the policy being optimised (differentiable).
        topk_logprobs_new: `[N, T, K]` log-probs of the K candidates under the current policy (differentiable).
        inputs: pi_old's log-probs of the sampled tokens `[N, T]` and of the candidates `[N, T, K]`, the advantages
            and the mask `[N, T]`, `correct` `[N]`, the current policy's `entropy` and `is_top1` `[N, T]`
            (`SimkoInputs`; constant).
        options: `alpha`, `tau`, `neg_scale` (`SimkoOptions`).
        eps_low, eps_high: PPO's clip range (the authors': 0.2).
        reduction: the aggregation, the length limit it may need and the optional weights (`Reduction`).
    Returns:
        `(loss, stats)`: the scalar loss and `loss/pg`, `loss/clip_frac`, `loss/simko_gate_frac` (gated tokens among
        the valid ones), `loss/simko_neg_scaled_frac` (tokens whose advantage was scaled), and the weights'
        statistics when there are weights.
    """
    _check_inputs(logprobs_new, topk_logprobs_new, inputs, reduction)
    x, o = inputs, options
    valid = x.mask.bool()
    k = topk_logprobs_new.shape[-1]
    log_ratio, ratio = importance_ratio(logprobs_new, x.logprobs_old, valid)
    vk = valid[..., None].expand_as(topk_logprobs_new)
    log_ratio_k = zero_padding(topk_logprobs_new - x.topk_logprobs_old.detach(), vk).clamp(-LOG_RATIO_BOUND,
                                                                                         LOG_RATIO_BOUND)
    # sg(r / r_k) * r_k: value r, gradient (r / r_k) grad r_k
    candidates = (log_ratio.detach()[..., None] - log_ratio_k.detach()).exp() * log_ratio_k.exp()
    gate = entropy_gate(x.entropy, x.mask, o.tau)
    mix = o.alpha * gate.to(ratio.dtype) * x.correct[:, None].to(ratio.dtype)
    mixed = (1.0 - mix) * ratio + mix / k * candidates.sum(-1)
    adv = as_constant(x.advantages, valid, ratio.dtype)
    negative = (adv.sum(-1) < 0)[:, None] & gate & x.is_top1.bool()
    adv = torch.where(negative, adv * o.neg_scale, adv)
    token_loss, unclipped, clipped = ppo_token_loss(mixed, adv, eps_low, eps_high)
    loss = reduction(zero_padding(token_loss, valid), valid)
    with torch.no_grad():
        n_valid = int(valid.sum())
        stats = {"loss/pg": float(loss), "loss/clip_frac": valid_fraction(clipped > unclipped, valid, n_valid),
                 "loss/simko_gate_frac": valid_fraction(gate, valid, n_valid),
                 "loss/simko_neg_scaled_frac": valid_fraction(negative, valid, n_valid)}
        reduction.record(stats, valid, n_valid, ratio.dtype)
    return loss, stats


def _check_simko(cfg) -> str | None:
    o = cfg.algo.options["simko"]
    bad = [f"algo.simko.top_k: must be >= 1, got {o.top_k}" if o.top_k < 1 else None,
           f"algo.simko.tau: must be in [0, 1], got {o.tau}" if not 0.0 <= o.tau <= 1.0 else None,
           f"algo.simko.alpha: must be in [0, 1], got {o.alpha}" if not 0.0 <= o.alpha <= 1.0 else None,
           f"algo.simko.neg_scale: must be > 0, got {o.neg_scale}" if not o.neg_scale > 0 else None]
    return "; ".join(b for b in bad if b) or None


@register("policy_loss", "simko", needs_old_logprobs=False, needs_topk=lambda o: o.top_k, options=SimkoOptions,
          check=_check_simko, reads=("eps_low", "eps_high", "loss_agg"), formula=(simko_loss, entropy_gate),
          cites=(Cite("SimKO", doc="5w"),),
          acts_at=(Site("explorl.train.update.fill_logprobs", "top_k=top_k)", "pi_old's top-K log-probs"),
                   Site("explorl.train.update.update_policy", "need_entropy, compile, top_k)",
                        "the current policy's top-K log-probs, entropies and top-1 flags")))
def _simko_adapter(logprobs_new: Tensor, batch: RolloutBatch, cfg, *, topk: TopK,
                   options: SimkoOptions) -> tuple[Tensor, dict[str, float]]:
    """SimKO (`simko_loss`): pi_old's top-K log-probs and `correct` from the batch, the current policy's top-K
    log-probs, entropies and top-1 flags from the update's forward (`topk`), PPO's clip range `algo.eps_low` /
    `eps_high`, the aggregation `algo.loss_agg` with the batch's weights."""
    batch.require("logprobs", "topk_logprobs", "correct", by="algo.loss=simko")
    inputs = SimkoInputs(logprobs_old=batch.logprobs, topk_logprobs_old=batch.topk_logprobs,
                         advantages=batch.advantages, mask=batch.loss_mask, correct=batch.correct,
                         entropy=topk.entropy, is_top1=topk.is_top1)
    return simko_loss(logprobs_new, topk.logprobs, inputs, options=options, eps_low=cfg.eps_low,
                      eps_high=cfg.eps_high, reduction=Reduction.of(batch, cfg.loss_agg))
