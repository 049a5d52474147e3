"""ReMax: REINFORCE with the reward of the prompt's greedy response as the baseline.

ReMax: Li et al. 2023 (Ziniu Li, Tian Xu, Yushun Zhang, Zhihang Lin, Yang Yu, Ruoyu Sun, Zhi-Quan Luo), "ReMax: A
  Simple, Effective, and Efficient Reinforcement Learning Method for Aligning Large Language Models", arXiv
  2310.10505 (as verl 0.9.1 cites it).

Implements ReMax's advantage (docs/methods.md §5n) as verl 0.9.1's `remax` computes it
(`verl.trainer.ppo.core_algos.compute_remax_outcome_advantage`): each response's reward minus the reward of the
greedy response to its prompt, on every response token; no normalisation. Estimator `remax`, no options. The greedy
response is a sampling change: the registry entry declares `needs_greedy_baseline`, and explorl's loop then samples
each prompt's greedy response (temperature 0) beside its rollouts, scores it with the same reward functions and fills
`RolloutBatch.baseline_rewards` (`explorl.rollout.collect.collect_rollouts`); it is not trained on. An engine that
does not fill the field refuses the estimator by name (verl 0.9.1 samples one only in its legacy v0 trainer, for its
own `remax`; TRL's trainer samples none).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from explorl.algos.core import check_token_inputs, float_dtype, on_response_tokens
from explorl.algos.registry import Cite, register

if TYPE_CHECKING:
    from explorl.algos.batch import RolloutBatch
    from explorl.config.schema import AlgoConfig


def remax(rewards: Tensor, baseline_rewards: Tensor, mask: Tensor) -> Tensor:
    """ReMax's advantage (docs/methods.md §5n; Li et al. 2023, "ReMax", as verl 0.9.1's `remax`), broadcast over the
    response tokens.

    `A_i = r_i - b_i`, `b_i` the reward of the greedy response to response i's prompt. verl computes the return
    `sum_{t' >= t} r_t'` of its token-level rewards; with the outcome reward on the last token (explorl's, and
    verl's reward managers') that is `r_i` on every response token, so the two agree.

    Args:
        rewards: `[N]` one scalar reward per response.
        baseline_rewards: `[N]` the greedy response's reward of each response's prompt.
        mask: `[N, T]` 1 on response tokens, 0 on padding.
    Returns:
        `[N, T]` advantages in the floating dtype of `rewards` (float32 otherwise), 0.0 where `mask == 0`.
    """
    check_token_inputs(mask)
    n = mask.shape[0]
    if rewards.shape != (n,) or baseline_rewards.shape != (n,):
        raise ValueError(f"remax: expected rewards and baseline_rewards [N] with N = {n}, got "
                         f"{tuple(rewards.shape)} and {tuple(baseline_rewards.shape)}")
    out_dtype = float_dtype(rewards)
    adv = rewards.detach().to(torch.float64) - baseline_rewards.detach().to(torch.float64)
    return on_response_tokens(adv, mask, out_dtype)


@register("estimator", "remax", needs_old_logprobs=False, needs_greedy_baseline=True, formula=remax,
          cites=(Cite("ReMax", doc="5n"),))
def _remax_adapter(batch: RolloutBatch, cfg: AlgoConfig) -> Tensor:
    """ReMax (Li et al. 2023): reward minus the reward of the prompt's greedy response."""
    batch.require("baseline_rewards", by="algo.advantage=remax (the engine sampled no greedy baseline response: "
                  "explorl's loop does; TRL's trainer and verl's v1 trainer do not)")
    return remax(batch.rewards, batch.baseline_rewards, batch.mask)
