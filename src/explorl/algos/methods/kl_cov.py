"""KL-Cov: the unclipped policy-gradient loss with a KL penalty on the highest-covariance tokens.

Clip-Cov/KL-Cov: Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models"
  (no arXiv id recorded).

Implements the KL-Cov objective of section 4.2 (docs/methods.md §5b). Policy loss `kl_cov`, options
`algo.kl_cov.<field>` (`KlCovOptions`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from explorl.algos.aggregation import Reduction, masked_mean
from explorl.algos.batch import RolloutBatch
from explorl.algos.core import (as_constant, centered_cov, check_loss_inputs, importance_ratio, ratio_stats,
                                top_k_mask, valid_fraction)
from explorl.algos.registry import Cite, register


@dataclass
class KlCovOptions:
    """KL-Cov's options, `algo.kl_cov.<field>` (Cui et al. 2025; docs/methods.md §5b)."""

    k_percent: float = 0.2
    """Percentage (not fraction) of tokens with the largest covariance that get the KL penalty."""
    coef: float = 1.0
    """Coefficient of |logp - logp_old| on the selected tokens."""


def kl_cov_loss(
    logprobs_new: Tensor,
    logprobs_old: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    k_percent: float = 0.2,
    kl_coef: float = 1.0,
    reduction: Reduction = Reduction("token-mean"),
) -> tuple[Tensor, dict[str, float]]:
    """KL-Cov: the unclipped policy-gradient loss with a KL penalty on the highest-covariance tokens.

    Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models", section 4.2
    (the KL-Cov objective); docs/methods.md §5b. Per call:

    1. `cov = (A - mean A) * (logp_new - mean logp_new)` over the valid tokens (`centered_cov`).
    2. The top `k = max(1, int(n_valid * k_percent / 100))` valid tokens by `cov` (signed, largest first; ties to
       the first in row-major order) get the token loss `-A * rho + kl_coef * |logp_new - logp_old|`.
    3. All other valid tokens get `-A * rho` (no PPO clip).
    4. The reduction's `is_weights` / `token_weights` multiply the whole token loss (penalty included); its `agg`
       aggregates with the normaliser of `mask`.

    `k_percent` is a percentage: the default 0.2 selects 0.2% of the tokens (the paper's k = 2e-3).
    `|logp_new - logp_old|` uses the log-ratio after the module's +-20 clamp, so its gradient vanishes beyond it.

    Args:
        logprobs_new, logprobs_old, advantages, mask: `[N, T]`, as in `policy_loss`.
        k_percent: percentage of the valid tokens penalised, in (0, 100].
        kl_coef: coefficient of the `|log ratio|` penalty (paper: 1), >= 0.
        reduction: the aggregation, the length limit it may need and the weights, as in `policy_loss`.
    Returns:
        `(loss, stats)`: `loss/pg`, `loss/ratio_mean`, `loss/ratio_min`, `loss/ratio_max`, `loss/ppo_kl`,
        `loss/kl_cov_frac` (fraction of valid tokens penalised), `loss/kl_cov_abs_kl` (mean `|log ratio|` over them),
        `loss/kl_cov_penalty_share` (the aggregated penalty over |policy-gradient part| + penalty: how much the
        penalty acts; 0 at ratio 1, i.e. with one update per batch), and the weight statistics of `policy_loss`
        when weights are given.
    """
    check_loss_inputs("kl_cov_loss", logprobs_new, logprobs_old, advantages, mask, reduction)
    if not 0.0 < k_percent <= 100.0:
        raise ValueError(f"kl_cov_loss: k_percent is a percentage in (0, 100], got {k_percent!r}")
    if kl_coef < 0:
        raise ValueError(f"kl_cov_loss: kl_coef must be >= 0, got {kl_coef!r}")
    valid = mask.bool()
    log_ratio, ratio = importance_ratio(logprobs_new, logprobs_old, valid)
    adv = as_constant(advantages, valid, ratio.dtype)
    with torch.no_grad():
        n_valid = int(valid.sum())
        k = max(1, int(n_valid * k_percent / 100.0)) if n_valid else 0
        selected = top_k_mask(centered_cov(advantages, logprobs_new, valid), valid, k)
    pg = -adv * ratio
    loss = reduction(torch.where(selected, pg + kl_coef * log_ratio.abs(), pg), valid)

    with torch.no_grad():
        stats = ratio_stats(loss, ratio, log_ratio, valid, n_valid)
        stats["loss/kl_cov_frac"] = valid_fraction(selected, valid, n_valid)
        stats["loss/kl_cov_abs_kl"] = float(masked_mean(log_ratio.abs(), selected))
        # how much of the objective the penalty is: its aggregate over |pg| + it (0 with one update: |log 1| = 0)
        penalty = reduction(torch.where(selected, kl_coef * log_ratio.abs(), 0.0), valid)
        pg_part = reduction(pg, valid)
        stats["loss/kl_cov_penalty_share"] = float(penalty / (pg_part.abs() + penalty).clamp_min(1e-12))
        reduction.record(stats, valid, n_valid, ratio.dtype)
    return loss, stats


@register("policy_loss", "kl_cov", needs_old_logprobs=False, options=KlCovOptions, reads=("loss_agg",),
          formula=kl_cov_loss, cites=(Cite("Clip-Cov/KL-Cov", "section 4.2", doc="5b"),))
def _kl_cov_adapter(logprobs_new: Tensor, batch: RolloutBatch, cfg, *,
                    options: KlCovOptions) -> tuple[Tensor, dict[str, float]]:
    """KL-Cov (`kl_cov_loss`) with the options `algo.kl_cov.*` and the aggregation `algo.loss_agg`."""
    return kl_cov_loss(logprobs_new, batch.logprobs, batch.advantages, batch.loss_mask, k_percent=options.k_percent,
                       kl_coef=options.coef, reduction=Reduction.of(batch, cfg.loss_agg))
