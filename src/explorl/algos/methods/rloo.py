"""RLOO: REINFORCE with the leave-one-out baseline.

RLOO: Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style Optimization for Learning from Human Feedback
  in LLMs" (arXiv 2402.14740, as verl 0.9.1 cites it).

Implements the RLOO estimator (docs/methods.md §5n): each response's reward minus the mean reward of
the other responses to its prompt. Estimator `rloo`; no options (verl 0.9.1's `rloo` has none). Built in since
issue 52; `configs/examples/plugins/rloo.py` shows the same maths written as a user's plugin, under its own name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from explorl.algos.core import check_response_inputs, float_dtype, on_response_tokens, segment_stats
from explorl.algos.registry import Cite, register

if TYPE_CHECKING:
    from explorl.algos.batch import RolloutBatch
    from explorl.config.schema import AlgoConfig


def rloo(rewards: Tensor, group: Tensor, mask: Tensor) -> Tensor:
    """RLOO advantage (docs/methods.md §5n; Ahmadian et al. 2024, "Back to Basics"), broadcast over
    the response tokens.

    `A_i = r_i - (1 / (n - 1)) * sum_{j != i} r_j` over the n responses of the group of response i, equal to
    `n / (n - 1) * (r_i - mean_g(r))`. Over a group the advantages sum to 0.

    A group of one response has no other response to form a baseline: explorl gives it 0 (as `grpo`, and as verl's
    `rloo_vectorized`); verl 0.9.1's `rloo` gives it its raw reward.

    Args:
        rewards: `[N]` one scalar reward per response.
        group: `[N]` int64 prompt ids; arbitrary values, any order, any group sizes.
        mask: `[N, T]` 1 on response tokens, 0 on padding.
    Returns:
        `[N, T]` advantages in the floating dtype of `rewards` (float32 otherwise), 0.0 where `mask == 0`.
    """
    check_response_inputs(rewards, group, mask)
    out_dtype = float_dtype(rewards)
    if rewards.numel() == 0:
        return torch.zeros(mask.shape, dtype=out_dtype, device=mask.device)
    r = rewards.detach().to(torch.float64)
    mean, _, count = segment_stats(r, group)
    adv = torch.where(count > 1, (r - mean) * count / (count - 1).clamp_min(1.0), torch.zeros_like(r))
    adv = adv.to(out_dtype)
    return on_response_tokens(adv, mask, out_dtype)


@register("estimator", "rloo", needs_old_logprobs=False, formula=rloo,
          cites=(Cite("RLOO", doc="5n"),))
def _rloo_adapter(batch: RolloutBatch, cfg: AlgoConfig) -> Tensor:
    """RLOO (Ahmadian et al. 2024): reward minus the mean reward of the group's other responses."""
    return rloo(batch.rewards, batch.group, batch.mask)
