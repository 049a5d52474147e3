"""PSR, NSR and W-REINFORCE: reinforcing only the correct responses, only penalising the wrong ones, or both with the
positive term down-weighted.

NSR: Xinyu Zhu, Mengzhou Xia, Zhepei Wei, Wei-Lin Chen, Danqi Chen, Yu Meng (2025), "The Surprising Effectiveness of
  Negative Reinforcement in LLM Reasoning", arXiv 2506.01347.

Implements the three objectives of the paper's decomposition (docs/methods.md §5t) as estimators: `psr` (Positive
Sample Reinforcement, the correct responses only, advantage +1), `nsr` (Negative Sample Reinforcement, the wrong
responses only, advantage -1) and `w_reinforce` (Weighted-REINFORCE: `+lam` on correct, `-1` on wrong; options
`algo.w_reinforce.<field>`, `WReinforceOptions`, `lam` 0.1 as the paper and its code recommend). No baseline and no
group: each response's advantage depends on its own reward only. The paper's reward is binary (+1 / -1); here a
response is correct when its reward is > 0.5 (explorl's binary convention, as `passk`).

Source: the paper's abstract and the authors' public code, TianHongZXY/RLVR-Decomposed
(`verl/trainer/ppo/core_algos.py`, `compute_psr_nsr_outcome_advantage`, with 0/1 scores: `positive` A = r,
`negative` A = r - 1, `weighted` A = lam * r on correct and r - 1 on wrong; their script
`run_qwen2.5-math-7b_psr_nsr.sh`: PPO's clipped loss at clip 0.2, token-mean, no KL, 8 responses per prompt, 1024
prompts in mini-batches of 256, lr 1e-6; entropy bonus 0.001 from their verl config). The paper's own text was not
available here: the equation numbers cited (the decomposition, eq. 2-4; W-REINFORCE, eq. 9) are as a third-party
summary of the paper gives them, not checked against the paper.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from explorl.algos.core import check_token_inputs, float_dtype, on_response_tokens
from explorl.algos.registry import Cite, register

if TYPE_CHECKING:
    from explorl.algos.batch import RolloutBatch
    from explorl.config.schema import AlgoConfig


def sample_reinforcement(rewards: Tensor, mask: Tensor, *, positive: float, negative: float) -> Tensor:
    """The advantage of the paper's decomposition of RLVR (docs/methods.md §5t; Zhu et al. 2025, "The Surprising
    Effectiveness of Negative Reinforcement in LLM Reasoning", eq. 2-4 and W-REINFORCE's eq. 9), broadcast over the
    response tokens.

    `A_i = +positive` when response i is correct (`r_i > 0.5`), `A_i = -negative` otherwise. PSR is
    `(positive, negative) = (1, 0)`, NSR `(0, 1)`, W-REINFORCE `(lam, 1)`, and `(1, 1)` is REINFORCE on +-1
    rewards (the paper's RLVR objective). No baseline: groups play no part.

    Args:
        rewards: `[N]` one scalar reward per response; `> 0.5` is correct.
        mask: `[N, T]` 1 on response tokens, 0 on padding.
        positive: the weight of the correct responses (>= 0).
        negative: the weight of the wrong responses (>= 0).
    Returns:
        `[N, T]` advantages in the floating dtype of `rewards` (float32 otherwise), 0.0 where `mask == 0`.
    """
    if rewards.shape != (mask.shape[0],):
        raise ValueError(f"expected rewards [N] with N = {mask.shape[0]}, got {tuple(rewards.shape)}")
    check_token_inputs(mask)
    if positive < 0 or negative < 0:
        raise ValueError(f"positive and negative must be >= 0, got {positive} and {negative}")
    out_dtype = float_dtype(rewards)
    correct = rewards.detach() > 0.5
    adv = torch.where(correct, torch.full(correct.shape, float(positive), dtype=torch.float64, device=mask.device),
                      torch.full(correct.shape, -float(negative), dtype=torch.float64, device=mask.device))
    return on_response_tokens(adv, mask, out_dtype)


@dataclass
class WReinforceOptions:
    """W-REINFORCE's options, `algo.w_reinforce.<field>` (Zhu et al. 2025; docs/methods.md §5t)."""

    lam: float = 0.1
    """lambda, the weight of the positive (correct-response) term; the negative term keeps weight 1. 0.1 is the
    paper's value (the authors' `positive_advantage_weight`); 1 is REINFORCE on +-1 rewards, 0 is NSR."""


def _check_w_reinforce(cfg) -> str | None:
    lam = cfg.algo.options["w_reinforce"].lam
    return None if lam >= 0 else f"algo.w_reinforce.lam: must be >= 0, got {lam}"


@register("estimator", "psr", needs_old_logprobs=False, formula=sample_reinforcement,
          cites=(Cite("NSR", "eq. 2-4", doc="5t"),))
def _psr_adapter(batch: RolloutBatch, cfg: AlgoConfig) -> Tensor:
    """PSR (Zhu et al. 2025): +1 on the correct responses, 0 on the wrong ones."""
    return sample_reinforcement(batch.rewards, batch.mask, positive=1.0, negative=0.0)


@register("estimator", "nsr", needs_old_logprobs=False, formula=sample_reinforcement,
          cites=(Cite("NSR", "eq. 2-4", doc="5t"),))
def _nsr_adapter(batch: RolloutBatch, cfg: AlgoConfig) -> Tensor:
    """NSR (Zhu et al. 2025): -1 on the wrong responses, 0 on the correct ones."""
    return sample_reinforcement(batch.rewards, batch.mask, positive=0.0, negative=1.0)


@register("estimator", "w_reinforce", needs_old_logprobs=False, options=WReinforceOptions, check=_check_w_reinforce,
          formula=sample_reinforcement, cites=(Cite("NSR", "eq. 9", doc="5t"),))
def _w_reinforce_adapter(batch: RolloutBatch, cfg: AlgoConfig, *, options: WReinforceOptions) -> Tensor:
    """W-REINFORCE (Zhu et al. 2025): +lam on the correct responses, -1 on the wrong ones."""
    return sample_reinforcement(batch.rewards, batch.mask, positive=options.lam, negative=1.0)
