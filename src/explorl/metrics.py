"""Evaluation and exploration metrics as plain functions of counts and tensors (docs/methods.md §8).

Sample-count metrics take, for one problem, `n` samples of which `c` are correct:
`pass_at_k` (some of k correct), `worst_at_k` (all of k correct), `avg_at_k` (mean accuracy), `maj_at_k`
(the majority answer of k samples is correct). All are unbiased estimates over the k-subsets of the n samples.
Tensor metrics: `token_entropy` (entropy of the softmax of logits) and `branching_factor` (smallest top-p set).

Metric names returned by table helpers are namespaced the way the trainer logs them, without the `eval/`
prefix that the trainer adds: `pass@1`, `pass@8`, ...
"""

from __future__ import annotations

import itertools
import math
import operator
import random
import re
from collections.abc import Hashable, Iterable, Mapping, Sequence

import torch
from torch import Tensor

__all__ = [
    "pass_at_k", "worst_at_k", "avg_at_k", "maj_at_k", "vote_keys", "pass_at_k_table", "branching_factor",
    "token_entropy",
]


def _check_counts(n: int, c: int, k: int | None = None) -> None:
    for name, v in (("n", n), ("c", c)) + ((("k", k),) if k is not None else ()):
        try:  # int-like (Python or numpy integers), not float, not bool
            if isinstance(v, bool) or operator.index(v) != v:
                raise TypeError
        except TypeError:
            raise ValueError(f"{name} must be an integer, got {v!r}") from None
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if k is not None and not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got n={n}, k={k}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k: probability that at least one of k samples drawn without replacement from n is correct.

    `1 - C(n-c, k) / C(n, k)`, 1.0 when `n - c < k` (Chen et al. 2021, "Evaluating Large Language Models Trained
    on Code", eq. 1), evaluated as the product `1 - prod_{i=n-c+1}^{n} (1 - k / i)` (their numerically stable form).

    Args:
        n: samples drawn for the problem (>= 1).
        c: correct samples among them (0 <= c <= n).
        k: subset size (1 <= k <= n).
    """
    _check_counts(n, c, k)
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def worst_at_k(n: int, c: int, k: int) -> float:
    """Unbiased worst@k: probability that all of k samples drawn without replacement from n are correct.

    `C(c, k) / C(n, k)` (0 when c < k), evaluated as `prod_{i=0}^{k-1} (c - i) / (n - i)`.
    """
    _check_counts(n, c, k)
    if c < k:
        return 0.0
    prod = 1.0
    for i in range(k):
        prod *= (c - i) / (n - i)
    return prod


def avg_at_k(n: int, c: int) -> float:
    """avg@k: the mean accuracy over the n samples, `c / n` (the expected accuracy of one sample; the k in the
    name is the number of samples drawn, here n)."""
    _check_counts(n, c)
    if n < 1:
        raise ValueError(f"need n >= 1, got n={n}")
    return c / n


def _majority_score(answers: Sequence[Hashable | None], correct: Sequence[bool], subset: Iterable[int]) -> float:
    """Score of one subset: the fraction of the tied most-voted answers that are correct (None never votes)."""
    votes: dict[Hashable, list[int]] = {}  # answer -> [count, correct count]
    for i in subset:
        if answers[i] is None:
            continue
        v = votes.setdefault(answers[i], [0, 0])
        v[0] += 1
        v[1] += bool(correct[i])
    if not votes:
        return 0.0
    top = max(v[0] for v in votes.values())
    winners = [v for v in votes.values() if v[0] == top]
    return sum(v[1] / v[0] for v in winners) / len(winners)


def maj_at_k(
    answers: Sequence[str | None], correct: Sequence[bool], k: int, *, max_subsets: int = 256, seed: int = 0
) -> float:
    """maj@k: probability that the majority answer among k samples (drawn without replacement) is correct.

    Per k-subset: answers are counted (`None`, an unparsable answer, never votes); the answers with the most
    votes win. A tie counts in proportion: with m tied answers of which j are correct, the subset scores j / m
    (the expected score of breaking the tie uniformly at random). An answer's correctness is the fraction of its
    samples in the subset marked correct (1 or 0 when, as usual, equal answers are graded alike). A subset whose
    answers are all `None` scores 0.

    The expectation is exact (every k-subset) when `C(n, k) <= max_subsets`, else a Monte-Carlo estimate over
    `max_subsets` subsets drawn uniformly with a `random.Random(seed)`, so the result is deterministic.

    Args:
        answers: `[n]` extracted final answers (any hashable, typically normalised strings), None if none.
        correct: `[n]` whether each sample is graded correct.
        k: votes per subset (1 <= k <= n).
        max_subsets: budget of subsets to evaluate.
        seed: seed of the Monte-Carlo draw.
    """
    n = len(answers)
    if len(correct) != n:
        raise ValueError(f"answers and correct must have the same length, got {n} and {len(correct)}")
    _check_counts(n, 0, k)
    if max_subsets < 1:
        raise ValueError(f"max_subsets must be >= 1, got {max_subsets}")
    if math.comb(n, k) <= max_subsets:
        subsets: Iterable[Sequence[int]] = itertools.combinations(range(n), k)
        count = math.comb(n, k)
    else:
        rng = random.Random(seed)
        subsets = (rng.sample(range(n), k) for _ in range(max_subsets))
        count = max_subsets
    return sum(_majority_score(answers, correct, s) for s in subsets) / count


CORRECT_VOTE = "\x00correct"
"""The vote of every sample graded correct (`vote_keys`)."""
_LATEX_NOISE = re.compile(r"\\left|\\right|\\[,!;: ]|\\displaystyle|\$|\s+")


def vote_keys(answers: Sequence[str | None], correct: Sequence[bool]) -> list[str | None]:
    """What each sample votes for in maj@k: equivalent answers must pool their votes.

    Every answer graded correct is equivalent to the ground truth (that is what the grader checked, with
    math-verify for the math reward), so they all vote `CORRECT_VOTE`, whatever their form (`1/2`, `0.5`,
    `\\frac{1}{2}`). Wrong answers vote for their text with LaTeX spacing, `\\left`/`\\right`, `$` and
    whitespace removed, `\\dfrac`/`\\tfrac` read as `\\frac`, and a trailing `.0...` dropped from a number. A
    sample with no extracted answer (`None`) never votes, even when a custom reward graded it correct. Linear in
    the answers' length (no parsing of model output).
    """
    if len(answers) != len(correct):
        raise ValueError(f"answers and correct must have the same length, got {len(answers)} and {len(correct)}")
    keys: list[str | None] = []
    for a, c in zip(answers, correct):
        if a is None:
            keys.append(None)  # nothing extracted: no vote, even when a custom reward graded it correct
        elif c:
            keys.append(CORRECT_VOTE)
        else:
            text = _LATEX_NOISE.sub("", str(a)).replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
            keys.append(re.sub(r"^([+-]?\d+)\.0+$", r"\1", text))
    return keys


def pass_at_k_table(results: Mapping[Hashable, Sequence[bool]], ks: Iterable[int]) -> dict[str, float]:
    """Mean unbiased pass@k over problems: `{"pass@1": ..., "pass@8": ...}` (the trainer prefixes `eval/`).

    Args:
        results: problem id -> per-sample correctness `[n_p]` (n may differ between problems).
        ks: the k values; each must be <= the number of samples of every problem.
    """
    ks = list(ks)
    if not results:
        raise ValueError("pass_at_k_table: no problems in results")
    table = {}
    for k in ks:
        scores = []
        for pid, flags in results.items():
            n, c = len(flags), sum(bool(f) for f in flags)
            if not 1 <= k <= n:
                raise ValueError(f"pass@{k}: problem {pid!r} has {n} samples; need 1 <= k <= n")
            scores.append(pass_at_k(n, c, k))
        table[f"pass@{k}"] = sum(scores) / len(scores)
    return table


def token_entropy(logits: Tensor) -> Tensor:
    """Entropy (nats) of `softmax(logits)` over the last dimension, `H = -sum_v p_v log p_v`.

    Stable for any logits: `log p = logits - logsumexp(logits)`; tokens with p = 0 (e.g. logits of -inf after
    top-k/top-p filtering) contribute exactly 0, in value and gradient. Half-precision inputs are computed in
    float32. Differentiable (for entropy regularisation).

    Args:
        logits: `[..., V]` unnormalised log-probabilities (already divided by any temperature).
    Returns:
        `[...]` entropies.
    """
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    logp = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
    p = logp.exp()
    safe_logp = torch.where(p > 0, logp, torch.zeros((), dtype=logp.dtype, device=logp.device))
    return -(p * safe_logp).sum(-1)


def branching_factor(probs: Tensor, top_p: float = 0.95, *, tol: float = 1e-6) -> Tensor:
    """Rollout branching factor: per position, the size of the smallest set of most probable tokens whose total
    probability reaches `top_p` (Deng et al. 2025, "From Trial-and-Error to Improvement", section 2.2;
    docs/methods.md §8b).

    The cumulative mass is summed in float64 and a mass within `tol` below `top_p` counts as reaching it, so that
    e.g. `[0.5, 0.3, 0.15, 0.05]` with top_p 0.95 gives 3 despite float rounding. The result is clamped to
    `[1, V]` (a distribution whose total mass falls short of top_p gives V).

    Args:
        probs: `[..., V]` probabilities (each row sums to 1).
        top_p: target mass in (0, 1].
        tol: rounding tolerance on the mass.
    Returns:
        `[...]` int64 set sizes.
    """
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    v = probs.shape[-1]
    if v < 1:
        raise ValueError("branching_factor: the vocabulary dimension is empty")
    mass = torch.sort(probs.detach().to(torch.float64), dim=-1, descending=True).values.cumsum(-1)
    short = (mass < top_p - tol).sum(-1)  # positions before the mass is reached
    return (short + 1).clamp(1, v).to(torch.long)


# --- Confidence intervals and curves over problems (docs/methods.md §8a; STILL, section 2.1) ---------------

__all__ += ["bootstrap_ci", "pass_at_k_curve", "worst_at_k_table"]


def bootstrap_ci(
    per_problem_values: Sequence[float], *, n_boot: int = 1000, alpha: float = 0.05, seed: int = 0
) -> tuple[float, float, float]:
    """Mean of per-problem scores with a percentile-bootstrap confidence interval over problems.

    The problems are resampled with replacement `n_boot` times (a `torch.Generator` seeded with `seed`, so the
    result is deterministic); the interval is the `alpha / 2` and `1 - alpha / 2` quantiles (linear
    interpolation) of the resampled means. The point estimate is the plain mean of the values, which the interval
    brackets in all but degenerate cases. One problem gives a zero-width interval.

    Args:
        per_problem_values: `[P]` one score per problem (e.g. unbiased pass@k), P >= 1, all finite.
        n_boot: number of bootstrap resamples (>= 1).
        alpha: 1 - confidence level, in (0, 1).
        seed: seed of the resampling.
    Returns:
        `(mean, lo, hi)` as floats.
    """
    return _bootstrap([list(per_problem_values)], n_boot, alpha, seed, "bootstrap_ci")


def bootstrap_ci_seeds(
    per_seed_values: Sequence[Sequence[float]], *, n_boot: int = 1000, alpha: float = 0.05, seed: int = 0
) -> tuple[float, float, float]:
    """Mean of per-problem scores over several runs (seeds) of the same problems, with a percentile-bootstrap
    interval that resamples both the runs and the problems.

    `bootstrap_ci` resamples problems only, so its interval says nothing about another training seed's run. Here
    each resample draws P problems and S runs with replacement, independently (problems and runs are crossed: every
    run scored the same problems), and takes the mean of the S x P values drawn. A spread between runs widens the
    interval even when every run's problems agree. The problem draws come first from the same generator as in
    `bootstrap_ci`, so with one run, or with runs that agree on every problem, the result is `bootstrap_ci`'s.

    Args:
        per_seed_values: `[S][P]` one score per run and problem (e.g. a paired pass@k difference), the same P
            problems in the same order in every run; S, P >= 1, all finite.
        n_boot, alpha, seed: as in `bootstrap_ci`.
    Returns:
        `(mean, lo, hi)` as floats; the mean is the plain mean of the S x P values.
    """
    return _bootstrap(per_seed_values, n_boot, alpha, seed, "bootstrap_ci_seeds")


def _bootstrap(per_seed_values: Sequence[Sequence[float]], n_boot: int, alpha: float, seed: int,
               name: str) -> tuple[float, float, float]:
    """`bootstrap_ci_seeds`; `name` is the public function's, for its errors."""
    rows = [[float(v) for v in run] for run in per_seed_values]
    if not rows or not rows[0]:
        raise ValueError(f"{name}: no values")
    if any(len(run) != len(rows[0]) for run in rows):
        raise ValueError(f"{name}: every run must score the same problems (rows of equal length), got "
                         f"lengths {[len(run) for run in rows]}")
    values = torch.tensor(rows, dtype=torch.float64)
    if not torch.isfinite(values).all():
        raise ValueError(f"{name}: values must be finite")
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    s, p = values.shape
    gen = torch.Generator().manual_seed(seed)
    problems = torch.randint(p, (n_boot, p), generator=gen)  # first, as bootstrap_ci draws them
    runs = torch.randint(s, (n_boot, s), generator=gen)
    # [n_boot, S, P]: the drawn runs' rows at the drawn problems
    means = values[runs.unsqueeze(-1), problems.unsqueeze(1)].mean(dim=(1, 2))
    q = torch.tensor([alpha / 2, 1 - alpha / 2], dtype=torch.float64)
    lo, hi = torch.quantile(means, q).tolist()
    return float(values.mean()), float(lo), float(hi)


def _per_problem(results: Mapping[Hashable, Sequence[bool]], k: int, fn, name: str) -> list[float]:
    if not results:
        raise ValueError(f"{name}: no problems in results")
    scores = []
    for pid, flags in results.items():
        n, c = len(flags), sum(bool(f) for f in flags)
        if not 1 <= k <= n:
            raise ValueError(f"{name}@{k}: problem {pid!r} has {n} samples; need 1 <= k <= n")
        scores.append(fn(n, c, k))
    return scores


def pass_at_k_curve(
    results: Mapping[Hashable, Sequence[bool]], ks: Iterable[int], *, n_boot: int = 1000, alpha: float = 0.05,
    seed: int = 0,
) -> dict[int, tuple[float, float, float]]:
    """Pass@k curve with bootstrap confidence intervals: `{k: (mean, lo, hi)}` (STILL, section 2.1, Figure 1(a)).

    For each k, the unbiased pass@k of every problem (`pass_at_k`) is computed and `bootstrap_ci` resamples the
    problems (the same `seed` for every k). `mean` equals `pass_at_k_table(results, [k])[f"pass@{k}"]`.

    Args:
        results: problem id -> per-sample correctness `[n_p]`.
        ks: the k values; each must be <= the number of samples of every problem.
    """
    return {
        k: bootstrap_ci(_per_problem(results, k, pass_at_k, "pass"), n_boot=n_boot, alpha=alpha, seed=seed)
        for k in ks
    }


def worst_at_k_table(results: Mapping[Hashable, Sequence[bool]], ks: Iterable[int]) -> dict[str, float]:
    """Mean unbiased worst@k over problems: `{"worst@1": ..., "worst@8": ...}` (analogous to `pass_at_k_table`).

    Args:
        results: problem id -> per-sample correctness `[n_p]`.
        ks: the k values; each must be <= the number of samples of every problem.
    """
    table = {}
    for k in ks:
        scores = _per_problem(results, k, worst_at_k, "worst")
        table[f"worst@{k}"] = sum(scores) / len(scores)
    return table
