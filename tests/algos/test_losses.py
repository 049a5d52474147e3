"""Clipped policy loss, aggregation modes and k3 KL: hand-derived values on small examples."""

import math

import pytest
import torch

from explorl.algos import losses as L
from explorl.algos.batch import RolloutBatch

# The 2x3 example used below. logp_old = 0, so rho = exp(logp_new) = RATIOS. eps_low = eps_high = 0.2.
RATIOS = torch.tensor([[1.5, 0.5, 1.0], [1.1, 0.7, 2.0]])
ADV = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
# token loss = -min(rho*A, clip(rho, 0.8, 1.2)*A):
#   row 0 (A=+1): rho 1.5 -> clip 1.2, -min(1.5, 1.2) = -1.2 (clipped, high)
#                 rho 0.5 -> clip 0.8, -min(0.5, 0.8) = -0.5
#                 rho 1.0 -> clip 1.0, -1.0
#   row 1 (A=-1): rho 1.1 -> clip 1.1, -min(-1.1, -1.1) = 1.1
#                 rho 0.7 -> clip 0.8, -min(-0.7, -0.8) = 0.8 (clipped, low)
#                 rho 2.0 -> padding
# valid sum = -1.2 - 0.5 - 1.0 + 1.1 + 0.8 = -0.8 over 5 tokens


def _loss(agg, max_response_len=None):
    logp_new = RATIOS.log().requires_grad_(True)
    loss, stats = L.policy_loss(logp_new, torch.zeros(2, 3), ADV, MASK, reduction=L.Reduction(agg, max_response_len))
    return loss, stats, logp_new


def test_token_mean_hand_value_and_stats():
    loss, stats, _ = _loss("token-mean")
    assert loss.item() == pytest.approx(-0.8 / 5, abs=1e-6)  # -0.16
    assert stats["loss/pg"] == pytest.approx(-0.16, abs=1e-6)
    assert stats["loss/clip_frac"] == pytest.approx(2 / 5)  # rho 1.5 (A>0) and rho 0.7 (A<0)
    assert stats["loss/clip_frac_low"] == pytest.approx(1 / 5)  # rho 0.7 < 0.8 with A < 0
    assert stats["loss/clip_frac_high"] == pytest.approx(1 / 5)  # rho 1.5 > 1.2 with A > 0
    assert stats["loss/ratio_mean"] == pytest.approx((1.5 + 0.5 + 1.0 + 1.1 + 0.7) / 5, abs=1e-6)  # 0.96
    assert stats["loss/ratio_max"] == pytest.approx(1.5, abs=1e-6)  # 2.0 is padding
    assert all(isinstance(v, float) for v in stats.values())


def test_seq_mean_token_mean_hand_value():
    loss, _, _ = _loss("seq-mean-token-mean")
    # row 0 mean = (-1.2 - 0.5 - 1.0) / 3 = -0.9; row 1 mean = (1.1 + 0.8) / 2 = 0.95; mean = 0.025
    assert loss.item() == pytest.approx(0.025, abs=1e-6)


def test_seq_mean_token_sum_norm_hand_value():
    loss, _, _ = _loss("seq-mean-token-sum-norm", max_response_len=4)
    # sum -0.8 / (N * max_response_len) = -0.8 / (2 * 4) = -0.1
    assert loss.item() == pytest.approx(-0.1, abs=1e-6)
    with pytest.raises(ValueError, match="max_response_len"):
        _loss("seq-mean-token-sum-norm")


def test_decoupled_clip_bounds():
    logp_new = RATIOS.log()
    _, stats = L.policy_loss(logp_new, torch.zeros(2, 3), ADV, MASK, eps_low=0.2, eps_high=0.6)
    # upper bound 1.6: rho 1.5 no longer clipped, -min(1.5, 1.5) = -1.5; sum = -1.5 - 0.5 - 1.0 + 1.1 + 0.8 = -1.1
    assert stats["loss/pg"] == pytest.approx(-1.1 / 5, abs=1e-6)
    assert stats["loss/clip_frac_high"] == 0.0
    assert stats["loss/clip_frac"] == pytest.approx(1 / 5)


