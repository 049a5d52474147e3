"""GPG (`algo.advantage: gpg`, docs/methods.md §5q): hand-derived values, groups in any order, padding, groups of
one, the option and its check."""

from __future__ import annotations

import pytest
import torch

from explorl.algos.batch import RolloutBatch
from explorl.algos.methods.gpg import gpg
from explorl.algos.registry import lookup
from explorl.config import ConfigError, load_config


def test_hand_derived_values_in_any_order_with_padding():
    # 6 responses, 3 nonzero rewards (1, 1, 3) -> alpha = 6 / 3 = 2
    # group 0: rewards 1, 0, 0 -> mean 1/3: A = 2 * 2/3 = 4/3, 2 * -1/3 = -2/3 (twice)
    # group 5: rewards 1, 0 -> mean 1/2: A = 1, -1;  group 2 (one response, reward 3) -> 0, but counts in alpha
    rewards = torch.tensor([0.0, 1.0, 3.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    group = torch.tensor([0, 5, 2, 0, 5, 0])
    mask = torch.tensor([[1, 1], [1, 0], [1, 1], [1, 1], [1, 1], [1, 0]], dtype=torch.float64)
    want = torch.tensor([-2 / 3, 1.0, 0.0, 4 / 3, -1.0, -2 / 3], dtype=torch.float64)[:, None] * mask
    torch.testing.assert_close(gpg(rewards, group, mask), want, rtol=0, atol=1e-15)
    perm = torch.tensor([4, 2, 0, 5, 1, 3])
    torch.testing.assert_close(gpg(rewards[perm], -group[perm], mask[perm]), want[perm], rtol=0, atol=1e-15)
    torch.testing.assert_close(gpg(rewards, group, mask, f_norm=4.0), want / 4, rtol=0, atol=1e-15)


def test_all_zero_rewards_give_zero():
    assert torch.equal(gpg(torch.zeros(4), torch.tensor([0, 0, 1, 1]), torch.ones(4, 3)), torch.zeros(4, 3))


def test_the_option_reaches_the_function_and_is_checked():
    cfg = load_config(None, ["algo.advantage=gpg", "algo.gpg.f_norm=2"]).algo
    batch = RolloutBatch(mask=torch.ones(2, 1), rewards=torch.tensor([1.0, 0.0]), group=torch.tensor([3, 3]))
    # alpha = 2 / 1 = 2; A = 2 * (+-0.5) / 2 = +-0.5
    assert torch.equal(lookup("estimator", "gpg").bind(cfg)(batch, cfg), torch.tensor([[0.5], [-0.5]]))
    with pytest.raises(ConfigError, match="algo.gpg.f_norm: must be > 0"):
        load_config(None, ["algo.advantage=gpg", "algo.gpg.f_norm=0"])
