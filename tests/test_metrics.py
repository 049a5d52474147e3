"""pass@k family against brute-force enumeration; maj@k ties; branching factor and entropy hand values."""

import itertools
import math
from collections import Counter

import pytest
import torch

from explorl import metrics as M


def brute(n, c, k, event):
    """Fraction of the k-subsets of n samples (the first c correct) for which `event(flags)` holds."""
    flags = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(flags, k))
    return sum(event(s) for s in subsets) / len(subsets)


CASES = [(n, c, k) for n in range(1, 9) for c in range(n + 1) for k in range(1, n + 1)]


@pytest.mark.parametrize("n,c,k", CASES)
def test_pass_and_worst_at_k_match_enumeration(n, c, k):
    assert M.pass_at_k(n, c, k) == pytest.approx(brute(n, c, k, any), abs=1e-12)
    assert M.worst_at_k(n, c, k) == pytest.approx(brute(n, c, k, all), abs=1e-12)


def test_pass_at_k_hand_values_and_large_n():
    # n=4, c=1, k=2: 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5
    assert M.pass_at_k(4, 1, 2) == pytest.approx(0.5)
    assert M.pass_at_k(5, 3, 3) == 1.0  # n - c = 2 < k = 3
    assert M.pass_at_k(10, 0, 5) == 0.0
    # large n stays finite and agrees with the exact rational value
    exact = 1 - math.comb(900, 64) / math.comb(1000, 64)
    assert M.pass_at_k(1000, 100, 64) == pytest.approx(exact, rel=1e-12)
    # worst@k: n=4, c=3, k=2: C(3,2)/C(4,2) = 3/6
    assert M.worst_at_k(4, 3, 2) == pytest.approx(0.5)


@pytest.mark.parametrize("args", [(3, 4, 1), (3, -1, 1), (3, 1, 0), (3, 1, 4), (3.0, 1, 1)])
def test_count_validation(args):
    with pytest.raises(ValueError):
        M.pass_at_k(*args)
    with pytest.raises(ValueError):
        M.worst_at_k(*args)


def test_avg_at_k():
    assert M.avg_at_k(8, 3) == 3 / 8
    with pytest.raises(ValueError):
        M.avg_at_k(0, 0)


def brute_maj(answers, correct, k):
    """Independent reference: every k-subset; tied winners share the credit."""
    scores = []
    for subset in itertools.combinations(range(len(answers)), k):
        votes = Counter(answers[i] for i in subset if answers[i] is not None)
        if not votes:
            scores.append(0.0)
            continue
        top = max(votes.values())
        winners = [a for a, v in votes.items() if v == top]
        ok = {a: any(correct[i] for i in subset if answers[i] == a) for a in winners}
        scores.append(sum(ok.values()) / len(winners))
    return sum(scores) / len(scores)


def test_maj_at_k_hand_values():
    answers, correct = ["a", "a", "b"], [True, True, False]
    assert M.maj_at_k(answers, correct, 1) == pytest.approx(2 / 3)  # each sample votes alone
    # k=2: {0,1} a wins -> 1; {0,2}, {1,2} tie a/b -> 1/2 each; (1 + 0.5 + 0.5) / 3 = 2/3
    assert M.maj_at_k(answers, correct, 2) == pytest.approx(2 / 3)
    assert M.maj_at_k(answers, correct, 3) == 1.0  # a: 2 votes vs b: 1
    # None never wins: k=2 subsets {0,1}, {0,2} -> "a" (correct) wins; {1,2} all None -> 0; 2/3
    assert M.maj_at_k(["a", None, None], [True, False, False], 2) == pytest.approx(2 / 3)
    assert M.maj_at_k([None, None], [False, False], 2) == 0.0


@pytest.mark.parametrize("seed", range(6))
def test_maj_at_k_matches_enumeration(seed):
    import random

    rng = random.Random(seed)
    n = rng.randint(2, 7)
    pool = ["1", "2", "3", None]
    truth = rng.choice(["1", "2"])
    answers = [rng.choice(pool) for _ in range(n)]
    correct = [a == truth for a in answers]
    for k in range(1, n + 1):
        assert M.maj_at_k(answers, correct, k) == pytest.approx(brute_maj(answers, correct, k), abs=1e-12)


