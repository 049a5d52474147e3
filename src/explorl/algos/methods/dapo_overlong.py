"""DAPO's soft overlong punishment: a length-aware reward term.

DAPO: Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale" (no arXiv id recorded).

Implements section 3.4, eq. 13 (docs/methods.md §5c). Not a registry entry yet: its settings are the core fields
`algo.overlong`, `algo.overlong_buffer` and `algo.overlong_penalty`, read by `explorl.algos.step`.
"""

from __future__ import annotations

import torch
from torch import Tensor


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
