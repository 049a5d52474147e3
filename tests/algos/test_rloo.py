"""RLOO (`algo.advantage: rloo`, docs/methods.md §5n): hand-derived values, groups in any order, padding, groups of
one."""

from __future__ import annotations

import torch

from explorl.algos.batch import RolloutBatch
from explorl.algos.methods.rloo import rloo
from explorl.algos.registry import get, lookup
from explorl.config import load_config


def test_hand_derived_values_in_any_order_with_padding():
    # group 7: rewards 1, 0, 0 -> 1 - (0 + 0) / 2 = 1; 0 - (1 + 0) / 2 = -0.5 (twice)
    # group 3: rewards 2, 4 -> 2 - 4 = -2, 4 - 2 = 2;  group 5 (one response) -> 0
    rewards = torch.tensor([0.0, 2.0, 1.0, 9.0, 4.0, 0.0])
    group = torch.tensor([7, 3, 7, 5, 3, 7])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 1], [1, 1, 0], [1, 0, 0]], dtype=torch.float32)
    want = torch.tensor([-0.5, -2.0, 1.0, 0.0, 2.0, -0.5])[:, None] * mask
    assert torch.equal(rloo(rewards, group, mask), want)
    perm = torch.tensor([5, 3, 0, 4, 2, 1])  # any order of the rows, any group ids
    assert torch.equal(rloo(rewards[perm], group[perm] * 11 - 4, mask[perm]), want[perm])


def test_groups_sum_to_zero_and_equal_scaled_group_centring():
    g = torch.Generator().manual_seed(0)
    rewards, group = torch.rand(20, generator=g, dtype=torch.float64), torch.randint(0, 4, (20,), generator=g)
    adv = rloo(rewards, group, torch.ones(20, 2, dtype=torch.float64))[:, 0]
    for k in group.unique():
        rows = group == k
        n = int(rows.sum())
        assert abs(float(adv[rows].sum())) < 1e-12
        torch.testing.assert_close(adv[rows], n / (n - 1) * (rewards[rows] - rewards[rows].mean()))


def test_registered_and_selected_by_config():
    cfg = load_config(None, ["algo.advantage=rloo"]).algo
    batch = RolloutBatch(mask=torch.ones(3, 2), rewards=torch.tensor([1.0, 0.0, 5.0]), group=torch.tensor([0, 0, 1]))
    want = torch.tensor([[1.0, 1.0], [-1.0, -1.0], [0.0, 0.0]])
    assert torch.equal(get("estimator", "rloo")(batch, cfg), want)
    assert torch.equal(lookup("estimator", "rloo").bind(cfg)(batch, cfg), want)
    assert lookup("estimator", "rloo").needs_old_logprobs is False
