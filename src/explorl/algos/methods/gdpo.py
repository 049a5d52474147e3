"""GDPO: each reward component normalised within its group, summed with weights, whitened over the batch.

GDPO: Liu et al. 2026, "GDPO: Group reward-Decoupled Normalization Policy Optimization for Multi-reward RL
  Optimization" (arXiv 2601.05242, as verl 0.9.1 cites it).

Implements verl 0.9.1's `gdpo` estimator (docs/methods.md §5r): GRPO's group advantage of each reward component,
their weighted sum, then whitening over every valid token of the batch. The components are the task's reward
functions (`task.reward` with several entries), each one's own scores in `RolloutBatch.reward_components` and their
weights `reward_weights`, which explorl's loop and TRL's trainer fill; with one reward function the one component is
the reward itself. Options `algo.gdpo.<field>` (`GdpoOptions`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import torch
from torch import Tensor

from explorl.algos.core import check_response_inputs, float_dtype, on_response_tokens
from explorl.algos.methods.grpo import grpo
from explorl.algos.methods.reinforce_pp import batch_whiten
from explorl.algos.registry import Cite, register

if TYPE_CHECKING:
    from explorl.algos.batch import RolloutBatch
    from explorl.config.schema import AlgoConfig


def gdpo(components: Tensor, group: Tensor, mask: Tensor, *, weights: Sequence[float] | Tensor | None = None,
         scale: bool = True, eps: float = 1e-6) -> Tensor:
    """GDPO advantage (docs/methods.md §5r; Liu et al. 2026, "GDPO"), as
    verl 0.9.1 computes it.

    For each reward component k: `A_k = grpo(r_k)`, the group z-score `(r_k - mean_g(r_k)) / (std_g(r_k) + eps)`
    (unbiased std; `scale=False`: no division); `A = sum_k w_k A_k`; then whitened over every valid token of the
    batch, `(A - mean(A)) / sqrt(var(A) + 1e-8)` with the unbiased variance. With one component this is GRPO's
    advantage whitened over the batch.

    A group of one response (or one whose component is constant) gets 0 for that component, as explorl's `grpo`
    gives (verl 0.9.1 gives a group of one `r_k / (1 + eps)`); the whitening then moves every zero alike.

    Args:
        components: `[N, K]` the K reward components of each response (`[N]`: one component).
        group: `[N]` int64 prompt ids; arbitrary values, any order, any group sizes.
        mask: `[N, T]` 1 on response tokens, 0 on padding.
        weights: `[K]` weight of each component; None: every weight 1.
        scale: divide each component's group deviation by its group std + eps (verl's `norm_adv_by_std_in_grpo`).
        eps: added to the standard deviation.
    Returns:
        `[N, T]` advantages in the floating dtype of `components` (float32 otherwise), 0.0 where `mask == 0`.
    """
    comps = components[:, None] if components.dim() == 1 else components
    if comps.dim() != 2 or comps.shape[1] == 0:
        raise ValueError(f"gdpo: expected components [N, K] (K >= 1) or [N], got {tuple(components.shape)}")
    check_response_inputs(comps[:, 0], group, mask)
    k = comps.shape[1]
    w = torch.ones(k, dtype=torch.float64) if weights is None else torch.as_tensor(weights, dtype=torch.float64)
    if w.shape != (k,):
        raise ValueError(f"gdpo: {w.numel()} weight(s) for {k} reward component(s)")
    out_dtype = float_dtype(components)
    total = torch.zeros(mask.shape, dtype=torch.float64, device=mask.device)
    for i in range(k):
        total = total + float(w[i]) * grpo(comps[:, i].to(torch.float64), group, mask, scale=scale, eps=eps)
    adv = batch_whiten(total, mask).to(out_dtype)
    return on_response_tokens(adv, mask, out_dtype)


@dataclass
class GdpoOptions:
    """GDPO's options, `algo.gdpo.<field>` (docs/methods.md §5r)."""

    norm_adv_by_std: bool = True
    """Divide each component's group deviation by its group std + `algo.adv_eps` (verl 0.9.1's
    `algorithm.norm_adv_by_std_in_grpo`, default true)."""


def _reward_entries(reward) -> list:
    return list(reward) if isinstance(reward, (list, tuple)) else [reward]


def _check_gdpo(cfg) -> str | None:
    entries = _reward_entries(getattr(getattr(cfg, "task", None), "reward", "auto"))
    changed = [name for name in cfg.algo.reward_shapers if name == "dapo_overlong"]
    if len(entries) > 1 and changed:
        return (f"algo.reward_shapers: {changed[0]} adds its penalty to the summed reward, and gdpo normalises each of "
                f"the {len(entries)} task.reward functions' own scores, so the penalty would not reach it; use "
                f"dapo_overlong_filter, one task.reward entry, or algo.advantage=grpo")
    return None


@register("estimator", "gdpo", needs_old_logprobs=False, needs_reward_components=True, reads=("adv_eps",),
          options=GdpoOptions, check=_check_gdpo, formula=(gdpo, grpo, batch_whiten), cites=(Cite("GDPO", doc="5r"),))
def _gdpo_adapter(batch: RolloutBatch, cfg: AlgoConfig, *, options: GdpoOptions) -> Tensor:
    """GDPO: per-component group z-scores of the reward functions' own scores (`batch.reward_components`, weighted
    by `batch.reward_weights`), summed and whitened over the batch; with one reward function, of the reward."""
    if batch.reward_components is None:
        return gdpo(batch.rewards, batch.group, batch.mask, scale=options.norm_adv_by_std, eps=cfg.adv_eps)
    weights = torch.tensor(batch.reward_weights, dtype=torch.float64)
    summed = batch.reward_components.to(torch.float64) @ weights
    if not torch.allclose(summed, batch.rewards.to(torch.float64), rtol=1e-4, atol=1e-5):
        raise ValueError("advantage 'gdpo': the rewards are not the weighted sum of the reward functions' scores (a "
                         "reward shaper changed them), and gdpo normalises the scores themselves; remove that reward "
                         "shaper or use algo.advantage=grpo")
    return gdpo(batch.reward_components, batch.group, batch.mask, weights=weights, scale=options.norm_adv_by_std,
                eps=cfg.adv_eps)
