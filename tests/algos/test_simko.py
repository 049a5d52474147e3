"""SimKO (docs/methods.md §5w): the loss's value and gradients by hand, against an independent transcription of the
authors' `compute_policy_loss_simko`, and the refusal of `algo.loss: simko` at validation (the batch lacks the top-K
log-probs it needs)."""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from explorl.algos.batch import MissingInputError, RolloutBatch
from explorl.algos.methods.simko import SimkoInputs, SimkoOptions, entropy_gate, simko_loss
from explorl.algos.registry import lookup
from explorl.config import AlgoConfig, ConfigError, load_config

F64 = torch.float64


def test_hand_derived_gradients_on_policy():
    # two responses of two tokens, new = old (every ratio 1), tau 0.8, alpha 0.5, K = 2, token-mean over 4 tokens
    # entropies [1, 3]: threshold 1 + 0.8 * (3 - 1) = 2.6, so the second token of each response is gated in
    # response 0 correct, A = +1: value -(1 + 1) / 4 per response; d/d logp_new: token 0 -1/4, token 1
    #   -(1 - 0.5) / 4 = -0.125; each of the K = 2 candidates of token 1: -(0.5 / 2) / 4 = -0.0625
    # response 1 wrong, A = -1, token 1 the policy's top-1 and gated: A' = -1.1 there -> d/d logp_new +1.1 / 4
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.7]], dtype=F64)
    new = logp.clone().requires_grad_(True)
    topk_old = torch.tensor([[[-0.3, -1.5]] * 2, [[-0.2, -2.0]] * 2], dtype=F64)
    topk_new = topk_old.clone().requires_grad_(True)
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]], dtype=F64)
    entropy = torch.tensor([[1.0, 3.0], [1.0, 3.0]], dtype=F64)
    is_top1 = torch.tensor([[False, False], [False, True]])
    inputs = SimkoInputs(logp, topk_old, adv, torch.ones(2, 2), torch.tensor([True, False]), entropy, is_top1)
    loss, stats = simko_loss(new, topk_new, inputs, options=SimkoOptions(alpha=0.5, tau=0.8))
    assert loss.item() == pytest.approx((-1 - 1 + 1 + 1.1) / 4, abs=1e-12)
    loss.backward()
    assert torch.allclose(new.grad, torch.tensor([[-0.25, -0.125], [0.25, 0.275]], dtype=F64), atol=1e-12)
    want_topk = torch.zeros(2, 2, 2, dtype=F64)
    want_topk[0, 1] = -0.0625
    assert torch.allclose(topk_new.grad, want_topk, atol=1e-12)
    assert stats["loss/simko_gate_frac"] == pytest.approx(0.5) and stats["loss/simko_neg_scaled_frac"] == 0.25


