"""verl's bypass mode: the rollout's log-probs as pi_old, and the rollout correction computed inside the loss from
the policy being optimised.

When Speed Kills Stability: Liu, Li, Fu, Wang, Liu, Shen 2025, "When Speed Kills Stability: Demystifying RL Collapse
  from the Training-Inference Mismatch" (a blog post, https://richardli.xyz/rl-collapse, that verl 0.9.1's
  `verl/trainer/ppo/rollout_corr_helper.py` cites; no arXiv id recorded).

Implements verl 0.9.1's `algorithm.rollout_correction.bypass_mode=true` (`apply_bypass_mode`, and the policy loss
`bypass_mode`, `compute_policy_loss_bypass_mode`); docs/methods.md §6d. Policy loss `bypass_mode`, options
`algo.bypass_mode.<field>` (`BypassOptions`). The engine skips the pi_old forward and takes the sampler's log-probs
`log mu` as pi_old (`old_is_behavior`); in the loss, with `x = log pi_theta - log mu` (detached), the importance
weights (`rollout_correction.rollout_is_weights`) and the rejection (`rollout_rejection.rejection_keep`) of the
rollout correction are computed on the current policy, and then `loss_type`:
- `ppo_clip` (verl's default): PPO-clip (`ppo.policy_loss`) with ratio pi_theta / mu on the tokens kept, no
  importance weights (the ratio is the correction);
- `reinforce`: `-w * A * log pi_theta` (`gpg_loss.gpg_loss` with the weights) on the tokens kept.
Differences: with several micro-batches explorl weighs each by its share of the loss mask before rejection.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from explorl.algos.aggregation import Reduction, zero_padding
from explorl.algos.batch import RolloutBatch
from explorl.algos.methods.gpg_loss import gpg_loss
from explorl.algos.methods.ppo import policy_loss
from explorl.algos.methods.rollout_correction import IS_LEVELS, IS_MODES, rollout_is_weights
from explorl.algos.methods.rollout_rejection import RS_MODES, rs_bounds, rejection_keep
from explorl.algos.registry import Cite, register

LOSS_TYPES: tuple[str, ...] = ("ppo_clip", "reinforce")
"""verl's `rollout_correction.loss_type`."""


@dataclass
class BypassOptions:
    """Bypass mode's options, `algo.bypass_mode.<field>` (verl 0.9.1's `algorithm.rollout_correction` with
    `bypass_mode=true`; defaults its `bypass_ppo_clip` preset; docs/methods.md §6d)."""

    loss_type: Literal[LOSS_TYPES] = "ppo_clip"
    """verl's `loss_type`: `ppo_clip` (PPO-clip with ratio pi_theta / mu) or `reinforce` (-w A log pi_theta)."""
    dual_clip_c: float | None = None
    """`ppo_clip`'s dual clip, as `algo.ppo.dual_clip_c` (verl's `clip_ratio_c`, 3.0 there); null: off."""
    rollout_is: Literal[IS_LEVELS] | None = None
    """verl's `rollout_is`: `token`, `sequence` or null (no weights; `ppo_clip` ignores them, as verl)."""
    rollout_is_mode: Literal[IS_MODES] = "truncate"
    """As `algo.rollout_is.mode` (a verl `"lower_upper"` threshold is `mask`)."""
    rollout_is_threshold: float | None = 2.0
    """As `algo.rollout_is.threshold` (verl's `rollout_is_threshold`, 2.0)."""
    rollout_is_threshold_lower: float | None = None
    """As `algo.rollout_is.threshold_lower`."""
    rollout_is_batch_normalize: bool = False
    """As `algo.rollout_is.batch_normalize` (verl's `rollout_is_batch_normalize`)."""
    rollout_rs: list[Literal[RS_MODES]] = field(default_factory=list)
    """As `algo.rollout_rs.modes` (verl's `rollout_rs`); empty: no rejection."""
    rollout_rs_threshold: list[float] = field(default_factory=list)
    """As `algo.rollout_rs.threshold`."""
    rollout_rs_threshold_lower: list[float] = field(default_factory=list)
    """As `algo.rollout_rs.threshold_lower`."""


