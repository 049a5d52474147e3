"""MaxRL: the group-centred reward divided by the group's mean reward, an estimator of the maximum-likelihood gradient.

MaxRL: Fahim Tajwar, Guanning Zeng, Yueer Zhou, Yuda Song, Daman Arora, Yiding Jiang, Jeff Schneider, Ruslan
  Salakhutdinov, Haiwen Feng, Andrea Zanette (2026), "Maximum Likelihood Reinforcement Learning", arXiv 2602.02710.

Implements MaxRL's advantage (Algorithm 1, "Practical Implementation of MaxRL"; the estimator of eq. 11 in section
4.2, docs/methods.md §5x): `A_i = (r_i - mu_g) / mu_g` with `mu_g` the mean reward of the group of response i, and 0
for a group whose mean is 0 (no successful rollout). With 0/1 rewards and K successes among N rollouts, the
policy gradient `sum_i A_i grad log pi(y_i) / N` is `sum_i (r_i / K - 1 / N) grad log pi(y_i)`: the
success-conditioned score (normalised by the K successes, where REINFORCE normalises by N) minus the unconditional
one as control variate, unbiased for the gradient of the truncated maximum-likelihood objective of order N.
Estimator `maxrl`, options `algo.maxrl.<field>` (`MaxrlOptions`): `eps` 1e-6 in the denominator (the authors' code).

Source: the paper's LaTeX source (Zanette-Labs/MaxRL, `paper.tex`: section 4, eq. 10-11, Algorithm 1, the weight
functions of section 5, the Qwen3 hyperparameters of appendix E.3: 16 rollouts per prompt, one gradient update per
rollout batch, fully on-policy, no KL, no entropy bonus, lr 1e-6); the authors' code (tajwarfahim/maxrl,
`verl/trainer/ppo/core_algos.py`, `compute_maxrl_outcome_advantage`: `(r - mean) / (mean + 1e-6)`; its script
`run_qwen3_training.sh`: clip 0.2/0.2, token-mean, one update per batch). The equation numbers are those of the
compiled LaTeX source; the arXiv text itself was not read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from explorl.algos.core import check_response_inputs, float_dtype, on_response_tokens, segment_stats
from explorl.algos.registry import Cite, register

if TYPE_CHECKING:
    from explorl.algos.batch import RolloutBatch
    from explorl.config.schema import AlgoConfig


def maxrl(rewards: Tensor, group: Tensor, mask: Tensor, *, eps: float = 1e-6) -> Tensor:
    """MaxRL's advantage (docs/methods.md §5x; Tajwar et al. 2026, "Maximum Likelihood Reinforcement Learning",
    Algorithm 1 and eq. 11), broadcast over the response tokens.

    `A_i = (r_i - mu_g) / (mu_g + eps)` with `mu_g` the mean reward of the group g of response i; 0 where
    `mu_g <= 0` (the paper's "0 if mu = 0": a group with no success gives no gradient; a negative mean, outside the
    paper's 0/1 rewards, has no likelihood reading) and for a group of one response (its own mean is its baseline).
    Over a group the advantages sum to 0.

    Args:
        rewards: `[N]` one scalar reward per response (the paper's are 0/1).
        group: `[N]` int64 prompt ids; arbitrary values, any order, any group sizes.
        mask: `[N, T]` 1 on response tokens, 0 on padding.
        eps: added to the group mean in the denominator (the authors' code: 1e-6).
    Returns:
        `[N, T]` advantages in the floating dtype of `rewards` (float32 otherwise), 0.0 where `mask == 0`.
    """
    check_response_inputs(rewards, group, mask)
    out_dtype = float_dtype(rewards)
    if rewards.numel() == 0:
        return torch.zeros(mask.shape, dtype=out_dtype, device=mask.device)
    r = rewards.detach().to(torch.float64)
    mean, _, count = segment_stats(r, group)
    adv = torch.where((count > 1) & (mean > 0), (r - mean) / (mean + eps), torch.zeros_like(r))
    return on_response_tokens(adv, mask, out_dtype)


@dataclass
class MaxrlOptions:
    """MaxRL's options, `algo.maxrl.<field>` (Tajwar et al. 2026; docs/methods.md §5x)."""

    eps: float = 1e-6
    """Added to the group's mean reward in the denominator (the authors' code; Algorithm 1 has none)."""


def _check_maxrl(cfg) -> str | None:
    eps = cfg.algo.options["maxrl"].eps
    return None if eps >= 0 else f"algo.maxrl.eps: must be >= 0, got {eps}"


@register("estimator", "maxrl", needs_old_logprobs=False, options=MaxrlOptions, check=_check_maxrl, formula=maxrl,
          cites=(Cite("MaxRL", "eq. 11, Algorithm 1", doc="5x"),))
def _maxrl_adapter(batch: RolloutBatch, cfg: AlgoConfig, *, options: MaxrlOptions) -> Tensor:
    """MaxRL (Tajwar et al. 2026): group-centred reward divided by the group's mean reward."""
    return maxrl(batch.rewards, batch.group, batch.mask, eps=options.eps)
