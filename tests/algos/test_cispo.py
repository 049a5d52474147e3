"""CISPO (docs/methods.md §5h): values derived by hand, the gradient against autograd of the formula written
independently (`-sg[clip(r)] * A * logp`, the clip detached), and the configuration's errors. verl 0.9.1's own
function is compared in tests/integrations/test_verl.py."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from explorl.algos.aggregation import Reduction
from explorl.algos.batch import RolloutBatch
from explorl.algos.methods.cispo import cispo_loss, cispo_weight
from explorl.algos.methods.ppo import policy_loss
from explorl.algos.registry import lookup
from explorl.config import ConfigError, load_config

F64 = torch.float64


def test_a_hand_derived_batch():
    # clip range [1 - 0.2, 1 + 0.28] = [0.8, 1.28]; token loss -w * A * logp_new, w = clip(r) (detached)
    # response 0, A = +1, two valid tokens (the third is padding, its huge log-prob must not leak):
    #   t0: logp_new -0.5, logp_old -1.0: r = e^0.5 = 1.64872 -> w = 1.28 (high bound); loss -1.28 * -0.5 = 0.64
    #   t1: logp_new -2.1, logp_old -2.0: r = e^-0.1 = 0.904837 -> w = 0.904837; loss 0.904837 * 2.1 = 1.900158
    # response 1, A = -2, three valid tokens, logp_old -1.0 each:
    #   t0: logp_new -2.0: r = e^-1 = 0.367879 -> w = 0.8 (low bound); loss -0.8 * -2 * -2.0 = -3.2
    #   t1: logp_new -0.8: r = e^0.2 = 1.221403 -> w = 1.221403; loss -1.221403 * -2 * -0.8 = -1.954244
    #   t2: logp_new -1.0: r = 1 -> w = 1; loss -1 * -2 * -1.0 = -2.0
    # token-mean over the 5 valid tokens: (0.64 + 1.900158 - 3.2 - 1.954244 - 2.0) / 5 = -0.922817
    old = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, -1.0]], dtype=F64)
    new = torch.tensor([[-0.5, -2.1, 50.0], [-2.0, -0.8, -1.0]], dtype=F64, requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    adv = torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0]], dtype=F64)
    loss, stats = cispo_loss(new, old, adv, mask, eps_low=0.2, eps_high=0.28, reduction=Reduction("token-mean"))
    w01, w11 = math.exp(-0.1), math.exp(0.2)
    want = (1.28 * 0.5 + w01 * 2.1 - 0.8 * 2 * 2.0 - w11 * 2 * 0.8 - 2.0) / 5
    assert loss.item() == pytest.approx(want, abs=1e-12)
    assert loss.item() == pytest.approx(-0.922817, abs=1e-6)
    # two of the five weights are clipped, one at each bound, whatever the advantage's sign
    assert stats["loss/clip_frac"] == pytest.approx(2 / 5)
    assert stats["loss/clip_frac_low"] == pytest.approx(1 / 5) and stats["loss/clip_frac_high"] == pytest.approx(1 / 5)
    assert stats["loss/cispo_weight_mean"] == pytest.approx((1.28 + w01 + 0.8 + w11 + 1.0) / 5)
    assert stats["loss/ratio_max"] == pytest.approx(math.exp(0.5)) and stats["loss/ratio_min"] == pytest.approx(
        math.exp(-1.0))
    loss.backward()
    # gradient -w * A / 5 at every valid token, the clipped ones included (PPO's clip would give t0 of both
    # responses none); 0 on the padding
    want_grad = torch.tensor([[-1.28, -w01, 0.0], [0.8 * 2, w11 * 2, 1.0 * 2]], dtype=F64) / 5
    assert torch.allclose(new.grad, want_grad, atol=1e-12)


def _reference(new, old, adv, mask, eps_low, eps_high, agg):
    """The CISPO token loss written out: the ratio taken from detached log-probs and clipped, then the aggregation
    by its definition (token-mean: over all valid tokens; seq-mean-token-mean: per response, then over
    the responses that have a token)."""
    valid = mask.bool()
    w = torch.exp(new.detach() - old).clamp(1 - eps_low, 1 + eps_high)
    token = torch.where(valid, -w * adv * new, torch.zeros_like(new))
    if agg == "token-mean":
        return token.sum() / valid.sum()
    rows = [token[i].sum() / valid[i].sum() for i in range(new.shape[0]) if valid[i].any()]
    return torch.stack(rows).mean()


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), eps=st.sampled_from([(0.2, 0.28), (1.0, 4.0), (0.0, 0.0)]),
       agg=st.sampled_from(["token-mean", "seq-mean-token-mean"]))
def test_loss_and_gradient_equal_autograd_of_the_formula(seed, eps, agg):
    g = torch.Generator().manual_seed(seed)
    n, width = 5, 7
    lengths = torch.randint(1, width + 1, (n,), generator=g)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
    old = -torch.rand(n, width, generator=g, dtype=F64) * 3
    new = (old + torch.randn(n, width, generator=g, dtype=F64)).requires_grad_(True)  # ratios well past the clip
    adv = torch.randn(n, width, generator=g, dtype=F64)  # token-level advantages too
    loss, _ = cispo_loss(new, old, adv, mask, eps_low=eps[0], eps_high=eps[1], reduction=Reduction(agg))
    (grad,) = torch.autograd.grad(loss, new)
    ref = _reference(new, old, adv, mask, *eps, agg)
    (ref_grad,) = torch.autograd.grad(ref, new)
    assert loss.item() == pytest.approx(ref.item(), abs=1e-12)
    assert torch.allclose(grad, ref_grad, atol=1e-12)
    # and the gradient in closed form: -w * A / n_valid per valid token (token-mean)
    if agg == "token-mean":
        w = cispo_weight(torch.exp(new.detach() - old), *eps)
        assert torch.allclose(grad, torch.where(mask.bool(), -w * adv, 0.0) / mask.sum(), atol=1e-12)


def test_inside_the_clip_range_the_gradient_is_ppos():
    # no weight clipped (a range wider than every ratio): CISPO's gradient -r A grad logp is PPO's unclipped one
    g = torch.Generator().manual_seed(4)
    old = -torch.rand(3, 4, generator=g, dtype=F64)
    new = (old + 0.1 * torch.randn(3, 4, generator=g, dtype=F64)).requires_grad_(True)
    adv, mask = torch.randn(3, 4, generator=g, dtype=F64), torch.ones(3, 4)
    (cispo,) = torch.autograd.grad(cispo_loss(new, old, adv, mask, eps_low=1.0, eps_high=10.0)[0], new)
    (ppo,) = torch.autograd.grad(policy_loss(new, old, adv, mask, eps_low=1.0, eps_high=10.0)[0], new)
    assert torch.allclose(cispo, ppo, atol=1e-12)


def test_on_the_first_update_the_weight_is_one_and_eps_low_one_is_no_lower_bound():
    logp = torch.tensor([[-1.0, -3.0]], dtype=F64, requires_grad=True)
    adv, mask = torch.tensor([[2.0, 2.0]], dtype=F64), torch.ones(1, 2)
    loss, stats = cispo_loss(logp, logp.detach(), adv, mask)
    assert loss.item() == pytest.approx(-(2.0 * -1.0 + 2.0 * -3.0) / 2)  # -A * logp, its token mean
    assert stats["loss/clip_frac"] == 0.0 and stats["loss/cispo_weight_mean"] == 1.0
    # eps_low 1: the bound is 0, below every ratio, so a tiny ratio keeps its own weight
    _, stats = cispo_loss(logp, logp.detach() + 5.0, adv, mask, eps_low=1.0, eps_high=4.0)
    assert stats["loss/clip_frac"] == 0.0 and stats["loss/cispo_weight_mean"] == pytest.approx(math.exp(-5.0))


def test_the_registered_loss_reads_the_core_clip_range_and_has_no_options():
    entry = lookup("policy_loss", "cispo")
    assert entry.options is None and entry.rowwise and not entry.needs_old_logprobs
    assert set(entry.reads) == {"eps_low", "eps_high", "loss_agg"}
    cfg = load_config(None, ["algo.loss=cispo", "algo.eps_low=1.0", "algo.eps_high=4.0"]).algo
    g = torch.Generator().manual_seed(1)
    old = -torch.rand(2, 3, generator=g)
    new, adv, mask = old + torch.randn(2, 3, generator=g), torch.randn(2, 3, generator=g), torch.ones(2, 3)
    got, _ = entry.bind(cfg)(new, RolloutBatch.for_loss(mask, adv, logprobs=old, max_response_len=3), cfg)
    want, _ = cispo_loss(new, old, adv, mask, eps_low=1.0, eps_high=4.0)
    assert torch.equal(got, want)


@pytest.mark.parametrize("overrides, message", [
    (["algo.loss=cispo", "algo.cispo.eps=1"], "algo.cispo: the policy loss 'cispo' has no options"),
    (["algo.loss=cispo", "algo.eps_low=1.5"], r"algo.eps_low: must be in \[0, 1\]"),
    (["algo.loss=cispo", "algo.eps_high=-1"], "algo.eps_high: must be >= 0"),
])
def test_configuration_errors_name_the_field(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_the_recipe_is_the_papers_objective():
    cfg = load_config(Path(__file__).resolve().parents[2] / "configs" / "recipes" / "cispo.yaml")
    a = cfg.algo
    assert (a.loss, a.loss_agg, a.eps_low, a.eps_high, a.mini_batches * a.epochs) == ("cispo", "token-mean", 1.0,
                                                                                      4.0, 4)


def test_a_response_with_zero_advantages_adds_no_loss_and_no_gradient():
    # the registry's `rowwise` promise: the update may leave such responses out of the forward and backward
    g = torch.Generator().manual_seed(6)
    old = -torch.rand(3, 4, generator=g, dtype=F64)
    new = (old + torch.randn(3, 4, generator=g, dtype=F64)).requires_grad_(True)
    adv = torch.randn(3, 4, generator=g, dtype=F64)
    adv[1] = 0.0
    loss, _ = cispo_loss(new, old, adv, torch.ones(3, 4),
                         reduction=Reduction("seq-mean-token-sum-norm", max_response_len=4))
    (grad,) = torch.autograd.grad(loss, new)
    assert torch.equal(grad[1], torch.zeros(4, dtype=F64))
    kept = [0, 2]
    alone, _ = cispo_loss(new[kept], old[kept], adv[kept], torch.ones(2, 4),
                          reduction=Reduction("seq-mean-token-sum-norm", max_response_len=4))
    assert loss.item() == pytest.approx(alone.item() * 2 / 3, abs=1e-12)  # the row counts in the mean only
