"""SAPO (docs/methods.md §5i): values derived by hand, the gradient against its closed form
`-A * r * 4 s (1 - s)` and against autograd of the formula written independently, and the configuration's errors.
verl 0.9.1's own function is compared in tests/integrations/test_verl.py."""

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
from explorl.algos.methods.sapo import SapoOptions, sapo_gate, sapo_loss
from explorl.algos.registry import lookup
from explorl.config import ConfigError, load_config

F64 = torch.float64


def _sig(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def test_a_hand_derived_batch():
    # gate f(r) = (4 / tau) * sigmoid(tau * (r - 1)); tau 1 where A > 0, 1.05 where A <= 0; token loss -f(r) * A
    # response 0, A = +1 (tau 1), two valid tokens and a padding token:
    #   t0: r = 2: s = sigmoid(1) = 0.731059, f = 4 s = 2.924234, loss -2.924234
    #   t1: r = 1: s = 0.5, f = 2, loss -2;  token mean -2.462117
    # response 1, A = -0.5 (tau 1.05), three tokens:
    #   t0: r = 0.5: s = sigmoid(-0.525) = 0.371686, f = 4 s / 1.05 = 1.415946, loss 0.707973
    #   t1: r = 1: f = 2 / 1.05 = 1.904762, loss 0.952381
    #   t2: r = 1.5: s = sigmoid(0.525) = 0.628314, f = 2.393577, loss 1.196789;  token mean 0.952381
    # seq-mean-token-mean: (-2.462117 + 0.952381) / 2 = -0.754868
    old = torch.tensor([[-1.0, -1.0, -1.0], [-2.0, -2.0, -2.0]], dtype=F64)
    log_r = torch.tensor([[math.log(2.0), 0.0, 40.0], [math.log(0.5), 0.0, math.log(1.5)]], dtype=F64)
    new = (old + log_r).requires_grad_(True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    adv = torch.tensor([[1.0, 1.0, 1.0], [-0.5, -0.5, -0.5]], dtype=F64)
    loss, stats = sapo_loss(new, old, adv, mask, tau_pos=1.0, tau_neg=1.05, reduction=Reduction("seq-mean-token-mean"))
    s00, s10, s12 = _sig(1.0), _sig(-0.525), _sig(0.525)
    row0 = (-4 * s00 - 2.0) / 2
    row1 = 0.5 * (4 / 1.05) * (s10 + 0.5 + s12) / 3
    assert loss.item() == pytest.approx((row0 + row1) / 2, abs=1e-12)
    assert loss.item() == pytest.approx(-0.754868, abs=1e-6)
    # the gate's slope 4 s (1 - s): 0.786448 at r = 2 (tau 1), 1 at r = 1, 0.934 at r = 0.5 and 1.5 (tau 1.05)
    slopes = [4 * s00 * (1 - s00), 1.0, 4 * s10 * (1 - s10), 1.0, 4 * s12 * (1 - s12)]
    assert stats["loss/sapo_slope_mean"] == pytest.approx(sum(slopes) / 5)
    loss.backward()
    # d loss / d logp_t = -A * r * 4 s (1 - s) / (|y_i| * 2 responses); 0 on the padding
    want = torch.tensor([[-1 * 2.0 * slopes[0] / 4, -1 * 1.0 / 4, 0.0],
                         [0.5 * 0.5 * slopes[2] / 6, 0.5 * 1.0 / 6, 0.5 * 1.5 * slopes[4] / 6]], dtype=F64)
    assert torch.allclose(new.grad, want, atol=1e-12)


def _reference(new, old, adv, mask, tau_pos, tau_neg):
    """SAPO's objective written out per response: each token's gate on its own ratio, the token mean, the mean over
    responses (seq-mean-token-mean, the paper's)."""
    rows = []
    for i in range(new.shape[0]):
        valid = mask[i].bool()
        r = torch.exp(new[i][valid] - old[i][valid])
        a = adv[i][valid]
        tau = torch.where(a > 0, torch.tensor(tau_pos, dtype=F64), torch.tensor(tau_neg, dtype=F64))
        rows.append((-(4 / tau) * torch.sigmoid(tau * (r - 1)) * a).mean())
    return torch.stack(rows).mean()


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), taus=st.sampled_from([(1.0, 1.05), (0.5, 2.0), (3.0, 3.0)]))
def test_loss_and_gradient_equal_autograd_of_the_formula(seed, taus):
    g = torch.Generator().manual_seed(seed)
    n, width = 5, 7
    lengths = torch.randint(1, width + 1, (n,), generator=g)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
    old = -torch.rand(n, width, generator=g, dtype=F64) * 2
    new = (old + 0.8 * torch.randn(n, width, generator=g, dtype=F64)).requires_grad_(True)
    adv = torch.randn(n, width, generator=g, dtype=F64)  # token-level advantages, both signs within a response
    loss, _ = sapo_loss(new, old, adv, mask, tau_pos=taus[0], tau_neg=taus[1],
                        reduction=Reduction("seq-mean-token-mean"))
    (grad,) = torch.autograd.grad(loss, new)
    ref = _reference(new, old, adv, mask, *taus)
    (ref_grad,) = torch.autograd.grad(ref, new)
    assert loss.item() == pytest.approx(ref.item(), abs=1e-12)
    assert torch.allclose(grad, ref_grad, atol=1e-12)
    # closed form: -A * r * 4 s (1 - s) / (|y_i| * n)
    r = torch.exp(new.detach() - old)
    _, slope = sapo_gate(r, adv, *taus)
    closed = -adv * r * slope / (mask.sum(-1, keepdim=True) * n)
    assert torch.allclose(grad, torch.where(mask.bool(), closed, 0.0), atol=1e-12)


