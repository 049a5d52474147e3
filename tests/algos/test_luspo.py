"""LUSPO (docs/methods.md §5y): values derived by hand, the loss and gradient against a reference rewritten from TRL
1.16's code path (`GRPOTrainer._compute_loss` with `loss_type="luspo"` and `importance_sampling_level="sequence"`),
the relation to GSPO, and the configuration's errors."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from explorl.algos.aggregation import Reduction
from explorl.algos.batch import RolloutBatch
from explorl.algos.methods.gspo import gspo_loss
from explorl.algos.methods.luspo import LuspoOptions, luspo_loss
from explorl.algos.registry import lookup
from explorl.config import ConfigError, load_config

F64 = torch.float64


def test_a_hand_derived_batch():
    # clip range [1 - 0.2, 1 + 0.28] = [0.8, 1.28]; GSPO's sequence ratio s = exp(mean_t log r_t)
    # response 0, A = +1, two valid tokens (the third is padding): log r = 0.2, 0.0 -> log s = 0.1, s = 1.105171
    #   (inside the range): GSPO's term -A s = -1.105171; times |y| = 2: -2.210342 at each token, token mean -2.210342
    # response 1, A = -0.5, three tokens: log r = -0.6, -0.3, 0.0 -> log s = -0.3, s = 0.740818 < 0.8: the clipped
    #   term wins, max(0.5 * 0.740818, 0.5 * 0.8) = 0.4; times |y| = 3: 1.2 at each token, token mean 1.2
    # seq-mean-token-mean: (-2.210342 + 1.2) / 2 = -0.505171 = (2 * -1.105171 + 3 * 0.4) / 2, TRL's
    #   (1 / N) sum_i |y_i| l_i
    old = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, -1.0]], dtype=F64)
    log_r = torch.tensor([[0.2, 0.0, 30.0], [-0.6, -0.3, 0.0]], dtype=F64)
    new = (old + log_r).requires_grad_(True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    adv = torch.tensor([[1.0, 1.0, 1.0], [-0.5, -0.5, -0.5]], dtype=F64)
    loss, stats = luspo_loss(new, old, adv, mask, eps_low=0.2, eps_high=0.28,
                             reduction=Reduction("seq-mean-token-mean"))
    s0 = math.exp(0.1)
    assert loss.item() == pytest.approx((2 * -s0 + 3 * 0.4) / 2, abs=1e-12)
    assert loss.item() == pytest.approx(-0.505171, abs=1e-6)
    assert stats["loss/clip_frac"] == pytest.approx(3 / 5)  # response 1's three tokens
    loss.backward()
    # response 0: d/d logp_t of 2 * (-A s) with s's token-form gradient s, over (2 tokens x 2 responses): -s / 2 at
    # each token (as TRL's: |y| * -A * s * (1 / |y|) / N); response 1 is clipped: 0; padding 0
    want = torch.tensor([[-s0 / 2, -s0 / 2, 0.0], [0.0, 0.0, 0.0]], dtype=F64)
    assert torch.allclose(new.grad, want, atol=1e-12)


def _trl_luspo(new, old, adv_seq, mask, eps_low, eps_high):
    """TRL 1.16's LUSPO written out from its code path: `importance_sampling_level="sequence"` takes the log weight
    as the masked token mean of `logp_new - logp_old` (length clamped at 1), one per response, `[N, 1]`; the loss
    types `grpo`/`luspo` take `-min(w * A, clip(w, 1 - eps_low, 1 + eps_high) * A)` on it (no `delta`, beta 0); and
    `luspo` aggregates by `(per_token_loss * mask).sum(-1).mean()`: the `[N, 1]` term broadcast over the mask and
    summed, i.e. `|y_i|` times the term, then the mean over the N responses."""
    m = mask.to(F64)
    log_w = ((new - old) * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1.0)
    w = torch.exp(log_w)
    a = adv_seq[:, None]
    per = -torch.minimum(w * a, torch.clamp(w, 1 - eps_low, 1 + eps_high) * a)
    return (per * m).sum(-1).mean()


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), eps=st.sampled_from([(0.2, 0.28), (3e-4, 4e-4), (0.05, 0.05)]))
def test_loss_and_gradient_equal_trls_sequence_level_luspo(seed, eps):
    g = torch.Generator().manual_seed(seed)
    n, width = 6, 8
    lengths = torch.randint(1, width + 1, (n,), generator=g)  # every response has a token (TRL counts empty ones)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
    old = -torch.rand(n, width, generator=g, dtype=F64) * 3
    new = (old + 0.3 * torch.randn(n, width, generator=g, dtype=F64)).requires_grad_(True)
    adv_seq = torch.randn(n, generator=g, dtype=F64)  # one advantage per response, as TRL's
    adv = adv_seq[:, None].expand(n, width)
    loss, _ = luspo_loss(new, old, adv, mask, eps_low=eps[0], eps_high=eps[1],
                         reduction=Reduction("seq-mean-token-mean"))
    (grad,) = torch.autograd.grad(loss, new)
    ref = _trl_luspo(new, old, adv_seq, mask, *eps)
    (ref_grad,) = torch.autograd.grad(ref, new)
    assert loss.item() == pytest.approx(ref.item(), abs=1e-12)
    assert torch.allclose(grad, ref_grad, atol=1e-12)


def test_it_is_gspo_with_each_token_weighted_by_its_response_length():
    g = torch.Generator().manual_seed(3)
    lengths = torch.tensor([1, 4, 7])
    mask = (torch.arange(7)[None, :] < lengths[:, None]).long()
    old = -torch.rand(3, 7, generator=g, dtype=F64)
    new = old + 0.01 * torch.randn(3, 7, generator=g, dtype=F64)
    adv = torch.randn(3, 7, generator=g, dtype=F64)
    for agg in ("seq-mean-token-mean", "token-mean"):
        ours, _ = luspo_loss(new, old, adv, mask, reduction=Reduction(agg))
        gspo, _ = gspo_loss(new, old, adv, mask,
                            reduction=Reduction(agg, token_weights=lengths[:, None].to(F64).expand(3, 7)))
        assert ours.item() == pytest.approx(gspo.item(), abs=1e-12)


def test_the_token_gradient_does_not_depend_on_the_response_length():
    # GSPO gives each token of a response of length L the gradient -A s / (L N); LUSPO -A s / N whatever L
    lengths = torch.tensor([1, 3, 6])
    mask = (torch.arange(6)[None, :] < lengths[:, None]).long()
    logp = torch.full((3, 6), -1.0, dtype=F64, requires_grad=True)
    adv = torch.ones(3, 6, dtype=F64)
    (grad,) = torch.autograd.grad(luspo_loss(logp, logp.detach(), adv, mask)[0], logp)  # first update: s = 1
    assert torch.allclose(grad, torch.where(mask.bool(), -1.0 / 3, 0.0).to(F64), atol=1e-12)
    (gspo,) = torch.autograd.grad(gspo_loss(logp, logp.detach(), adv, mask)[0], logp)
    assert torch.allclose(gspo, torch.where(mask.bool(), -1.0 / (3 * lengths[:, None]), 0.0).to(F64), atol=1e-12)


def test_the_registered_loss_reads_the_core_clip_range_its_options_and_the_aggregation():
    entry = lookup("policy_loss", "luspo")
    assert entry.options is LuspoOptions and entry.rowwise and not entry.needs_old_logprobs
    assert set(entry.reads) == {"eps_low", "eps_high", "loss_agg"} and LuspoOptions().max_log_ratio == 10.0
    cfg = load_config(None, ["algo.loss=luspo", "algo.eps_low=0.1", "algo.eps_high=0.3", "algo.loss_agg=token-mean",
                             "algo.luspo.max_log_ratio=0.05"]).algo
    g = torch.Generator().manual_seed(1)
    old = -torch.rand(2, 3, generator=g)
    new, adv, mask = old + torch.randn(2, 3, generator=g), torch.randn(2, 3, generator=g), torch.ones(2, 3)
    got, _ = entry.bind(cfg)(new, RolloutBatch.for_loss(mask, adv, logprobs=old, max_response_len=3), cfg)
    want, _ = luspo_loss(new, old, adv, mask, eps_low=0.1, eps_high=0.3, max_log_ratio=0.05,
                         reduction=Reduction("token-mean"))
    assert torch.equal(got, want)


@pytest.mark.parametrize("overrides, message", [
    (["algo.loss=luspo", "algo.luspo.max_log_ratio=0"], r"algo.luspo.max_log_ratio: must be > 0 .*got 0.0"),
    (["algo.luspo.max_log_ratio=2"], "algo.luspo: options of the policy loss 'luspo', which is not selected"),
    (["algo.loss=luspo", "algo.luspo.cap=2"], "algo.luspo.cap"),
])
def test_configuration_errors_name_the_field(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_the_recipe_is_the_papers_objective():
    cfg = load_config(Path(__file__).resolve().parents[2] / "configs" / "recipes" / "luspo.yaml")
    a = cfg.algo
    assert (a.loss, a.loss_agg, a.eps_low, a.eps_high, a.kl_coef, a.mini_batches * a.epochs) == (
        "luspo", "seq-mean-token-mean", 3e-4, 4e-4, 0.0, 4)


def test_a_response_with_zero_advantages_adds_no_loss_and_no_gradient():
    # the registry's `rowwise` promise: the update may leave such responses out of the forward and backward
    g = torch.Generator().manual_seed(6)
    old = -torch.rand(3, 4, generator=g, dtype=F64)
    new = (old + 0.1 * torch.randn(3, 4, generator=g, dtype=F64)).requires_grad_(True)
    adv = torch.randn(3, 4, generator=g, dtype=F64)
    adv[1] = 0.0
    loss, _ = luspo_loss(new, old, adv, torch.ones(3, 4), eps_low=0.2, eps_high=0.2)
    (grad,) = torch.autograd.grad(loss, new)
    assert torch.equal(grad[1], torch.zeros(4, dtype=F64))
    kept = [0, 2]
    alone, _ = luspo_loss(new[kept], old[kept], adv[kept], torch.ones(2, 4), eps_low=0.2, eps_high=0.2)
    assert loss.item() == pytest.approx(alone.item() * 2 / 3, abs=1e-12)  # the row counts in the mean only
