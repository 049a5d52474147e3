"""An estimator added from outside explorl (the README's "Add a method"): RLOO (Ahmadian et al. 2024, "Back to
Basics: Revisiting REINFORCE Style Optimization for Learning from Human Feedback in LLMs"), each response's reward
minus the mean reward of the other responses to the same prompt. explorl ships RLOO built in (`algo.advantage:
rloo`, src/explorl/algos/methods/rloo.py, docs/methods.md §5n); this file keeps the same maths as a user's plugin,
under its own name `my_rloo` (a name already registered is refused), with an option the built-in lacks. Select it
with `run.plugins: [rloo]` (this directory on PYTHONPATH, or the file next to your config) and `algo.advantage:
my_rloo`; its one option is `algo.my_rloo.normalize`.
"""

# rloo.py, next to your config (or anywhere on PYTHONPATH)
from dataclasses import dataclass

import torch

from explorl.algos import register


@dataclass
class RlooOptions:
    normalize: bool = False
    """Divide each group's advantages by the (unbiased) std of its rewards + 1e-6, as GRPO does."""


@register("estimator", "my_rloo", needs_old_logprobs=False, options=RlooOptions)
def my_rloo(batch, cfg, *, options: RlooOptions):
    """A_i = r_i - mean_{j != i} r_j over the group of response i; 0 for a group of one. Shapes: [N] -> [N, T]."""
    rewards = batch.rewards.double()
    ids = torch.unique(batch.group, return_inverse=True)[1]
    total = torch.zeros(int(ids.max()) + 1, dtype=torch.float64, device=rewards.device)
    total.index_add_(0, ids, rewards)
    count = torch.bincount(ids).double()[ids]
    adv = torch.where(count > 1, rewards - (total[ids] - rewards) / (count - 1).clamp_min(1), 0.0)
    if options.normalize:
        squares = torch.zeros_like(total).index_add_(0, ids, (rewards - total[ids] / count) ** 2)
        adv = adv / ((squares[ids] / (count - 1).clamp_min(1)).sqrt() + 1e-6)
    return adv.to(batch.mask.dtype)[:, None] * batch.mask