def test_on_the_first_update_the_gradient_is_the_policy_gradient():
    # r = 1: the slope is 1 for either temperature, so the gradient is PPO's (-A grad logp), though the values
    # differ (SAPO's -(2 / tau) A)
    g = torch.Generator().manual_seed(2)
    logp = torch.randn(3, 4, generator=g, dtype=F64).requires_grad_(True)
    adv, mask = torch.randn(3, 4, generator=g, dtype=F64), torch.ones(3, 4)
    loss, stats = sapo_loss(logp, logp.detach(), adv, mask, reduction=Reduction("token-mean"))
    (sapo,) = torch.autograd.grad(loss, logp)
    (ppo,) = torch.autograd.grad(policy_loss(logp, logp.detach(), adv, mask, reduction=Reduction("token-mean"))[0],
                                 logp)
    assert torch.allclose(sapo, ppo, atol=1e-12) and stats["loss/sapo_slope_mean"] == 1.0
    two_over_tau = torch.where(adv > 0, torch.tensor(2.0, dtype=F64), torch.tensor(2 / 1.05, dtype=F64))
    assert loss.item() == pytest.approx(-(adv * two_over_tau).mean().item(), abs=1e-12)


def test_the_gate_damps_more_the_further_the_ratio_and_the_larger_tau():
    r = torch.tensor([1.0, 1.5, 2.0, 4.0], dtype=F64)
    pos = torch.ones(4, dtype=F64)
    _, slope1 = sapo_gate(r, pos, 1.0, 1.05)
    _, slope3 = sapo_gate(r, pos, 3.0, 1.05)
    assert slope1[0] == 1.0 and bool((slope1.diff() < 0).all()) and bool((slope3[1:] < slope1[1:]).all())
    # the negative temperature applies where A <= 0 (A = 0 included, as verl's `advantages > 0`)
    gate, _ = sapo_gate(torch.tensor([2.0, 2.0], dtype=F64), torch.tensor([0.0, -1.0], dtype=F64), 1.0, 2.0)
    assert torch.allclose(gate, torch.full((2,), 2.0 * _sig(2.0), dtype=F64))


def test_the_registered_loss_reads_its_options_and_the_aggregation():
    entry = lookup("policy_loss", "sapo")
    assert entry.options is SapoOptions and entry.rowwise and not entry.needs_old_logprobs
    assert (SapoOptions().tau_pos, SapoOptions().tau_neg) == (1.0, 1.05)  # verl 0.9.1's defaults (the paper's)
    cfg = load_config(None, ["algo.loss=sapo", "algo.loss_agg=token-mean", "algo.sapo.tau_pos=0.7",
                             "algo.sapo.tau_neg=1.3"]).algo
    g = torch.Generator().manual_seed(1)
    old = -torch.rand(2, 3, generator=g)
    new, adv, mask = old + torch.randn(2, 3, generator=g), torch.randn(2, 3, generator=g), torch.ones(2, 3)
    got, _ = entry.bind(cfg)(new, RolloutBatch.for_loss(mask, adv, logprobs=old, max_response_len=3), cfg)
    want, _ = sapo_loss(new, old, adv, mask, tau_pos=0.7, tau_neg=1.3, reduction=Reduction("token-mean"))
    assert torch.equal(got, want)


@pytest.mark.parametrize("overrides, message", [
    (["algo.loss=sapo", "algo.sapo.tau_pos=0"], r"algo.sapo.tau_pos: must be > 0 .*got 0.0"),
    (["algo.loss=sapo", "algo.sapo.tau_neg=-1"], r"algo.sapo.tau_neg: must be > 0 .*got -1.0"),
    (["algo.sapo.tau_pos=2"], "algo.sapo: options of the policy loss 'sapo', which is not selected"),
    (["algo.loss=sapo", "algo.sapo.temperature=2"], "algo.sapo.temperature"),
])
def test_configuration_errors_name_the_field(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_the_function_refuses_a_temperature_that_is_not_positive():
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="tau_pos and tau_neg must be > 0"):
        sapo_loss(x, x, x, torch.ones(1, 2), tau_neg=0.0)


def test_the_recipe_is_the_papers_objective():
    cfg = load_config(Path(__file__).resolve().parents[2] / "configs" / "recipes" / "sapo.yaml")
    a = cfg.algo
    assert (a.loss, a.loss_agg, a.mini_batches * a.epochs) == ("sapo", "seq-mean-token-mean", 4)
    assert (a.options["sapo"].tau_pos, a.options["sapo"].tau_neg) == (1.0, 1.05)


def test_a_response_with_zero_advantages_adds_no_loss_and_no_gradient():
    # the registry's `rowwise` promise: the update may leave such responses out of the forward and backward
    g = torch.Generator().manual_seed(6)
    old = -torch.rand(3, 4, generator=g, dtype=F64)
    new = (old + torch.randn(3, 4, generator=g, dtype=F64)).requires_grad_(True)
    adv = torch.randn(3, 4, generator=g, dtype=F64)
    adv[1] = 0.0
    loss, _ = sapo_loss(new, old, adv, torch.ones(3, 4))
    (grad,) = torch.autograd.grad(loss, new)
    assert torch.equal(grad[1], torch.zeros(4, dtype=F64))
    kept = [0, 2]
    alone, _ = sapo_loss(new[kept], old[kept], adv[kept], torch.ones(2, 4))
    assert loss.item() == pytest.approx(alone.item() * 2 / 3, abs=1e-12)  # the row counts in the mean only