def test_gradient_hand_values_and_zero_at_padding():
    logp_new = RATIOS.log().clone()
    logp_new[1, 2] = -math.inf  # garbage in the padding must not produce nan
    logp_new.requires_grad_(True)
    loss, _ = L.policy_loss(logp_new, torch.zeros(2, 3), ADV, MASK)
    loss.backward()
    # d/dlogp of -A*rho/5 = -A*rho/5 where unclipped; 0 where the clipped (constant) term is active or padding
    expected = torch.tensor([[0.0, -0.5 / 5, -1.0 / 5], [1.1 / 5, 0.0, 0.0]])
    assert torch.allclose(logp_new.grad, expected, atol=1e-6)
    assert logp_new.grad[1, 2].item() == 0.0


def test_is_weights_multiply_and_get_no_gradient():
    w = torch.tensor([[2.0, 1.0, 1.0], [1.0, 0.5, 1.0]], requires_grad=True)
    loss, stats = L.policy_loss(RATIOS.log(), torch.zeros(2, 3), ADV, MASK, reduction=L.Reduction(is_weights=w))
    # (-1.2*2 - 0.5 - 1.0 + 1.1 + 0.8*0.5) / 5 = -2.4 / 5 = -0.48
    assert loss.item() == pytest.approx(-0.48, abs=1e-6)
    assert stats["loss/is_weight_mean"] == pytest.approx((2 + 1 + 1 + 1 + 0.5) / 5)
    assert not loss.requires_grad  # neither logp_new nor (detached) weights carry a graph here


@pytest.mark.parametrize("agg", L.LOSS_AGG_MODES)
def test_ratio_one_gives_minus_aggregated_advantage(agg):
    gen = torch.Generator().manual_seed(0)
    logp = torch.randn(4, 5, generator=gen)
    adv = torch.randn(4, 5, generator=gen)
    mask = (torch.rand(4, 5, generator=gen) > 0.3).float()
    loss, stats = L.policy_loss(logp, logp, adv, mask, reduction=L.Reduction(agg, max_response_len=7))
    expected = -L.aggregate(adv, mask, agg, max_response_len=7)
    assert loss.item() == pytest.approx(expected.item(), abs=1e-6)
    assert stats["loss/clip_frac"] == 0.0
    assert stats["loss/ratio_mean"] == pytest.approx(1.0)


def test_invalid_agg_lists_modes():
    with pytest.raises(ValueError, match="token-mean, seq-mean-token-mean, seq-mean-token-sum-norm"):
        L.policy_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2),
                      reduction=L.Reduction("sum"))
    with pytest.raises(ValueError, match="valid"):
        L.aggregate(torch.zeros(1, 2), torch.ones(1, 2), "mean")


@pytest.mark.parametrize("agg", L.LOSS_AGG_MODES)
def test_empty_mask_gives_zero_not_nan(agg):
    logp_new = torch.randn(2, 3, requires_grad=True)
    loss, stats = L.policy_loss(logp_new, torch.zeros(2, 3), torch.ones(2, 3), torch.zeros(2, 3),
                                reduction=L.Reduction(agg, max_response_len=3))
    assert loss.item() == 0.0
    loss.backward()
    assert torch.equal(logp_new.grad, torch.zeros(2, 3))
    assert all(math.isfinite(v) for v in stats.values())


def test_aggregate_seq_mean_skips_empty_responses():
    values = torch.tensor([[1.0, 3.0], [5.0, 7.0], [100.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.0, 0.0]])
    # responses: mean(1, 3) = 2, mean(5) = 5, empty -> left out; (2 + 5) / 2 = 3.5
    assert L.aggregate(values, mask, "seq-mean-token-mean").item() == pytest.approx(3.5)
    # token-mean: (1 + 3 + 5) / 3 = 3; sum-norm: 9 / (3 * 2) = 1.5
    assert L.aggregate(values, mask, "token-mean").item() == pytest.approx(3.0)
    assert L.aggregate(values, mask, "seq-mean-token-sum-norm", max_response_len=2).item() == pytest.approx(1.5)


