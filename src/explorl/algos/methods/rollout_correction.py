"""Rollout correction: importance weights between the distribution sampled and the trainer's pi_old, and the
off-policy sequence mask.

When Speed Kills Stability: Liu, Li, Fu, Wang, Liu, Shen 2025, "When Speed Kills Stability: Demystifying RL Collapse
  from the Training-Inference Mismatch" (a blog post, https://richardli.xyz/rl-collapse, that verl 0.9.1's
  `verl/trainer/ppo/rollout_corr_helper.py` cites; no arXiv id recorded).
DeepSeek-V3.2: DeepSeek-AI 2025, "DeepSeek-V3.2", arXiv 2512.02556 (as TRL 1.16's `GRPOConfig` cites it), eq. 9.

Implements verl 0.9.1's rollout-correction importance weights (`algorithm.rollout_correction.rollout_is*`) with
TRL 1.16's (`GRPOConfig.vllm_importance_sampling_*`), and TRL's off-policy sequence mask (`off_policy_mask_threshold`,
DeepSeek-V3.2 eq. 9); docs/methods.md §6d.

The engine that samples (vLLM in bfloat16, explorl's sampler with EAD's per-token temperature or top-p) gives each
token a log-prob `log mu` (`RolloutBatch.behavior_logprobs`, of the distribution actually sampled) that differs from
the trainer's `log pi_old` (`RolloutBatch.logprobs`). With `r = pi_old / mu` per token:

- importance weights `rollout_is` (`algo.importance_weights=rollout_is`, options `algo.rollout_is.<field>`): per
  token `r_t`, or per sequence `prod_t r_t` on every token of the response (computed in log space, the log clamped
  to +-20 as verl does); `truncate`: clamped into [threshold_lower, threshold] (TIS); `mask`: 0 outside it (IcePop,
  TRL's `*_mask`); optionally divided by their batch mean. verl: `rollout_is` = `level`, a float
  `rollout_is_threshold` = `mode=truncate threshold=...`, a `"lower_upper"` string = `mode=mask
  threshold_lower=lower threshold=upper`, `rollout_is_batch_normalize` = `batch_normalize`. TRL:
  `vllm_importance_sampling_mode=<level>_<mode>`, `vllm_importance_sampling_clip_max` = `threshold`,
  `..._clip_min` = `threshold_lower`.
- the off-policy sequence mask `off_policy_mask` (a shaper, `algo.shapers=[..., off_policy_mask]`, option
  `algo.off_policy_mask.threshold`, TRL's `off_policy_mask_threshold`): a token whose advantage is negative in a
  response whose mean `log mu - log pi_old` exceeds delta gets advantage 0, so it leaves every advantage-linear loss.
- rejection sampling `rollout_rs` is a reward shaper (`explorl.algos.methods.rollout_rejection`): it removes tokens
  or responses from the loss mask before the estimator, as verl's `rollout_rs` edits `response_mask` before
  `compute_advantage`, so the aggregation no longer counts them (a weight of 0 would still be counted).

Why three entries and not one: each acts where verl and TRL act (weights on the token loss; the loss mask before the
advantages; a mask of the loss that depends on the advantage's sign), and they compose as verl and TRL allow, by
selecting several: `algo.importance_weights=rollout_is algo.reward_shapers=[rollout_rs]
algo.shapers=[off_policy_mask]`.

Differences, said where they act: the off-policy mask is computed once per batch from pi_old, TRL's at every
micro-step from the policy being optimised (the same at the first update of a batch; later TRL's also sees the drift
of the updates); zeroing the advantage masks the policy loss but not the KL term, as TRL's mask does. verl's means
divide by the count + 1e-8, explorl's by the count (relative 1e-8 / count).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
from torch import Tensor

from explorl.algos.aggregation import masked_mean, zero_padding
from explorl.algos.core import LOG_RATIO_BOUND, check_token_inputs, valid_fraction
from explorl.algos.registry import Cite, register

if TYPE_CHECKING:
    from explorl.algos.batch import RolloutBatch

IS_LEVELS: tuple[str, ...] = ("token", "sequence")
"""`level` of `rollout_is_weights`: verl's `rollout_is`, the prefix of TRL's `vllm_importance_sampling_mode`."""
IS_MODES: tuple[str, ...] = ("truncate", "mask")
"""`mode` of `rollout_is_weights`: the suffix of TRL's `vllm_importance_sampling_mode`."""


def rollout_log_ratio(logprobs: Tensor, behavior_logprobs: Tensor, mask: Tensor) -> Tensor:
    """`[N, T]` detached `log pi_old - log mu` of each token (verl's `log_ratio`), 0 on padding (`mask == 0`)."""
    check_token_inputs(mask, logprobs=logprobs, behavior_logprobs=behavior_logprobs)
    return zero_padding(logprobs.detach() - behavior_logprobs.detach(), mask)


