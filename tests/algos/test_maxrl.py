"""MaxRL (docs/methods.md §5x): hand-derived advantages (Algorithm 1), eq. 11's score weights r_i / K - 1 / N, the
groups without success or with one response, the registered estimator and the recipe."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from explorl.algos.batch import RolloutBatch
from explorl.algos.methods.maxrl import maxrl
from explorl.algos.registry import lookup
from explorl.config import ConfigError, load_config

F64 = torch.float64


def test_hand_derived_values():
    # group 5: rewards [1, 0, 0, 0] -> mu 0.25: correct (1 - 0.25) / 0.25 = 3, wrong -0.25 / 0.25 = -1
    # group 1: rewards [1, 1, 0, 1] -> mu 0.75: correct 0.25 / 0.75 = 1/3, wrong -1
    # group 8: all wrong -> mu 0 -> 0 (no gradient); group 2: one response -> 0
    rewards = torch.tensor([1, 0, 0, 0, 1, 1, 0, 1, 0, 0, 1], dtype=F64)
    group = torch.tensor([5, 5, 5, 5, 1, 1, 1, 1, 8, 8, 2])
    mask = torch.ones(11, 3, dtype=F64)
    mask[1, 2] = 0
    want = torch.tensor([3, -1, -1, -1, 1 / 3, 1 / 3, -1, 1 / 3, 0, 0, 0], dtype=F64)[:, None] * mask
    assert torch.allclose(maxrl(rewards, group, mask, eps=0.0), want, atol=1e-12)
    assert torch.allclose(maxrl(rewards, group, mask), want, atol=1e-5)  # eps 1e-6 in the denominator
    assert maxrl(rewards, group, mask)[1, 2] == 0.0


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(2, 16))
def test_the_score_weights_are_r_over_k_minus_one_over_n(seed, n):
    # eq. 11: (1 / N) sum_i A_i S_i = sum_i (r_i / K - 1 / N) S_i with K the successes, for K >= 1
    g = torch.Generator().manual_seed(seed)
    rewards = (torch.rand(n, generator=g) > 0.7).to(F64)
    k = float(rewards.sum())
    adv = maxrl(rewards, torch.zeros(n, dtype=torch.long), torch.ones(n, 1, dtype=F64), eps=0.0)[:, 0]
    if k == 0:
        assert torch.equal(adv, torch.zeros(n, dtype=F64))
    else:
        assert torch.allclose(adv / n, rewards / k - 1 / n, atol=1e-12)
        assert abs(float(adv.sum())) < 1e-9  # zero-mean over the group: the control variate keeps it unbiased


def test_registered_with_its_option():
    cfg = load_config(None, ["algo.advantage=maxrl", "algo.maxrl.eps=0"]).algo
    batch = RolloutBatch(mask=torch.ones(3, 2), rewards=torch.tensor([1.0, 0.0, 0.0]), group=torch.tensor([0, 0, 0]))
    got = lookup("estimator", "maxrl").bind(cfg)(batch, cfg)
    assert torch.allclose(got, torch.tensor([[2.0, 2.0], [-1.0, -1.0], [-1.0, -1.0]]))
    assert lookup("estimator", "maxrl").needs_old_logprobs is False
    with pytest.raises(ConfigError, match="algo.maxrl.eps: must be >= 0"):
        load_config(None, ["algo.advantage=maxrl", "algo.maxrl.eps=-1"])


def test_the_recipe_is_the_papers_on_policy_setting():
    a = load_config(Path(__file__).resolve().parents[2] / "configs" / "recipes" / "maxrl.yaml").algo
    assert (a.advantage, a.loss_agg, a.kl_coef, a.entropy_coef, a.mini_batches * a.epochs) == (
        "maxrl", "token-mean", 0.0, 0.0, 1)
