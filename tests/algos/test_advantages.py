"""GRPO / Dr.GRPO advantages: hand-derived values, edge cases, and a slow per-group reference."""

import math

import pytest
import torch

from explorl.algos import get_advantage
from explorl.algos.registry import names
from explorl.algos.batch import RolloutBatch
from explorl.algos import advantages as A
from explorl.config import AlgoConfig


def slow_grpo(rewards, group, mask, scale=True, eps=1e-6):
    """Reference: a Python loop over groups, statistics.stdev-style unbiased std."""
    out = torch.zeros(mask.shape, dtype=torch.float64)
    r = rewards.tolist()
    g = group.tolist()
    for gid in set(g):
        idx = [i for i in range(len(g)) if g[i] == gid]
        vals = [r[i] for i in idx]
        if len(vals) < 2 or len(set(vals)) == 1:
            continue
        mean = sum(vals) / len(vals)
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1))
        for i in idx:
            a = r[i] - mean
            out[i] = a / (std + eps) if scale else a
    return out * mask.double()


def test_hand_values_one_group():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    adv = A.grpo(rewards, torch.zeros(4, dtype=torch.long), torch.ones(4, 3))
    # mean = 0.5; unbiased var = 4 * 0.25 / 3 = 1/3, std = 0.5773503;
    # A = +-0.5 / (0.5773503 + 1e-6) = +-0.8660239
    expected = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    assert adv.shape == (4, 3)
    assert torch.allclose(adv[:, 0], torch.tensor([expected, -expected, -expected, expected]), atol=1e-6)
    assert abs(expected - 0.866024) < 1e-5
    assert torch.equal(adv, adv[:, :1].expand(4, 3))  # broadcast over tokens


def test_dr_grpo_no_scale():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.5])
    adv = A.grpo(rewards, torch.zeros(4, dtype=torch.long), torch.ones(4, 2), scale=False)
    # mean = 1.5 / 4 = 0.375; A = r - 0.375
    assert torch.allclose(adv[:, 0], torch.tensor([0.625, -0.375, -0.375, 0.125]))


def test_singleton_and_constant_groups_are_zero():
    # group 5: single response; group 2: all rewards equal 0.1 (mean may round); group 9: informative
    rewards = torch.tensor([3.0, 0.1, 0.1, 0.1, 1.0, 0.0])
    group = torch.tensor([5, 2, 2, 2, 9, 9])
    for scale in (True, False):
        adv = A.grpo(rewards, group, torch.ones(6, 4), scale=scale)
        assert torch.all(adv[:4] == 0.0)
        # group 9: mean 0.5, unbiased std = sqrt(2 * 0.25 / 1) = 0.7071068; A = +-0.5 / 0.7071078 = +-0.7071058
        a = 0.5 / (math.sqrt(0.5) + 1e-6) if scale else 0.5
        assert torch.allclose(adv[4:, 0], torch.tensor([a, -a]), atol=1e-6)


def test_variable_sizes_noncontiguous_unsorted_ids():
    rewards = torch.tensor([1.0, 0.0, 2.0, 0.0, 1.0, 4.0])
    group = torch.tensor([100, -3, 100, -3, 100, 7])
    adv = A.grpo(rewards, group, torch.ones(6, 1))
    # group 100: r = 1, 2, 1 -> mean 4/3; deviations -1/3, 2/3, -1/3; var = (1/9 + 4/9 + 1/9) / 2 = 1/3
    s100 = math.sqrt(1 / 3) + 1e-6
    # group -3: r = 0, 0 -> constant -> 0; group 7: size 1 -> 0
    expected = torch.tensor([-1 / 3 / s100, 0.0, 2 / 3 / s100, 0.0, -1 / 3 / s100, 0.0])
    assert torch.allclose(adv[:, 0], expected, atol=1e-6)


