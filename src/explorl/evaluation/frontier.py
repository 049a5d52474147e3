"""The coverage-entropy frontier: pass@k of a model against its sampling entropy, and paired differences between two
models at equal entropy (docs/methods.md §8a). A model evaluated at several temperatures gives one point per
temperature (its mean token entropy there, and each problem's correct count); between points, each problem's pass@k
is interpolated linearly in the entropy. An exploration method's claim is a frontier above GRPO's at every entropy,
not a higher pass@k at T = 1 that comes only from sampling hotter. explorl's instrument; not in the papers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from explorl.metrics import bootstrap_ci_seeds, pass_at_k


@dataclass(frozen=True)
class FrontierPoint:
    """One model evaluated at one sampling temperature."""

    temperature: float
    entropy: float
    """Mean token entropy of the sampled responses (nats, over their valid tokens)."""
    n: int
    """Samples per problem."""
    correct: Mapping[str, int]
    """Problem id -> correct samples out of `n`."""


def pass_at_entropy(points: Sequence[FrontierPoint], entropy: float, k: int) -> dict[str, float] | None:
    """Each problem's unbiased pass@k at `entropy`, linear in the entropy between the two points that bracket it
    (a point's own values at its own entropy); None outside the points' entropy range (no extrapolation). Problems
    are those every point evaluated. `points` are one model's, at distinct entropies, in any order.
    """
    if not points:
        raise ValueError("pass_at_entropy: no points")
    if any(k > p.n for p in points):
        raise ValueError(f"pass_at_entropy: k={k} exceeds a point's n={min(p.n for p in points)}")
    ordered = sorted(points, key=lambda p: p.entropy)
    if not ordered[0].entropy <= entropy <= ordered[-1].entropy:
        return None
    ids = [pid for pid in ordered[0].correct if all(pid in p.correct for p in ordered)]

    def at(p: FrontierPoint) -> dict[str, float]:
        return {pid: pass_at_k(p.n, p.correct[pid], k) for pid in ids}

    for a, b in zip(ordered, ordered[1:] + ordered[-1:]):
        if a.entropy <= entropy <= b.entropy:
            w = 0.0 if b.entropy == a.entropy else (entropy - a.entropy) / (b.entropy - a.entropy)
            va, vb = at(a), at(b)
            return {pid: (1 - w) * va[pid] + w * vb[pid] for pid in ids}
    raise AssertionError("unreachable: the entropy lies in the points' range")


def shared_entropy_range(frontiers: Mapping[str, Sequence[FrontierPoint]]) -> tuple[float, float]:
    """(low, high): the entropies every model's frontier reaches; low > high when the ranges do not overlap."""
    low = max(min(p.entropy for p in pts) for pts in frontiers.values())
    high = min(max(p.entropy for p in pts) for pts in frontiers.values())
    return low, high


def entropy_grid(low: float, high: float, points: int) -> list[float]:
    """`points` entropies evenly spaced from `low` to `high` (just `low` when `points` is 1 or the range is one
    value): where paired differences are reported."""
    if points == 1 or high == low:
        return [low]
    return [low + (high - low) * i / (points - 1) for i in range(points)]


def paired_frontier_difference(reference: Sequence[FrontierPoint], other: Sequence[FrontierPoint], k: int,
                               entropies: Sequence[float], *, n_boot: int = 1000,
                               seed: int = 0) -> list[tuple[float, float, float, float]]:
    """pass@k of `other` minus `reference` at each of `entropies` both models reach, with a 95% paired bootstrap
    interval over the problems both evaluated (the shared difficulty of a problem cancels): `[(entropy, mean, lo,
    hi)]`; entropies outside either model's range are left out. A model against itself is zero everywhere.
    """
    return [(h, mean, lo, hi) for h, mean, lo, hi, _ in
            paired_frontier_difference_seeds([(reference, other)], k, entropies, n_boot=n_boot, seed=seed)]


def paired_frontier_difference_seeds(pairs: Sequence[tuple[Sequence[FrontierPoint], Sequence[FrontierPoint]]], k: int,
                                     entropies: Sequence[float], *, n_boot: int = 1000,
                                     seed: int = 0) -> list[tuple[float, float, float, float, list[float]]]:
    """`paired_frontier_difference` over training seeds: each pair is (reference, other) of one seed (a method's
    run and its baseline's of the same seed, or the base model's). At each of `entropies` every pair reaches, the
    per-problem differences of all pairs, over the problems every pair evaluated, with a 95% interval that
    resamples problems and seeds (`metrics.bootstrap_ci_seeds`; with one pair, over problems only): `[(entropy,
    mean, lo, hi, [each pair's mean])]`.
    """
    if not pairs:
        raise ValueError("paired_frontier_difference_seeds: no pairs")
    out = []
    for h in entropies:
        rows = [(pass_at_entropy(ref, h, k), pass_at_entropy(oth, h, k)) for ref, oth in pairs]
        if any(ref is None or oth is None for ref, oth in rows):
            continue
        common = [pid for pid in rows[0][0] if all(pid in ref and pid in oth for ref, oth in rows)]
        if not common:
            raise ValueError("paired_frontier_difference: the models share no problem")
        diffs = [[oth[pid] - ref[pid] for pid in common] for ref, oth in rows]
        out.append((float(h), *bootstrap_ci_seeds(diffs, n_boot=n_boot, seed=seed),
                    [sum(row) / len(row) for row in diffs]))
    return out
