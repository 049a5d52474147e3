"""The entropy-based advantage: a clipped entropy term added to the advantage.

entropy advantage: Cheng et al. 2025, "Reasoning with Exploration: An Entropy Perspective" (no arXiv id recorded).

Implements `A' = A + min(alpha * H, |A| / kappa)` (docs/methods.md §5e). Shaper `entropy_adv`, options
`algo.entropy_adv.<field>` (`EntropyAdvOptions`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from explorl.algos.core import check_token_inputs, float_dtype
from explorl.algos.registry import Cite, register

if TYPE_CHECKING:
    from explorl.algos.batch import RolloutBatch
    from explorl.config.schema import AlgoConfig


def entropy_shaped(
    advantages: Tensor, entropy: Tensor, mask: Tensor, *, alpha: float = 0.4, kappa: float = 2.0
) -> Tensor:
    """Entropy-based advantage (docs/methods.md §5e; Cheng et al. 2025, "Reasoning with Exploration: An Entropy
    Perspective", the clipped entropy term psi(H) added to the advantage).

    `A' = A + min(alpha * H.detach(), |A| / kappa)`. Taken literally, as the paper writes it (docs/methods.md §5e): the
    term is added whatever the sign of A, so for a negative advantage it *reduces the penalty* of high-entropy
    tokens (it never flips the sign, since it is at most |A| / kappa with kappa > 1). A zero advantage stays
    zero for H >= 0.

    Args:
        advantages: `[N, T]` token advantages.
        entropy: `[N, T]` token entropy of the old policy.
        mask: `[N, T]` 1 on response tokens, 0 on padding.
        alpha: entropy coefficient (0.4). kappa: the term is at most |A| / kappa (2).
    Returns:
        `[N, T]` in the floating dtype of `advantages` (float32 otherwise), 0.0 where `mask == 0`.
    """
    check_token_inputs(mask, advantages=advantages, entropy=entropy)
    out_dtype = float_dtype(advantages)
    f64 = torch.float64
    a = advantages.detach().to(f64)
    h = entropy.detach().to(f64)
    out = a + torch.minimum(alpha * h, a.abs() / kappa)
    out = torch.where(mask.bool(), out, torch.zeros((), dtype=f64, device=mask.device))
    return out.to(out_dtype)


@dataclass
class EntropyAdvOptions:
    """Entropy-based advantage's options, `algo.entropy_adv.<field>` (Cheng et al.; docs/methods.md §5)."""

    alpha: float = 0.4
    """alpha in A + min(alpha * H, |A| / kappa)."""
    kappa: float = 2.0
    """kappa."""


@register("shaper", "entropy_adv", needs_old_logprobs=False, options=EntropyAdvOptions, formula=entropy_shaped,
          cites=(Cite("entropy advantage", doc="5e"),))
def _entropy_adv_shaper(advantages: Tensor, batch: RolloutBatch, cfg: AlgoConfig, step: int, *,
                        options: EntropyAdvOptions) -> Tensor:
    """Entropy-based advantage (Cheng et al.): A + min(alpha * H, |A| / kappa)."""
    batch.require("entropy", by="shaper 'entropy_adv'")
    return entropy_shaped(advantages, batch.entropy, batch.mask, alpha=options.alpha, kappa=options.kappa)
