"""QAE (docs/methods.md §5u): hand-derived quantile baselines and advantages, both interpolations against an
independent loop (and `torch.quantile`), the two-regime gate on 0/1 rewards, the registered estimator and its
options."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from explorl.algos.batch import RolloutBatch
from explorl.algos.methods.grpo import grpo
from explorl.algos.methods.qae import group_quantile, qae
from explorl.algos.registry import lookup
from explorl.config import ConfigError, load_config

F64 = torch.float64


def test_hand_derived_baselines_and_advantages():
    # group 4: rewards [1, 1, 0, 1, 1, 0, 1, 0] (8 responses, 5 correct, p = 0.625), K = 0.4
    #   inverse_cdf: ceil(0.4 * 8) = ceil(3.2) = 4th smallest of [0, 0, 0, 1, 1, 1, 1, 1] -> 1 (p > 1 - K = 0.6)
    #   linear: position 0.4 * 7 = 2.8 -> sorted[2] * 0.2 + sorted[3] * 0.8 = 0.8
    #   unbiased std: mean 0.625, sum of squares 5 * 0.375^2 + 3 * 0.625^2 = 1.875, / 7 -> sqrt(0.267857) = 0.517549
    # group 2: rewards [0, 1, 0, 0] (p = 0.25 <= 0.6): inverse_cdf ceil(1.6) = 2nd smallest = 0; linear 0.4 * 3 = 1.2
    #   -> sorted[1] * 0.8 + sorted[2] * 0.2 = 0; unbiased std sqrt((3 * 0.25^2 + 0.75^2) / 3) = 0.5
    # group 7: one response -> 0
    rewards = torch.tensor([1, 1, 0, 1, 1, 0, 1, 0, 0, 1, 0, 0, 1], dtype=F64)
    group = torch.tensor([4] * 8 + [2] * 4 + [7])
    mask = torch.ones(13, 2, dtype=F64)
    b = group_quantile(rewards, group, 0.4)
    assert torch.equal(b, torch.tensor([1.0] * 8 + [0.0] * 4 + [1.0], dtype=F64))
    b_lin = group_quantile(rewards, group, 0.4, interpolation="linear")
    assert torch.allclose(b_lin, torch.tensor([0.8] * 8 + [0.0] * 4 + [1.0], dtype=F64), atol=1e-12)
    std4, std2 = math.sqrt(1.875 / 7), 0.5
    adv = qae(rewards, group, mask, k=0.4)[:, 0]
    # easy prompt (group 4): the correct responses get 0, the wrong ones -1 / std; hard prompt (group 2): the reverse
    want = [0, 0, -1 / (std4 + 1e-6), 0, 0, -1 / (std4 + 1e-6), 0, -1 / (std4 + 1e-6), 0, 1 / (std2 + 1e-6), 0, 0, 0]
    assert torch.allclose(adv, torch.tensor(want, dtype=F64), atol=1e-12)
    lin = qae(rewards, group, mask, k=0.4, interpolation="linear", scale=False)[:, 0]
    want_lin = [0.2, 0.2, -0.8, 0.2, 0.2, -0.8, 0.2, -0.8, 0, 1, 0, 0, 0]
    assert torch.allclose(lin, torch.tensor(want_lin, dtype=F64), atol=1e-12)


def _loop_reference(rewards, group, k, interpolation):
    """The K-quantile of each group by its definition, one group at a time in Python."""
    out = []
    for i in range(len(rewards)):
        xs = sorted(float(rewards[j]) for j in range(len(rewards)) if group[j] == group[i])
        n = len(xs)
        if interpolation == "inverse_cdf":  # the smallest x with #{x_j <= x} / n >= k
            out.append(next(x for x in xs if sum(y <= x for y in xs) / n >= k))
        else:
            out.append(float(torch.quantile(torch.tensor(xs, dtype=F64), k)))
    return torch.tensor(out, dtype=F64)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), k=st.sampled_from([0.1, 0.25, 0.4, 0.5, 0.6, 0.75, 0.9, 0.999]),
       interpolation=st.sampled_from(["inverse_cdf", "linear"]), binary=st.booleans())
def test_quantile_equals_the_loop_reference(seed, k, interpolation, binary):
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, 20, (1,), generator=g))
    rewards = (torch.rand(n, generator=g) > 0.5).to(F64) if binary else torch.randint(0, 4, (n,), generator=g).to(F64)
    group = torch.randint(0, 4, (n,), generator=g) * 7 - 3  # any ids, any order
    got = group_quantile(rewards, group, k, interpolation=interpolation)
    assert torch.allclose(got, _loop_reference(rewards, group, k, interpolation), atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), k=st.sampled_from([0.2, 0.4, 0.6, 0.8]))
def test_two_regime_gate_on_binary_rewards(seed, k):
    # eq. 4: baseline 0 when p <= 1 - K (only successes get an advantage, > 0), 1 otherwise (only failures, < 0)
    g = torch.Generator().manual_seed(seed)
    rewards = (torch.rand(32, generator=g) > torch.rand(1, generator=g)).to(F64)
    group = torch.arange(32) // 8
    adv = qae(rewards, group, torch.ones(32, 1, dtype=F64), k=k)[:, 0]
    for q in range(4):
        rows = group == q
        p = float(rewards[rows].mean())
        if p in (0.0, 1.0):
            assert torch.equal(adv[rows], torch.zeros(8, dtype=F64))
        elif p <= 1 - k + 1e-12:
            assert (adv[rows][rewards[rows] == 0] == 0).all() and (adv[rows][rewards[rows] == 1] > 0).all()
        else:
            assert (adv[rows][rewards[rows] == 1] == 0).all() and (adv[rows][rewards[rows] == 0] < 0).all()


def test_k_one_half_on_symmetric_groups_is_not_the_mean_but_the_median():
    # a group [0, 1]: inverse_cdf K 0.5 -> ceil(1) = 1st smallest = 0 (the mean would be 0.5)
    rewards, group, mask = torch.tensor([0.0, 1.0], dtype=F64), torch.tensor([0, 0]), torch.ones(2, 1, dtype=F64)
    assert torch.equal(group_quantile(rewards, group, 0.5), torch.zeros(2, dtype=F64))
    # linear K 0.5 on [0, 1] is 0.5, the mean: then QAE is GRPO
    assert torch.allclose(qae(rewards, group, mask, k=0.5, interpolation="linear"), grpo(rewards, group, mask))


def test_registered_reads_options_and_eps_and_pads_with_zero():
    cfg = load_config(None, ["algo.advantage=qae", "algo.qae.k=0.4", "algo.adv_eps=0.5"]).algo
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 1.0]])
    batch = RolloutBatch(mask=mask, rewards=torch.tensor([0.0, 1.0, 0.0, 0.0]), group=torch.tensor([0, 0, 0, 0]))
    got = lookup("estimator", "qae").bind(cfg)(batch, cfg)
    # p = 0.25 <= 0.6: baseline 0; unbiased std of [0, 1, 0, 0] = 0.5; advantage of the success 1 / (0.5 + 0.5) = 1
    assert torch.equal(got, torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 0.0], [0.0, 0.0]]))
    assert lookup("estimator", "qae").needs_old_logprobs is False


@pytest.mark.parametrize("overrides, message", [
    (["algo.advantage=qae", "algo.qae.k=1.0"], r"algo.qae.k: must be in \(0, 1\)"),
    (["algo.advantage=qae", "algo.qae.k=0"], r"algo.qae.k: must be in \(0, 1\)"),
    (["algo.advantage=qae", "algo.qae.interpolation=nearest"], "algo.qae.interpolation: must be one of"),
])
def test_configuration_errors_name_the_field(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_the_recipe_is_dapo_with_the_quantile_baseline():
    cfg = load_config(Path(__file__).resolve().parents[2] / "configs" / "recipes" / "qae.yaml")
    a = cfg.algo
    assert (a.advantage, a.options["qae"].k, a.options["qae"].interpolation, a.loss_agg, a.eps_low, a.eps_high,
            a.reward_shapers, a.mini_batches * a.epochs, cfg.budget.policy) == (
        "qae", 0.4, "inverse_cdf", "token-mean", 0.2, 0.28, ["dapo_overlong"], 16, "dapo")
