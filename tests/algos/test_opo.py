"""OPO (`algo.advantage: opo`, docs/methods.md §5p): hand-derived values, groups in any order, padding, groups of
one."""

from __future__ import annotations

import torch

from explorl.algos.batch import RolloutBatch
from explorl.algos.methods.opo import opo
from explorl.algos.registry import get
from explorl.config import load_config


def test_hand_derived_values_in_any_order_with_padding():
    # group 4: rewards 1, 0 with lengths 3, 1 -> baseline (3*1 + 1*0) / 4 = 0.75: A = 0.25, -0.75
    # group 9: rewards 2, 2, 5 with lengths 2, 2, 2 -> baseline 3 (the plain mean): A = -1, -1, 2
    # group 1 (one response) -> 0
    rewards = torch.tensor([2.0, 1.0, 5.0, 7.0, 0.0, 2.0])
    group = torch.tensor([9, 4, 9, 1, 4, 9])
    lengths = torch.tensor([2, 3, 2, 3, 1, 2])
    mask = (torch.arange(3)[None, :] < lengths[:, None]).float()
    want = torch.tensor([-1.0, 0.25, 2.0, 0.0, -0.75, -1.0])[:, None] * mask
    assert torch.equal(opo(rewards, group, mask), want)
    perm = torch.tensor([3, 5, 1, 0, 4, 2])
    assert torch.equal(opo(rewards[perm], group[perm] + 100, mask[perm]), want[perm])


def test_a_group_without_valid_tokens_gets_zero():
    mask = torch.tensor([[0.0, 0.0], [0.0, 0.0], [1.0, 0.0], [1.0, 1.0]])
    adv = opo(torch.tensor([1.0, 0.0, 1.0, 0.0]), torch.tensor([0, 0, 1, 1]), mask)
    # group 1: lengths 1, 2 -> baseline 1/3: A = 2/3, -1/3
    torch.testing.assert_close(adv, torch.tensor([[0.0, 0.0], [0.0, 0.0], [2 / 3, 0.0], [-1 / 3, -1 / 3]]))


def test_registered_and_selected_by_config():
    cfg = load_config(None, ["algo.advantage=opo"]).algo
    batch = RolloutBatch(mask=torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]]), rewards=torch.tensor([1.0, 0.0]),
                         group=torch.tensor([0, 0]))
    # baseline (3*1 + 0) / 4 = 0.75
    assert torch.equal(get("estimator", "opo")(batch, cfg), torch.tensor([[0.25, 0.25, 0.25], [-0.75, 0.0, 0.0]]))
