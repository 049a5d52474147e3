"""The algorithm step every engine calls: what a batch of scored rollouts becomes, and the loss it is trained with.

    needs = requirements(cfg)                      # which tensors to compute before the step
    batch = compute_advantages(batch, cfg, step)   # the batch with its advantages (`RolloutBatch` stage 4)
    loss, stats = policy_objective(logprobs, entropy, batch.select(rows, width), cfg)   # per micro-batch

explorl's own loop (`explorl.train.loop`) calls exactly these, and so do the engine integrations, so no method's
logic exists twice. The pipeline, in order (docs/methods.md):
1. the reward shapers (`algo.reward_shapers`) in order: the rewards and the loss mask (DAPO's soft overlong penalty
   `dapo_overlong`, its overlong filtering `dapo_overlong_filter`);
2. the estimator (`algo.advantage`) on the batch as the methods see it: the loss mask applied to every tensor;
3. the shapers (`algo.shapers`) in order (one that keeps a state across steps, outcome-based exploration's answer
   counts, gets it from `states`, which explorl's loop holds and checkpoints);
4. the token filter (`algo.token_filter`, per-token weights) and the importance weights (`algo.importance_weights`:
   EAD's truncated importance sampling `tis`, per token or per sequence, docs/methods.md §6);
5. per micro-batch: the policy loss (`algo.loss`; verl's dual clip by `algo.ppo.dual_clip_c`) plus the k3 KL
   (`algo.kl_coef`; clamped as verl's `low_var_kl` by `algo.kl_clamp`, docs/methods.md §9; times the ratio
   pi / pi_old with `algo.kl_importance_weighted`, DeepSeek-V3.2's, TRL's `use_bias_correction_kl`) minus the entropy
   bonus (`algo.entropy_coef`), each aggregated by `algo.loss_agg`.
Which function serves a name is the registry's business (`explorl.algos.registry`); this file names no method.
`cfg` is an `AlgoConfig` (or anything with its fields): nothing here imports explorl outside `explorl.algos`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from explorl.algos.batch import RolloutBatch, TopK
from explorl.algos.aggregation import aggregate, masked_mean, question_weights
from explorl.algos.core import importance_ratio, kl_k3
from explorl.algos.mismatch import mismatch_metrics
from explorl.algos.registry import lookup

if TYPE_CHECKING:
    from explorl.config.schema import AlgoConfig

__all__ = ["Requirements", "requirements", "single_update_shortcut", "compute_advantages", "policy_objective",
           "idle_rows", "shaper_states"]


@dataclass(frozen=True)
class Requirements:
    """What a configured method needs computed before and during its step."""

    ref: bool
    """A frozen reference policy is kept and `RolloutBatch.ref_logprobs` filled (k3 KL, ERPO, ...)."""
    old_logprobs: bool
    """pi_old's log-probs are read before the update (estimators, shapers, importance weights)."""
    behavior: bool
    """The sampler's behaviour log-probs are read."""
    update_entropy: bool
    """The update's forward must return token entropies (the entropy bonus)."""
    greedy_baseline: bool = False
    """Each prompt's greedy response is sampled and scored too (`RolloutBatch.baseline_rewards`: ReMax)."""
    sum_pi_squared: bool = False
    """pi_old's forward also computes `RolloutBatch.sum_pi_squared` (the optimal token baseline)."""
    topk: int = 0
    """K > 0: pi_old's forward fills `RolloutBatch.topk_logprobs` and the update's forward gives the loss its `TopK`
    (the loss's `needs_topk`: SimKO); 0: neither."""
    outcomes: bool = False
    """Each response's outcome is filled (`RolloutBatch.outcomes`: a shaper's `needs_outcomes`)."""
    line_starts: bool = False
    """Each response's line starts are filled (`RolloutBatch.line_starts`: `algo.kl_tokens: line_starts`)."""


def _chosen(cfg: AlgoConfig) -> list:
    return ([lookup("reward_shaper", r) for r in cfg.reward_shapers] + [lookup("estimator", cfg.advantage)]
            + [lookup("shaper", s) for s in cfg.shapers] + [lookup("token_filter", cfg.token_filter),
                                                            lookup("importance_weights", cfg.importance_weights),
                                                            lookup("policy_loss", cfg.loss)])


