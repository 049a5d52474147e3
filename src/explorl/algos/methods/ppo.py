"""The PPO-clip policy loss (GRPO's, DAPO's and Dr.GRPO's token loss), with verl's optional dual clip.

PPO: Schulman et al. 2017, "Proximal Policy Optimization Algorithms" (no arXiv id recorded).
DAPO: Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale" (no arXiv id recorded).

Implements the clipped surrogate, eq. 7 of PPO, with DAPO's decoupled clip bounds ("clip-higher", section 3.1)
and token-mean aggregation (section 3.3); docs/methods.md §1b. The dual clip (off by default; docs/methods.md
§1 and §9) is verl 0.9's `clip_ratio_c` (Ye et al. 2020, arXiv:1912.09729). Policy loss `ppo`, options
`algo.ppo.<field>` (`PpoOptions`); the clip bounds are the core fields `algo.eps_low` / `algo.eps_high`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from explorl.algos.aggregation import Reduction
from explorl.algos.batch import RolloutBatch
from explorl.algos.core import (as_constant, check_loss_inputs, importance_ratio, ppo_stats, ppo_token_loss,
                                valid_fraction)
from explorl.algos.registry import Cite, register


@dataclass
class PpoOptions:
    """The PPO-clip loss's options, `algo.ppo.<field>` (docs/methods.md §1, §9)."""

    dual_clip_c: float | None = None
    """Dual-clip PPO as verl 0.9 applies it (its `actor.clip_ratio_c`, default 3.0, always on; Ye et al. 2020): for
    tokens with A < 0 the token loss is min(-A * c, PPO-clip loss), so a huge ratio cannot drive it further. Must be
    > 1. null (explorl's default): off. verl's Clip-Cov has none, so `clip_cov` has no such option."""


def _check_ppo(cfg) -> str | None:
    c = cfg.algo.options["ppo"].dual_clip_c
    return None if c is None or c > 1 else (f"algo.ppo.dual_clip_c: must be > 1 (verl's clip_ratio_c is 3.0) or null "
                                            f"for no dual clip, got {c}")


def _dual_clip(token_loss: Tensor, adv: Tensor, dual_clip_c: float) -> tuple[Tensor, Tensor]:
    """verl's dual clip of the PPO token loss: `(token_loss', active)`, `active` where the bound acts.

    For A < 0: `min(-A * c, token_loss)`; A >= 0 unchanged (verl `compute_policy_loss_vanilla`: `pg_losses3 =
    -A * clip_ratio_c`, `where(A < 0, min(pg_losses3, max(pg_losses1, pg_losses2)), ...)`). Where the bound is
    active the token loss is the constant `-A * c` (A detached), so the token gets no gradient. Ties keep the PPO
    term (same value; its gradient is the PPO one).
    """
    bound = -adv * dual_clip_c
    active = (adv < 0) & (token_loss > bound)
    return torch.where(active, bound, token_loss), active


