"""Continuations of response prefixes, the sampling step of the branching and perturbation probes: k continuations
of each head after the prompt in one call of the command's sampler (`continue_prefixes`, `Sampler.sample_fixed`),
and their texts scored by the task (`score_heads`, a `Score`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from explorl.rollout.sampler import Sampler


Score = Callable[[list[str]], list[float]]
"""`fn(texts) -> scores` of one problem's responses (its answer and meta bound), a response correct when its score
is > 0.5; `explorl probe` passes the task's judgment as 1.0 / 0.0."""


def token_id_list(x) -> list[int]:
    """An id or a sequence of ids (a tokenizer's `eos_token_id` may be either) as a list of ints."""
    return [int(x)] if isinstance(x, int) else [int(e) for e in x]


def continue_prefixes(sampler: Sampler, prompt_ids: Sequence[int], heads: Sequence[Sequence[int]], k: int, *,
                      temperature: float = 1.0, generator: torch.Generator | None = None) -> list[list[list[int]]]:
    """k continuations of each head (response tokens so far) after the prompt, in one `sampler.sample_fixed` call
    (its EOS ids, length limit and top-p).

    A head that ends with EOS is complete: its k continuations are empty and it is not sampled. With a single
    empty head this is exactly `sampler.sample_fixed([prompt_ids], k, ...)` (same generator state, same draws).
    Returns `[len(heads)][k]` token-id lists (EOS included when produced, no padding).
    """
    eos = token_id_list(sampler.eos_token_id)
    out: list[list[list[int]]] = [[[] for _ in range(k)] if h and h[-1] in eos else [] for h in heads]
    open_heads = [i for i, h in enumerate(heads) if not (h and h[-1] in eos)]
    if open_heads and k > 0:
        ro = sampler.sample_fixed([list(prompt_ids) + list(heads[i]) for i in open_heads], k, temperature, generator)
        for row, (g, length) in enumerate(zip(ro.group.tolist(), ro.lengths.tolist())):
            out[open_heads[g]].append(ro.response_ids[row, :length].tolist())
    return out


def score_heads(tokenizer, heads, conts, score: Score) -> list[tuple[list[str], list[float]]]:
    """Texts and rewards of every head's continuations, scored in one call of `score`."""
    texts = [[tokenizer.decode(list(h) + c, skip_special_tokens=True) for c in cs] for h, cs in zip(heads, conts)]
    flat = [t for ts in texts for t in ts]
    rewards = [float(r) for r in score(flat)] if flat else []
    out, i = [], 0
    for ts in texts:
        out.append((ts, rewards[i:i + len(ts)]))
        i += len(ts)
    return out


@dataclass
class ContinuationSampler:
    """How a probe continues response prefixes and scores the results: `k` continuations of each prefix drawn by
    `sampler` (its EOS ids, length limit and top-p) at `temperature` with `generator`, their texts decoded by
    `tokenizer` and scored by `score`, one problem's (`scored`)."""

    sampler: Sampler
    """The command's sampler, whose model continues the prefixes."""
    tokenizer: Any
    """Decodes each prefix with its continuation for scoring."""
    k: int
    """Continuations per prefix."""
    score: Score
    """The scores of a list of this problem's response texts."""
    temperature: float = 1.0
    """The sampling temperature of the continuations."""
    generator: torch.Generator | None = None
    """The generator the continuations are drawn with (on the model's device)."""

    def scored(self, prompt_ids: Sequence[int], heads: Sequence[Sequence[int]]) -> list[tuple[list[str], list[float]]]:
        """Texts and rewards of the k continuations of each head after the prompt (`continue_prefixes`, then
        `score_heads`)."""
        conts = continue_prefixes(self.sampler, prompt_ids, heads, self.k, temperature=self.temperature,
                                  generator=self.generator)
        return score_heads(self.tokenizer, heads, conts, self.score)
