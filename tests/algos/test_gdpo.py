"""GDPO (`algo.advantage: gdpo`, docs/methods.md §5r): hand-derived values, several components, groups in any
order, padding, groups of one, and the refusal of a config whose reward has several functions."""

from __future__ import annotations

import math

import pytest
import torch

from explorl.algos.batch import RolloutBatch
from explorl.algos.methods.gdpo import gdpo
from explorl.algos.methods.grpo import grpo
from explorl.algos.methods.reinforce_pp import batch_whiten
from explorl.algos.registry import lookup
from explorl.config import ConfigError, load_config

F64 = torch.float64


def test_one_component_without_std_hand_derived():
    # group 1: rewards 1, 0 (one token each) -> centred 0.5, -0.5; group 6 (one response, 2 tokens) -> 0
    # tokens 0.5 | -0.5 | 0, 0: mean 0, unbiased var 0.5 / 3 = 1/6 -> A = value / sqrt(1/6 + 1e-8)
    rewards = torch.tensor([1.0, 4.0, 0.0], dtype=F64)
    group = torch.tensor([1, 6, 1])
    mask = torch.tensor([[1, 0], [1, 1], [1, 0]], dtype=F64)
    s = math.sqrt(1 / 6 + 1e-8)
    want = torch.tensor([[0.5 / s, 0], [0, 0], [-0.5 / s, 0]], dtype=F64)
    torch.testing.assert_close(gdpo(rewards, group, mask, scale=False), want, rtol=0, atol=1e-14)
    perm = torch.tensor([1, 2, 0])
    torch.testing.assert_close(gdpo(rewards[perm], group[perm] - 9, mask[perm], scale=False), want[perm],
                               rtol=0, atol=1e-14)


def test_components_are_normalised_apart_then_weighted():
    # components (1, 0) and (0, 1) in one group, weights 1 and 2, no std: 0.5 - 2 * 0.5 = -0.5 and -0.5 + 2 * 0.5 =
    # 0.5; tokens -0.5 | 0.5: mean 0, unbiased var 0.5 -> A = -+0.5 / sqrt(0.5 + 1e-8)
    comps = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=F64)
    mask = torch.ones(2, 1, dtype=F64)
    a = 0.5 / math.sqrt(0.5 + 1e-8)
    got = gdpo(comps, torch.tensor([0, 0]), mask, weights=[1.0, 2.0], scale=False)
    torch.testing.assert_close(got, torch.tensor([[-a], [a]], dtype=F64), rtol=0, atol=1e-14)
    # with the std: each component's z-score is +-0.5 / (std + eps), std = sqrt(0.5); the whitening removes the scale
    got = gdpo(comps, torch.tensor([0, 0]), mask, weights=[1.0, 2.0])
    z = 0.5 / (math.sqrt(0.5) + 1e-6)
    b = z / math.sqrt(2 * z * z + 1e-8)
    torch.testing.assert_close(got, torch.tensor([[-b], [b]], dtype=F64), rtol=0, atol=1e-14)
    with pytest.raises(ValueError, match="1 weight"):
        gdpo(comps, torch.tensor([0, 0]), mask, weights=[1.0])


def test_one_component_is_grpo_whitened_over_the_batch():
    g = torch.Generator().manual_seed(3)
    rewards = (torch.rand(12, generator=g) > 0.5).to(F64)
    group = torch.randint(0, 4, (12,), generator=g)
    mask = (torch.arange(5)[None, :] < torch.randint(1, 6, (12,), generator=g)[:, None]).to(F64)
    want = batch_whiten(grpo(rewards, group, mask), mask)
    torch.testing.assert_close(gdpo(rewards, group, mask), want, rtol=0, atol=0)


def test_selected_by_config_and_refused_with_several_reward_functions():
    cfg = load_config(None, ["algo.advantage=gdpo", "algo.gdpo.norm_adv_by_std=false"]).algo
    batch = RolloutBatch(mask=torch.ones(3, 2), rewards=torch.tensor([1.0, 0.0, 2.0]), group=torch.tensor([0, 0, 1]))
    got = lookup("estimator", "gdpo").bind(cfg)(batch, cfg)
    assert torch.equal(got, gdpo(batch.rewards, batch.group, batch.mask, scale=False))
    with pytest.raises(ConfigError, match="gdpo normalises each reward component"):
        load_config(None, ["algo.advantage=gdpo", "task.reward=[auto,exact]"])
