"""Clip-Cov: the PPO-clip loss with the gradient of a few random high-covariance tokens removed.

Clip-Cov/KL-Cov: Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models"
  (no arXiv id recorded).

Implements the Clip-Cov objective of section 4.2 (docs/methods.md §5a) on the token covariance `Cov(y_i)` of
section 4 (`explorl.algos.core.centered_cov`). Policy loss `clip_cov`, options `algo.clip_cov.<field>`
(`ClipCovOptions`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from explorl.algos.aggregation import Reduction
from explorl.algos.batch import RolloutBatch
from explorl.algos.core import (as_constant, centered_cov, check_loss_inputs, importance_ratio, ppo_stats,
                                ppo_token_loss, valid_fraction)
from explorl.algos.registry import Cite, register


@dataclass
class ClipCovOptions:
    """Clip-Cov's options, `algo.clip_cov.<field>` (Cui et al. 2025; docs/methods.md §5a)."""

    ratio: float = 2e-4
    """Fraction of tokens whose gradient is removed."""
    lb: float = 1.0
    """Lower covariance bound of the candidates."""
    ub: float = 5.0
    """Upper covariance bound of the candidates."""


# The clip range is one `(eps_low, eps_high)` pair here (as `ppo_stats` takes it), not two keywords: with Clip-Cov's
# options, its random source and the reduction, two would make nine parameters.
def clip_cov_loss(logprobs_new: Tensor, logprobs_old: Tensor, advantages: Tensor, mask: Tensor, *,
                  clip_range: tuple[float, float] = (0.2, 0.2), options: ClipCovOptions = ClipCovOptions(),
                  generator: torch.Generator | None = None,
                  reduction: Reduction = Reduction("token-mean")) -> tuple[Tensor, dict[str, float]]:
    """Clip-Cov: the PPO-clip loss with the gradient of a few random high-covariance tokens removed.

    Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models", section 4.2
    (the Clip-Cov objective); docs/methods.md §5a. Per call:

    1. `cov = (A - mean A) * (logp_new - mean logp_new)`, both means over all valid tokens (`centered_cov`).
    2. Candidates: valid tokens the PPO clip has not already clipped (the clipped term is not strictly the larger
       loss, as `loss/clip_frac` counts) with `lb < cov < ub` (open interval).
    3. `n = max(int(options.ratio * n_valid), 1)` of them (all when there are fewer), drawn uniformly without
       replacement with `generator` (the global torch RNG when None), have their token term set to 0.
    4. Every other valid token has the PPO-clip token loss of `policy_loss`; then the reduction's `is_weights` /
       `token_weights` multiply and its `agg` aggregates with the normaliser of `mask` (a selected token still counts
       in it).

    Reading fixed here: the paper writes the selected tokens' term as 0 (and its public code multiplies their
    loss by 0), so their value leaves the loss as well as their gradient; the gradient equals a detach. Because the
    normaliser is unchanged, every other token gets exactly the gradient `policy_loss` gives it. Selection is per
    call: the trainer's micro-batches each select their own tokens.

    No dual clip: this loss shares the PPO token loss of `policy_loss` (`ppo_token_loss`) but not its optional
    dual clip, because verl's Clip-Cov loss (`compute_policy_loss_clip_cov`) has none; the dual clip is an option of
    the `ppo` loss only (`algo.ppo.dual_clip_c`), refused with `algo.loss=clip_cov` (docs/methods.md §9).

    Args:
        logprobs_new, logprobs_old, advantages, mask: `[N, T]`, as in `policy_loss`.
        clip_range: `(eps_low, eps_high)`, PPO's clip range `[1 - eps_low, 1 + eps_high]` of the ratio.
        options: `ratio`, the fraction of the valid tokens whose gradient is removed, in (0, 1] (paper: 2e-4), and
            `lb`, `ub`, the covariance bounds of the candidates, `lb < ub` (paper: 1 and 5).
        generator: random source of the selection (its device must suit `torch.randperm`); drawn from only when
            there are candidates.
        reduction: the aggregation, the length limit it may need and the weights, as in `policy_loss`.
    Returns:
        `(loss, stats)`: the stats of `policy_loss` plus `loss/clip_cov_frac` (fraction of valid tokens whose
        gradient was removed) and `loss/clip_cov_candidate_frac` (fraction of valid tokens that were candidates).
    """
    check_loss_inputs("clip_cov_loss", logprobs_new, logprobs_old, advantages, mask, reduction)
    eps_low, eps_high = clip_range
    clip_ratio, lb, ub = options.ratio, options.lb, options.ub
    if not 0.0 < clip_ratio <= 1.0:
        raise ValueError(f"clip_cov_loss: options.ratio must be in (0, 1], got {clip_ratio!r}")
    if not lb < ub:
        raise ValueError(f"clip_cov_loss: need options.lb < options.ub, got lb={lb!r}, ub={ub!r}")
    valid = mask.bool()
    log_ratio, ratio = importance_ratio(logprobs_new, logprobs_old, valid)
    adv = as_constant(advantages, valid, ratio.dtype)
    token_loss, loss_unclipped, loss_clipped = ppo_token_loss(ratio, adv, eps_low, eps_high)
    n_valid = int(valid.sum())
    with torch.no_grad():  # 1.-2. the candidates: not clipped already, lb < cov < ub
        cov = centered_cov(advantages, logprobs_new, valid)
        candidates = valid & ~(loss_clipped > loss_unclipped) & (cov > lb) & (cov < ub)
    selected = _draw(candidates, max(int(clip_ratio * n_valid), 1) if n_valid else 0, generator)  # 3.

    token_loss = torch.where(selected, torch.zeros((), dtype=token_loss.dtype, device=token_loss.device),
                             token_loss)
    loss = reduction(token_loss, valid)

    with torch.no_grad():
        stats = ppo_stats(loss, ratio, log_ratio, adv, loss_clipped > loss_unclipped, valid, n_valid,
                          (eps_low, eps_high))
        stats["loss/clip_cov_frac"] = valid_fraction(selected, valid, n_valid)
        stats["loss/clip_cov_candidate_frac"] = valid_fraction(candidates, valid, n_valid)
        reduction.record(stats, valid, n_valid, ratio.dtype)
    return loss, stats


