"""Pass@k training: the analytic group advantage of the pass@k objective.

pass@k training: Chen et al. 2025, "Pass@k Training for Adaptively Balancing Exploration and Exploitation of Large
  Reasoning Models" (no arXiv id recorded).

Implements the analytic advantage for binary rewards (docs/methods.md §5f), with explorl's reading for groups
smaller than k. Estimator `passk`, options `algo.passk.<field>` (`PasskOptions`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from explorl.algos.core import check_response_inputs, dense_ids, float_dtype, on_response_tokens
from explorl.algos.registry import Cite, register

if TYPE_CHECKING:
    from explorl.algos.batch import RolloutBatch
    from explorl.config.schema import AlgoConfig


def _log_comb(a: Tensor, b: Tensor) -> Tensor:
    """log C(a, b) for float64 tensors with 0 <= b <= a (caller masks the other entries)."""
    return torch.lgamma(a + 1) - torch.lgamma(b + 1) - torch.lgamma(a - b + 1)


def passk(rewards: Tensor, group: Tensor, mask: Tensor, *, k: int) -> Tensor:
    """Pass@k training advantage (docs/methods.md §5f; Chen et al. 2025, "Pass@k Training for Adaptively
    Balancing Exploration and Exploitation of Large Reasoning Models", the analytic group advantage).

    Binary rewards (`reward > 0.5` counts as correct); per group, n responses of which c are correct:
      `rho = 1 - C(n-c, k) / C(n, k)` (the unbiased pass@k of the group), `s = sqrt(rho * (1 - rho))`;
      correct response: `(1 - rho) / (s + 1e-6)`;
      wrong response: `(1 - rho - C(n-c-1, k-1) / C(n-1, k-1)) / (s + 1e-6)`.
    All-correct and all-wrong groups get 0. Over a group the advantages sum to 0 (up to the 1e-6).

    Groups smaller than k (explorl's reading, docs/methods.md §5f): `k_eff = min(k, n)`. With k_eff = n every k-subset
    is the whole group, so `rho = 1` whenever c >= 1 and both numerators vanish: groups with `n <= k` get
    advantage 0 (they carry no pass@k signal), consistent with `metrics.pass_at_k` being 1 when n - c < k.

    Args:
        rewards: `[N]` rewards; > 0.5 is correct.
        group: `[N]` int64 prompt ids; arbitrary values, any order, any group sizes.
        mask: `[N, T]` 1 on response tokens, 0 on padding.
        k: the k of the pass@k objective (>= 1).
    Returns:
        `[N, T]` advantages broadcast over tokens, in the floating dtype of `rewards` (float32 otherwise),
        0.0 where `mask == 0`.
    """
    check_response_inputs(rewards, group, mask)
    if int(k) < 1:
        raise ValueError(f"passk: k must be >= 1, got {k}")
    out_dtype = float_dtype(rewards)
    f64 = torch.float64
    if rewards.numel() == 0:
        return torch.zeros(mask.shape, dtype=out_dtype, device=mask.device)
    correct = rewards.detach() > 0.5
    dense, n_groups = dense_ids(group)
    n_g = torch.zeros(n_groups, dtype=f64, device=rewards.device).index_add_(
        0, dense, torch.ones(dense.shape, dtype=f64, device=rewards.device))
    c_g = torch.zeros_like(n_g).index_add_(0, dense, correct.to(f64))
    n, c = n_g[dense], c_g[dense]
    ke = torch.minimum(torch.full_like(n, float(k)), n)
    wrong_n = n - c
    # C(n-c, k) / C(n, k), zero when n - c < k
    fail = torch.where(wrong_n >= ke, torch.exp(_log_comb(wrong_n.clamp_min(ke), ke) - _log_comb(n, ke)),
                       torch.zeros_like(n))
    rho = 1.0 - fail
    s = torch.sqrt((rho * (1.0 - rho)).clamp_min(0.0))
    # C(n-c-1, k-1) / C(n-1, k-1), zero when n - c - 1 < k - 1
    a1, b1 = wrong_n - 1, ke - 1  # b1 >= 0 since ke >= 1
    tail = torch.where(a1 >= b1, torch.exp(_log_comb(a1.clamp_min(b1), b1) - _log_comb(n - 1, b1)),
                       torch.zeros_like(n))
    adv = torch.where(correct, (1.0 - rho) / (s + 1e-6), (1.0 - rho - tail) / (s + 1e-6))
    degenerate = (c == 0) | (c == n)
    adv = torch.where(degenerate, torch.zeros_like(adv), adv).to(out_dtype)
    return on_response_tokens(adv, mask, out_dtype)


@dataclass
class PasskOptions:
    """Pass@k training's options, `algo.passk.<field>` (Chen et al.; docs/methods.md §5)."""

    k: int = 4
    """The k of the pass@k objective (binary rewards); at most sampling.group_size."""


def _check_passk(cfg) -> str | None:
    k, g = cfg.algo.options["passk"].k, cfg.sampling.group_size
    return None if 1 <= k <= g else f"algo.passk.k: must be in [1, sampling.group_size={g}], got {k}"


@register("estimator", "passk", needs_old_logprobs=False, options=PasskOptions, check=_check_passk, formula=passk,
          cites=(Cite("pass@k training", doc="5f"),))
def _passk_adapter(batch: RolloutBatch, cfg: AlgoConfig, *, options: PasskOptions) -> Tensor:
    """Pass@k training (Chen et al.): analytic group advantage of the pass@k objective, binary rewards."""
    return passk(batch.rewards, batch.group, batch.mask, k=options.k)
