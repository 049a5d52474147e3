"""E3 dynamic rollout budget (Algorithm 1), difficulty ranks and the G_min/G_max curriculum."""

import copy
import json
import random

import pytest

from explorl.rollout import budget as B


def test_algorithm1_hand_example():
    # B = 4, G = 8, G_min = 4, G_max = 12, k = [0.25, 0.5, 0.75, 1.0]; sum k = 2.5
    # N_total = 32; start at 4 each (16); N_rem = 32 - 16 = 16
    # step 4: 16 * k / 2.5 = [1.6, 3.2, 4.8, 6.4] -> floors [1, 3, 4, 6] -> G = [5, 7, 8, 10], sum 30
    # step 6: 2 left, descending k: prompt 3 -> 11, prompt 2 -> 9
    assert B.allocate([0.25, 0.5, 0.75, 1.0], 8, 4, 12) == [5, 7, 9, 11]


def test_step4_is_capped_and_excess_cycles():
    # B = 3, G = 8, G_min = 4, G_max = 10, k = [0, 0, 1]; N_rem = 24 - 12 = 12
    # step 4: [4 + 0, 4 + 0, 4 + 12 = 16] -> capped [4, 4, 10], sum 18, 6 left
    # hand-out in descending k: prompt 2 is full (skipped); prompts 0 and 1 tie at k = 0 (lower index first),
    # cycling: 0, 1, 0, 1, 0, 1 -> [7, 7, 10]
    assert B.allocate([0.0, 0.0, 1.0], 8, 4, 10) == [7, 7, 10]


def test_ties_lower_batch_index_first():
    # B = 3, G = 4, G_min = 2, G_max = 6, k = [0.3, 0.3, 0.4]; N_rem = 12 - 6 = 6
    # step 4: 6 * k / 1.0 = [1.8, 1.8, 2.4] -> [3, 3, 4], sum 10, 2 left
    # hand-out: prompt 2 (k = 0.4) -> 5, then the tie 0 vs 1: prompt 0 -> 4
    assert B.allocate([0.3, 0.3, 0.4], 4, 2, 6) == [4, 3, 5]


def test_remainder_cycles_more_than_once():
    # B = 4, G = 4, G_min = 2, G_max = 6, k = [0.1, 0.2, 0.3, 100.0]; sum k = 100.6; N_rem = 16 - 8 = 8
    # step 4: 8 * k / 100.6 = [0.008, 0.016, 0.024, 7.95] -> [2, 2, 2, 2 + 7 = 9] -> capped [2, 2, 2, 6], 4 left
    # hand-out: 3 full; order 2, 1, 0 -> [3, 3, 3, 6], 1 left; second cycle: prompt 2 -> [3, 3, 4, 6]
    assert B.allocate([0.1, 0.2, 0.3, 100.0], 4, 2, 6) == [3, 3, 4, 6]


def test_degenerate_cases():
    assert B.allocate([0.0, 0.0, 0.0], 8, 4, 12) == [8, 8, 8]  # sum(k) == 0 gives every prompt G
    assert B.allocate([0.2, 0.9], 8, 8, 8) == [8, 8]  # first pass: G_min = G_max = G
    assert B.allocate([], 8, 4, 12) == []
    assert B.allocate([0.5, 0.5, 0.5, 0.5], 8, 4, 12) == [8, 8, 8, 8]  # equal k: N_rem = B(G - G_min) splits evenly
    # exact rational shares survive float rounding: k = [1/3, 2/3], N_rem = 2 * (8 - 5) = 6 -> shares [2, 4]
    assert B.allocate([1 / 3, 2 / 3], 8, 5, 12) == [7, 9]


def test_infeasible_and_invalid():
    with pytest.raises(ValueError):
        B.allocate([0.5, 1.0], 8, 9, 12)  # B * G_min > B * G
    with pytest.raises(ValueError):
        B.allocate([0.5, 1.0], 8, 4, 7)  # B * G_max < B * G
    with pytest.raises(ValueError):
        B.allocate([-0.5, 1.0], 8, 4, 12)
    with pytest.raises(ValueError):
        B.allocate([float("nan"), 1.0], 8, 4, 12)


