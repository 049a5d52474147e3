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

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from explorl.algos.aggregation import zero_padding
from explorl.algos.batch import RolloutBatch
from explorl.algos.methods.gpg_loss import gpg_loss
from explorl.algos.methods.ppo import policy_loss
from explorl.algos.methods.rollout_correction import IS_LEVELS, IS_MODES, rollout_is_weights
from explorl.algos.methods.rollout_rejection import RS_MODES, rs_bounds, rejection_keep
from explorl.algos.registry import Cite, register

LOSS_TYPES: tuple[str, ...] = ("ppo_clip", "reinforce")
"""verl's `rollout_correction.loss_type`."""


def bypass_loss(logprobs_new: Tensor, logprobs_rollout: Tensor, advantages: Tensor, mask: Tensor, *,
                loss_type: str = "ppo_clip", eps_low: float = 0.2, eps_high: float = 0.2, agg: str = "token-mean",
                max_response_len: int | None = None, token_weights: Tensor | None = None,
                dual_clip_c: float | None = None, is_level: str | None = None, is_mode: str = "truncate",
                is_upper: float | None = 2.0, is_lower: float | None = None, is_batch_normalize: bool = False,
                rs_modes: list[str] = (), rs_upper: list[float] = (),
                rs_lower: list[float] = ()) -> tuple[Tensor, dict[str, float]]:
    """verl 0.9.1's bypass-mode policy loss (`compute_policy_loss_bypass_mode`; docs/methods.md §6d).

    `x = logprobs_new - logprobs_rollout` (detached, 0 on padding); weights `w = rollout_is_weights(x, ...)` when
    `is_level` is given; kept tokens `rejection_keep(x, ...)` when `rs_modes` are; `m = mask * kept`. `ppo_clip`:
    `policy_loss(logprobs_new, logprobs_rollout, A, m)` without `w`; `reinforce`: `gpg_loss` on `m` with `w`.

    Args:
        logprobs_new: `[N, T]` log-probs under the policy being optimised (differentiable).
        logprobs_rollout: `[N, T]` the sampler's log-probs, pi_old here (constant).
        advantages, mask: `[N, T]`.
        loss_type: `LOSS_TYPES`.
        eps_low, eps_high, dual_clip_c: PPO-clip's clip range and dual clip (`ppo_clip`).
        agg, max_response_len, token_weights: as in `policy_loss`.
        is_level, is_mode, is_upper, is_lower, is_batch_normalize: `rollout_is_weights`' (None level: no weights).
        rs_modes, rs_upper, rs_lower: `rejection_keep`'s (no modes: no rejection).
    Returns:
        `(loss, stats)`: the loss's statistics plus `is/*` of the weights and `is/rejected_frac`.
    """
    valid = mask.bool()
    with torch.no_grad():
        x = zero_padding(logprobs_new.detach() - logprobs_rollout.detach(), valid)
        w = out = None
        if is_level is not None:
            w, out = rollout_is_weights(x, mask, level=is_level, mode=is_mode, upper=is_upper, lower=is_lower,
                                        batch_normalize=is_batch_normalize)
        kept = rejection_keep(x, mask, list(rs_modes), list(rs_upper), list(rs_lower)) if rs_modes else valid
        m = (mask * kept).to(mask.dtype)
    if loss_type == "ppo_clip":
        loss, stats = policy_loss(logprobs_new, logprobs_rollout, advantages, m, eps_low=eps_low, eps_high=eps_high,
                                  agg=agg, max_response_len=max_response_len, token_weights=token_weights,
                                  dual_clip_c=dual_clip_c)
    elif loss_type == "reinforce":
        loss, stats = gpg_loss(logprobs_new, logprobs_rollout, advantages, m, agg=agg,
                               max_response_len=max_response_len, is_weights=None if w is None else w * m,
                               token_weights=token_weights)
    else:
        raise ValueError(f"bypass_loss: unknown loss_type {loss_type!r}; valid: {', '.join(LOSS_TYPES)}")
    n_valid = int(valid.sum())
    stats["is/rejected_frac"] = float((valid & ~kept).sum()) / max(n_valid, 1)
    if w is not None and n_valid:
        stats["is/weight_mean"] = float(w[valid].mean())
        stats["is/outside_frac"] = float(out[valid].float().mean())
    return loss, stats


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
    o = options
    return bypass_loss(logprobs_new, batch.logprobs, batch.advantages, batch.loss_mask, loss_type=o.loss_type,
                       eps_low=cfg.eps_low, eps_high=cfg.eps_high, agg=cfg.loss_agg,
                       max_response_len=batch.max_response_len, token_weights=batch.token_weights,
                       dual_clip_c=o.dual_clip_c, is_level=o.rollout_is, is_mode=o.rollout_is_mode,
                       is_upper=o.rollout_is_threshold, is_lower=o.rollout_is_threshold_lower,
                       is_batch_normalize=o.rollout_is_batch_normalize, rs_modes=o.rollout_rs,
                       rs_upper=o.rollout_rs_threshold, rs_lower=o.rollout_rs_threshold_lower)