def policy_loss(
    logprobs_new: Tensor,
    logprobs_old: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip_c: float | None = None,
    reduction: Reduction = Reduction("token-mean"),
) -> tuple[Tensor, dict[str, float]]:
    """Clipped surrogate policy-gradient loss (to minimise), reduced by `reduction` (docs/methods.md §1b).

    Token loss `-min(rho * A, clip(rho, 1 - eps_low, 1 + eps_high) * A)`, `rho = exp(logp_new - logp_old)`:
    PPO, Schulman et al. 2017, eq. 7; decoupled bounds `eps_low` / `eps_high` ("clip-higher") and token-mean
    aggregation from DAPO, Yu et al. 2025, sections 3.1 and 3.3. The reduction's optional `is_weights` (e.g. the
    truncated importance weights of EAD, docs/methods.md §6c, from `tis_weights`) multiply the token loss and receive
    no gradient. Its optional `token_weights` do the same (e.g. `forking_mask`, the 80/20 forking-token baseline of
    Wang et al. 2025, docs/methods.md §5d); tokens they zero still count in the aggregation's normaliser.

    Dual clip (`dual_clip_c`, off by default; docs/methods.md §1 and §9): verl 0.9's dual-clip PPO (Ye et al. 2020,
    arXiv:1912.09729; verl's `clip_ratio_c`, default 3, always on in verl). For tokens with A < 0 the token loss becomes
    `min(-A * c, max(-A * rho, -A * clip(rho, 1 - eps_low, 1 + eps_high)))`, so a token whose ratio has run far
    above 1 cannot push a negative-advantage loss beyond `|A| * c`; there it is a constant (no gradient). Tokens
    with A >= 0 are unchanged. The weights multiply after the dual clip, as in verl.

    Args:
        logprobs_new: `[N, T]` log-probs of the sampled tokens under the policy being optimised (differentiable).
        logprobs_old: `[N, T]` the same under the policy that produced the batch (treated as constant).
        advantages: `[N, T]` per-token advantages (treated as constant).
        mask: `[N, T]` 1 on response tokens.
        eps_low, eps_high: clip range `[1 - eps_low, 1 + eps_high]` of the ratio.
        dual_clip_c: the dual-clip constant `c` (> 1), or None (default) for no dual clip.
        reduction: the aggregation (one of `LOSS_AGG_MODES`, see `aggregate`), the configured response length limit
            (required for `seq-mean-token-sum-norm`) and the optional `[N, T]` detached `is_weights` and
            `token_weights` (e.g. a 0/1 token selection) multiplying the token loss; the normaliser of the
            aggregation is still computed from `mask`.
    Returns:
        `(loss, stats)`: the scalar loss (0, not nan, when the mask is empty) and detached float statistics over
        valid tokens: `loss/pg` (the loss value), `loss/clip_frac` (the clipped term is active: it is strictly the
        larger loss), `loss/clip_frac_low` (rho < 1 - eps_low with A < 0), `loss/clip_frac_high`
        (rho > 1 + eps_high with A > 0), `loss/ratio_mean`, `loss/ratio_min`, `loss/ratio_max`, `loss/ppo_kl` (mean of
        `logp_old - logp_new`), `loss/is_weight_mean` when there are `is_weights`, and `loss/masked_frac` (the
        fraction of valid tokens whose token weight is 0) when there are `token_weights` (`Reduction.record`); with
        `dual_clip_c`, `loss/dual_clip_frac` (fraction of valid tokens where the bound `-A * c` is the active term;
        verl's `pg_clipfrac_lower`).
    """
    check_loss_inputs("policy_loss", logprobs_new, logprobs_old, advantages, mask, reduction)
    if dual_clip_c is not None and not dual_clip_c > 1.0:
        raise ValueError(f"policy_loss: dual_clip_c must be > 1 (or None for no dual clip), got {dual_clip_c!r}")
    valid = mask.bool()
    log_ratio, ratio = importance_ratio(logprobs_new, logprobs_old, valid)
    adv = as_constant(advantages, valid, ratio.dtype)
    token_loss, loss_unclipped, loss_clipped = ppo_token_loss(ratio, adv, eps_low, eps_high)
    dual_active = None
    if dual_clip_c is not None:
        token_loss, dual_active = _dual_clip(token_loss, adv, dual_clip_c)
    loss = reduction(token_loss, valid)

    with torch.no_grad():
        n_valid = int(valid.sum())
        stats = ppo_stats(loss, ratio, log_ratio, adv, loss_clipped > loss_unclipped, valid, n_valid,
                          (eps_low, eps_high))
        if dual_active is not None:
            stats["loss/dual_clip_frac"] = valid_fraction(dual_active, valid, n_valid)
        reduction.record(stats, valid, n_valid, ratio.dtype)
    return loss, stats


@register("policy_loss", "ppo", needs_old_logprobs=False, rowwise=True, options=PpoOptions, check=_check_ppo,
          reads=("eps_low", "eps_high", "loss_agg"), formula=policy_loss, cites=(Cite("PPO", "eq. 7", doc="1b"),))
def _ppo_adapter(logprobs_new: Tensor, batch: RolloutBatch, cfg, *,
                 options: PpoOptions) -> tuple[Tensor, dict[str, float]]:
    """PPO-clip (`policy_loss`) with the clip range `algo.eps_low` / `algo.eps_high`, the dual clip
    `algo.ppo.dual_clip_c` and the aggregation `algo.loss_agg`."""
    return policy_loss(logprobs_new, batch.logprobs, batch.advantages, batch.loss_mask, eps_low=cfg.eps_low,
                       eps_high=cfg.eps_high, dual_clip_c=options.dual_clip_c,
                       reduction=Reduction.of(batch, cfg.loss_agg))
