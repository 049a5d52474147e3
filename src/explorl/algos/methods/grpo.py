"""GRPO's group-relative advantage, and Dr.GRPO's (the same without the std division).

GRPO: Shao et al. 2024, "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models" (no
  arXiv id recorded).
Dr.GRPO: Liu et al. 2025, "Understanding R1-Zero-like Training: A Critical Perspective" (no arXiv id recorded).
E3: Mengqi Liao, Xiangyu Xi, Ruinian Chen, Jia Leng, Yangen Hu, Ke Zeng, Shuai Liu, Huaiyu Wan, "Enhancing
  Efficiency and Exploration in Reinforcement Learning for LLMs" (no arXiv id recorded).

Implements GRPO's outcome-supervision advantage (section 4.1.2, the advantage of eq. 3; E3 eq. 2 writes the same),
`A_i = (r_i - mean_g(r)) / (std_g(r) + eps)` with the unbiased std over the responses of group g, and Dr.GRPO's
`A_i = r_i - mean_g(r)` (docs/methods.md §1, §1a). Estimators `grpo` and `dr_grpo`; no options of their own
(they read the core field `algo.adv_eps`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from explorl.algos.core import check_response_inputs, dense_ids, group_range_equal, on_response_tokens, segment_stats
from explorl.algos.registry import Cite, register

if TYPE_CHECKING:
    from explorl.algos.batch import RolloutBatch
    from explorl.config.schema import AlgoConfig


def grpo(rewards: Tensor, group: Tensor, mask: Tensor, *, scale: bool = True, eps: float = 1e-6) -> Tensor:
    """Group-relative advantage of GRPO, broadcast over the response tokens (docs/methods.md §1a).

    `A_i = (r_i - mean_g(r)) / (std_g(r) + eps)` with the mean and the **unbiased** standard deviation over
    the responses of group g (as verl and TRL compute it). GRPO: Shao et al. 2024, "DeepSeekMath", section 4.1.2
    (outcome supervision). `scale=False` drops the division, `A_i = r_i - mean_g(r)`: Dr.GRPO, Liu et al. 2025,
    "Understanding R1-Zero-like Training: A Critical Perspective" ("GRPO Done Right").

    A group of size 1, or one whose rewards are all equal, gets advantage exactly 0 (compared exactly, so that
    rounding in the mean cannot leak a tiny deviation that `/ (std + eps)` would blow up).

    Args:
        rewards: `[N]` one scalar reward per response.
        group: `[N]` int64 prompt ids; arbitrary values, any order, any group sizes.
        mask: `[N, T]` 1 on response tokens, 0 on padding.
        scale: divide by `std + eps` (GRPO) or not (Dr.GRPO).
        eps: added to the standard deviation.
    Returns:
        `[N, T]` advantages in the floating dtype of `rewards` (float32 for integer rewards), 0.0 where `mask == 0`.
    """
    check_response_inputs(rewards, group, mask)
    out_dtype = rewards.dtype if rewards.dtype.is_floating_point else torch.float32
    if rewards.numel() == 0:
        return torch.zeros(mask.shape, dtype=out_dtype, device=mask.device)
    r = rewards.detach().to(torch.float64)
    dense, n_groups = dense_ids(group)
    mean, std, count = segment_stats(r, dense, unbiased=True)
    adv = r - mean
    if scale:
        adv = adv / (std + eps)
    degenerate = (count < 2) | group_range_equal(r, dense, n_groups, torch.ones_like(r, dtype=torch.bool))
    adv = torch.where(degenerate, torch.zeros_like(adv), adv).to(out_dtype)
    return on_response_tokens(adv, mask, out_dtype)


@register("estimator", "grpo", needs_old_logprobs=False, reads=("adv_eps",), formula=grpo,
          cites=(Cite("GRPO", "section 4.1.2, eq. 3", doc="1, 1a"), Cite("E3", "eq. 2", doc="1a")))
def _grpo_adapter(batch: RolloutBatch, cfg: AlgoConfig) -> Tensor:
    """GRPO (Shao et al. 2024): group z-score with unbiased std."""
    return grpo(batch.rewards, batch.group, batch.mask, eps=cfg.adv_eps)


@register("estimator", "dr_grpo", needs_old_logprobs=False, reads=("adv_eps",), formula=grpo,
          cites=(Cite("Dr.GRPO", doc="1a"),))
def _dr_grpo_adapter(batch: RolloutBatch, cfg: AlgoConfig) -> Tensor:
    """Dr.GRPO (Liu et al. 2025): group mean baseline, no std division."""
    return grpo(batch.rewards, batch.group, batch.mask, scale=False, eps=cfg.adv_eps)