def test_masked_mean():
    x = torch.tensor([[1.0, float("nan")], [3.0, 4.0]])
    m = torch.tensor([[1, 0], [1, 1]])
    assert L.masked_mean(x, m).item() == pytest.approx(8 / 3)
    assert torch.allclose(L.masked_mean(x, m, dim=-1), torch.tensor([1.0, 3.5]))
    assert L.masked_mean(x, torch.zeros(2, 2)).item() == 0.0


def test_kl_k3_hand_values():
    logp = torch.tensor([[-1.0, -1.0, -1.0, -2.0]])
    ref = logp + torch.tensor([[0.0, math.log(2), -math.log(2), 5.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    kl = L.kl_k3(logp, ref, mask)
    # d = 0 -> e^0 - 0 - 1 = 0; d = ln2 -> 2 - ln2 - 1 = 0.3068528; d = -ln2 -> 0.5 + ln2 - 1 = 0.1931472; padding 0
    expected = torch.tensor([[0.0, 2 - math.log(2) - 1, 0.5 + math.log(2) - 1, 0.0]])
    assert torch.allclose(kl, expected, atol=1e-6)
    assert kl[0, 3].item() == 0.0
    assert torch.all(L.kl_k3(logp, ref) >= 0)  # without mask: every position, still non-negative


def test_reduction_weights_multiply_without_changing_the_normaliser():
    # token loss [[1, 2], [3, 4]], every token valid, token weights [[0, 1], [1, 1]]: token-mean over the 4 valid
    # tokens, the weight-0 one included, = (0 * 1 + 2 + 3 + 4) / 4 = 2.25; importance weights 2 everywhere double
    # it: 4.5. The weights are constants: d loss / d token_loss = is_w * token_w / 4 = [[0, 0.5], [0.5, 0.5]].
    token_loss = torch.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    valid = torch.ones(2, 2, dtype=torch.bool)
    token_w = torch.tensor([[0.0, 1.0], [1.0, 1.0]])
    assert L.Reduction(token_weights=token_w)(token_loss, valid).item() == pytest.approx(2.25)
    is_w = torch.full((2, 2), 2.0, requires_grad=True)
    both = L.Reduction(is_weights=is_w, token_weights=token_w)
    loss = both(token_loss, valid)
    assert loss.item() == pytest.approx(4.5)
    loss.backward()
    assert torch.equal(token_loss.grad, torch.tensor([[0.0, 0.5], [0.5, 0.5]])) and is_w.grad is None
    # the statistics: mean importance weight 2; 1 of the 4 valid tokens has token weight 0
    assert both.record({}, valid, 4, torch.float32) == {"loss/is_weight_mean": 2.0, "loss/masked_frac": 0.25}
    # no weights, seq-mean-token-mean: ((1 + 2) / 2 + (3 + 4) / 2) / 2 = 2.5
    assert L.Reduction("seq-mean-token-mean")(token_loss, valid).item() == pytest.approx(2.5)


def test_reduction_of_a_batch_reads_its_fields():
    mask = torch.ones(2, 3)
    is_w, token_w = torch.full((2, 3), 0.5), torch.zeros(2, 3)
    batch = RolloutBatch.for_loss(mask, torch.zeros(2, 3), max_response_len=7, is_weights=is_w,
                                  token_weights=token_w)
    reduction = L.Reduction.of(batch, "seq-mean-token-sum-norm")
    assert (reduction.agg, reduction.max_response_len) == ("seq-mean-token-sum-norm", 7)
    assert reduction.is_weights is is_w and reduction.token_weights is token_w
    assert L.Reduction.of(RolloutBatch.for_loss(mask, torch.zeros(2, 3)), "token-mean") == L.Reduction()
