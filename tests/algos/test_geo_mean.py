"""GMPO (docs/methods.md §5k): values derived by hand, loss and gradient equal to an independent reference that
computes the objective one response at a time, the rollout weights' reduction, and the check's refusals. verl
0.9.1's own function is compared in tests/integrations/test_verl.py."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from explorl.algos.aggregation import Reduction
from explorl.algos.batch import RolloutBatch
from explorl.algos.methods.geo_mean import clipped_log_ratio, geo_mean_loss, sequence_weights
from explorl.algos.registry import lookup
from explorl.config import AlgoConfig, ConfigError, load_config

D = torch.float64


def _batch():
    # row 0: A = +1 on 2 tokens (a third is padding), log-ratios 0.6 and -0.2; clip 0.4/0.4 in log space, one-sided
    #   for A > 0: min(0.6, 0.4) = 0.4, -0.2 stays -> mean 0.1, ratio e^0.1 = 1.1051709, term -1.1051709
    # row 1: A = -1 on 3 tokens, log-ratios -0.6, 0.3, 0: for A < 0 max(x, -0.4): -0.4, 0.3, 0 -> mean -1/30,
    #   ratio e^(-1/30) = 0.9672161, term +0.9672161
    # seq-mean-token-mean: (-1.1051709 + 0.9672161) / 2 = -0.0689774
    old = torch.zeros(2, 3, dtype=D)
    new = torch.tensor([[0.6, -0.2, 5.0], [-0.6, 0.3, 0.0]], dtype=D, requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    adv = torch.tensor([[1.0, 1.0, 0.0], [-1.0, -1.0, -1.0]], dtype=D)
    return old, new, adv, mask


def test_a_hand_derived_batch():
    old, new, adv, mask = _batch()
    loss, stats = geo_mean_loss(new, old, adv, mask, eps_low=0.4, eps_high=0.4)
    assert loss.item() == pytest.approx((-math.exp(0.1) + math.exp(-1 / 30)) / 2, abs=1e-12)
    loss.backward()
    # d/d logp_t of (1/2) * (-A_i * exp(mean_t x_t)) = -(1/2) * A_i * r_i / |y_i| where token t is not clipped:
    # row 0: token 0 clipped (0), token 1: -e^0.1 / 4; row 1: token 0 clipped, tokens 1, 2: e^(-1/30) / 6
    want = torch.tensor([[0.0, -math.exp(0.1) / 4, 0.0], [0.0, math.exp(-1 / 30) / 6, math.exp(-1 / 30) / 6]],
                        dtype=D)
    assert torch.allclose(new.grad, want, atol=1e-12)
    # the clip acts on 2 of the 5 valid tokens: row 0's first (high), row 1's first (low)
    assert stats["loss/clip_frac"] == pytest.approx(2 / 5)
    assert stats["loss/clip_frac_high"] == pytest.approx(1 / 5) and stats["loss/clip_frac_low"] == pytest.approx(1 / 5)
    assert stats["loss/ratio_max"] == pytest.approx(math.exp(0.1))
    assert stats["loss/ratio_min"] == pytest.approx(math.exp(-1 / 30))


def test_the_clip_is_one_sided_by_the_advantage_sign():
    x = torch.tensor([[-1.0, -0.1, 0.1, 1.0]] * 3, dtype=D)
    adv = torch.tensor([[2.0] * 4, [-0.5] * 4, [0.0] * 4], dtype=D)
    got = clipped_log_ratio(x, adv, 0.3, 0.2)
    assert got.tolist() == [[-1.0, -0.1, 0.1, 0.2], [-0.3, -0.1, 0.1, 1.0], [0.0] * 4]


def test_rollout_weights_act_through_their_geometric_mean_per_response():
    old, new, adv, mask = _batch()
    # row 0: 0.5 and 2 -> geometric mean 1 (padding 100 ignored); row 1: 8, 1, 1 -> 2
    is_w = torch.tensor([[0.5, 2.0, 100.0], [8.0, 1.0, 1.0]], dtype=D)
    assert torch.allclose(sequence_weights(is_w, mask.bool()), torch.tensor([1.0, 2.0], dtype=D), atol=1e-12)
    loss, stats = geo_mean_loss(new, old, adv, mask, eps_low=0.4, eps_high=0.4,
                                reduction=Reduction("seq-mean-token-mean", is_weights=is_w))
    assert loss.item() == pytest.approx((-math.exp(0.1) + 2 * math.exp(-1 / 30)) / 2, abs=1e-12)
    assert "loss/is_weight_mean" in stats


def test_per_question_weights_scale_each_responses_term():
    old, new, adv, mask = _batch()
    token_w = torch.tensor([[3.0] * 3, [0.5] * 3], dtype=D)  # constant per response, as question_weights are
    loss, _ = geo_mean_loss(new, old, adv, mask, eps_low=0.4, eps_high=0.4,
                            reduction=Reduction("seq-mean-token-mean-per-question", token_weights=token_w))
    assert loss.item() == pytest.approx((-3 * math.exp(0.1) + 0.5 * math.exp(-1 / 30)) / 2, abs=1e-12)


def _reference(new, old, adv, mask, eps_low, eps_high):
    """GMPO written per response: the one-sided clip of each token's log-ratio, the geometric mean of the clipped
    ratios, the response's mean advantage times it, the mean over responses with a token."""
    terms = []
    for i in range(new.shape[0]):
        valid = mask[i].bool()
        if not valid.any():
            continue
        x, a = new[i][valid] - old[i][valid], adv[i][valid]
        clipped = torch.where(a > 0, torch.minimum(x, torch.full_like(x, eps_high)),
                              torch.where(a < 0, torch.maximum(x, torch.full_like(x, -eps_low)), 0 * x))
        terms.append(-a.mean() * torch.exp(clipped.mean()))
    return torch.stack(terms).mean()


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), eps=st.sampled_from([(0.4, 0.4), (0.2, 0.28), (0.05, 1.0)]),
       token_level=st.booleans())