def test_property_random_batches():
    rng = random.Random(1234)
    for trial in range(3000):
        n = rng.randint(1, 40)
        G = rng.randint(1, 16)
        G_min = rng.randint(0, G)
        G_max = rng.randint(G, G + 12)
        kind = rng.random()
        if kind < 0.15:
            k = [0.0] * n
        elif kind < 0.5:  # many ties and zeros: ranks over a small dataset
            D = rng.randint(1, 6)
            k = [rng.randint(0, D) / D for _ in range(n)]
        else:
            k = [rng.random() if rng.random() > 0.2 else 0.0 for _ in range(n)]
        out = B.allocate(k, G, G_min, G_max)
        assert len(out) == n and sum(out) == n * G, (trial, k, G, G_min, G_max, out)
        assert all(G_min <= g <= G_max for g in out), (trial, k, G, G_min, G_max, out)
        # monotone in difficulty: a strictly harder prompt never gets fewer rollouts
        for i in range(n):
            for j in range(n):
                if k[i] > k[j]:
                    assert out[i] >= out[j], (trial, k, out)
        if sum(k) == 0:
            assert out == [G] * n
        assert B.allocate(list(k), G, G_min, G_max) == out  # deterministic


# ---------------------------------------------------------------------------------------------- tracker


def test_tracker_ranks_hand_example():
    # 5 prompts; average rewards after one pass: p0 = 1.0, p1 = 0.25, p2 = (0+0+1)/3 = 0.333, p3 never seen,
    # p4 = 1.0 (ties p0; the lower id ranks first). Descending: p0 (1), p4 (2), p2 (3), p1 (4); |D| = 5
    tr = B.DifficultyTracker(5)
    assert tr.k([0, 1, 2, 3, 4]) == [0.0] * 5  # nothing ranked during the first pass
    tr.update([0, 1], [[1.0, 1.0], [0.0, 1.0, 0.0, 0.0]])
    tr.update([2, 4], [[0.0, 0.0, 1.0], [1.0]])
    assert tr.k([0]) == [0.0]  # ranks change only at the end of a pass
    tr.end_of_pass()
    assert tr.k([0, 1, 2, 3, 4]) == [1 / 5, 4 / 5, 3 / 5, 0.0, 2 / 5]
    assert tr.mean_reward([2, 3]) == [pytest.approx(1 / 3), None]
    # second pass: cumulative over the run. p0 now 2 of 4 -> 0.5; p3 first seen at 0.0;
    # descending: p4 1.0 (1), p0 0.5 (2), p2 0.333 (3), p1 0.25 (4), p3 0.0 (5)
    tr.update([0, 3], [[0.0, 0.0], [0.0]])
    tr.end_of_pass()
    assert tr.k([0, 1, 2, 3, 4]) == [2 / 5, 4 / 5, 3 / 5, 5 / 5, 1 / 5]
    # the ranks feed Algorithm 1: harder prompts get more rollouts
    out = B.allocate(tr.k([4, 3]), 8, 4, 12)  # k = [0.2, 1.0]; N_rem = 8: floors [1, 6] -> [5, 10], +1 to p3
    assert out == [5, 11]


def test_tracker_state_round_trip_and_errors():
    tr = B.DifficultyTracker(3)
    tr.update([0, 2], [[1.0], [0.5, 0.5]])
    tr.end_of_pass()
    tr.update([1], [[0.25]])
    other = B.DifficultyTracker(3)
    other.load_state_dict(json.loads(json.dumps(tr.state_dict())))
    tr.end_of_pass()
    other.end_of_pass()
    assert other.k([0, 1, 2]) == tr.k([0, 1, 2]) == [1 / 3, 3 / 3, 2 / 3]
    with pytest.raises(ValueError):
        B.DifficultyTracker(4).load_state_dict(tr.state_dict())
    with pytest.raises(IndexError):
        tr.update([3], [[1.0]])
    with pytest.raises(ValueError):
        tr.update([0, 1], [[1.0]])


# ---------------------------------------------------------------------------------------------- curriculum


def test_curriculum_bounds_sequence():
    cur = B.BudgetCurriculum(8)  # paper: G = 8, limits 4 and 12, step 2
    seen = [cur.bounds()]
    for _ in range(3):
        cur.end_of_pass()
        seen.append(cur.bounds())
    assert seen == [(8, 8), (6, 10), (4, 12), (4, 12)]
    restored = B.BudgetCurriculum(8)
    restored.load_state_dict(copy.deepcopy(cur.state_dict()))
    assert restored.bounds() == (4, 12) and restored.passes == 3


def test_curriculum_asymmetric_limits_and_errors():
    cur = B.BudgetCurriculum(8, g_min_limit=7, g_max_limit=16, step_size=3)
    cur.end_of_pass()
    assert cur.bounds() == (7, 11)
    cur.end_of_pass()
    assert cur.bounds() == (7, 14)
    cur.end_of_pass()
    assert cur.bounds() == (7, 16)
    with pytest.raises(ValueError):
        B.BudgetCurriculum(8, g_min_limit=9)
    with pytest.raises(ValueError):
        B.BudgetCurriculum(8, g_max_limit=7)
