"""GSPO (docs/methods.md §5g): values derived by hand, and loss and gradient equal to an independent reference that
computes the paper's sequence-level objective (eq. 5) directly, one ratio per response, wherever the advantage is one
number per response (GRPO's). verl 0.9.1's own function is compared in tests/integrations/test_verl.py."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from explorl.algos.aggregation import Reduction
from explorl.algos.methods.gspo import gspo_loss, sequence_log_ratio


def test_a_hand_derived_batch():
    # response 0: 2 tokens, log ratios +0.2 and 0 -> log s = 0.1, s = e^0.1 = 1.10517; A = +1, clip 0.2/0.2 keeps it:
    #   token loss -1.10517 at both tokens, its token mean -1.10517
    # response 1: 3 tokens, log ratios -0.9, 0, 0 -> log s = -0.3, s = 0.74082; A = -2: unclipped loss 2 * 0.74082 =
    #   1.48164, clipped -2 * 0.8 * -1 = 1.6 (the larger: active); token mean 1.6
    # seq-mean-token-mean: (-1.10517 + 1.6) / 2 = 0.247414
    old = torch.zeros(2, 3, dtype=torch.float64)
    new = torch.tensor([[0.2, 0.0, 9.0], [-0.9, 0.0, 0.0]], dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    adv = torch.tensor([[1.0, 1.0, 0.0], [-2.0, -2.0, -2.0]], dtype=torch.float64)
    loss, stats = gspo_loss(new, old, adv, mask, eps_low=0.2, eps_high=0.2, reduction=Reduction("seq-mean-token-mean"))
    assert float(loss) == pytest.approx((-math.exp(0.1) + 1.6) / 2, abs=1e-12)
    assert torch.allclose(sequence_log_ratio(new, old, mask.bool()), torch.tensor([0.1, -0.3], dtype=torch.float64))
    # clip: response 1's 3 tokens of 5 valid; the ratios are 1.10517 (x2) and 0.74082 (x3)
    assert stats["loss/clip_frac"] == pytest.approx(3 / 5) and stats["loss/clip_frac_low"] == pytest.approx(3 / 5)
    assert stats["loss/ratio_max"] == pytest.approx(math.exp(0.1)) and stats["loss/ratio_min"] == pytest.approx(
        math.exp(-0.3))
    loss.backward()
    # gradient: response 0 unclipped, d/d logp_t of (1/2) * mean_t(-A s) = -(1/2) * A * s / |y| = -1.10517 / 4;
    # response 1 clipped: 0; the padding token of response 0: 0
    want = torch.tensor([[-math.exp(0.1) / 4, -math.exp(0.1) / 4, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    assert torch.allclose(new.grad, want, atol=1e-12)


def _reference(new, old, adv_per_response, mask, eps_low, eps_high):
    """GSPO's eq. 5 written per response: s_i = exp(mean_t log ratio), the clipped term on it, the mean over
    responses (no token form, no stop-gradient)."""
    terms = []
    for i in range(new.shape[0]):
        valid = mask[i].bool()
        log_s = (new[i][valid] - old[i][valid]).mean()
        s = torch.exp(log_s)
        a = adv_per_response[i]
        terms.append(torch.maximum(-a * s, -a * s.clamp(1 - eps_low, 1 + eps_high)))
    return torch.stack(terms).mean()


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), eps=st.sampled_from([(0.2, 0.28), (3e-4, 4e-4), (1.0, 1.0)]))
def test_with_one_advantage_per_response_the_token_form_is_the_sequence_objective(seed, eps):
    g = torch.Generator().manual_seed(seed)
    n, width = 5, 7
    lengths = torch.randint(1, width + 1, (n,), generator=g)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
    old = -torch.rand(n, width, generator=g, dtype=torch.float64) * 2
    new = (old + 0.3 * torch.randn(n, width, generator=g, dtype=torch.float64)).requires_grad_(True)
    adv_r = torch.randn(n, generator=g, dtype=torch.float64)
    loss, _ = gspo_loss(new, old, adv_r[:, None].expand(n, width), mask, eps_low=eps[0], eps_high=eps[1],
                        reduction=Reduction("seq-mean-token-mean"))
    (grad,) = torch.autograd.grad(loss, new)
    ref = _reference(new, old, adv_r, mask, *eps)
    (ref_grad,) = torch.autograd.grad(ref, new)
    assert float(loss) == pytest.approx(float(ref), abs=1e-12)
    assert torch.allclose(grad, ref_grad, atol=1e-12)


def test_a_first_update_has_ratio_one_and_the_log_ratio_cap_holds():
    new = torch.tensor([[-1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    mask = torch.ones(1, 2)
    adv = torch.ones(1, 2, dtype=torch.float64)
    _, stats = gspo_loss(new, new.detach(), adv, mask)
    assert stats["loss/ratio_mean"] == 1.0 and stats["loss/clip_frac"] == 0.0
    # log s = 30 > the cap 10: the ratio is e^10 (then clipped to 1 + eps_high for A > 0)
    _, stats = gspo_loss(new, new.detach() - 30, adv, mask, max_log_ratio=10.0)
    assert stats["loss/ratio_max"] == pytest.approx(math.exp(10.0))
