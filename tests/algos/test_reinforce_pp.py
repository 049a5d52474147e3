"""REINFORCE++ and REINFORCE++-baseline (`algo.advantage: reinforce_plus_plus`, `reinforce_plus_plus_baseline`,
docs/methods.md §5o): hand-derived values, groups in any order, padding, groups of one, the option and its check."""

from __future__ import annotations

import math

import pytest
import torch

from explorl.algos.batch import RolloutBatch
from explorl.algos.methods.reinforce_pp import batch_whiten, reinforce_plus_plus, reinforce_plus_plus_baseline
from explorl.algos.registry import lookup
from explorl.config import ConfigError, load_config

F64 = torch.float64


def test_reinforce_plus_plus_hand_derived_gamma_one():
    # rewards 1, 0, 1 with lengths 1, 2, 1: the valid tokens carry 1 | 0, 0 | 1 -> mean 0.5,
    # unbiased var 4 * 0.25 / 3 = 1/3 -> A = +-0.5 / sqrt(1/3 + 1e-8); groups play no part
    mask = torch.tensor([[1, 0], [1, 1], [1, 0]], dtype=F64)
    a = 0.5 / math.sqrt(1 / 3 + 1e-8)
    want = torch.tensor([[a, 0.0], [-a, -a], [a, 0.0]], dtype=F64)
    torch.testing.assert_close(reinforce_plus_plus(torch.tensor([1.0, 0.0, 1.0], dtype=F64), mask), want,
                               rtol=0, atol=1e-14)


def test_reinforce_plus_plus_hand_derived_discount():
    # gamma 0.5, rewards 1, 0, lengths 2, 1: returns 0.5 (one valid token after it), 1 | 0 -> mean 0.5,
    # unbiased var (0 + 0.25 + 0.25) / 2 = 0.25 -> A = (0, 0.5 / s | -0.5 / s), s = sqrt(0.25 + 1e-8)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=F64)
    s = math.sqrt(0.25 + 1e-8)
    want = torch.tensor([[0.0, 0.5 / s, 0.0], [-0.5 / s, 0.0, 0.0]], dtype=F64)
    got = reinforce_plus_plus(torch.tensor([1.0, 0.0], dtype=F64), mask, gamma=0.5)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-14)
    # gamma 0: only the last token carries the reward: 0 | 1 | 0 -> the same whitening, rows swapped in place
    got = reinforce_plus_plus(torch.tensor([1.0, 0.0], dtype=F64), mask, gamma=0.0)
    a, b = -(1 / 3) / math.sqrt(1 / 3 + 1e-8), (2 / 3) / math.sqrt(1 / 3 + 1e-8)
    torch.testing.assert_close(got, torch.tensor([[a, b, 0.0], [a, 0.0, 0.0]], dtype=F64), rtol=0, atol=1e-14)


def test_baseline_hand_derived_in_any_order_with_a_group_of_one():
    # group 2: rewards 1, 0, lengths 1, 3 -> centred 0.5, -0.5; group 8 (one response, length 2) -> 0 (its own mean)
    # tokens 0.5 | -0.5 x3 | 0 x2: mean -1/6; deviations 2/3, -1/3 (x3), 1/6 (x2);
    # sum of squares 4/9 + 3/9 + 2/36 = 5/6, unbiased var 1/6 -> A = deviation / sqrt(1/6 + 1e-8)
    rewards = torch.tensor([1.0, 5.0, 0.0], dtype=F64)
    group = torch.tensor([2, 8, 2])
    lengths = torch.tensor([1, 2, 3])
    mask = (torch.arange(4)[None, :] < lengths[:, None]).to(F64)
    s = math.sqrt(1 / 6 + 1e-8)
    want = torch.tensor([[2 / 3, 0, 0, 0], [1 / 6, 1 / 6, 0, 0], [-1 / 3, -1 / 3, -1 / 3, 0]], dtype=F64) / s
    torch.testing.assert_close(reinforce_plus_plus_baseline(rewards, group, mask), want, rtol=0, atol=1e-14)
    perm = torch.tensor([2, 0, 1])
    torch.testing.assert_close(reinforce_plus_plus_baseline(rewards[perm], group[perm] * 3, mask[perm]), want[perm],
                               rtol=0, atol=1e-14)


def test_fewer_than_two_valid_tokens_give_zero():
    mask = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    assert torch.equal(reinforce_plus_plus(torch.tensor([3.0, 1.0]), mask), torch.zeros(2, 2))
    assert torch.equal(batch_whiten(torch.ones(2, 2), torch.zeros(2, 2)), torch.zeros(2, 2, dtype=F64))


def test_selected_by_config_with_the_option_checked():
    cfg = load_config(None, ["algo.advantage=reinforce_plus_plus", "algo.reinforce_plus_plus.gamma=0.5"]).algo
    batch = RolloutBatch(mask=torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]), rewards=torch.tensor([1.0, 0.0]),
                         group=torch.tensor([0, 0]))
    got = lookup("estimator", "reinforce_plus_plus").bind(cfg)(batch, cfg)
    assert torch.equal(got, reinforce_plus_plus(batch.rewards, batch.mask, gamma=0.5))
    with pytest.raises(ConfigError, match=r"algo.reinforce_plus_plus.gamma: must be in \[0, 1\]"):
        load_config(None, ["algo.advantage=reinforce_plus_plus", "algo.reinforce_plus_plus.gamma=1.5"])
    cfg = load_config(None, ["algo.advantage=reinforce_plus_plus_baseline"]).algo
    got = lookup("estimator", "reinforce_plus_plus_baseline").bind(cfg)(batch, cfg)
    assert torch.equal(got, reinforce_plus_plus_baseline(batch.rewards, batch.group, batch.mask))
    assert got.dtype == torch.float32 and got[0, 2] == 0 and got[1, 1] == 0
