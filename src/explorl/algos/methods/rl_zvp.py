"""RL-ZVP: GRPO's advantage, and an entropy-scaled token advantage on the zero-variance prompts GRPO gives none.

RL-ZVP: Thanh-Long V. Le, Myeongho Jeon, Kim Vu, Viet Lai, Eunho Yang (2025), "No Prompt Left Behind: Exploiting
  Zero-Variance Prompts in LLM Reinforcement Learning via Entropy-Guided Advantage Shaping", arXiv 2509.21880.

Implements RL-ZVP's advantage (section 3.2, eq. 5, and Algorithm 1; docs/methods.md §5v). A group whose rewards do
not all agree gets GRPO's advantage (eq. 1: `(r_i - mean) / (std + algo.adv_eps)`, the unbiased std, as `grpo`). A
zero-variance group (every reward equal) gets, per token t of response i with token entropy H_i,t (detached):
`alpha * H_i,t` when its reward is > 0 (all correct), and `-alpha * (max_k H_i,k - H_i,t)` otherwise (all wrong; the
max over the response's own tokens), so that high-entropy tokens are reinforced most on correct responses and
penalised least on wrong ones. Estimator `rl_zvp`, options `algo.rl_zvp.<field>` (`RlZvpOptions`): `alpha` 0.1 (the
paper's best value, Table 3).

Source: the paper's text (sections 2-4: eq. 1, eq. 5, eq. 6, Algorithm 1, Table 3; 16 gradient steps per rollout
batch, section 4.1). Its appendix C (the remaining hyperparameters) was not read; no public code was found.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from explorl.algos.batch import MissingInputError
from explorl.algos.core import (check_response_inputs, check_token_inputs, dense_ids, float_dtype, group_range_equal,
                                segment_stats)
from explorl.algos.registry import Cite, register

if TYPE_CHECKING:
    from explorl.algos.batch import RolloutBatch
    from explorl.config.schema import AlgoConfig


def rl_zvp(rewards: Tensor, group: Tensor, mask: Tensor, entropy: Tensor, *, alpha: float = 0.1,
           eps: float = 1e-6) -> Tensor:
    """RL-ZVP's token advantage (docs/methods.md §5v; Le et al. 2025, "No Prompt Left Behind", eq. 1 and eq. 5).

    Group g of response i with rewards not all equal: `A_i,t = (r_i - mean_g(r)) / (std_g(r) + eps)` (GRPO, the
    unbiased std). Zero-variance group (every reward of g equal, a group of one included):
    `A_i,t = alpha * H_i,t` if `r_i > 0`, else `-alpha * (max_k H_i,k - H_i,t)` with k over the valid tokens of
    response i. The entropy enters as a constant (detached, the paper's footnote 3).

    Args:
        rewards: `[N]` one scalar reward per response.
        group: `[N]` int64 prompt ids; arbitrary values, any order, any group sizes.
        mask: `[N, T]` 1 on response tokens, 0 on padding.
        entropy: `[N, T]` the policy's token entropy at each position (read on the zero-variance groups only).
        alpha: the scaling factor of the entropy term (> 0).
        eps: added to GRPO's standard deviation.
    Returns:
        `[N, T]` advantages in the floating dtype of `rewards` (float32 otherwise), 0.0 where `mask == 0`.
    """
    check_response_inputs(rewards, group, mask)
    check_token_inputs(mask, entropy=entropy)
    out_dtype = float_dtype(rewards)
    if rewards.numel() == 0:
        return torch.zeros(mask.shape, dtype=out_dtype, device=mask.device)
    valid = mask.bool()
    r = rewards.detach().to(torch.float64)
    dense, n_groups = dense_ids(group)
    mean, std, _ = segment_stats(r, dense, unbiased=True)
    # a group of one included: std({r}) = 0
    zero_variance = group_range_equal(r, dense, n_groups, torch.ones_like(r, dtype=torch.bool))
    grpo = ((r - mean) / (std + eps))[:, None].expand(mask.shape)
    h = torch.where(valid, entropy.detach().to(torch.float64), torch.zeros((), dtype=torch.float64))
    h_max = torch.where(valid, h, torch.full_like(h, -math.inf)).amax(dim=-1, keepdim=True)
    zvp = torch.where((r > 0)[:, None], alpha * h, -alpha * (h_max - h))
    adv = torch.where(zero_variance[:, None], zvp, grpo)
    return torch.where(valid, adv, torch.zeros((), dtype=torch.float64, device=adv.device)).to(out_dtype)


@dataclass
class RlZvpOptions:
    """RL-ZVP's options, `algo.rl_zvp.<field>` (Le et al. 2025; docs/methods.md §5v)."""

    alpha: float = 0.1
    """alpha, the scaling factor of the token entropy in the zero-variance groups' advantage (eq. 5; 0.1 is the
    paper's best of 0.05, 0.1, 0.2, 0.3, Table 3)."""


def _check_rl_zvp(cfg) -> str | None:
    alpha = cfg.algo.options["rl_zvp"].alpha
    return None if alpha > 0 else f"algo.rl_zvp.alpha: must be > 0, got {alpha}"


@register("estimator", "rl_zvp", needs_old_logprobs=False, options=RlZvpOptions, check=_check_rl_zvp,
          reads=("adv_eps",), formula=rl_zvp, cites=(Cite("RL-ZVP", "eq. 1, eq. 5, section 3.2, Algorithm 1",
                                                          doc="5v"),))
def _rl_zvp_adapter(batch: RolloutBatch, cfg: AlgoConfig, *, options: RlZvpOptions) -> Tensor:
    """RL-ZVP (Le et al. 2025): GRPO, and alpha-scaled token entropy on the zero-variance groups."""
    batch.require("entropy", by="rl_zvp")
    adv = rl_zvp(batch.rewards, batch.group, batch.mask, batch.entropy, alpha=options.alpha, eps=cfg.adv_eps)
    if not torch.isfinite(adv).all():
        raise MissingInputError("rl_zvp needs finite token entropies of the policy (RolloutBatch.entropy); the batch's "
                                "are not finite on some response token (an engine that does not return them, such "
                                "as vLLM's sampler, leaves NaN: take pi_old's from a forward pass)")
    return adv
