"""Exploration measures over rollouts (STILL, sections 2 and 3; docs/methods.md §8).

Set measures: `unsolvable_set` (the k-rollout unsolvable problems, section 2.1) and `set_overlaps` (the regions of
the Venn diagram comparing models, Figure 1(c)). Tensor measures over a batch of responses, each given as
`[N, T]` tensors with a `[N, T]` mask (1 / True on response tokens): `entropy_by_position` (the positional entropy
profile, section 3.3), `entropy_split` (entropy of positive vs negative responses, section 3.1),
`response_perplexity` (instance PPL, section 3.2). Answer measures: `answer_diversity`, `mean_answer_diversity`
(section 2.3, Figure 1(b)). `entropy_performance_fit` fits `R = -a * exp(H) + b` (section 3).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable, Mapping, Sequence

import torch
from torch import Tensor

__all__ = [
    "unsolvable_set", "set_overlaps", "entropy_by_position", "entropy_split", "response_perplexity",
    "answer_diversity", "mean_answer_diversity", "entropy_performance_fit",
]


def unsolvable_set(results: Mapping[Hashable, Sequence[bool]], k: int) -> set:
    """The k-rollout unsolvable set: problems with no correct answer among k samples (STILL, section 2.1).

    The paper samples k responses per problem; here the first k of each problem's samples are those k (so a run
    with n > k samples gives the set a k-sample run would have given, not the unbiased pass@k estimate).

    Args:
        results: problem id -> per-sample correctness `[n_p]`, in sampling order.
        k: samples considered per problem; every problem needs at least k samples.
    Returns:
        the ids of the problems whose first k samples are all incorrect.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    out = set()
    for pid, flags in results.items():
        if len(flags) < k:
            raise ValueError(f"unsolvable_set: problem {pid!r} has {len(flags)} samples, fewer than k={k}")
        if not any(bool(f) for f in list(flags)[:k]):
            out.add(pid)
    return out


def set_overlaps(sets: Mapping[str, set]) -> dict[str, int]:
    """Sizes of every region of the Venn diagram of named sets (STILL, Figure 1(c)); meant for 2 or 3 sets.

    A region is the elements that belong to exactly the sets of a non-empty subset S of the names: its key joins
    the names in S with "&", in the order given, then appends "-" and each name not in S. For sets A, B, C:
    "A-B-C" (only in A), "B-A-C", "C-A-B", "A&B-C", "A&C-B", "B&C-A", "A&B&C". With two sets: "A-B", "B-A",
    "A&B". Every region is listed, empty ones with 0; the counts sum to the size of the union. Names containing
    "&" or "-" make keys ambiguous and are refused.

    Args:
        sets: name -> set of problem ids (e.g. each model's `unsolvable_set`); 1 to 3 sets.
    Returns:
        region key -> number of elements, regions ordered by the number of sets they belong to.
    """
    names = list(sets)
    if not 1 <= len(names) <= 3:
        raise ValueError(f"set_overlaps: need 1 to 3 sets, got {len(names)}")
    for name in names:
        if not name or "&" in name or "-" in name:
            raise ValueError(f"set_overlaps: set name {name!r} must be non-empty without '&' or '-'")
    members = {name: set(sets[name]) for name in names}
    union = set().union(*members.values())
    out: dict[str, int] = {}
    for size in range(1, len(names) + 1):
        for inside in itertools.combinations(names, size):
            outside = [n for n in names if n not in inside]
            key = "&".join(inside) + "".join("-" + n for n in outside)
            out[key] = sum(
                1 for x in union
                if all(x in members[n] for n in inside) and not any(x in members[n] for n in outside)
            )
    return out


def _check_pair(values: Tensor, mask: Tensor, name: str) -> Tensor:
    if values.dim() != 2 or values.shape != mask.shape:
        raise ValueError(f"{name}: need [N, T] values and mask of the same shape, got {tuple(values.shape)} "
                         f"and {tuple(mask.shape)}")
    return mask > 0


