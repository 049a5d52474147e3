"""EAD's truncated importance weights (TIS), per token or per sequence.

EAD: anonymous (under double-blind review), "Let it Calm: Exploratory Annealed Decoding for Verifiable Reinforcement
  Learning" (no arXiv id recorded).

Implements the truncated-IS loss of App. B.2 (docs/methods.md §6c; its sequence level: docs/methods.md §6 and
§9): the weights `min(pi_old / pi_behaviour, C)` that multiply the token loss as `is_weights`. Importance weights
`tis` (`algo.importance_weights: tis`), options `algo.tis.<field>` (`TisOptions`); `none`, the default, weighs
nothing. It reads pi_old's and the sampler's (behaviour) log-probs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
from torch import Tensor

from explorl.algos.aggregation import masked_mean, zero_padding
from explorl.algos.core import LOG_RATIO_BOUND, valid_fraction
from explorl.algos.registry import Cite, lookup, register

if TYPE_CHECKING:
    from explorl.algos.batch import RolloutBatch


TIS_LEVELS: tuple[str, ...] = ("token", "sequence")
"""Valid values of `level` in `tis_weights` / `tis_stats` (docs/methods.md §6)."""


def _tis_log_ratio(logprobs: Tensor, behavior_logprobs: Tensor, valid: Tensor, level: str) -> Tensor:
    """Detached `[N, T]` log importance ratio of each token's weight: its own `logprobs - behavior_logprobs`
    (`token`), or the sum of those over the valid tokens of its response, broadcast to them (`sequence`, in at
    least float32); 0 on padding."""
    d = zero_padding(logprobs.detach() - behavior_logprobs.detach(), valid)
    if level == "token":
        return d
    d = d.to(torch.promote_types(d.dtype, torch.float32))
    log_seq = d.sum(dim=-1, keepdim=True)  # [N, 1]: log pi_old(y|x) - log mu(y|x)
    return zero_padding(log_seq.expand_as(d), valid)


def _tis_raw(logprobs: Tensor, behavior_logprobs: Tensor, valid: Tensor, level: str = "token") -> Tensor:
    """`exp(log_ratio)` of `_tis_log_ratio`, detached, 1 on padding, in the inputs' dtype; the log-ratio is capped
    at +20 before `exp`."""
    raw = torch.exp(_tis_log_ratio(logprobs, behavior_logprobs, valid, level).clamp(max=LOG_RATIO_BOUND))
    return raw.to(torch.promote_types(logprobs.dtype, behavior_logprobs.dtype))


def _check_tis(logprobs: Tensor, behavior_logprobs: Tensor, mask: Tensor, cap: float, level: str) -> None:
    if logprobs.shape != mask.shape or behavior_logprobs.shape != mask.shape:
        raise ValueError(f"tis_weights: logprobs, behavior_logprobs and mask must share one shape; got "
                         f"{tuple(logprobs.shape)}, {tuple(behavior_logprobs.shape)}, {tuple(mask.shape)}")
    if not cap > 0:
        raise ValueError(f"tis_weights: cap must be > 0, got {cap!r}")
    if level not in TIS_LEVELS:
        raise ValueError(f"tis_weights: unknown level {level!r}; valid: {', '.join(TIS_LEVELS)}")
    if level == "sequence" and mask.dim() != 2:
        raise ValueError(f"tis_weights: level 'sequence' needs [N, T] inputs, got {tuple(mask.shape)}")


def tis_weights(logprobs: Tensor, behavior_logprobs: Tensor, mask: Tensor, *, cap: float = 2.0,
                level: str = "token") -> Tensor:
    """Truncated importance weights `w = min(exp(logprobs - behavior_logprobs), cap)`, per token or per sequence.

    EAD (appendix B.2, the truncated-IS loss): the samples come from the annealed behaviour policy,
    the optimised policy stays at the base temperature, so each token's loss is multiplied by
    `min(pi_old(y) / pi_old^EAD(y), C)`; docs/methods.md §6c (C = 2.0 by default; the paper names no value).
    Pass the result as `is_weights`.

    `level` (docs/methods.md §6 and §9): `token` (default) weighs each token by its own truncated ratio, as above.
    `sequence` is the ratio EAD App. B.2 writes, of whole sequences, `min(pi_old(y|x) / pi_EAD(y|x), C)`:
    every valid token of response i gets `min(exp(S_i), cap)`, `S_i = sum_t mask * (logprobs - behavior_logprobs)`,
    computed in log space as `min(exp(min(S_i, 20)), cap)` so a long response cannot overflow (the +20 guard
    only matters for `cap > 4.8e8`); `S_i` is summed in at least float32.

    Args:
        logprobs: `[N, T]` old-policy log-probs of the sampled tokens at the training temperature.
        behavior_logprobs: `[N, T]` log-probs of the same tokens under the distribution they were drawn from.
        mask: `[N, T]` 1 on response tokens.
        cap: the truncation `C` (> 0; `math.inf` disables it).
        level: `token` or `sequence` (`TIS_LEVELS`).
    Returns:
        `[N, T]` detached weights in `[0, cap]`, exactly 0 where `mask == 0` (so all 0 for a response without
        valid tokens). Numerical guard: the log-ratio is capped at 20 before `exp` (only matters for
        `cap > 4.8e8`).
    """
    _check_tis(logprobs, behavior_logprobs, mask, cap, level)
    with torch.no_grad():
        valid = mask.bool()
        return zero_padding(_tis_raw(logprobs, behavior_logprobs, valid, level).clamp(max=cap), valid)


def tis_stats(logprobs: Tensor, behavior_logprobs: Tensor, mask: Tensor, cap: float = 2.0, *,
              level: str = "token") -> dict[str, float]:
    """Statistics of `tis_weights` (with the same `cap` and `level`) over the valid tokens (shapes as there).

    Returns:
        `is/weight_mean` and `is/weight_max` of the truncated weights (1.0 when no token is valid, the neutral
        weight) and `is/truncated_frac`, the fraction of valid tokens whose untruncated ratio exceeds `cap`
        (`exp(logprobs - behavior_logprobs)` per token; at level `sequence` their response's ratio, so every
        statistic is token-weighted, as the loss sees the weights).
    """
    _check_tis(logprobs, behavior_logprobs, mask, cap, level)
    with torch.no_grad():
        valid = mask.bool()
        n_valid = int(valid.sum())
        if level == "token":
            raw = _tis_raw(logprobs, behavior_logprobs, valid)
            truncated = raw > cap
        else:  # compare in log space: the response's ratio itself may overflow
            raw = _tis_raw(logprobs, behavior_logprobs, valid, level)
            truncated = _tis_log_ratio(logprobs, behavior_logprobs, valid, level) > math.log(cap)
        w = raw.clamp(max=cap)
        return {
            "is/weight_mean": float(masked_mean(w, valid)) if n_valid else 1.0,
            "is/weight_max": float(w[valid].max()) if n_valid else 1.0,
            "is/truncated_frac": valid_fraction(truncated, valid, n_valid),
        }


@dataclass
class TisOptions:
    """Truncated importance sampling's options, `algo.tis.<field>` (EAD App. B.2; docs/methods.md §6c)."""

    cap: float = 2.0
    """Cap C of the truncated importance weights (must be >= 1; the paper names no value)."""
    level: Literal[TIS_LEVELS] = "token"
    """Level of the truncated importance weights (docs/methods.md §6). `token` (explorl's default): each token's
    own min(pi_old / mu, cap). `sequence`: the truncated ratio of whole sequences that EAD writes (App. B.2,
    min(pi_old(y|x) / pi_EAD(y|x), C)), the same weight on every token of a response, computed in log space."""


