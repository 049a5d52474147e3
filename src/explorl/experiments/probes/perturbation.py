"""Random replacement and truncation at the high- and low-entropy positions of correct responses (ERPO,
Figure 1(b)); `significance.compare_proportions` tests the difference."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from explorl.experiments.probes.continuations import ContinuationSampler, token_id_list


def entropy_extremes(entropy: Sequence[float], frac: float) -> tuple[list[int], list[int]]:
    """Positions of the `m = max(1, round(frac * L))` highest- and lowest-entropy tokens of a response of L
    perturbable tokens (ERPO, Figure 1(b): the top and bottom 5%), m capped at L // 2 so the sets are
    disjoint; ties go to the earlier position. Returns (high, low), each sorted by position; empty when L < 2."""
    if not 0 < frac <= 0.5:
        raise ValueError(f"frac must lie in (0, 0.5], got {frac}")
    ent = [float(x) for x in entropy]
    m = min(max(1, round(frac * len(ent))), len(ent) // 2)
    if m == 0:
        return [], []
    order = sorted(range(len(ent)), key=lambda i: (-ent[i], i))
    low_order = sorted(range(len(ent)), key=lambda i: (ent[i], i))
    return sorted(order[:m]), sorted(low_order[:m])


def perturbed_head(response_ids: Sequence[int], t: int, mode: str, *, vocab_size: int, exclude: Sequence[int] = (),
                   generator: torch.Generator | None = None) -> list[int]:
    """The prefix a perturbation at position t leaves to be continued: `truncate` gives `o_<t`; `replace` gives
    `o_<t + [v]`, v uniform over the ids below `vocab_size` other than `o_t` and `exclude` (drawn with
    `generator`, a CPU generator)."""
    head = [int(x) for x in response_ids[:t]]
    if mode == "truncate":
        return head
    if mode != "replace":
        raise ValueError(f"mode must be 'replace' or 'truncate', got {mode!r}")
    banned = set(int(e) for e in exclude) | {int(response_ids[t])}
    allowed = [v for v in range(vocab_size) if v not in banned]
    if not allowed:
        raise ValueError("perturbed_head: no token is left to replace with")
    return head + [allowed[int(torch.randint(len(allowed), (1,), generator=generator))]]


def perturb_probe(continuations: ContinuationSampler, prompt_ids: Sequence[int], response_ids: Sequence[int],
                  entropy: Sequence[float], *, frac: float = 0.05, modes: Sequence[str] = ("replace", "truncate"),
                  token_generator: torch.Generator | None = None) -> dict:
    """Perturb one response at its highest- and lowest-entropy positions and regenerate (ERPO,
    Figure 1(b)).

    The perturbable positions are the response's tokens less a final EOS; `entropy_extremes` picks them. Each
    (mode, position) prefix (`perturbed_head`, drawn with `token_generator`; replacements never draw the sampler's
    pad or EOS ids) gets `continuations.k` continuations, all in one call of its sampler (`ContinuationSampler`).
    Returns `{mode: {"high": {"positions", "rewards"}, "low": {...}}}`, the rewards of the k continuations of every
    position, position by position.
    """
    sampler = continuations.sampler
    response_ids = [int(x) for x in response_ids]
    eos = token_id_list(sampler.eos_token_id)
    length = len(response_ids) - (1 if response_ids and response_ids[-1] in eos else 0)
    high, low = entropy_extremes(list(entropy)[:length], frac)
    exclude = sorted(set(eos) | {sampler.pad_token_id})
    keys, heads = [], []
    for mode in modes:
        for side, positions in (("high", high), ("low", low)):
            for t in positions:
                keys.append((mode, side))
                heads.append(perturbed_head(response_ids, t, mode, vocab_size=len(continuations.tokenizer),
                                            exclude=exclude, generator=token_generator))
    scored = continuations.scored(prompt_ids, heads)
    out = {m: {"high": {"positions": high, "rewards": []}, "low": {"positions": low, "rewards": []}} for m in modes}
    for (mode, side), (_, rewards) in zip(keys, scored):
        out[mode][side]["rewards"].extend(rewards)
    return out
