"""Where a response's lines begin, in tokens: `RolloutBatch.line_starts`, what `algo.kl_tokens: line_starts` anchors
(docs/methods.md §5ae). A worked answer written line by line chooses at each line start between another line and its
answer; on the out-of-distribution testbed that choice is what RL sharpens and what loses the long chains.

A token begins a line when the token before it ends with a newline, as the tokenizer decodes it alone; a response's
first token begins one when its prompt's last token ends with a newline (or the prompt is empty)."""

from __future__ import annotations

import functools

import torch
from torch import Tensor


@functools.lru_cache(maxsize=4)
def ends_line_table(tokenizer) -> Tensor:
    """`[V]` bool over the tokenizer's ids (`len(tokenizer)`): the token decoded alone ends with a newline (`"\\n"`,
    `".\\n\\n"`, ...). Built once per tokenizer (decoding every id: about a second for a 150k vocabulary)."""
    texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
    return torch.tensor([t.endswith("\n") for t in texts], dtype=torch.bool)


def line_start_mask(prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor, mask: Tensor,
                    ends_line: Tensor) -> Tensor:
    """1.0 on the response tokens that begin a line (module docstring), 0.0 elsewhere and on padding.

    Args:
        prompt_ids: `[N, P]` int64 prompt ids, left-padded (the last column is each prompt's last token).
        prompt_mask: `[N, P]` 1 on real prompt tokens.
        response_ids: `[N, T]` int64 sampled ids.
        mask: `[N, T]` 1 on response tokens.
        ends_line: `[V]` bool, `ends_line_table`; an id outside it ends no line.
    Returns:
        `[N, T]` in `mask`'s dtype.
    """
    if prompt_ids.shape[0] != response_ids.shape[0] or response_ids.shape != mask.shape:
        raise ValueError(f"line_start_mask: expected prompt_ids [N, P], response_ids and mask [N, T] with one N, got "
                         f"{tuple(prompt_ids.shape)}, {tuple(response_ids.shape)}, {tuple(mask.shape)}")
    ends_line = ends_line.to(response_ids.device)
    n = response_ids.shape[0]
    last = prompt_ids[:, -1:] if prompt_ids.shape[1] else torch.full((n, 1), -1, device=response_ids.device)
    before = torch.cat([last, response_ids[:, :-1]], dim=1)  # the token before each response token
    known = (before >= 0) & (before < ends_line.numel())
    starts = ends_line[before.clamp(0, ends_line.numel() - 1)] & known
    if response_ids.shape[1]:  # an empty prompt: the response starts the text
        starts[:, 0] |= (prompt_mask[:, -1] == 0) if prompt_mask.shape[1] else True
    return starts.to(mask.dtype) * mask
