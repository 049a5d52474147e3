"""The rollout/trainer mismatch figures (`explorl.algos.mismatch`), on batches worked out by hand; equality with
verl's own function is tests/integrations/test_verl_mismatch.py."""

from __future__ import annotations

import math

import pytest
import torch

from explorl.algos.mismatch import MISMATCH_KEYS, SAFETY_BOUND, mismatch_stats

L = math.log


def test_equal_logprobs_are_the_ideal_figures():
    lp = torch.log(torch.tensor([[0.5, 0.25, 0.9], [0.1, 0.7, 0.3]]))
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    s = mismatch_stats(lp, lp.clone(), mask)
    assert set(s) == set(MISMATCH_KEYS)
    for key in ("kl", "k3_kl", "log_ppl_diff", "log_ppl_abs_diff", "chi2_token", "ratio_oob", "ratio_low",
                "ratio_high"):
        assert s[key] == 0.0, key
    for key in ("ppl_ratio", "ratio_max", "ratio_min", "ess"):
        assert s[key] == 1.0, key
    assert s["training_ppl"] == s["rollout_ppl"] == pytest.approx((1 / (0.5 * 0.25 * 0.9) ** (1 / 3)
                                                                   + 1 / (0.1 * 0.7) ** 0.5) / 2)
    assert s["tokens"] == 5.0


def test_a_batch_worked_out_by_hand():
    # response 0: two tokens, the trainer gives the second 0.5 where the sampler said 0.25 (ratio 2);
    # response 1: one token, equal; its padding holds nan and -inf, which must not count
    train = torch.tensor([[L(0.5), L(0.5)], [L(0.8), float("nan")]])
    roll = torch.tensor([[L(0.5), L(0.25)], [L(0.8), float("-inf")]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    s = mismatch_stats(train, roll, mask)
    # d = log p_trainer - log p_rollout = [0, log 2, 0], rho = [1, 2, 1]
    assert s["kl"] == pytest.approx(-L(2) / 3)
    assert s["k3_kl"] == pytest.approx((2 - L(2) - 1) / 3)
    assert s["chi2_token"] == pytest.approx((1 + 4 + 1) / 3 - 1)
    assert (s["ratio_oob"], s["ratio_high"], s["ratio_low"]) == pytest.approx((1 / 3, 1 / 3, 0.0))
    assert (s["ratio_max"], s["ratio_min"]) == pytest.approx((2.0, 1.0))
    assert s["ess"] == pytest.approx((4 / 3) ** 2 / 2)  # mean(rho)^2 / mean(rho^2) = 8/9
    # per response: mean log p_trainer = [log .5, log .8], mean log p_rollout = [1.5 log .5, log .8]
    assert s["training_ppl"] == pytest.approx((2.0 + 1.25) / 2)
    assert s["rollout_ppl"] == pytest.approx((2 ** 1.5 + 1.25) / 2)
    assert s["training_log_ppl"] == pytest.approx((L(2) - L(0.8)) / 2)
    assert s["rollout_log_ppl"] == pytest.approx((1.5 * L(2) - L(0.8)) / 2)
    assert s["log_ppl_diff"] == pytest.approx(-0.25 * L(2))
    assert s["log_ppl_abs_diff"] == pytest.approx(0.25 * L(2))
    assert s["ppl_ratio"] == pytest.approx((2 ** -0.5 + 1) / 2)
    assert s["tokens"] == 3.0


def test_top_p_renormalisation_the_trainer_does_not_apply_gives_ratios_of_the_nucleus_mass():
    # a sampler that renormalises over a nucleus of mass Z returns log p - log Z: every ratio is Z <= 1, the k1 KL
    # is mean(-log Z) and the ratios outside [0.9, 1.1] are those of nuclei lighter than 0.9
    p = torch.tensor([[0.4, 0.3, 0.2]])
    z = torch.tensor([[0.95, 0.85, 1.0]])
    s = mismatch_stats(torch.log(p), torch.log(p / z), torch.ones(1, 3))
    assert s["kl"] == pytest.approx(float(-torch.log(z).mean()))
    assert s["ratio_max"] == pytest.approx(1.0) and s["ratio_min"] == pytest.approx(0.85)
    assert (s["ratio_oob"], s["ratio_low"], s["ratio_high"]) == pytest.approx((1 / 3, 1 / 3, 0.0))


def test_bounds_and_the_safety_clamp():
    train = torch.tensor([[0.0, -50.0, L(1.05)]])
    roll = torch.tensor([[-50.0, 0.0, 0.0]])
    s = mismatch_stats(train, roll, torch.ones(1, 3), low=0.5, high=1.01)
    assert s["ratio_max"] == pytest.approx(math.exp(SAFETY_BOUND))
    assert s["ratio_min"] == pytest.approx(math.exp(-SAFETY_BOUND))
    assert (s["ratio_high"], s["ratio_low"]) == pytest.approx((2 / 3, 1 / 3))
    assert all(math.isfinite(v) for v in s.values())


def test_float32_and_bfloat16_inputs_are_measured_in_float64():
    g = torch.Generator().manual_seed(0)
    lp = -torch.rand(4, 6, generator=g) * 3
    mask = torch.ones(4, 6)
    s32 = mismatch_stats(lp, lp + 1e-4, mask)
    assert s32["kl"] == pytest.approx(1e-4, rel=1e-2)
    sbf = mismatch_stats(lp.bfloat16(), (lp + 0.05).bfloat16(), mask)
    assert sbf["kl"] > 0 and sbf["k3_kl"] > 0


def test_refusals():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="shapes differ"):
        mismatch_stats(x, torch.zeros(2, 4), x)
    with pytest.raises(ValueError, match=r"\[N, T\]"):
        mismatch_stats(torch.zeros(3), torch.zeros(3), torch.ones(3))
    with pytest.raises(ValueError, match="no token"):
        mismatch_stats(x, x, torch.zeros(2, 3))
