"""bootstrap_ci, pass_at_k_curve, worst_at_k_table (METHODS.md section 8; STILL, section 2.1)."""

import math

import pytest

from explorl.metrics import (
    bootstrap_ci,
    bootstrap_ci_seeds,
    pass_at_k,
    pass_at_k_curve,
    pass_at_k_table,
    worst_at_k_table,
)


def test_bootstrap_ci_brackets_mean_and_is_deterministic():
    values = [0, 1, 0, 1, 1, 0.5, 0.25, 1, 0, 0.75]  # mean 5.5 / 10 = 0.55
    mean, lo, hi = bootstrap_ci(values)
    assert mean == pytest.approx(0.55)
    assert 0.0 <= lo < mean < hi <= 1.0
    assert bootstrap_ci(values) == (mean, lo, hi)  # same seed, same interval
    # a narrower confidence level gives a narrower interval (same resamples, inner quantiles)
    _, lo80, hi80 = bootstrap_ci(values, alpha=0.2)
    assert lo <= lo80 and hi80 <= hi


def test_bootstrap_ci_shrinks_with_more_problems():
    # the same 0/1 pattern repeated: the mean stays 0.5, the standard error falls as 1/sqrt(P)
    few = [0.0, 1.0] * 5  # 10 problems
    many = [0.0, 1.0] * 500  # 1000 problems
    m1, lo1, hi1 = bootstrap_ci(few)
    m2, lo2, hi2 = bootstrap_ci(many)
    assert m1 == m2 == 0.5
    assert lo2 < 0.5 < hi2
    # width ~ 2 * 1.96 * 0.5 / sqrt(P): ~0.62 for P = 10, ~0.062 for P = 1000
    assert (hi2 - lo2) < (hi1 - lo1) / 5
    assert (hi2 - lo2) == pytest.approx(2 * 1.96 * 0.5 / math.sqrt(1000), rel=0.2)


def test_bootstrap_ci_degenerate_and_errors():
    assert bootstrap_ci([0.3]) == pytest.approx((0.3, 0.3, 0.3))
    assert bootstrap_ci([0.7] * 5) == pytest.approx((0.7, 0.7, 0.7))
    with pytest.raises(ValueError):
        bootstrap_ci([])
    with pytest.raises(ValueError):
        bootstrap_ci([0.1, float("nan")])
    with pytest.raises(ValueError):
        bootstrap_ci([0.1], alpha=0.0)
    with pytest.raises(ValueError):
        bootstrap_ci([0.1], n_boot=0)


def test_bootstrap_ci_seeds_is_bootstrap_ci_when_runs_agree():
    values = [0, 1, 0, 1, 1, 0.5, 0.25, 1, 0, 0.75]
    # one run, or three runs that agree on every problem: the run draws change nothing, and the problem draws come
    # first from the same generator, so the interval is bootstrap_ci's
    assert bootstrap_ci_seeds([values]) == pytest.approx(bootstrap_ci(values))
    assert bootstrap_ci_seeds([values] * 3, n_boot=500, seed=3) == pytest.approx(bootstrap_ci(values, n_boot=500,
                                                                                               seed=3))


def test_bootstrap_ci_seeds_widens_with_a_spread_between_runs():
    # every problem agrees within a run, the two runs differ: run 0 scores 0, run 1 scores 1 on all 20 problems.
    # A resample's mean is the share of run 1 among the 2 runs drawn: 0, 1/2, 1 with probabilities 1/4, 1/2, 1/4,
    # so the 2.5% and 97.5% quantiles are 0 and 1 (each end holds about a quarter of 4000 draws, far above 2.5%);
    # bootstrap over problems alone would give the zero-width interval (0.5, 0.5, 0.5)
    runs = [[0.0] * 20, [1.0] * 20]
    assert bootstrap_ci_seeds(runs, n_boot=4000) == pytest.approx((0.5, 0.0, 1.0))
    assert bootstrap_ci([sum(col) / 2 for col in zip(*runs)]) == pytest.approx((0.5, 0.5, 0.5))


def test_bootstrap_ci_seeds_matches_a_loop_over_the_same_draws():
    import torch

    runs = [[0.1, 0.4, -0.2, 0.0, 0.3], [0.2, -0.1, 0.5, 0.1, 0.0], [-0.3, 0.2, 0.1, 0.4, 0.2]]
    n_boot = 50
    gen = torch.Generator().manual_seed(7)  # the documented order: problem draws, then run draws
    problems = torch.randint(5, (n_boot, 5), generator=gen).tolist()
    drawn_runs = torch.randint(3, (n_boot, 3), generator=gen).tolist()
    means = sorted(sum(runs[r][q] for r in rs for q in ps) / 15 for ps, rs in zip(problems, drawn_runs))
    # torch.quantile's linear interpolation at 0.025 and 0.975 over 50 sorted values: positions 1.225 and 47.775
    lo = means[1] + 0.225 * (means[2] - means[1])
    hi = means[47] + 0.775 * (means[48] - means[47])
    assert bootstrap_ci_seeds(runs, n_boot=n_boot, seed=7) == pytest.approx((sum(map(sum, runs)) / 15, lo, hi))