def test_loss_and_gradient_equal_the_per_response_reference(seed, eps, token_level):
    g = torch.Generator().manual_seed(seed)
    n, width = 5, 7
    lengths = torch.randint(0, width + 1, (n,), generator=g)
    lengths[0] = width  # at least one response with tokens
    mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
    old = -torch.rand(n, width, generator=g, dtype=D) * 2
    new = (old + 0.5 * torch.randn(n, width, generator=g, dtype=D)).requires_grad_(True)
    adv = torch.randn(n, width if token_level else 1, generator=g, dtype=D).expand(n, width)
    loss, _ = geo_mean_loss(new, old, adv, mask, eps_low=eps[0], eps_high=eps[1])
    (grad,) = torch.autograd.grad(loss, new)
    ref = _reference(new, old, adv, mask, *eps)
    (ref_grad,) = torch.autograd.grad(ref, new)
    assert loss.item() == pytest.approx(ref.item(), abs=1e-12)
    assert torch.allclose(grad, ref_grad, atol=1e-12)


def test_the_registered_loss_reads_the_core_clip_range_and_aggregation():
    old, new, adv, mask = _batch()
    entry = lookup("policy_loss", "geo_mean")
    assert entry.options is None and entry.rowwise and entry.cites[0].paper == "GMPO"
    cfg = AlgoConfig(loss="geo_mean", loss_agg="seq-mean-token-mean", eps_low=0.1, eps_high=0.3)
    got = entry.fn(new, RolloutBatch.for_loss(mask, adv, logprobs=old, max_response_len=3), cfg)
    want = geo_mean_loss(new, old, adv, mask, eps_low=0.1, eps_high=0.3)
    assert torch.equal(got[0], want[0]) and got[1] == want[1]


@pytest.mark.parametrize("overrides, message", [
    (["algo.loss_agg=token-mean"], r"algo.loss_agg=token-mean: GMPO's objective is the mean over responses .*set "
                                   r"algo.loss_agg=seq-mean-token-mean"),
    (["algo.loss_agg=seq-mean-token-sum-norm"], r"algo.loss_agg=seq-mean-token-sum-norm: GMPO's"),
    (["algo.loss_agg=seq-mean-token-mean", "algo.token_filter=forking"],
     r"algo.token_filter=forking: GMPO has one ratio and one term per response"),
])
def test_the_check_refuses_what_gmpo_has_no_place_for(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, ["algo.loss=geo_mean", *overrides])


def test_the_method_layer_is_the_papers_clip_range(tmp_path):
    cfg = load_config(None, ["algo.loss=geo_mean", "algo.loss_agg=seq-mean-token-mean-per-question"])
    assert cfg.algo.loss == "geo_mean"
    (tmp_path / "mine.yaml").write_text("methods: [gmpo]\n")
    layer = load_config(tmp_path / "mine.yaml").algo
    assert (layer.loss, layer.loss_agg, layer.eps_low, layer.eps_high) == ("geo_mean", "seq-mean-token-mean", 0.4, 0.4)