def requirements(cfg: AlgoConfig) -> Requirements:
    """Ask the registry what the configured estimator, shapers, token filter and loss need."""
    chosen, loss = _chosen(cfg), lookup("policy_loss", cfg.loss)
    return Requirements(
        ref=cfg.kl_coef > 0 or any(e.needs_ref for e in chosen),
        old_logprobs=any(e.needs_old_logprobs for e in chosen),
        behavior=any(e.needs_behavior for e in chosen),
        update_entropy=cfg.entropy_coef != 0,
        greedy_baseline=lookup("estimator", cfg.advantage).needs_greedy_baseline,
        sum_pi_squared=any(e.needs_sum_pi_squared for e in chosen),
        topk=0 if loss.needs_topk is None else int(loss.needs_topk(loss.options_in(cfg))),
        outcomes=any(lookup("shaper", s).needs_outcomes for s in cfg.shapers),
        line_starts=cfg.kl_coef > 0 and cfg.kl_tokens == "line_starts",
    )


def shaper_states(cfg: AlgoConfig) -> dict[str, Any]:
    """A new state for each configured shaper that keeps one across steps (`ShaperEntry.state`), by name: what
    `compute_advantages(..., states=)` takes and a checkpoint keeps (`state_dict`); empty for every other method."""
    entries = [lookup("shaper", s) for s in cfg.shapers]
    return {e.name: e.state(e.options_in(cfg)) for e in entries if e.state is not None}


def single_update_shortcut(cfg: AlgoConfig, behavior_is_policy: bool) -> bool:
    """Whether pi_old may be taken from the training forward itself (detached) instead of a separate forward.

    True when the batch gets exactly one update (so it happens at the sampling weights), the distribution sampled
    from is the optimised policy (`behavior_is_policy`: the temperature schedule's registry entry; then the
    sampler's entropies are the policy's too), and nothing before the update reads pi_old's log-probs or its
    `sum_pi_squared`. TRL does the same for one update per batch; it saves a forward pass.
    """
    needs = requirements(cfg)
    return (cfg.epochs == 1 and cfg.mini_batches == 1 and behavior_is_policy and not needs.old_logprobs
            and not needs.sum_pi_squared)


def idle_rows(batch: RolloutBatch, cfg: AlgoConfig) -> Tensor:
    """[N] bool: the responses that add nothing to the loss or to its gradient, whatever the policy's log-probs.

    A response is idle when every advantage of it is zero (a group whose rewards all agree, under GRPO), the
    policy loss is `rowwise` in the registry (each response's token loss depends on its own tensors only and
    vanishes with its advantage: PPO-clip, with or without importance and token weights) and reads no top-K
    log-probs (`needs_topk`), and no term acts without an advantage (`algo.kl_coef`, `algo.entropy_coef`). The
    update needs an idle response's log-probs only for its statistics (`loss/ratio_mean`, ...), so it can leave it
    out of the forward and backward with grad (`explorl.train.update.update_policy`); the normaliser of the
    aggregation still counts it.
    """
    batch.require("advantages", "loss_mask", by="idle_rows (run compute_advantages first)")
    n = batch.advantages.shape[0]
    entry = lookup("policy_loss", cfg.loss)
    if cfg.kl_coef > 0 or cfg.entropy_coef != 0 or not entry.rowwise or entry.needs_topk is not None:
        return torch.zeros(n, dtype=torch.bool, device=batch.advantages.device)
    return ~((batch.advantages != 0) & (batch.loss_mask != 0)).any(dim=-1)


def _masked(x: Tensor | None, mask: Tensor) -> Tensor | None:
    return None if x is None else x * mask


