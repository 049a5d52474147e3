"""explorl.analysis.measures on hand-checked examples (STILL, sections 2-3; METHODS.md section 8)."""

import math

import pytest
import torch

from explorl.analysis.measures import (
    answer_diversity,
    entropy_by_position,
    entropy_performance_fit,
    entropy_split,
    mean_answer_diversity,
    response_perplexity,
    set_overlaps,
    unsolvable_set,
)

T, F = True, False


def test_unsolvable_set_uses_first_k_samples():
    results = {"p1": [F, F, T, F], "p2": [F, F, F, F], "p3": [T, F, F, F], "p4": [F, T, F, F]}
    # k = 1: only p3 is correct in its first sample
    assert unsolvable_set(results, 1) == {"p1", "p2", "p4"}
    # k = 2: p4's second sample is correct
    assert unsolvable_set(results, 2) == {"p1", "p2"}
    # k = 4: only p2 never succeeds
    assert unsolvable_set(results, 4) == {"p2"}
    with pytest.raises(ValueError):
        unsolvable_set(results, 5)
    with pytest.raises(ValueError):
        unsolvable_set(results, 0)


def test_set_overlaps_three_sets():
    sets = {"A": {1, 2, 3, 4}, "B": {3, 4, 5}, "C": {4, 5, 6, 7}}
    out = set_overlaps(sets)
    # only A: {1, 2}; only B: {}; only C: {6, 7}; A&B not C: {3}; A&C not B: {}; B&C not A: {5}; all: {4}
    assert out == {"A-B-C": 2, "B-A-C": 0, "C-A-B": 2, "A&B-C": 1, "A&C-B": 0, "B&C-A": 1, "A&B&C": 1}
    assert sum(out.values()) == len({1, 2, 3, 4, 5, 6, 7})


def test_set_overlaps_two_sets_and_errors():
    assert set_overlaps({"base": {1, 2, 3}, "rl": {3, 4}}) == {"base-rl": 2, "rl-base": 1, "base&rl": 1}
    with pytest.raises(ValueError):
        set_overlaps({"sft-math": {1}, "rl": {2}})
    with pytest.raises(ValueError):
        set_overlaps({})


def test_entropy_by_position_hand_example():
    # row 0: L = 4, bins = 2 -> tokens 0,1 -> bin 0 (floor(0*2/4)=0, floor(1*2/4)=0), tokens 2,3 -> bin 1
    # row 1: L = 2 -> token 0 -> bin 0, token 1 -> bin floor(2/2) = 1; padding ignored
    entropy = torch.tensor([[1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 99.0, 99.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    prof = entropy_by_position(entropy, mask, bins=2)
    # bin 0: (1 + 2 + 10) / 3 = 13/3; bin 1: (3 + 4 + 20) / 3 = 9
    assert prof.tolist() == pytest.approx([13 / 3, 9.0])
    # bins = 4 with row 1 only (L = 2): token 0 -> bin 0, token 1 -> bin floor(1*4/2) = 2; bins 1 and 3 empty
    prof = entropy_by_position(entropy[1:], mask[1:], bins=4)
    assert prof[0] == 10 and prof[2] == 20
    assert math.isnan(prof[1]) and math.isnan(prof[3])


def test_entropy_by_position_counts_valid_tokens_not_columns():
    # valid tokens at columns 2, 3 (left padding): they are tokens 0 and 1 of a 2-token response
    entropy = torch.tensor([[9.0, 9.0, 1.0, 3.0]])
    mask = torch.tensor([[0, 0, 1, 1]])
    assert entropy_by_position(entropy, mask, bins=2).tolist() == [1.0, 3.0]


def test_entropy_split_hand_example():
    entropy = torch.tensor([[1.0, 3.0, 0.0], [2.0, 0.0, 0.0], [4.0, 4.0, 7.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]])
    out = entropy_split(entropy, mask, torch.tensor([True, False, True]))
    # all tokens: 1, 3, 2, 4, 4, 7 -> 21 / 6 = 3.5; positive (rows 0, 2): 1, 3, 4, 4, 7 -> 19 / 5; negative: 2
    assert out["mean"] == pytest.approx(3.5)
    assert out["pos"] == pytest.approx(19 / 5)
    assert out["neg"] == pytest.approx(2.0)
    assert out["per_response"] == pytest.approx([2.0, 2.0, 5.0])
    none_neg = entropy_split(entropy, mask, [True, True, True])
    assert math.isnan(none_neg["neg"])
    with pytest.raises(ValueError):
        entropy_split(entropy, mask, [True, False])


def test_response_perplexity_hand_values():
    ln2 = math.log(2)
    logprobs = torch.tensor([[-ln2, -ln2, float("-inf")], [0.0, -2 * ln2, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0]])
    ppl = response_perplexity(logprobs, mask)
    # row 0: exp(ln2) = 2 (the masked -inf is ignored); row 1: exp(2 ln2 / 3) = 2 ** (2/3); row 2: empty -> NaN
    assert ppl[0].item() == pytest.approx(2.0)
    assert ppl[1].item() == pytest.approx(2 ** (2 / 3))
    assert math.isnan(ppl[2].item())
    assert ppl.dtype == torch.float32


def test_answer_diversity():
    assert answer_diversity(["4", "4", "5", None, "6", None]) == 3
    assert answer_diversity([None, None]) == 0
    assert mean_answer_diversity({"p1": ["1", "1"], "p2": ["1", "2", "3"]}) == pytest.approx(2.0)


def test_entropy_performance_fit_recovers_noiseless_parameters():
    a, b = 0.3, 1.2
    hs = [0.1, 0.25, 0.4, 0.7, 1.0]
    rs = [-a * math.exp(h) + b for h in hs]
    fit = entropy_performance_fit(hs, rs)
    assert fit["a"] == pytest.approx(a, abs=1e-12)
    assert fit["b"] == pytest.approx(b, abs=1e-12)
    assert fit["r2"] == pytest.approx(1.0, abs=1e-12)


def test_entropy_performance_fit_hand_example_and_errors():
    # x = exp(H) = 1, e, with rewards 1, 0 -> two points are fitted exactly: slope -1 / (e - 1)
    fit = entropy_performance_fit([0.0, 1.0], [1.0, 0.0])
    assert fit["a"] == pytest.approx(1 / (math.e - 1))
    assert fit["b"] == pytest.approx(1 + 1 / (math.e - 1))  # R(x=1) = -a + b = 1
    assert fit["r2"] == pytest.approx(1.0)
    # constant rewards: a = 0, b = R, r2 undefined
    flat = entropy_performance_fit([0.0, 1.0, 2.0], [0.5, 0.5, 0.5])
    assert flat["a"] == pytest.approx(0.0) and flat["b"] == pytest.approx(0.5) and math.isnan(flat["r2"])
    with pytest.raises(ValueError):
        entropy_performance_fit([0.5], [0.5])
    with pytest.raises(ValueError):
        entropy_performance_fit([0.5, 0.5, 0.5], [0.1, 0.2, 0.3])
    with pytest.raises(ValueError):
        entropy_performance_fit([0.1, 0.2], [0.1])
