"""VESPO (docs/methods.md §5y): values derived by hand, the loss and gradient against a reference rewritten from TRL
1.16's code path (`GRPOTrainer.get_gamma_weights` and `_compute_loss` with `loss_type="vespo"`), the kernel's
shape, and the configuration's errors."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from explorl.algos.aggregation import Reduction
from explorl.algos.batch import RolloutBatch
from explorl.algos.methods.ppo import policy_loss
from explorl.algos.methods.vespo import VespoOptions, vespo_kernel, vespo_loss
from explorl.algos.registry import lookup
from explorl.config import ConfigError, load_config

F64 = torch.float64


def _phi(w: float, k: float, lam: float) -> float:
    return w ** k * math.exp(lam * (1.0 - w))


def test_a_hand_derived_batch():
    # kernel phi(W) = W^k exp(lambda (1 - W)); (k, lambda) = (2, 3) for A >= 0, (3, 2) for A < 0 (the defaults)
    # response 0, A = +1, two valid tokens (the third is padding): log r = 0.1, 0.2 -> log W = 0.3 (a sum, no mean),
    #   W = 1.349859, phi = 1.349859^2 exp(3 (1 - 1.349859)) = 0.637898; logp_new = -0.9, -1.8:
    #   token loss -phi A logp = 0.574108, 1.148217
    # response 1, A = -0.5, three tokens: log r = -0.2, -0.1, 0.0 -> log W = -0.3, W = 0.740818,
    #   phi = 0.740818^3 exp(2 (1 - 0.740818)) = 0.682743; logp_new = -1.2, -1.1, -1.0:
    #   token loss 0.5 phi logp = -0.409646, -0.375509, -0.341372
    # token-mean over the 5 valid tokens: 0.595798 / 5 = 0.119160
    old = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, -1.0]], dtype=F64)
    log_r = torch.tensor([[0.1, 0.2, 40.0], [-0.2, -0.1, 0.0]], dtype=F64)
    new = (old + log_r).requires_grad_(True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    adv = torch.tensor([[1.0, 1.0, 1.0], [-0.5, -0.5, -0.5]], dtype=F64)
    loss, stats = vespo_loss(new, old, adv, mask, reduction=Reduction("token-mean"))
    phi0, phi1 = _phi(math.exp(0.3), 2, 3), _phi(math.exp(-0.3), 3, 2)
    assert (phi0, phi1) == (pytest.approx(0.637898, abs=1e-6), pytest.approx(0.682743, abs=1e-6))
    want = (phi0 * (0.9 + 1.8) - 0.5 * phi1 * (1.2 + 1.1 + 1.0)) / 5
    assert loss.item() == pytest.approx(want, abs=1e-12)
    assert loss.item() == pytest.approx(0.119160, abs=1e-6)
    assert stats["loss/vespo_phi_mean"] == pytest.approx((2 * phi0 + 3 * phi1) / 5)
    assert stats["loss/vespo_log_w_mean"] == pytest.approx(0.0, abs=1e-12)  # (0.3 - 0.3) / 2
    loss.backward()
    # gradient -phi A / 5 at every valid token (the kernel is detached); 0 on the padding
    want_grad = torch.tensor([[-phi0, -phi0, 0.0], [0.5 * phi1] * 3], dtype=F64) / 5
    assert torch.allclose(new.grad, want_grad, atol=1e-12)


def _trl_vespo(new, old, adv_seq, mask, k_pos, lambda_pos, k_neg, lambda_neg):
    """TRL 1.16's VESPO written out from its code path, one process, no vLLM ratios, no gradient accumulation:
    `get_gamma_weights` clamps each token log-ratio to +-20, sums it over the response's mask (no mean), clamps the
    sum to [log 1e-8, 20], picks (k, lambda) by `advantages >= 0` with lambda >= 1e-4, and returns
    exp(lambda + k log w - lambda w) under no_grad with nan/inf set to 0; `_compute_loss` takes
    `-phi * A * logp_new` and, for `vespo` (as `dapo`), divides the masked sum by the number of completion tokens."""
    m = mask.to(F64)
    with torch.no_grad():
        log_w = (torch.clamp(new - old, -20.0, 20.0) * m).sum(-1, keepdim=True).clamp(math.log(1e-8), 20.0)
        a = adv_seq[:, None]
        k = torch.where(a >= 0, torch.tensor(k_pos, dtype=F64), torch.tensor(k_neg, dtype=F64))
        lam = torch.where(a >= 0, torch.tensor(lambda_pos, dtype=F64), torch.tensor(lambda_neg, dtype=F64))
        lam = lam.clamp(min=1e-4)
        phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
    per = -phi * adv_seq[:, None] * new
    return (per * m).sum() / m.sum().clamp(min=1.0)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), scale=st.sampled_from([0.05, 0.5, 8.0]),
       params=st.sampled_from([(2.0, 3.0, 3.0, 2.0), (0.5, 1.0, 4.0, 0.0), (1.0, 1e-5, 3000.0, 1e-5)]))
def test_loss_and_gradient_equal_trls(seed, scale, params):
    # scale 8: log W far past both clamps; params (1, 1e-5, 3000, 1e-5): lambda below TRL's 1e-4 floor, and
    # exp(k log W) overflowing to inf for a large log W, which both set to 0
    g = torch.Generator().manual_seed(seed)
    n, width = 6, 8
    lengths = torch.randint(1, width + 1, (n,), generator=g)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
    old = -torch.rand(n, width, generator=g, dtype=F64) * 3
    new = (old + scale * torch.randn(n, width, generator=g, dtype=F64)).requires_grad_(True)
    adv_seq = torch.randn(n, generator=g, dtype=F64)
    adv_seq[0] = 0.0  # A = 0 takes the positive parameters (TRL's `advantages >= 0`); it adds nothing either way
    adv = adv_seq[:, None].expand(n, width)
    k_pos, lambda_pos, k_neg, lambda_neg = params
    loss, _ = vespo_loss(new, old, adv, mask,
                         options=VespoOptions(k_pos=k_pos, lambda_pos=lambda_pos, k_neg=k_neg, lambda_neg=lambda_neg),
                         reduction=Reduction("token-mean"))
    (grad,) = torch.autograd.grad(loss, new)
    ref = _trl_vespo(new, old, adv_seq, mask, *params)
    (ref_grad,) = torch.autograd.grad(ref, new)
    assert loss.item() == pytest.approx(ref.item(), rel=1e-12, abs=1e-12)
    assert torch.allclose(grad, ref_grad, rtol=1e-12, atol=1e-12)


def test_the_kernel_is_one_at_one_peaks_at_k_over_lambda_and_vanishes_at_the_extremes():
    pos = torch.ones(1, dtype=F64)
    at = lambda w, **kw: float(vespo_kernel(torch.tensor([math.log(w)], dtype=F64), pos, **kw))  # noqa: E731
    assert at(1.0) == pytest.approx(1.0, abs=1e-15)
    # d/dW [k log W - lambda W] = 0 at W = k / lambda (2/3 for the defaults): the kernel is largest there
    peak = at(2 / 3)
    assert peak > at(0.6) and peak > at(0.7) and peak == pytest.approx(_phi(2 / 3, 2, 3), rel=1e-12)
    assert at(1e-9) == pytest.approx(_phi(1e-8, 2, 3), rel=1e-9)  # log W clamped at log 1e-8
    assert at(1e12) == 0.0  # log W clamped at 20: exp(3 + 40 - 3 e^20) underflows
    # the negative parameters where A < 0
    neg = -torch.ones(1, dtype=F64)
    assert float(vespo_kernel(torch.tensor([0.3], dtype=F64), neg)) == pytest.approx(_phi(math.exp(0.3), 3, 2))


def test_on_the_first_update_the_kernel_is_one_and_the_gradient_is_the_policy_gradient():
    g = torch.Generator().manual_seed(2)
    logp = (-torch.rand(3, 4, generator=g, dtype=F64)).requires_grad_(True)
    adv, mask = torch.randn(3, 4, generator=g, dtype=F64), torch.ones(3, 4)
    loss, stats = vespo_loss(logp, logp.detach(), adv, mask)
    (vespo,) = torch.autograd.grad(loss, logp)
    (ppo,) = torch.autograd.grad(policy_loss(logp, logp.detach(), adv, mask, reduction=Reduction("token-mean"))[0],
                                 logp)
    assert torch.allclose(vespo, ppo, atol=1e-12) and stats["loss/vespo_phi_mean"] == 1.0
    assert loss.item() == pytest.approx(-(adv * logp.detach()).mean().item(), abs=1e-12)


def test_the_sequence_weight_is_not_length_normalised():
    # the same per-token drift 0.1 on 2 and on 8 tokens: log W 0.2 and 0.8, so the longer response is damped more
    mask = torch.tensor([[1] * 2 + [0] * 6, [1] * 8])
    old = torch.zeros(2, 8, dtype=F64)
    _, stats = vespo_loss(old + 0.1, old, torch.ones(2, 8, dtype=F64), mask)
    assert stats["loss/vespo_log_w_mean"] == pytest.approx(0.5)
    assert stats["loss/vespo_phi_mean"] == pytest.approx((2 * _phi(math.exp(0.2), 2, 3)
                                                          + 8 * _phi(math.exp(0.8), 2, 3)) / 10)


def test_the_registered_loss_reads_its_options_and_the_aggregation():
    entry = lookup("policy_loss", "vespo")
    assert entry.options is VespoOptions and entry.rowwise and not entry.needs_old_logprobs
    o = VespoOptions()
    assert (o.k_pos, o.lambda_pos, o.k_neg, o.lambda_neg) == (2.0, 3.0, 3.0, 2.0)  # TRL 1.16's defaults
    cfg = load_config(None, ["algo.loss=vespo", "algo.loss_agg=seq-mean-token-mean", "algo.vespo.k_pos=1.5",
                             "algo.vespo.lambda_pos=0.5", "algo.vespo.k_neg=4", "algo.vespo.lambda_neg=1"]).algo
    g = torch.Generator().manual_seed(1)
    old = -torch.rand(2, 3, generator=g)
    new, adv, mask = old + torch.randn(2, 3, generator=g), torch.randn(2, 3, generator=g), torch.ones(2, 3)
    got, _ = entry.bind(cfg)(new, RolloutBatch.for_loss(mask, adv, logprobs=old, max_response_len=3), cfg)
    want, _ = vespo_loss(new, old, adv, mask,
                         options=VespoOptions(k_pos=1.5, lambda_pos=0.5, k_neg=4.0, lambda_neg=1.0),
                         reduction=Reduction("seq-mean-token-mean"))
    assert torch.equal(got, want)


@pytest.mark.parametrize("overrides, message", [
    (["algo.loss=vespo", "algo.vespo.k_pos=-1"], r"algo.vespo.k_pos: must be a finite number >= 0 .*got -1.0"),
    (["algo.loss=vespo", "algo.vespo.lambda_neg=-0.5"], r"algo.vespo.lambda_neg: must be .*got -0.5"),
    (["algo.vespo.k_neg=2"], "algo.vespo: options of the policy loss 'vespo', which is not selected"),
    (["algo.loss=vespo", "algo.vespo.k=2"], "algo.vespo.k"),
])
def test_configuration_errors_name_the_field(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_the_recipe_is_the_papers_objective():
    cfg = load_config(Path(__file__).resolve().parents[2] / "configs" / "recipes" / "vespo.yaml")
    a = cfg.algo
    assert (a.loss, a.loss_agg, a.kl_coef, a.mini_batches * a.epochs) == ("vespo", "token-mean", 0.0, 8)
    o = a.options["vespo"]
    assert (o.k_pos, o.lambda_pos, o.k_neg, o.lambda_neg) == (2.0, 3.0, 3.0, 2.0)


def test_a_response_with_zero_advantages_adds_no_loss_and_no_gradient():
    # the registry's `rowwise` promise: the update may leave such responses out of the forward and backward
    g = torch.Generator().manual_seed(6)
    old = -torch.rand(3, 4, generator=g, dtype=F64)
    new = (old + 0.3 * torch.randn(3, 4, generator=g, dtype=F64)).requires_grad_(True)
    adv = torch.randn(3, 4, generator=g, dtype=F64)
    adv[1] = 0.0
    loss, _ = vespo_loss(new, old, adv, torch.ones(3, 4),
                         reduction=Reduction("seq-mean-token-sum-norm", max_response_len=4))
    (grad,) = torch.autograd.grad(loss, new)
    assert torch.equal(grad[1], torch.zeros(4, dtype=F64))
    kept = [0, 2]
    alone, _ = vespo_loss(new[kept], old[kept], adv[kept], torch.ones(2, 4),
                          reduction=Reduction("seq-mean-token-sum-norm", max_response_len=4))
    assert loss.item() == pytest.approx(alone.item() * 2 / 3, abs=1e-12)  # the row counts in the mean only