def _authors(old, old_topk, new, new_topk, entropy, adv, mask, correct, is_top1, alpha, tau, clip):
    """The authors' computation transcribed independently: per-row torch.quantile threshold, the mixed ratio with
    their numerator / (denominator + 1e-8), the 1.1 factor on negative rows' top-1 gated tokens, PPO's clip,
    token-mean."""
    k = new_topk.shape[-1]
    valid = mask > 0
    thr = torch.stack([torch.quantile(entropy[b][valid[b]], tau) for b in range(entropy.shape[0])])[:, None]
    w = (entropy > thr).to(F64)
    diff_k = new_topk - old_topk
    terms = (torch.exp((new - old).detach())[..., None] / (torch.exp(diff_k.detach()) + 1e-8)) * torch.exp(diff_k)
    mix = alpha * w * valid
    ratio = torch.exp(new - old)
    ratio = torch.where(correct[:, None] & valid, (1 - mix) * ratio + mix / k * terms.sum(-1), ratio)
    neg = ((adv * mask).sum(-1) < 0)[:, None] & is_top1 & (entropy > thr)
    a = torch.where(neg, adv * 1.1, adv)
    losses = torch.maximum(-a * ratio, -a * ratio.clamp(1 - clip, 1 + clip))
    return (losses * mask).sum() / mask.sum()


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), alpha=st.sampled_from([0.01, 0.3]), tau=st.sampled_from([0.5, 0.8]))
def test_equals_the_authors_computation(seed, alpha, tau):
    g = torch.Generator().manual_seed(seed)
    n, t, k = 4, 6, 3
    mask = torch.ones(n, t, dtype=F64)
    mask[1, 4:] = 0
    old = -torch.rand(n, t, generator=g, dtype=F64) * 2
    new = (old + 0.3 * torch.randn(n, t, generator=g, dtype=F64)).requires_grad_(True)
    old_topk = -torch.rand(n, t, k, generator=g, dtype=F64) * 2
    new_topk = (old_topk + 0.3 * torch.randn(n, t, k, generator=g, dtype=F64)).requires_grad_(True)
    entropy = torch.rand(n, t, generator=g, dtype=F64) * 3
    adv = torch.tensor([1.0, -0.5, 0.7, -1.2], dtype=F64)[:, None].expand(n, t) * mask
    correct = torch.tensor([True, False, True, False])
    is_top1 = torch.rand(n, t, generator=g) > 0.4
    inputs = SimkoInputs(old, old_topk, adv, mask, correct, entropy, is_top1)
    loss, _ = simko_loss(new, new_topk, inputs, options=SimkoOptions(alpha=alpha, tau=tau))
    ref = _authors(old, old_topk, new, new_topk, entropy, adv, mask, correct, is_top1, alpha, tau, 0.2)
    grads = torch.autograd.grad(loss, (new, new_topk))
    ref_grads = torch.autograd.grad(ref, (new, new_topk))
    assert loss.item() == pytest.approx(ref.item(), abs=1e-6)
    for got, want in zip(grads, ref_grads):
        assert torch.allclose(got * mask[..., None] if got.dim() == 3 else got * mask,
                              want * mask[..., None] if want.dim() == 3 else want * mask, atol=1e-6)


def test_the_gate_is_per_response_and_tau_one_selects_nothing():
    entropy = torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0], [5.0, 5.0, 0.0, 9.0, 9.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    # row 0: quantile 0.5 of 0..4 is 2 -> tokens 3 and 4; row 1: of [5, 5, 0] is 5 -> none (the 9s are padding)
    assert torch.equal(entropy_gate(entropy, mask, 0.5), torch.tensor([[0, 0, 0, 1, 1], [0, 0, 0, 0, 0]]).bool())
    assert not entropy_gate(entropy, mask, 1.0).any()


def test_refused_at_validation_with_what_is_missing():
    with pytest.raises(ConfigError, match="algo.loss: simko needs, per token, the log-probabilities of the K most "
                                          "probable tokens"):
        load_config(None, ["algo.loss=simko"])
    entry = lookup("policy_loss", "simko")
    assert entry.options().top_k == 3 and entry.options().tau == 0.8 and entry.options().alpha == 0.01
    x = torch.zeros(1, 2)
    with pytest.raises(MissingInputError, match="simko needs"):
        entry.fn(x, RolloutBatch.for_loss(torch.ones(1, 2), x, logprobs=x, max_response_len=2), AlgoConfig(),
                 options=entry.options())


@pytest.mark.parametrize("override, field", [("algo.simko.top_k=0", "algo.simko.top_k"),
                                             ("algo.simko.tau=1.5", "algo.simko.tau"),
                                             ("algo.simko.alpha=-0.1", "algo.simko.alpha"),
                                             ("algo.simko.neg_scale=0", "algo.simko.neg_scale")])
def test_a_bad_option_is_named_before_the_refusal_of_the_loss(override, field):
    with pytest.raises(ConfigError, match=re.escape(field)):
        load_config(None, ["algo.loss=simko", override])
