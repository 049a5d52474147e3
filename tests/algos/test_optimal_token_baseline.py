"""The optimal token baseline (docs/methods.md §5s): hand-derived values, groups in any order, padding, groups of
one, the zero tail; what it asks of the step (`sum_pi_squared` from pi_old's forward, no single-update shortcut) and
its error on a batch without `sum_pi_squared`."""

from __future__ import annotations

import math

import pytest
import torch

from explorl.algos.batch import MissingInputError, RolloutBatch
from explorl.algos.methods.optimal_token_baseline import OptimalTokenBaselineOptions, optimal_token_baseline
from explorl.algos.registry import get
from explorl.algos.step import compute_advantages, requirements, single_update_shortcut
from explorl.config import AlgoConfig, load_config

F64 = torch.float64
EPS = 1e-8


def _inputs():
    # group 4: responses of lengths 2 and 1, rewards 1 and 0; group 0: one response (reward 3, length 1)
    # every token: pi = 0.5 and sum_v pi^2 = 0.5, so w = 1 - 2 * 0.5 + 0.5 = 0.5 and W = 0.5, 1.0 along a response
    rewards = torch.tensor([1.0, 3.0, 0.0], dtype=F64)
    group = torch.tensor([4, 0, 4])
    mask = torch.tensor([[1, 1], [1, 0], [1, 0]], dtype=F64)
    logprobs = torch.full((3, 2), math.log(0.5), dtype=F64)
    return rewards, group, mask, logprobs, torch.full((3, 2), 0.5, dtype=F64)


def test_hand_derived_values_with_and_without_the_zero_tail():
    rewards, group, mask, lp, s2 = _inputs()
    # column 0 of group 4: B = (1 * 0.5 + 0 * 0.5) / (0.5 + 0.5 + eps); A = 1 - B, 0 - B
    b0 = 0.5 / (1.0 + EPS)
    # column 1: only the first response is valid: B = 1 * 1.0 / (1.0 + eps), unless the zero tail (its unique
    # longest response beyond the second-longest, length 1) sets it to 0: A = 1
    b1 = 1.0 / (1.0 + EPS)
    want = torch.tensor([[1 - b0, 1.0], [0.0, 0.0], [-b0, 0.0]], dtype=F64)  # the group of one gets 0
    torch.testing.assert_close(optimal_token_baseline(rewards, group, mask, lp, s2), want, rtol=0, atol=1e-15)
    want[0, 1] = 1 - b1
    got = optimal_token_baseline(rewards, group, mask, lp, s2, handle_zero_tail=False)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-15)
    perm = torch.tensor([2, 0, 1])
    got = optimal_token_baseline(rewards[perm], group[perm] + 5, mask[perm], lp[perm], s2[perm],
                                 handle_zero_tail=False)
    torch.testing.assert_close(got, want[perm], rtol=0, atol=1e-15)


def test_importance_weights_scale_the_path_variance():
    rewards, group, mask, lp, s2 = _inputs()
    # weight 2 on the first response's tokens: w = 0.5 * 4 = 2, W = 2, 4; the second's stays 0.5
    isw = torch.tensor([[2.0, 2.0], [1.0, 1.0], [1.0, 1.0]], dtype=F64)
    b0 = 2.0 / (2.5 + EPS)
    got = optimal_token_baseline(rewards, group, mask, lp, s2, is_weights=isw)
    torch.testing.assert_close(got[:, 0], torch.tensor([1 - b0, 0.0, -b0], dtype=F64), rtol=0, atol=1e-15)


def test_equal_lengths_have_no_tail_and_a_flat_proxy_gives_the_group_mean():
    # all w equal and equal lengths: B_t = mean reward of the group (up to eps)
    mask = torch.ones(3, 4, dtype=F64)
    rewards = torch.tensor([1.0, 0.0, 0.0], dtype=F64)
    got = optimal_token_baseline(rewards, torch.zeros(3, dtype=torch.long), mask, torch.full((3, 4), -1.0, dtype=F64),
                                 torch.full((3, 4), 0.3, dtype=F64))
    torch.testing.assert_close(got, (rewards - 1 / 3)[:, None].expand(3, 4), rtol=0, atol=1e-7)


def test_the_step_fills_sum_pi_squared_and_the_adapter_needs_it():
    cfg = load_config(None, ["algo.advantage=optimal_token_baseline"]).algo  # accepted at validation now
    needs = requirements(cfg)
    assert needs.sum_pi_squared and needs.old_logprobs and not single_update_shortcut(cfg, True)
    assert not requirements(AlgoConfig()).sum_pi_squared  # only the entries that declare it ask for the forward's
    rewards, group, mask, lp, s2 = _inputs()
    batch = RolloutBatch(mask=mask, rewards=rewards, group=group, logprobs=lp)
    with pytest.raises(MissingInputError, match="optimal_token_baseline needs .*sum_pi_squared"):
        get("estimator", "optimal_token_baseline")(batch, AlgoConfig(), options=OptimalTokenBaselineOptions())
    got = compute_advantages(batch.replace(sum_pi_squared=s2), cfg, step=1).advantages
    torch.testing.assert_close(got, optimal_token_baseline(rewards, group, mask, lp, s2).to(got.dtype))


def test_tir_variant_is_otb_on_each_responses_valid_tokens_regrouped():
    # contiguous masks (explorl's sampler's): the same as optimal_token_baseline, exactly
    from explorl.algos.methods.optimal_token_baseline import tir_optimal_token_baseline

    g = torch.Generator().manual_seed(5)
    mask = (torch.arange(6)[None, :] < torch.tensor([6, 4, 5, 2, 6, 3])[:, None]).to(torch.float64)
    rewards, group = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0], dtype=torch.float64), torch.tensor([0, 0, 0, 1, 1, 1])
    logprobs = -torch.rand(mask.shape, generator=g, dtype=torch.float64) * mask
    s2 = torch.rand(mask.shape, generator=g, dtype=torch.float64) * 0.5 * mask
    otb = optimal_token_baseline(rewards, group, mask, logprobs, s2)
    assert torch.equal(tir_optimal_token_baseline(rewards, group, mask, logprobs, s2), otb)
    # a hole at columns 1-2 of response 0 (6 tokens -> 4 valid): its k-th valid token is column [0, 3, 4, 5][k], so
    # its advantages there are those of the contiguous 4-token response, and 0 in the hole
    holed = mask.clone()
    holed[0, 1:3] = 0.0
    packed = mask.clone()
    packed[0, 4:] = 0.0
    moved = lambda x: torch.cat([x[:1, [0, 3, 4, 5]], torch.zeros(1, 2, dtype=x.dtype)], 1)  # noqa: E731
    lp2, s22 = logprobs.clone(), s2.clone()
    lp2[:1], s22[:1] = moved(logprobs), moved(s2)
    want = optimal_token_baseline(rewards, group, packed, lp2, s22)
    got = tir_optimal_token_baseline(rewards, group, holed, logprobs, s2)
    assert torch.equal(got[0, [0, 3, 4, 5]], want[0, :4]) and torch.all(got[0, 1:3] == 0)
    assert torch.equal(got[1:], want[1:])
