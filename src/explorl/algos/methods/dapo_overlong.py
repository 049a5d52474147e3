"""DAPO's overlong reward shaping: the soft overlong punishment (a length-aware reward term) and overlong filtering.

DAPO: Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale" (no arXiv id recorded).

Implements section 3.4, eq. 13 (docs/methods.md §5c). Reward shapers (`algo.reward_shapers`): `dapo_overlong`, the
soft punishment added to the reward, options `algo.dapo_overlong.<field>` (`OverlongOptions`); and
`dapo_overlong_filter`, which removes truncated responses from the loss. Both read the length limit the responses
were sampled under and their truncation flags.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from explorl.algos.registry import Cite, register

if TYPE_CHECKING:
    from explorl.algos.batch import RolloutBatch


def overlong_penalty(
    lengths: Tensor,
    truncated: Tensor | None,
    max_len: int,
    *,
    buffer: int,
    penalty: float = 1.0,
) -> Tensor:
    """Length-aware reward term for overlong responses, to add to the reward (DAPO soft overlong punishment).

    Yu et al. 2025 (DAPO), section 3.4, eq. 13, with `L_max = max_len`, `L_cache = buffer`, scaled by `penalty`:
    `0` if `L <= max_len - buffer`; `((max_len - buffer) - L) / buffer * penalty` if `max_len - buffer < L <= max_len`
    (falling linearly to `-penalty` at `L = max_len`); `-penalty` if `L > max_len`. A response flagged `truncated`
    (cut at the length limit without EOS) counts as exceeding: `-penalty`. As in DAPO, `max_len` is the generation
    limit and the soft zone is its last `buffer` tokens.

    Args:
        lengths: `[N]` response lengths in tokens.
        truncated: `[N]` bool, True where the response hit the limit without ending; None for no flags.
        max_len: `L_max`, >= 1.
        buffer: `L_cache`, `0 <= buffer <= max_len` (0 gives a hard step at `max_len`).
        penalty: the magnitude of the full penalty (DAPO: 1).
    Returns:
        `[N]` float tensor of values in `[-penalty, 0]` (lengths' dtype when floating, else float32).
    """
    if max_len < 1 or not 0 <= buffer <= max_len:
        raise ValueError(f"overlong_penalty: need max_len >= 1 and 0 <= buffer <= max_len; "
                         f"got max_len={max_len!r}, buffer={buffer!r}")
    lengths = torch.as_tensor(lengths)
    dtype = lengths.dtype if lengths.is_floating_point() else torch.float32
    length = lengths.to(dtype)
    start = float(max_len - buffer)
    zero = torch.zeros((), dtype=dtype, device=length.device)
    inside = (start - length) / buffer * penalty if buffer > 0 else torch.zeros_like(length)
    out = torch.where(length <= start, zero, inside)
    over = length > max_len
    if truncated is not None:
        truncated = torch.as_tensor(truncated, device=length.device)
        if truncated.shape != length.shape:
            raise ValueError(f"overlong_penalty: lengths {tuple(length.shape)} and truncated "
                             f"{tuple(truncated.shape)} differ in shape")
        over = over | truncated.bool()
    return torch.where(over, torch.full((), -float(penalty), dtype=dtype, device=length.device), out)


@dataclass
class OverlongOptions:
    """DAPO's soft overlong punishment's options, `algo.dapo_overlong.<field>` (DAPO eq. 13; docs/methods.md §5c)."""

    buffer: int | None = None
    """L_cache: tokens before the length limit where the penalty ramps from 0 to -penalty, in (0,
    sampling.max_new_tokens). null: a fifth of the limit (DAPO's 4,096 of 20,480), so the penalty keeps the paper's
    shape at any length."""
    penalty: float = 1.0
    """Size of the full penalty (DAPO: 1), >= 0."""


def _check_overlong(cfg) -> str | None:
    o, limit = cfg.algo.options["dapo_overlong"], cfg.sampling.max_new_tokens
    if not o.penalty >= 0:
        return f"algo.dapo_overlong.penalty: must be >= 0, got {o.penalty}"
    if o.buffer is not None and not 0 < o.buffer < limit:
        return f"algo.dapo_overlong.buffer: must be in (0, sampling.max_new_tokens={limit}), got {o.buffer}"
    return None


@register("reward_shaper", "dapo_overlong", needs_old_logprobs=False, needs_length_limit=True,
          options=OverlongOptions, check=_check_overlong, formula=overlong_penalty,
          cites=(Cite("DAPO", "section 3.4, eq. 13", doc="5c"),))
def soft_overlong_punishment(batch: RolloutBatch, cfg, *, options: OverlongOptions) -> tuple[Tensor, Tensor]:
    """DAPO eq. 13: the soft penalty of responses that run into the length limit, added to their rewards."""
    if batch.max_response_len is None:
        raise ValueError("reward shaper dapo_overlong (algo.reward_shapers) needs RolloutBatch.max_response_len, "
                         "the length limit the responses were sampled under")
    limit = batch.max_response_len
    buffer = options.buffer if options.buffer is not None else max(1, limit // 5)
    penalty = overlong_penalty(batch.lengths, batch.truncated, limit, buffer=buffer, penalty=options.penalty)
    return batch.rewards + penalty, batch.mask


@register("reward_shaper", "dapo_overlong_filter", needs_old_logprobs=False, needs_length_limit=True,
          cites=(Cite("DAPO", "section 3.4", doc="5c"),))
def overlong_filter(batch: RolloutBatch, cfg) -> tuple[Tensor, Tensor]:
    """DAPO's overlong filtering: responses truncated at the length limit are removed from the loss."""
    return batch.rewards, batch.mask * (~batch.truncated).to(batch.mask.dtype)[:, None]