@register("policy_loss", "clip_cov", needs_old_logprobs=False, needs_generator=True, options=ClipCovOptions,
          reads=("eps_low", "eps_high", "loss_agg"), formula=clip_cov_loss,
          cites=(Cite("Clip-Cov/KL-Cov", "section 4.2", doc="5a"),))
def _clip_cov_adapter(logprobs_new: Tensor, batch: RolloutBatch, cfg, *, generator: torch.Generator | None = None,
                      options: ClipCovOptions) -> tuple[Tensor, dict[str, float]]:
    """Clip-Cov (`clip_cov_loss`) with the clip range `algo.eps_low` / `algo.eps_high`, the options
    `algo.clip_cov.*` and the aggregation `algo.loss_agg`."""
    return clip_cov_loss(logprobs_new, batch.logprobs, batch.advantages, batch.loss_mask,
                         clip_range=(cfg.eps_low, cfg.eps_high), options=options, generator=generator,
                         reduction=Reduction.of(batch, cfg.loss_agg))


@torch.no_grad()
def _draw(candidates: Tensor, n: int, generator: torch.Generator | None) -> Tensor:
    """Bool `[N, T]`: `min(n, #candidates)` of the `candidates` drawn uniformly without replacement with `generator`
    (the global torch RNG when None; drawn from only when there is something to draw)."""
    cand_idx = torch.nonzero(candidates.reshape(-1)).squeeze(1)
    n_clip = min(n, cand_idx.numel())
    selected = torch.zeros_like(candidates.reshape(-1))
    if n_clip > 0:
        device = generator.device if generator is not None else torch.device("cpu")
        perm = torch.randperm(cand_idx.numel(), generator=generator, device=device)
        selected[cand_idx[perm[:n_clip].to(cand_idx.device)]] = True
    return selected.reshape(candidates.shape)