def entropy_by_position(entropy: Tensor, mask: Tensor, bins: int = 10) -> Tensor:
    """Mean token entropy by relative position in the response (STILL, section 3.3, the U-shaped profile).

    The t-th valid token (0-based) of a response with L valid tokens falls in bin `floor(t * bins / L)`; each bin
    holds the mean entropy of all its tokens, pooled over responses (token-weighted); empty bins are NaN. t counts
    valid tokens, so left-padded rows bin correctly too (the trainer logs this as `entropy/by_position`).

    Args:
        entropy: `[N, T]` token entropies.
        mask: `[N, T]` 1 / True on response tokens.
        bins: number of position bins (>= 1).
    Returns:
        `[bins]` float64 mean entropies (on the CPU).
    """
    valid = _check_pair(entropy, mask, "entropy_by_position")
    if bins < 1:
        raise ValueError(f"bins must be >= 1, got {bins}")
    valid = valid.cpu()
    rank = valid.long().cumsum(-1) - 1  # index of each valid token among its row's valid tokens
    lengths = valid.sum(-1, keepdim=True).clamp_min(1)
    b = (rank * bins // lengths).clamp(0, bins - 1)[valid]
    vals = entropy.detach().cpu().double()[valid]
    sums = torch.zeros(bins, dtype=torch.float64).index_add_(0, b, vals)
    counts = torch.zeros(bins, dtype=torch.float64).index_add_(0, b, torch.ones_like(vals))
    return torch.where(counts > 0, sums / counts.clamp_min(1), torch.full_like(sums, float("nan")))


def entropy_split(entropy: Tensor, mask: Tensor, correct: Tensor | Sequence[bool]) -> dict:
    """Mean entropy of all, positive (correct) and negative responses (STILL, section 3.1, Figure 3(b)).

    The three means are token-weighted (pooled over the valid tokens of the responses concerned, as the trainer's
    `entropy/pos` and `entropy/neg` metrics); a group without tokens gives NaN.

    Args:
        entropy: `[N, T]` token entropies.
        mask: `[N, T]` 1 / True on response tokens.
        correct: `[N]` whether each response is correct.
    Returns:
        `{"mean": float, "pos": float, "neg": float, "per_response": list[float]}`, `per_response` being the
        `[N]` per-response mean entropies (NaN for an empty response).
    """
    valid = _check_pair(entropy, mask, "entropy_split").cpu()
    ent = entropy.detach().cpu().double()
    correct = torch.as_tensor(correct).cpu().bool().reshape(-1)
    if correct.numel() != ent.shape[0]:
        raise ValueError(f"entropy_split: correct has {correct.numel()} entries for {ent.shape[0]} responses")

    def pooled(rows: Tensor) -> float:
        sel = valid & rows[:, None]
        return float(ent[sel].mean()) if sel.any() else float("nan")

    counts = valid.sum(-1)
    sums = torch.where(valid, ent, torch.zeros((), dtype=torch.float64)).sum(-1)
    per = torch.where(counts > 0, sums / counts.clamp_min(1), torch.full_like(sums, float("nan")))
    return {
        "mean": pooled(torch.ones_like(correct)),
        "pos": pooled(correct),
        "neg": pooled(~correct),
        "per_response": per.tolist(),
    }


def response_perplexity(logprobs: Tensor, mask: Tensor) -> Tensor:
    """Instance perplexity of each response, `exp(-mean of its token log-probabilities)` (STILL, section 3.2).

    Masked positions are ignored whatever they hold (also -inf or NaN). An empty response gives NaN.

    Args:
        logprobs: `[N, T]` log-probabilities (natural log) of the sampled tokens.
        mask: `[N, T]` 1 / True on response tokens.
    Returns:
        `[N]` perplexities, float32 (float64 for float64 input).
    """
    valid = _check_pair(logprobs, mask, "response_perplexity")
    lp = torch.where(valid, logprobs.detach().double(), torch.zeros((), dtype=torch.float64, device=logprobs.device))
    counts = valid.sum(-1)
    ppl = torch.exp(-lp.sum(-1) / counts.clamp_min(1))
    ppl = torch.where(counts > 0, ppl, torch.full_like(ppl, float("nan")))
    return ppl.to(torch.promote_types(logprobs.dtype, torch.float32))


def answer_diversity(answers: Sequence[str | None]) -> int:
    """Number of distinct final answers among one problem's samples (STILL, section 2.3, Figure 1(b)).

    `None` (no answer extracted) is not an answer. Answers are compared as given, so normalise them first (e.g.
    the extracted `\\boxed{}` content, stripped).
    """
    return len({a for a in answers if a is not None})


def mean_answer_diversity(answers_by_problem: Mapping[Hashable, Sequence[str | None]]) -> float:
    """`answer_diversity` averaged over problems.

    Args:
        answers_by_problem: problem id -> the final answers of its samples.
    """
    if not answers_by_problem:
        raise ValueError("mean_answer_diversity: no problems")
    return sum(answer_diversity(a) for a in answers_by_problem.values()) / len(answers_by_problem)


def entropy_performance_fit(entropies: Sequence[float], rewards: Sequence[float]) -> dict[str, float]:
    """Least-squares fit of `R = -a * exp(H) + b` over training steps (STILL, section 3, after Cui et al.).

    Linear in `x = exp(H)`: ordinary least squares of R on x gives slope `-a` and intercept `b` in closed form,
    `a = -cov(x, R) / var(x)`, `b = mean(R) + a * mean(x)`. a and b are not constrained to be positive (the paper
    expects a, b > 0); `b - a` is the reward predicted at zero entropy. `r2 = 1 - SS_res / SS_tot` is the
    coefficient of determination of the fit in R; it is NaN when the rewards are constant (SS_tot = 0).

    Args:
        entropies: `[S]` mean policy entropy (nats) at each step; at least two distinct values.
        rewards: `[S]` mean reward (or accuracy) at the same steps.
    Returns:
        `{"a": float, "b": float, "r2": float}`.
    """
    h = [float(v) for v in entropies]
    r = [float(v) for v in rewards]
    if len(h) != len(r):
        raise ValueError(f"entropy_performance_fit: {len(h)} entropies but {len(r)} rewards")
    if len(h) < 2:
        raise ValueError("entropy_performance_fit: need at least 2 points")
    if not all(math.isfinite(v) for v in h + r):
        raise ValueError("entropy_performance_fit: values must be finite")
    if max(h) == min(h):
        raise ValueError("entropy_performance_fit: the entropies are all equal; the fit is undetermined")
    x = [math.exp(v) for v in h]
    n = len(x)
    mx, mr = sum(x) / n, sum(r) / n
    sxx = sum((xi - mx) ** 2 for xi in x)
    sxr = sum((xi - mx) * (ri - mr) for xi, ri in zip(x, r))
    slope = sxr / sxx
    a = -slope
    b = mr - slope * mx
    ss_res = sum((ri - (b - a * xi)) ** 2 for xi, ri in zip(x, r))
    ss_tot = sum((ri - mr) ** 2 for ri in r)
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else float("nan")
    return {"a": a, "b": b, "r2": r2}
