"""STILL's position-based advantage shaping.

STILL: Jia Deng, Jie Chen, Zhipeng Chen, Daixuan Cheng, Fei Bai, Beichen Zhang, Yinqian Min, Yanzipeng Gao, Wayne
  Xin Zhao, Ji-Rong Wen, "From Trial-and-Error to Improvement: A Systematic Analysis of LLM Exploration Mechanisms
  in RLVR" (no arXiv id recorded).

Implements section 4.4.2, eqs. 8 and 12: a sigmoid bonus in the token's relative position pushing each advantage
further in its own direction (docs/methods.md §7b), applied inside a step window. Shaper `position`, options
`algo.position.<field>` (`PositionOptions`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from explorl.algos.core import check_token_inputs, float_dtype, token_positions
from explorl.algos.registry import Cite, register

if TYPE_CHECKING:
    from explorl.algos.batch import RolloutBatch
    from explorl.config.schema import AlgoConfig


def position_shaped(
    advantages: Tensor,
    mask: Tensor,
    *,
    gamma: float = 0.1,
    m: float = 15.0,
    d: float = 1.0,
    n: float = 0.5,
    cap_frac: float | None = None,
) -> Tensor:
    """Position-based advantage shaping (docs/methods.md §7b; STILL, section 4.4.2, eqs. 8 and 12).

    For token t (1-based, counted over valid tokens) of response i: `l = (t - 1) / |o_i|`,
    `b = gamma * sigmoid(d * m * (l - n))`, `A~ = A + sign(A) * b`. The bonus pushes each advantage further
    in its own direction (sign(0) = 0, so a zero advantage stays zero); with d = +1 it grows with position.
    `cap_frac` (optional, as the public code with 0.5) caps the bonus: `b <= cap_frac * |A|`.

    Reading: the paper prints the shift n = -0.5 (`r = m * (l - n)`), under which the sigmoid is saturated for
    every l in [0, 1]; explorl's default (docs/methods.md §7b) and the public code centre it at n = 0.5; `n=-0.5`
    gives the printed formula. The step window of the
    recipe (from step 200 for 100 steps) is applied by the registry adapter, not here.

    Args:
        advantages: `[N, T]` token advantages.
        mask: `[N, T]` 1 on response tokens, 0 on padding.
        gamma: bonus scale (paper: 0.1). m: sigmoid steepness (15). d: direction (+1 later tokens, -1 earlier).
        n: centre of the sigmoid in relative position (0.5; the paper prints -0.5).
        cap_frac: optional cap of the bonus as a fraction of |A|.
    Returns:
        `[N, T]` in the floating dtype of `advantages` (float32 otherwise), 0.0 where `mask == 0`.
    """
    check_token_inputs(mask, advantages=advantages)
    out_dtype = float_dtype(advantages)
    f64 = torch.float64
    zero = torch.zeros((), dtype=f64, device=mask.device)
    valid = mask.bool()
    pos, length = token_positions(valid)
    rel = (pos - 1).to(f64) / length.clamp_min(1).to(f64)
    bonus = gamma * torch.sigmoid(d * m * (rel - n))
    a = advantages.detach().to(f64)
    if cap_frac is not None:
        bonus = torch.minimum(bonus, cap_frac * a.abs())
    out = torch.where(valid, a + torch.sign(a) * bonus, zero)
    return out.to(out_dtype)


@dataclass
class PositionOptions:
    """Position shaping's options, `algo.position.<field>` (STILL section 4.4.2; docs/methods.md §7)."""

    gamma: float = 0.1
    """Bonus scale gamma."""
    m: float = 15.0
    """Sigmoid steepness m."""
    d: float = 1.0
    """Direction d (+1 favours later tokens)."""
    n: float = 0.5
    """Centre shift n of the sigmoid, r = m * (l - n) (docs/methods.md §7b). 0.5 (explorl and the public code)
    centres it mid-response; -0.5 is the value STILL prints (section 4.4.2), which saturates the sigmoid so
    that every token gets about the full bonus gamma."""
    start: int = 0
    """First training step (1-based) of its window."""
    steps: int = 0
    """Length of its window in steps (0 = every step)."""
    cap_frac: float | None = None
    """Optional cap of the bonus as a fraction of |A| (the public code uses 0.5)."""


def _check_position(cfg) -> str | None:
    o = cfg.algo.options["position"]
    if o.cap_frac is not None and o.cap_frac < 0:
        return f"algo.position.cap_frac: must be >= 0, got {o.cap_frac}"
    if not math.isfinite(o.n):
        return (f"algo.position.n: must be a finite number (0.5 centres the bonus mid-response; the paper prints "
                f"-0.5), got {o.n}")
    return None if o.steps >= 0 else f"algo.position.steps: must be >= 0 (0 = every step), got {o.steps}"


@register("shaper", "position", needs_old_logprobs=False, options=PositionOptions, check=_check_position,
          needs_step=lambda o: o.steps > 0, formula=position_shaped,
          cites=(Cite("STILL", "section 4.4.2, eq. 8, eq. 12", doc="7b"),))
def _position_shaper(advantages: Tensor, batch: RolloutBatch, cfg: AlgoConfig, step: int, *,
                     options: PositionOptions) -> Tensor:
    """Position shaping (STILL, section 4.4.2) inside its step window: `start <= step < start + steps`, or
    every step when `steps == 0`; the identity outside it."""
    start, steps = options.start, options.steps
    if steps > 0 and not (start <= step < start + steps):
        return advantages
    return position_shaped(advantages, batch.mask, gamma=options.gamma, m=options.m, d=options.d, n=options.n,
                           cap_frac=options.cap_frac)