def test_bootstrap_ci_seeds_errors():
    with pytest.raises(ValueError, match="no values"):
        bootstrap_ci_seeds([])
    with pytest.raises(ValueError, match="same problems"):
        bootstrap_ci_seeds([[0.1, 0.2], [0.3]])
    with pytest.raises(ValueError, match="finite"):
        bootstrap_ci_seeds([[0.1, float("inf")]])
    with pytest.raises(ValueError, match="alpha"):
        bootstrap_ci_seeds([[0.1]], alpha=1.0)


def test_pass_at_k_curve_means_match_table():
    results = {"p1": [True, False, False, False], "p2": [False] * 4, "p3": [True, True, False, True]}
    curve = pass_at_k_curve(results, [1, 2, 4])
    assert list(curve) == [1, 2, 4]
    # pass@1 = (1/4 + 0 + 3/4) / 3 = 1/3; pass@2 for p1: 1 - C(3,2)/C(4,2) = 1 - 3/6 = 1/2, p3: 1 -> (1/2+0+1)/3
    assert curve[1][0] == pytest.approx(1 / 3)
    assert curve[2][0] == pytest.approx(0.5)
    assert curve[4][0] == pytest.approx(2 / 3)
    table = pass_at_k_table(results, [1, 2, 4])
    for k, (mean, lo, hi) in curve.items():
        assert mean == pytest.approx(table[f"pass@{k}"])
        assert lo <= mean <= hi
    assert curve[2][0] == pytest.approx(sum(pass_at_k(4, c, 2) for c in (1, 0, 3)) / 3)
    with pytest.raises(ValueError):
        pass_at_k_curve(results, [5])
    with pytest.raises(ValueError):
        pass_at_k_curve({}, [1])


def test_worst_at_k_table_hand_values():
    results = {"p1": [True, True, False, True], "p2": [True] * 4, "p3": [False, True, False, False]}
    table = worst_at_k_table(results, [1, 2, 4])
    assert list(table) == ["worst@1", "worst@2", "worst@4"]
    # worst@1 = mean accuracy = (3/4 + 1 + 1/4) / 3 = 2/3
    assert table["worst@1"] == pytest.approx(2 / 3)
    # worst@2: p1 C(3,2)/C(4,2) = 3/6, p2 1, p3 0 -> (1/2 + 1 + 0) / 3 = 1/2
    assert table["worst@2"] == pytest.approx(0.5)
    # worst@4: only p2 is all correct -> 1/3
    assert table["worst@4"] == pytest.approx(1 / 3)
    with pytest.raises(ValueError):
        worst_at_k_table(results, [5])


def test_vote_keys_pool_equivalent_answers_for_majority_voting():
    from explorl.metrics import CORRECT_VOTE, maj_at_k, vote_keys

    answers = ["1/2", "0.5", "3", "3.00"]
    correct = [True, True, False, False]
    keys = vote_keys(answers, correct)
    assert keys == [CORRECT_VOTE, CORRECT_VOTE, "3", "3"]
    # k = 4 (the one subset): by string the wrong "3" would win 2 votes to 1 ("3.00" is not "3" either way here
    # after normalising); pooled, the correct class ties it 2-2: score 1/2. By raw strings: "3" 1, "3.00" 1,
    # "1/2" 1, "0.5" 1: a four-way tie, two of them correct: also 1/2 - so check a case where pooling decides:
    assert maj_at_k(keys, correct, 4) == 0.5
    answers, correct = ["1/2", "\\frac{1}{2}", "0.5", "7", "7"], [True, True, True, False, False]
    assert maj_at_k(answers, correct, 5) == 0.0  # by string "7" wins with 2 votes against 1 each
    assert maj_at_k(vote_keys(answers, correct), correct, 5) == 1.0  # pooled: 3 correct votes against 2
    # wrong answers: LaTeX spacing, \left/\right, $, whitespace and \dfrac are noise; None never votes
    assert vote_keys(["$\\left( 1, 2 \\right)$", "\\dfrac{1}{3}", None, "-4.000"], [False] * 4) == \
        ["(1,2)", "\\frac{1}{3}", None, "-4"]
    with pytest.raises(ValueError, match="same length"):
        vote_keys(["1"], [True, False])