def _check_bounds(mode: str, upper: float | None, lower: float | None) -> None:
    if mode not in IS_MODES:
        raise ValueError(f"rollout_is_weights: unknown mode {mode!r}; valid: {', '.join(IS_MODES)}")
    if upper is None and lower is None:
        raise ValueError("rollout_is_weights: give threshold (upper) or threshold_lower, or both")
    if (upper is not None and not upper > 0) or (lower is not None and not lower > 0):
        raise ValueError(f"rollout_is_weights: the bounds must be > 0, got lower={lower}, upper={upper}")
    if upper is not None and lower is not None and lower > upper:
        raise ValueError(f"rollout_is_weights: threshold_lower {lower} > threshold {upper}")


def rollout_is_weights(log_ratio: Tensor, mask: Tensor, *, level: str = "sequence", mode: str = "truncate",
                       upper: float | None = 2.0, lower: float | None = None,
                       batch_normalize: bool = False) -> tuple[Tensor, Tensor]:
    """Importance weights of the rollout correction (verl's `compute_rollout_correction_weights`, TRL's
    `vllm_importance_sampling_mode`; docs/methods.md §6d).

    `raw = exp(clamp(x, -20, 20))` with `x` the token's `log_ratio` (`token`) or the sum of its response's over the
    valid tokens (`sequence`, summed in at least float32, the same on every token). `truncate`:
    `clamp(raw, lower, upper)` (a bound that is None does not act; verl's TIS has only the upper); `mask`: `raw` where
    `lower <= raw <= upper`, else 0 (verl's IcePop, TRL's `*_mask`). `batch_normalize`: then divided by their mean
    over the valid tokens (`token`) or over the non-empty responses (`sequence`), when that mean is > 1e-8.

    Args:
        log_ratio: `[N, T]` `log pi_old - log mu` (`rollout_log_ratio`).
        mask: `[N, T]` 1 on the tokens the loss counts.
        level, mode: `IS_LEVELS`, `IS_MODES`.
        upper, lower: the bounds (> 0, `lower <= upper`, at least one given).
        batch_normalize: divide by the batch mean.
    Returns:
        `(weights, outside)`: `[N, T]` detached weights, exactly 0 where `mask == 0`, in the dtype of `log_ratio`;
        `[N, T]` bool, the valid tokens whose raw weight was outside the bounds (truncated or masked).
    """
    check_token_inputs(mask, log_ratio=log_ratio)
    if level not in IS_LEVELS:
        raise ValueError(f"rollout_is_weights: unknown level {level!r}; valid: {', '.join(IS_LEVELS)}")
    _check_bounds(mode, upper, lower)
    valid = mask.bool()
    with torch.no_grad():
        x = zero_padding(log_ratio.detach(), valid)
        if level == "sequence":
            x = x.to(torch.promote_types(x.dtype, torch.float32)).sum(-1, keepdim=True).expand_as(x)
        raw = torch.exp(x.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)).to(log_ratio.dtype)
        hi = math.inf if upper is None else upper
        lo = -math.inf if lower is None else lower
        outside = ((raw < lo) | (raw > hi)) & valid
        w = raw.clamp(min=lower, max=upper) if mode == "truncate" else torch.where(outside, 0.0, raw)
        w = zero_padding(w, valid)
        if batch_normalize:
            if level == "token":
                mean = masked_mean(w, valid)
            else:  # one weight per non-empty response
                rows = valid.any(-1)
                mean = w.amax(-1)[rows].mean() if bool(rows.any()) else w.new_zeros(())
            if float(mean) > 1e-8:
                w = w / mean
        return w, outside


def rollout_is_stats(weights: Tensor, outside: Tensor, mask: Tensor) -> dict[str, float]:
    """`is/weight_mean`, `is/weight_max` of the weights over the valid tokens (1.0 when none is valid) and
    `is/outside_frac`, the share of valid tokens whose raw weight was outside the bounds. Shapes `[N, T]`."""
    valid = mask.bool()
    n_valid = int(valid.sum())
    return {"is/weight_mean": float(masked_mean(weights, valid)) if n_valid else 1.0,
            "is/weight_max": float(weights[valid].max()) if n_valid else 1.0,
            "is/outside_frac": valid_fraction(outside, valid, n_valid)}


@dataclass
class RolloutIsOptions:
    """Rollout-correction importance weights' options, `algo.rollout_is.<field>` (verl 0.9.1's
    `algorithm.rollout_correction.rollout_is*`, with its defaults; docs/methods.md §6d)."""

    level: Literal[IS_LEVELS] = "sequence"
    """verl's `rollout_is`: `token` (each token's own ratio pi_old / mu) or `sequence` (the product over the
    response, on every token of it; verl's default)."""
    mode: Literal[IS_MODES] = "truncate"
    """`truncate` (TIS: clamp into the bounds; verl's float `rollout_is_threshold`) or `mask` (IcePop: weight 0
    outside them; verl's `"lower_upper"` threshold, TRL's `*_mask` modes)."""
    threshold: float | None = 2.0
    """Upper bound (verl's `rollout_is_threshold`, 2.0; TRL's `vllm_importance_sampling_clip_max`); null: none."""
    threshold_lower: float | None = None
    """Lower bound (the `lower` of verl's `"lower_upper"`; TRL's `vllm_importance_sampling_clip_min`); null: none."""
    batch_normalize: bool = False
    """Divide the weights by their batch mean (verl's `rollout_is_batch_normalize`)."""


