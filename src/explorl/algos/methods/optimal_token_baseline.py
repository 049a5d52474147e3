"""The optimal token baseline (OTB): a per-token group baseline weighted by each response's cumulative path variance.

OTB: Yingru Li, Jiawei Xu, Ziniu Li et al., "The Optimal Token Baseline: Variance Reduction for Long-Horizon LLM-RL"
  (no arXiv id recorded).

Implements verl 0.9.1's `optimal_token_baseline` estimator for outcome rewards (docs/methods.md §5s). It reads, per
token, pi_old's probability of the sampled token (`RolloutBatch.logprobs`) and `sum_v pi_old(v)^2` over the vocabulary
(`RolloutBatch.sum_pi_squared`, verl's `sum_pi_squared`): the entry declares `needs_sum_pi_squared`, so pi_old's
forward (`explorl.train.update.fill_logprobs`) computes it at the training temperature. Engines that cannot fill it
(TRL's trainer, verl's estimator call) refuse the estimator by name. Options `algo.optimal_token_baseline.<field>`
(`OptimalTokenBaselineOptions`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from explorl.algos.core import check_response_inputs, check_token_inputs, dense_ids, float_dtype
from explorl.algos.registry import Cite, register

if TYPE_CHECKING:
    from explorl.algos.batch import RolloutBatch
    from explorl.config.schema import AlgoConfig

def optimal_token_baseline(rewards: Tensor, group: Tensor, mask: Tensor, logprobs: Tensor, sum_pi_squared: Tensor,
                           *, is_weights: Tensor | None = None, handle_zero_tail: bool = True,
                           eps: float = 1e-8) -> Tensor:
    """Optimal token baseline advantage (docs/methods.md §5s; Li et al., "The Optimal Token Baseline"), as verl
    0.9.1's `compute_optimal_token_baseline_advantage` computes it for one outcome reward per response.

    Per valid token t of response i: the return `G_i,t = r_i` (the reward sits on the last valid token, no
    discount); the path-variance proxy `w_i,t = 1 - 2 pi_i,t + sum_v pi(v)^2` (the logit-gradient proxy of
    `||grad log pi||^2`; times `is_weights^2` when given), accumulated `W_i,t = sum_{s <= t} w_i,s` over valid tokens;
    per group and column t, `B_t = sum_i G_i,t W_i,t / (sum_i W_i,t + eps)` over the group's responses valid at t;
    `A_i,t = G_i,t - B_t`. With `handle_zero_tail`, the columns of a group's unique longest response beyond its
    second-longest get baseline 0 (the response alone there would otherwise be its own baseline).

    A group of one response gets 0 (as explorl's `grpo`; verl 0.9.1 gives it no baseline, i.e. its raw reward).

    Args:
        rewards: `[N]` one scalar reward per response.
        group: `[N]` int64 prompt ids; arbitrary values, any order, any group sizes.
        mask: `[N, T]` 1 on response tokens, 0 on padding (responses start at column 0).
        logprobs: `[N, T]` pi_old's log-probability of each sampled token.
        sum_pi_squared: `[N, T]` `sum_v pi_old(v)^2` at each position.
        is_weights: optional `[N, T]` rollout importance weights (verl's `rollout_is_weights`).
        handle_zero_tail: verl's option of that name (default true).
        eps: added to the baseline's denominator (verl's 1e-8).
    Returns:
        `[N, T]` advantages in the floating dtype of `rewards` (float32 otherwise), 0.0 where `mask == 0`.
    """
    check_response_inputs(rewards, group, mask)
    check_token_inputs(mask, logprobs=logprobs, sum_pi_squared=sum_pi_squared,
                       **({} if is_weights is None else {"is_weights": is_weights}))
    out_dtype = float_dtype(rewards)
    if rewards.numel() == 0:
        return torch.zeros(mask.shape, dtype=out_dtype, device=mask.device)
    f64 = torch.float64
    valid = mask.bool()
    m = valid.to(f64)
    returns = rewards.detach().to(f64)[:, None] * m
    w = 1.0 - 2.0 * logprobs.detach().to(f64).exp() + sum_pi_squared.detach().to(f64)
    if is_weights is not None:
        w = w * is_weights.detach().to(f64) ** 2
    cum = torch.where(valid, w, torch.zeros_like(w)).cumsum(-1) * m
    dense, n_groups = dense_ids(group)
    num = torch.zeros((n_groups, mask.shape[1]), dtype=f64, device=mask.device).index_add_(0, dense, returns * cum)
    den = torch.zeros_like(num).index_add_(0, dense, cum)
    baseline = (num / (den + eps))[dense]
    ones = torch.ones(dense.shape, dtype=f64, device=mask.device)
    count = torch.zeros(n_groups, dtype=f64, device=mask.device).index_add_(0, dense, ones)[dense]
    if handle_zero_tail:
        length = m.sum(-1)
        longest = torch.full((n_groups,), -1.0, dtype=f64, device=mask.device).scatter_reduce(
            0, dense, length, "amax")[dense]
        is_max = length == longest
        n_max = torch.zeros(n_groups, dtype=f64, device=mask.device).index_add_(0, dense, is_max.to(f64))[dense]
        second = torch.full((n_groups,), -1.0, dtype=f64, device=mask.device).scatter_reduce(
            0, dense, torch.where(is_max, torch.full_like(length, -1.0), length), "amax")[dense]
        tail = is_max & (n_max == 1) & (count > 1)
        columns = torch.arange(mask.shape[1], device=mask.device, dtype=f64)[None, :]
        baseline = torch.where(tail[:, None] & (columns >= second[:, None]), torch.zeros_like(baseline), baseline)
    adv = torch.where((count > 1)[:, None] & valid, returns - baseline, torch.zeros_like(baseline))
    return adv.to(out_dtype)


@dataclass
class OptimalTokenBaselineOptions:
    """The optimal token baseline's options, `algo.optimal_token_baseline.<field>` (docs/methods.md §5s)."""

    handle_zero_tail: bool = True
    """Baseline 0 on the columns of a group's unique longest response beyond its second-longest (verl 0.9.1's
    `handle_zero_tail`, default true)."""


@register("estimator", "optimal_token_baseline", options=OptimalTokenBaselineOptions, needs_sum_pi_squared=True,
          formula=optimal_token_baseline, cites=(Cite("OTB", doc="5s"),))
def _otb_adapter(batch: RolloutBatch, cfg: AlgoConfig, *, options: OptimalTokenBaselineOptions) -> Tensor:
    """Optimal token baseline (Li et al.): per-token group baseline weighted by cumulative path variance."""
    batch.require("logprobs", "sum_pi_squared", by="optimal_token_baseline")
    return optimal_token_baseline(batch.rewards, batch.group, batch.mask, batch.logprobs, batch.sum_pi_squared,
                                  handle_zero_tail=options.handle_zero_tail)


def valid_tokens_first(mask: Tensor) -> tuple[Tensor, Tensor]:
    """`(index, compact)`: `index` `[N, L]` the columns of each row's valid tokens in order, then its other columns
    (L = the longest row's count of valid tokens), and `compact` `[N, L]` bool, True on the first `count` columns of
    each row. `x.gather(1, index)` moves a row's valid tokens to its front, keeping their order."""
    valid = mask.bool()
    order = torch.argsort((~valid).to(torch.int8), dim=-1, stable=True)
    width = int(valid.sum(-1).max()) if valid.numel() else 0
    columns = torch.arange(width, device=mask.device)[None, :]
    return order[:, :width], columns < valid.sum(-1, keepdim=True)


def tir_optimal_token_baseline(rewards: Tensor, group: Tensor, mask: Tensor, logprobs: Tensor, sum_pi_squared: Tensor,
                               *, is_weights: Tensor | None = None, handle_zero_tail: bool = True,
                               eps: float = 1e-8) -> Tensor:
    """The optimal token baseline over each response's valid tokens regrouped to its front (docs/methods.md §5s), as
    verl 0.9.1's `tir_optimal_token_baseline` (`compute_multi_turn_optimal_token_baseline_advantage`) computes it for
    one outcome reward per response: a mask with holes (tool output in a multi-turn response; here also tokens a
    token-level rejection removed) is compacted, so the k-th valid token of every response in a group shares the
    k-th baseline `B_k`, then `optimal_token_baseline` runs on the compacted tokens and the advantages go back to
    their columns. The returns are the reward-to-go of a reward on the last valid token, `r_i` on every valid token.
    With a contiguous mask (explorl's sampler's) it is `optimal_token_baseline`. Arguments and value as there."""
    check_token_inputs(mask, logprobs=logprobs, sum_pi_squared=sum_pi_squared,
                       **({} if is_weights is None else {"is_weights": is_weights}))
    index, compact = valid_tokens_first(mask)
    take = lambda x: x.gather(1, index)  # noqa: E731
    adv = optimal_token_baseline(rewards, group, compact.to(mask.dtype), take(logprobs), take(sum_pi_squared),
                                 is_weights=None if is_weights is None else take(is_weights),
                                 handle_zero_tail=handle_zero_tail, eps=eps)
    out = torch.zeros(mask.shape, dtype=adv.dtype, device=mask.device).scatter_(1, index, adv)
    return torch.where(mask.bool(), out, torch.zeros((), dtype=adv.dtype, device=mask.device))


@register("estimator", "tir_optimal_token_baseline", options=OptimalTokenBaselineOptions, needs_sum_pi_squared=True,
          formula=tir_optimal_token_baseline, cites=(Cite("OTB", doc="5s"),))
def _tir_otb_adapter(batch: RolloutBatch, cfg: AlgoConfig, *, options: OptimalTokenBaselineOptions) -> Tensor:
    """The optimal token baseline over each response's valid tokens regrouped (verl's multi-turn variant)."""
    batch.require("logprobs", "sum_pi_squared", by="tir_optimal_token_baseline")
    return tir_optimal_token_baseline(batch.rewards, batch.group, batch.mask, batch.logprobs, batch.sum_pi_squared,
                                      handle_zero_tail=options.handle_zero_tail)