@torch.no_grad()
def compute_advantages(batch: RolloutBatch, cfg: AlgoConfig, step: int,
                       states: Mapping[str, Any] | None = None) -> RolloutBatch:
    """Reward shapers, estimator, shapers, token filter and importance weights for one batch.

    Args:
        batch: the scored responses (`RolloutBatch` with `rewards`); `logprobs` may be None under
            `single_update_shortcut`.
        cfg: an `AlgoConfig`.
        step: the 1-based training step (step windows of shapers such as `position`).
        states: the states of the shapers that keep one across steps (`shaper_states`), updated in place; each is
            passed to its shaper as the keyword `state` (None for an engine that keeps none) and its `stats` join
            the batch's.
    Returns:
        `batch` with the method's fields (stage 4): `loss_mask`, `shaped_rewards`, `base_advantages`, `advantages`,
        `token_weights`, `is_weights` and `stats` (what the method did, `tokens/*`, `is/*`, `kl/mean`, and, when the
        batch carries both pi_old's and the sampler's log-probs from different forwards, the rollout/trainer
        mismatch `mismatch/*` of `explorl.algos.mismatch` on every response token). The estimator and shapers see
        the batch with the loss mask applied to every tensor.
    """
    batch.require("rewards", by="compute_advantages (score the responses first)")
    rewards, loss_mask = batch.rewards, batch.mask
    for name in cfg.reward_shapers:  # DAPO's overlong shaping: a penalty on the rewards, or the mask less truncation
        rewards, loss_mask = lookup("reward_shaper", name).bind(cfg)(batch.replace(rewards=rewards, mask=loss_mask),
                                                                     cfg)
    seen = batch.replace(mask=loss_mask, rewards=rewards, logprobs=_masked(batch.logprobs, loss_mask),
                         entropy=_masked(batch.entropy, loss_mask),
                         behavior_logprobs=_masked(batch.behavior_logprobs, loss_mask),
                         ref_logprobs=_masked(batch.ref_logprobs, loss_mask),
                         sum_pi_squared=_masked(batch.sum_pi_squared, loss_mask))
    advantages = lookup("estimator", cfg.advantage).bind(cfg)(seen, cfg)
    base = advantages
    if batch.advantage_scale is not None:  # the sampler's per-response multiplier (FR3E's modulation)
        advantages = advantages * batch.advantage_scale.to(advantages.dtype)[:, None]
    kept: dict[str, Any] = {}
    for name in cfg.shapers:
        entry = lookup("shaper", name)
        if entry.state is not None:  # a shaper with a state across steps (the outcome counts): the loop's, or None
            kept[name] = (states or {}).get(name)
        extra = {"state": kept[name]} if name in kept else {}
        advantages = entry.bind(cfg)(advantages, seen, cfg, step, **extra)
    token_weights = lookup("token_filter", cfg.token_filter).bind(cfg)(seen, loss_mask, cfg)
    is_weights, is_stats = lookup("importance_weights", cfg.importance_weights).bind(cfg)(seen, loss_mask, cfg)
    stats = _method_stats(batch.mask, loss_mask, base, advantages, token_weights)
    if lookup("aggregation", cfg.loss_agg).per_question:  # E3 eq. 1: every question weighs the same
        weights = question_weights(batch.group, loss_mask.sum(-1) > 0).to(loss_mask.dtype)[:, None] * loss_mask
        token_weights = weights if token_weights is None else token_weights * weights
    stats.update(is_stats)
    stats.update({k: v for state in kept.values() if state is not None for k, v in state.stats.items()})
    # the sampler against pi_old's forward; under verl's bypass mode pi_old is the rollout itself, and the mismatch is
    # measured on the update's forward instead (`explorl.train.update.update_policy`)
    if (batch.logprobs is not None and batch.behavior_logprobs is not None
            and not lookup("policy_loss", cfg.loss).old_is_behavior):
        stats.update(mismatch_metrics(batch.logprobs, batch.behavior_logprobs, batch.mask))
    if batch.ref_logprobs is not None and batch.logprobs is not None:
        kl = kl_k3(batch.logprobs, seen.ref_logprobs, loss_mask, clamp=cfg.kl_clamp)
        stats["kl/mean"] = float(masked_mean(kl, loss_mask))
    return batch.replace(loss_mask=loss_mask, shaped_rewards=rewards, base_advantages=base, advantages=advantages,
                         token_weights=token_weights, is_weights=is_weights, stats=stats)


