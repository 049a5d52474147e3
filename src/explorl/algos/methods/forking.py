"""Token filters: `none` (every valid token trains) and the forking-token filter.

forking tokens: Wang et al. 2025, "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive Effective Reinforcement
  Learning for LLM Reasoning" (no arXiv id recorded).

Implements the 80/20 objective's indicator `H >= tau_rho` (the batch's entropy quantile) as a 0/1 token weight
(docs/methods.md §5d); the unselected tokens still count in the aggregation's normaliser. Token filters `none`
(explorl's default, docs/methods.md §1b) and `forking`, options `algo.forking.<field>` (`ForkingOptions`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from explorl.algos.core import top_k_mask
from explorl.algos.registry import Cite, register


def forking_mask(entropy: Tensor, mask: Tensor, *, top_frac: float = 0.2) -> Tensor:
    """0/1 selection of the highest-entropy ("forking") valid tokens of the batch, for `token_weights`.

    Wang et al. 2025, "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive Effective Reinforcement Learning
    for LLM Reasoning" (the DAPO objective restricted by the indicator `H >= tau_rho`, the batch's entropy
    quantile); docs/methods.md §5d. Exactly `k = max(1, int(n_valid * top_frac))` tokens are selected (the count
    convention of Clip-Cov), the highest entropies first, ties to the token first in row-major order. This differs
    from the paper's quantile threshold only in how ties and rounding at the threshold are resolved.

    Pass the result as `token_weights`: the unselected tokens contribute 0 but still count in the `token-mean`
    normaliser, as the paper's objective keeps `1 / sum_i |o_i|`.

    Args:
        entropy: `[N, T]` token entropies of the old policy (any value on padding; nan counts as lowest).
        mask: `[N, T]` 1 on response tokens.
        top_frac: fraction of the valid tokens kept, in (0, 1] (paper: 0.2).
    Returns:
        `[N, T]` float tensor (entropy's dtype when floating, else float32), 1.0 on the selected tokens, 0.0 elsewhere
        (always 0 where `mask == 0`; all zeros when no token is valid). No gradient.
    """
    if entropy.shape != mask.shape or mask.dim() != 2:
        raise ValueError(f"forking_mask: expected entropy and mask of one [N, T] shape; got "
                         f"{tuple(entropy.shape)} and {tuple(mask.shape)}")
    if not 0.0 < top_frac <= 1.0:
        raise ValueError(f"forking_mask: top_frac must be in (0, 1], got {top_frac!r}")
    valid = mask.bool()
    n_valid = int(valid.sum())
    k = max(1, int(n_valid * top_frac)) if n_valid else 0
    dtype = entropy.dtype if entropy.is_floating_point() else torch.float32
    return top_k_mask(entropy, valid, k).to(dtype)


@register("token_filter", "none", needs_old_logprobs=False, cites=(Cite("explorl", doc="1b"),))
def _no_token_filter(batch, loss_mask: Tensor, cfg) -> None:
    """Every valid token trains."""
    return None


@dataclass
class ForkingOptions:
    """The forking-token filter's options, `algo.forking.<field>` (Wang et al. 80/20; docs/methods.md §5)."""

    top_frac: float = 0.2
    """Fraction of the batch's valid tokens kept: those of highest entropy."""


def _check_forking(cfg) -> str | None:
    f = cfg.algo.options["forking"].top_frac
    return None if 0 < f <= 1 else f"algo.forking.top_frac: must be in (0, 1], got {f}"


@register("token_filter", "forking", needs_old_logprobs=False, options=ForkingOptions, check=_check_forking,
          formula=forking_mask,
          cites=(Cite("forking tokens", doc="5d"),))
def _forking_filter(batch, loss_mask: Tensor, cfg, *, options: ForkingOptions) -> Tensor:
    """Only the top `top_frac` highest-entropy tokens of the batch train (Wang et al., 80/20)."""
    batch.require("entropy", by="token_filter 'forking'")
    return forking_mask(batch.entropy, loss_mask, top_frac=options.top_frac)
