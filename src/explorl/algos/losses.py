"""Policy losses, their aggregation and the per-token weights, by their public names: a thin module re-exporting
the built-in methods and the shared pieces.

The per-token objective and the aggregation over tokens are separate settings (as verl's `loss_agg_mode`): each
policy loss builds its token loss and hands it to `aggregate`, which the step also uses for the KL (`kl_k3`) and
entropy terms, so every term of the objective is normalised the same way. The losses are one file each under
`explorl.algos.methods` (`ppo`: `policy_loss`; `clip_cov`; `kl_cov`), as are the forking-token filter
(`forking_mask`), EAD's truncated importance weights (`tis`) and DAPO's soft overlong punishment
(`dapo_overlong`); the aggregation (`LOSS_AGG_MODES`) and the micro-batch accounting are
`explorl.algos.aggregation`, the k3 KL `explorl.algos.core`. Every loss function takes `(logprobs_new,
logprobs_old, advantages, mask, *, <its hyperparameters>, reduction)`, `reduction` a `Reduction` (the aggregation,
the length limit it may need and the per-token weights); the registered policy losses take the config and their
options instead of the loss's own keywords (`get_policy_loss`), so the step calls any of them the same way
(docs/methods.md §1, §5, §6, §9).
"""

from __future__ import annotations

from typing import Callable

from torch import Tensor

from explorl.algos.aggregation import (LOSS_AGG, LOSS_AGG_MODES, PER_QUESTION, Reduction, aggregate,
                                       aggregation_count, masked_mean, masked_sum, micro_batch_share, question_weights)
from explorl.algos.core import kl_k3
from explorl.algos.methods.clip_cov import ClipCovOptions, clip_cov_loss
from explorl.algos.methods.dapo_overlong import OverlongOptions, overlong_penalty
from explorl.algos.methods.forking import ForkingOptions, forking_mask
from explorl.algos.methods.kl_cov import KlCovOptions, kl_cov_loss
from explorl.algos.methods.ppo import PpoOptions, policy_loss
from explorl.algos.methods.tis import TIS_LEVELS, TisOptions, tis_stats, tis_weights
from explorl.algos.registry import get

__all__ = [
    "LOSS_AGG", "LOSS_AGG_MODES", "masked_sum", "masked_mean", "aggregate", "kl_k3", "policy_loss",
    "tis_weights", "tis_stats", "TIS_LEVELS", "forking_mask", "clip_cov_loss", "kl_cov_loss", "overlong_penalty",
    "get_policy_loss", "aggregation_count", "micro_batch_share", "PpoOptions", "ClipCovOptions", "KlCovOptions",
    "ForkingOptions", "PER_QUESTION", "question_weights", "TisOptions", "OverlongOptions", "Reduction",
]


def get_policy_loss(name: str) -> Callable[..., tuple[Tensor, dict[str, float]]]:
    """The policy loss registered as `name`, called as `fn(logprobs_new, logprobs_old, advantages, mask, cfg, *,
    max_response_len, is_weights, token_weights[, generator][, options]) -> (loss, stats)` (`cfg` an `AlgoConfig`;
    `lookup("policy_loss", name).bind(cfg)` supplies the options); KeyError listing the valid names otherwise."""
    return get("policy_loss", name)
