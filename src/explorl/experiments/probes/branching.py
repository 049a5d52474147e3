"""The forking experiment (EAD, Figure 2): continuations sampled from prefixes cut at several positions of a
response, success by cut position."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from explorl.experiments.probes.continuations import ContinuationSampler
from explorl.metrics import maj_at_k, vote_keys


def branch_probe(continuations: ContinuationSampler, prompt_ids: Sequence[int], response_ids: Sequence[int],
                 cuts: Sequence[int], *, extract_answer: Callable[[str], str | None] | None = None,
                 entropy: Sequence[float] | None = None) -> list[dict]:
    """The forking experiment on one response (EAD, Figure 2, after Yang & Holtzman 2025): for each cut
    t, keep `o_<t` and sample `continuations.k` continuations with its sampler at its temperature; score every
    completed response with its `score`.

    Cuts at or beyond the response's length are skipped (no token is left to branch at). All prefixes go to the
    sampler together (`continue_prefixes`); a single cut at 0 is plain sampling from the prompt.

    Args:
        continuations: how each prefix is continued and scored (`ContinuationSampler`: k continuations per cut).
        prompt_ids: the prompt's token ids; response_ids: the base response (unpadded; EOS last if it ended).
        cuts: 0-based response positions.
        extract_answer: final answer of a text, for the majority vote (maj@k over all k); None skips it.
        entropy: the base response's token entropies `[L]`, to record the entropy at each cut.
    Returns:
        One dict per kept cut, in order: `cut`, `entropy` (or None), `texts`, `rewards`, `accuracy` (fraction of
        rewards > 0.5), `maj` (maj@k of the k continuations, or None).
    """
    if continuations.k < 1:
        raise ValueError(f"k must be >= 1, got {continuations.k}")
    response_ids = [int(x) for x in response_ids]
    kept = [int(t) for t in cuts if 0 <= int(t) < max(len(response_ids), 1)]
    heads = [response_ids[:t] for t in kept]
    out = []
    for t, (texts, rewards) in zip(kept, continuations.scored(prompt_ids, heads)):
        correct = [r > 0.5 for r in rewards]
        maj = None
        if extract_answer is not None:
            answers = [extract_answer(x) for x in texts]
            maj = maj_at_k(vote_keys(answers, correct), correct, len(texts))
        out.append({"cut": t, "entropy": float(entropy[t]) if entropy is not None and t < len(entropy) else None,
                    "texts": texts, "rewards": rewards, "accuracy": sum(correct) / len(correct), "maj": maj})
    return out


def branch_summary(per_problem: Sequence[Sequence[dict]], cuts: Sequence[int]) -> list[dict]:
    """`branch_probe` results of many problems, averaged per cut: `cut`, `problems` (those whose response reached
    the cut), `accuracy`, `maj` (None without answers) and `entropy` (mean entropy at the cut), the means over
    those problems (NaN when none)."""
    out = []
    for t in cuts:
        rows = [r for results in per_problem for r in results if r["cut"] == t]

        def mean(key: str):
            vals = [r[key] for r in rows if r[key] is not None]
            return sum(vals) / len(vals) if vals else (float("nan") if rows or key == "accuracy" else None)

        out.append({"cut": int(t), "problems": len(rows), "accuracy": mean("accuracy"), "maj": mean("maj"),
                    "entropy": mean("entropy")})
    return out