def _method_stats(response_mask: Tensor, loss_mask: Tensor, base: Tensor, advantages: Tensor,
                  token_weights: Tensor | None) -> dict[str, float]:
    """Share of response tokens the method removed from the loss or whose |advantage| the shapers reduced."""
    valid = response_mask > 0
    n_valid = max(int(valid.sum()), 1)
    weights = loss_mask if token_weights is None else loss_mask * token_weights
    return {"tokens/masked_frac": float(((weights == 0) & valid).sum()) / n_valid,
            "tokens/downweighted_frac": float(((advantages.abs() < base.abs() - 1e-12) & valid).sum()) / n_valid}


def policy_objective(logprobs: Tensor, entropy: Tensor | None, batch: RolloutBatch, cfg: AlgoConfig, *,
                     generator: torch.Generator | None = None,
                     topk: TopK | None = None) -> tuple[Tensor, dict[str, float]]:
    """The loss to minimise on one (micro-)batch: policy loss + kl_coef * KL - entropy_coef * H, one aggregation.

    KL is the per-token k3 estimate (`kl_k3`), times the ratio `exp(logprobs - pi_old)` (with its gradient) when
    `cfg.kl_importance_weighted` (DeepSeek-V3.2, arXiv 2512.02556, its unbiased KL estimate; docs/methods.md §1c),
    and 0 off the tokens that begin a line under `cfg.kl_tokens == "line_starts"` (`batch.line_starts`; the term is
    still aggregated over every loss token, as the policy loss: docs/methods.md §5ae).

    Args:
        logprobs: [n, t] log-probs of the sampled tokens under the policy being optimised (with gradient).
        entropy: [n, t] its token entropies, or None when `cfg.entropy_coef == 0`.
        batch: the same rows and columns (`select`) of `compute_advantages`' result. pi_old is `batch.logprobs`, or
            `logprobs` detached when that is None (`single_update_shortcut`; then pi_old's top-K log-probs are
            `topk.logprobs` detached too).
        cfg: an `AlgoConfig`.
        generator: random source of losses that sample tokens (Clip-Cov).
        topk: the forward's top-K log-probs, entropies and top-1 flags, for a loss that declares `needs_topk`.
    Returns:
        (scalar loss, stats): the loss variant's statistics plus `kl/mean` and `loss/entropy` when those terms act.
    """
    batch.require("advantages", "loss_mask", by="policy_objective (run compute_advantages first)")
    entry = lookup("policy_loss", cfg.loss)
    extra = {"generator": generator} if entry.needs_generator else {}
    if entry.needs_topk is not None:
        if topk is None:
            raise ValueError(f"policy_objective: algo.loss={cfg.loss} needs the forward's top-K log-probs (`topk`)")
        extra["topk"] = topk
    mask = batch.loss_mask
    with_old = batch if batch.logprobs is not None else batch.replace(
        logprobs=logprobs.detach(), topk_logprobs=None if topk is None else topk.logprobs.detach())
    loss, stats = entry.bind(cfg)(logprobs, with_old, cfg, **extra)
    if cfg.kl_coef > 0:
        batch.require("ref_logprobs", by="algo.kl_coef > 0")
        token_kl = kl_k3(logprobs, batch.ref_logprobs, mask, clamp=cfg.kl_clamp)
        if cfg.kl_importance_weighted:  # DeepSeek-V3.2: pi / pi_old makes pi_old's samples estimate pi's KL gradient
            token_kl = token_kl * importance_ratio(logprobs, with_old.logprobs, mask.bool())[1]
        if cfg.kl_tokens == "line_starts":  # only the answer-or-another-line choice is anchored
            batch.require("line_starts", by="algo.kl_tokens=line_starts")
            starts = mask * batch.line_starts
            token_kl = token_kl * starts
            stats["kl/line_start_mean"] = float(token_kl.detach().sum() / starts.sum().clamp_min(1))
        kl = aggregate(token_kl, mask, cfg.loss_agg, batch.max_response_len)
        loss = loss + cfg.kl_coef * kl
        stats["kl/mean"] = float(kl.detach())
    if cfg.entropy_coef != 0:
        if entropy is None:
            raise ValueError("policy_objective: algo.entropy_coef != 0 needs the token entropies of the forward")
        ent_term = aggregate(entropy, mask, cfg.loss_agg, batch.max_response_len)
        loss = loss - cfg.entropy_coef * ent_term
        stats["loss/entropy"] = float(ent_term.detach())
    return loss, stats