def bypass_loss(logprobs_new: Tensor, logprobs_rollout: Tensor, advantages: Tensor, mask: Tensor, *,
                eps_low: float = 0.2, eps_high: float = 0.2, options: BypassOptions = BypassOptions(),
                reduction: Reduction = Reduction("token-mean")) -> tuple[Tensor, dict[str, float]]:
    """verl 0.9.1's bypass-mode policy loss (`compute_policy_loss_bypass_mode`; docs/methods.md §6d).

    `x = logprobs_new - logprobs_rollout` (detached, 0 on padding); weights `w = rollout_is_weights(x, ...)` when
    `options.rollout_is` is given; kept tokens `rejection_keep(x, ...)` when `options.rollout_rs` are;
    `m = mask * kept`. `ppo_clip`: `policy_loss(logprobs_new, logprobs_rollout, A, m)` without `w`; `reinforce`:
    `gpg_loss` on `m` with `w`.

    Args:
        logprobs_new: `[N, T]` log-probs under the policy being optimised (differentiable).
        logprobs_rollout: `[N, T]` the sampler's log-probs, pi_old here (constant).
        advantages, mask: `[N, T]`.
        eps_low, eps_high: PPO-clip's clip range (`ppo_clip`).
        options: `loss_type` (`LOSS_TYPES`), `ppo_clip`'s `dual_clip_c`, `rollout_is_weights`' (`rollout_is`, the
            level, None: no weights; `rollout_is_mode`, `rollout_is_threshold`, `rollout_is_threshold_lower`,
            `rollout_is_batch_normalize`) and `rejection_keep`'s (`rollout_rs`, no modes: no rejection;
            `rollout_rs_threshold`, `rollout_rs_threshold_lower`).
        reduction: the aggregation, the length limit it may need and the token weights, as in `policy_loss`; no
            `is_weights` (the weights are `w`, computed here from the policy being optimised).
    Returns:
        `(loss, stats)`: the loss's statistics plus `is/*` of the weights and `is/rejected_frac`.
    """
    o = options
    if reduction.is_weights is not None:
        raise ValueError("bypass_loss: reduction.is_weights must be None: bypass mode computes its importance weights "
                         "from the policy being optimised (options.rollout_is)")
    valid = mask.bool()
    with torch.no_grad():
        x = zero_padding(logprobs_new.detach() - logprobs_rollout.detach(), valid)
        w = out = None
        if o.rollout_is is not None:
            w, out = rollout_is_weights(x, mask, level=o.rollout_is, mode=o.rollout_is_mode,
                                        upper=o.rollout_is_threshold, lower=o.rollout_is_threshold_lower,
                                        batch_normalize=o.rollout_is_batch_normalize)
        kept = (rejection_keep(x, mask, list(o.rollout_rs), list(o.rollout_rs_threshold),
                               list(o.rollout_rs_threshold_lower)) if o.rollout_rs else valid)
        m = (mask * kept).to(mask.dtype)
    if o.loss_type == "ppo_clip":
        loss, stats = policy_loss(logprobs_new, logprobs_rollout, advantages, m, eps_low=eps_low, eps_high=eps_high,
                                  dual_clip_c=o.dual_clip_c, reduction=reduction)
    elif o.loss_type == "reinforce":
        weighted = dataclasses.replace(reduction, is_weights=None if w is None else w * m)
        loss, stats = gpg_loss(logprobs_new, logprobs_rollout, advantages, m, reduction=weighted)
    else:
        raise ValueError(f"bypass_loss: unknown loss_type {o.loss_type!r}; valid: {', '.join(LOSS_TYPES)}")
    n_valid = int(valid.sum())
    stats["is/rejected_frac"] = float((valid & ~kept).sum()) / max(n_valid, 1)
    if w is not None and n_valid:
        stats["is/weight_mean"] = float(w[valid].mean())
        stats["is/outside_frac"] = float(out[valid].float().mean())
    return loss, stats


def _check_bypass(cfg) -> str | None:
    o, a = cfg.algo.options["bypass_mode"], cfg.algo
    others = ([f"algo.importance_weights={a.importance_weights}"] * (a.importance_weights != "none")
              + ["algo.reward_shapers=[rollout_rs]"] * ("rollout_rs" in a.reward_shapers)
              + ["algo.shapers=[off_policy_mask]"] * ("off_policy_mask" in a.shapers))
    if others:
        return (f"algo.loss=bypass_mode: pi_old is the rollout's log-probs, so {', '.join(others)} would compare "
                f"them with themselves; use algo.bypass_mode.rollout_is / rollout_rs (computed from the policy being "
                f"optimised)")
    if o.dual_clip_c is not None and not o.dual_clip_c > 1:
        return f"algo.bypass_mode.dual_clip_c: must be > 1 or null, got {o.dual_clip_c}"
    if o.rollout_is is not None and o.rollout_is_threshold is None and o.rollout_is_threshold_lower is None:
        return "algo.bypass_mode.rollout_is_threshold: null with rollout_is_threshold_lower null bounds nothing"
    if o.rollout_rs:
        try:
            rs_bounds(list(o.rollout_rs), list(o.rollout_rs_threshold), list(o.rollout_rs_threshold_lower))
        except ValueError as e:
            return f"algo.bypass_mode.rollout_rs: {str(e).removeprefix('rollout_rs: ')}"
    return None


@register("policy_loss", "bypass_mode", needs_behavior=True, old_is_behavior=True, options=BypassOptions,
          check=_check_bypass, reads=("eps_low", "eps_high", "loss_agg"), formula=bypass_loss,
          cites=(Cite("When Speed Kills Stability", doc="6d"),))
def _bypass_adapter(logprobs_new: Tensor, batch: RolloutBatch, cfg, *,
                    options: BypassOptions) -> tuple[Tensor, dict[str, float]]:
    """Bypass mode (`bypass_loss`): `batch.logprobs` are the rollout's (the engine filled pi_old with them)."""
    # the batch's importance weights, if any, compare pi_old with the sampler: here the same log-probs, so they are
    # left out (the config refuses algo.importance_weights with bypass mode); the loss computes its own
    reduction = dataclasses.replace(Reduction.of(batch, cfg.loss_agg), is_weights=None)
    return bypass_loss(logprobs_new, batch.logprobs, batch.advantages, batch.loss_mask, eps_low=cfg.eps_low,
                       eps_high=cfg.eps_high, options=options, reduction=reduction)