def test_zero_outside_mask():
    rewards = torch.tensor([1.0, 0.0, 0.5])
    group = torch.tensor([0, 0, 0])
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.float32)
    adv = A.grpo(rewards, group, mask)
    assert torch.all(adv[mask == 0] == 0.0)
    assert torch.all(adv[mask == 1] != 0.0)
    assert A.grpo(rewards, group, mask.bool()).dtype == torch.float32


def test_integer_rewards_and_dtype():
    adv = A.grpo(torch.tensor([1, 0]), torch.tensor([0, 0]), torch.ones(2, 1))
    assert adv.dtype == torch.float32
    adv64 = A.grpo(torch.tensor([1.0, 0.0], dtype=torch.float64), torch.tensor([0, 0]), torch.ones(2, 1))
    assert adv64.dtype == torch.float64


def test_empty_batch():
    adv = A.grpo(torch.zeros(0), torch.zeros(0, dtype=torch.long), torch.zeros(0, 5))
    assert adv.shape == (0, 5)


def test_shape_errors():
    with pytest.raises(ValueError):
        A.grpo(torch.zeros(3), torch.zeros(2, dtype=torch.long), torch.ones(3, 2))
    with pytest.raises(ValueError):
        A.grpo(torch.zeros(3), torch.zeros(3), torch.ones(3, 2))  # float group ids


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("scale", [True, False])
def test_matches_slow_reference_and_groups_sum_to_zero(seed, scale):
    gen = torch.Generator().manual_seed(seed)
    n, t = 40, 6
    group = torch.randint(0, 9, (n,), generator=gen) * 7 - 20  # ids in {-20, -13, ..., 36}, unsorted
    rewards = torch.randint(0, 3, (n,), generator=gen).float() / 2  # ties and constant groups are likely
    lengths = torch.randint(0, t + 1, (n,), generator=gen)
    mask = (torch.arange(t)[None, :] < lengths[:, None]).float()
    adv = A.grpo(rewards, group, mask, scale=scale)
    ref = slow_grpo(rewards, group, mask, scale=scale)
    assert torch.allclose(adv.double(), ref, atol=1e-5)
    # property: per group, the per-response advantages sum to ~0 (they are centred on the group mean)
    per_response = A.grpo(rewards, group, torch.ones(n, 1), scale=scale)[:, 0]
    for gid in group.unique():
        assert abs(per_response[group == gid].sum().item()) < 1e-5


def test_segment_stats_over_tokens():
    values = torch.tensor([[1.0, 3.0, float("nan")], [5.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    ids = torch.tensor([[4, 4, 4], [8, 8, 8]])
    mean, std, count = A.segment_stats(values, ids, mask)
    # segment 4: valid {1, 3} -> mean 2, population std 1; segment 8: {5} -> mean 5, std 0
    assert torch.equal(mean, torch.tensor([[2.0, 2, 2], [5, 5, 5]], dtype=torch.float64))
    assert torch.equal(std, torch.tensor([[1.0, 1, 1], [0, 0, 0]], dtype=torch.float64))
    assert torch.equal(count, torch.tensor([[2.0, 2, 2], [1, 1, 1]], dtype=torch.float64))
    _, ustd, _ = A.segment_stats(values, ids, mask, unbiased=True)
    assert ustd[0, 0].item() == pytest.approx(math.sqrt(2.0))  # (1 + 1) / (2 - 1)


def test_registry_adapters():
    assert {"grpo", "dr_grpo"} <= set(names("estimator"))
    batch = RolloutBatch(rewards=torch.tensor([1.0, 0.0]), group=torch.tensor([3, 3]), mask=torch.ones(2, 2))
    cfg = AlgoConfig(adv_eps=0.5)
    # mean 0.5, unbiased std sqrt(0.5) = 0.7071068; A = 0.5 / (0.7071068 + 0.5) = 0.4142136
    assert get_advantage("grpo")(batch, cfg)[0, 0].item() == pytest.approx(0.5 / (math.sqrt(0.5) + 0.5))
    assert get_advantage("dr_grpo")(batch, cfg)[0, 0].item() == pytest.approx(0.5)
    with pytest.raises(KeyError, match="grpo"):
        get_advantage("nope")