def _check_rollout_is(cfg) -> str | None:
    o = cfg.algo.options["rollout_is"]
    if o.threshold is None and o.threshold_lower is None:
        return "algo.rollout_is.threshold: null with algo.rollout_is.threshold_lower null bounds nothing; set one"
    for name in ("threshold", "threshold_lower"):
        value = getattr(o, name)
        if value is not None and not value > 0:
            return f"algo.rollout_is.{name}: must be > 0, got {value}"
    if o.threshold is not None and o.threshold_lower is not None and o.threshold_lower > o.threshold:
        return (f"algo.rollout_is.threshold_lower: {o.threshold_lower} is above algo.rollout_is.threshold "
                f"{o.threshold}")
    if (o.threshold is not None and o.threshold < 1) or (o.threshold_lower is not None and o.threshold_lower > 1):
        return (f"algo.rollout_is: the bounds [{o.threshold_lower}, {o.threshold}] leave out the ratio 1 of a token "
                f"sampled exactly as the trainer computes it; use threshold >= 1 >= threshold_lower")
    return None


@register("importance_weights", "rollout_is", needs_behavior=True, options=RolloutIsOptions,
          check=_check_rollout_is, formula=(rollout_log_ratio, rollout_is_weights),
          cites=(Cite("When Speed Kills Stability", doc="6d"),))
def rollout_importance_weights(batch: RolloutBatch, loss_mask: Tensor, cfg, *,
                               options: RolloutIsOptions) -> tuple[Tensor, dict[str, float]]:
    """verl's / TRL's rollout-correction importance weights of the batch (`rollout_is_weights`) and their
    statistics (`rollout_is_stats`)."""
    batch.require("logprobs", "behavior_logprobs", by="algo.importance_weights=rollout_is")
    log_ratio = rollout_log_ratio(batch.logprobs, batch.behavior_logprobs, loss_mask)
    weights, outside = rollout_is_weights(log_ratio, loss_mask, level=options.level, mode=options.mode,
                                          upper=options.threshold, lower=options.threshold_lower,
                                          batch_normalize=options.batch_normalize)
    return weights, rollout_is_stats(weights, outside, loss_mask)


def off_policy_mask(advantages: Tensor, logprobs: Tensor, behavior_logprobs: Tensor, mask: Tensor,
                    threshold: float) -> Tensor:
    """The off-policy sequence mask of DeepSeek-V3.2 (eq. 9), as TRL 1.16's `get_off_policy_mask` computes it.

    `kl_i = mean over response i's valid tokens of (log mu - log pi_old)`; a token is kept (1) where its advantage is
    `>= 0` or `kl_i <= threshold`, dropped (0) otherwise.

    Args:
        advantages: `[N, T]` per-token advantages (one value per response for GRPO's).
        logprobs, behavior_logprobs: `[N, T]` pi_old's and the sampler's log-probs of the tokens.
        mask: `[N, T]` 1 on the tokens the loss counts.
        threshold: delta.
    Returns:
        `[N, T]` bool keep mask (True on padding too: the caller's mask removes it).
    """
    check_token_inputs(mask, advantages=advantages, logprobs=logprobs, behavior_logprobs=behavior_logprobs)
    valid = mask.bool()
    kl = masked_mean(-rollout_log_ratio(logprobs, behavior_logprobs, valid), valid, dim=-1)  # [N]
    return (advantages >= 0) | (kl <= threshold)[:, None]


@dataclass
class OffPolicyMaskOptions:
    """The off-policy sequence mask's options, `algo.off_policy_mask.<field>` (DeepSeek-V3.2 eq. 9, TRL's
    `off_policy_mask_threshold`; docs/methods.md §6d)."""

    threshold: float = 0.5
    """delta: a response whose mean log(mu / pi_old) is above it loses its negative advantages (TRL's
    `off_policy_mask_threshold`; 0.5 is its documented example, TRL has no default). Must be >= 0."""


def _check_off_policy_mask(cfg) -> str | None:
    t = cfg.algo.options["off_policy_mask"].threshold
    return None if t >= 0 else f"algo.off_policy_mask.threshold: must be >= 0 (TRL's example: 0.5), got {t}"


@register("shaper", "off_policy_mask", needs_behavior=True, options=OffPolicyMaskOptions,
          check=_check_off_policy_mask, formula=off_policy_mask,
          cites=(Cite("DeepSeek-V3.2", "eq. 9", doc="6d"),))
def off_policy_sequence_mask(advantages: Tensor, batch: RolloutBatch, cfg, step: int, *,
                             options: OffPolicyMaskOptions) -> Tensor:
    """Advantage 0 where the off-policy sequence mask (`off_policy_mask`) drops the token."""
    batch.require("logprobs", "behavior_logprobs", by="algo.shapers=[off_policy_mask]")
    keep = off_policy_mask(advantages, batch.logprobs, batch.behavior_logprobs, batch.mask, options.threshold)
    return torch.where(keep, advantages, torch.zeros((), dtype=advantages.dtype, device=advantages.device))