def _check_tis_options(cfg) -> str | None:
    o, s = cfg.algo.options["tis"], cfg.sampling
    if o.level not in TIS_LEVELS:
        return f"algo.tis.level: {o.level!r} is not a valid choice; valid choices: {', '.join(TIS_LEVELS)}"
    if not o.cap >= 1.0:
        return f"algo.tis.cap: must be >= 1, got {o.cap}"
    # vLLM's kernels are not the trainer's: its log-probs differ from the policy's even at one temperature
    if lookup("temperature_schedule", s.schedule).behavior_is_policy and s.top_p >= 1.0 and s.engine != "vllm":
        return (f"algo.importance_weights=tis: the behaviour policy equals the optimised one here (schedule "
                f"{s.schedule}, top_p = 1), so every importance weight is 1; use sampling.schedule=ead or revead, "
                f"sampling.engine=vllm, or algo.importance_weights=none")
    return None


@register("importance_weights", "none", needs_old_logprobs=False, cites=(Cite("explorl", doc="1b"),))
def no_importance_weights(batch: RolloutBatch, loss_mask: Tensor, cfg) -> tuple[None, dict[str, float]]:
    """No importance weights: the samples are taken as drawn from the optimised policy."""
    return None, {}


@register("importance_weights", "tis", needs_behavior=True, options=TisOptions, check=_check_tis_options,
          formula=tis_weights,
          cites=(Cite("EAD", "App. B.2", doc="6c"),))
def truncated_importance_weights(batch: RolloutBatch, loss_mask: Tensor, cfg, *,
                                 options: TisOptions) -> tuple[Tensor, dict[str, float]]:
    """EAD's truncated importance weights of the batch (`tis_weights`) and their statistics (`tis_stats`)."""
    batch.require("logprobs", "behavior_logprobs", by="algo.importance_weights=tis")
    weights = tis_weights(batch.logprobs, batch.behavior_logprobs, loss_mask, cap=options.cap, level=options.level)
    return weights, tis_stats(batch.logprobs, batch.behavior_logprobs, loss_mask, cap=options.cap,
                              level=options.level)