def test_maj_at_k_monte_carlo_is_deterministic_and_close():
    answers = ["x"] * 8 + ["y"] * 6 + ["z"] * 4 + [None] * 2
    correct = [a == "x" for a in answers]
    # C(20, 5) = 15504 > 256 -> Monte-Carlo over 256 subsets
    a = M.maj_at_k(answers, correct, 5, seed=1)
    assert a == M.maj_at_k(answers, correct, 5, seed=1)
    exact = M.maj_at_k(answers, correct, 5, max_subsets=20000)
    assert abs(a - exact) < 0.12  # binomial std <= 0.5 / sqrt(256) = 0.031


def test_maj_at_k_validation():
    with pytest.raises(ValueError):
        M.maj_at_k(["a"], [True, False], 1)
    with pytest.raises(ValueError):
        M.maj_at_k(["a", "b"], [True, False], 3)


def test_pass_at_k_table():
    results = {"p1": [True, False, False, False], 7: [True, True, True, True]}
    table = M.pass_at_k_table(results, [1, 4])
    # pass@1: (1/4 + 1) / 2 = 0.625; pass@4: (1 + 1) / 2 = 1
    assert table == {"pass@1": pytest.approx(0.625), "pass@4": pytest.approx(1.0)}
    with pytest.raises(ValueError):
        M.pass_at_k_table(results, [5])
    with pytest.raises(ValueError):
        M.pass_at_k_table({}, [1])


def test_branching_factor_hand_cases():
    probs = torch.tensor([
        [0.5, 0.3, 0.15, 0.05],  # cumsum .5 .8 .95 -> reaches 0.95 at 3 tokens (rounding tolerated)
        [0.96, 0.02, 0.01, 0.01],  # one token already holds 0.96 >= 0.95
        [0.05, 0.15, 0.3, 0.5],  # order does not matter -> 3
        [0.25, 0.25, 0.25, 0.25],  # cumsum .25 .5 .75 1 -> 4
    ])
    assert M.branching_factor(probs).tolist() == [3, 1, 3, 4]
    assert M.branching_factor(probs[3], top_p=1.0).item() == 4
    assert M.branching_factor(probs[0], top_p=0.5).item() == 1  # mass exactly 0.5 reaches 0.5
    assert M.branching_factor(probs[0], top_p=0.8).item() == 2  # 0.5 + 0.3 reaches 0.8
    out = M.branching_factor(probs.reshape(2, 2, 4))
    assert out.shape == (2, 2) and out.dtype == torch.long
    assert M.branching_factor(torch.tensor([0.1, 0.1])).item() == 2  # mass short of top_p -> clamped to V
    with pytest.raises(ValueError):
        M.branching_factor(probs, top_p=0.0)


def test_token_entropy():
    assert M.token_entropy(torch.zeros(4)).item() == pytest.approx(math.log(4))  # uniform over 4
    # p = (1/2, 1/4, 1/4): H = 1/2 ln 2 + 2 * 1/4 ln 4 = 1.5 ln 2 = 1.0397208
    logits = torch.tensor([0.5, 0.25, 0.25]).log() + 3.0  # a shift changes nothing
    assert M.token_entropy(logits).item() == pytest.approx(1.5 * math.log(2), abs=1e-6)
    # -inf logits (filtered tokens) contribute 0, in value and gradient
    x = torch.tensor([[0.0, 0.0, -math.inf], [1000.0, 0.0, 0.0]], requires_grad=True)
    h = M.token_entropy(x)
    assert h[0].item() == pytest.approx(math.log(2))
    assert h[1].item() == pytest.approx(0.0, abs=1e-6)
    h.sum().backward()
    assert torch.isfinite(x.grad).all()
    assert M.token_entropy(torch.zeros(2, 3, 5, dtype=torch.bfloat16)).dtype == torch.float32
