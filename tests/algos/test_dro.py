"""DRO (docs/methods.md §5l): values derived by hand, the gradient against its closed form, the penalty where the
advantage is 0, the registered loss and the required option's validation. verl 0.9.1's own function is compared in
tests/integrations/test_verl.py."""

from __future__ import annotations

import pytest
import torch

from explorl.algos.aggregation import Reduction
from explorl.algos.batch import RolloutBatch
from explorl.algos.methods.dro import DroOptions, dro_loss
from explorl.algos.registry import lookup
from explorl.config import AlgoConfig, ConfigError, load_config

D = torch.float64


def test_a_hand_derived_batch():
    # one response, A = 1 on both tokens, beta 0.1; log pi_old -1, -2; log pi -0.5, -2.5 (log-ratios +0.5, -0.5):
    #   token losses -(logp * A - beta/2 * x^2): -(-0.5 - 0.0125) = 0.5125 and -(-2.5 - 0.0125) = 2.5125
    #   token-mean 1.5125; gradient -(A - beta * x) / 2: -(1 - 0.05) / 2 = -0.475, -(1 + 0.05) / 2 = -0.525
    old = torch.tensor([[-1.0, -2.0]], dtype=D)
    new = torch.tensor([[-0.5, -2.5]], dtype=D, requires_grad=True)
    loss, stats = dro_loss(new, old, torch.ones(1, 2, dtype=D), torch.ones(1, 2), beta=0.1)
    assert loss.item() == pytest.approx(1.5125, abs=1e-12)
    assert stats["loss/dro_penalty"] == pytest.approx(0.0125, abs=1e-12)
    loss.backward()
    assert torch.allclose(new.grad, torch.tensor([[-0.475, -0.525]], dtype=D), atol=1e-12)


def test_the_penalty_acts_where_the_advantage_is_zero():
    # A = 0, log-ratio 1, beta 0.1: the loss is beta/2 = 0.05 and its gradient beta * x = 0.1 pulls back: so the
    # registry entry is not row-wise (a response with all-zero advantages is not left out of the update)
    new = torch.tensor([[-1.0]], dtype=D, requires_grad=True)
    loss, _ = dro_loss(new, torch.tensor([[-2.0]], dtype=D), torch.zeros(1, 1, dtype=D), torch.ones(1, 1), beta=0.1)
    loss.backward()
    assert loss.item() == pytest.approx(0.05) and new.grad.item() == pytest.approx(0.1)
    assert not lookup("policy_loss", "dro").rowwise


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_the_gradient_is_the_advantage_less_the_pull_back(agg):
    g = torch.Generator().manual_seed(3)
    n, width, beta = 5, 6, 0.3
    lengths = torch.randint(1, width + 1, (n,), generator=g)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).to(D)
    old = -torch.rand(n, width, generator=g, dtype=D) * 2
    new = (old + 0.5 * torch.randn(n, width, generator=g, dtype=D)).requires_grad_(True)
    adv, is_w = torch.randn(n, width, generator=g, dtype=D), torch.rand(n, width, generator=g, dtype=D) + 0.5
    loss, _ = dro_loss(new, old, adv, mask, beta=beta,
                       reduction=Reduction(agg, max_response_len=width, is_weights=is_w))
    (grad,) = torch.autograd.grad(loss, new)
    d_agg = {"token-mean": mask / mask.sum(),
             "seq-mean-token-mean": mask / mask.sum(-1, keepdim=True) / n,
             "seq-mean-token-sum-norm": mask / (n * width)}[agg]
    assert torch.allclose(grad, -(adv - beta * (new.detach() - old)) * is_w * d_agg, atol=1e-12)


def test_the_registered_loss_reads_beta_and_the_aggregation():
    g = torch.Generator().manual_seed(0)
    old, adv = -torch.rand(3, 4, generator=g, dtype=D), torch.randn(3, 4, generator=g, dtype=D)
    new, mask = old + 0.2 * torch.randn(3, 4, generator=g, dtype=D), torch.ones(3, 4)
    entry = lookup("policy_loss", "dro")
    assert entry.options is DroOptions and entry.cites[0].paper == "DRO"
    cfg = AlgoConfig(loss="dro", loss_agg="seq-mean-token-mean")
    got = entry.fn(new, RolloutBatch.for_loss(mask, adv, logprobs=old, max_response_len=4), cfg,
                   options=DroOptions(beta=0.2))
    want = dro_loss(new, old, adv, mask, beta=0.2, reduction=Reduction("seq-mean-token-mean", max_response_len=4))
    assert torch.equal(got[0], want[0]) and got[1] == want[1]


def test_beta_is_required_and_positive():
    assert DroOptions().beta is None  # verl's policy_loss.dro_beta: no default
    assert load_config(None, ["algo.loss=dro", "algo.dro.beta=0.05"]).algo.options["dro"].beta == 0.05
    with pytest.raises(ConfigError, match=r"algo.dro.beta: DRO needs its penalty coefficient, > 0 .*got None"):
        load_config(None, ["algo.loss=dro"])
    with pytest.raises(ConfigError, match=r"algo.dro.beta: .*got -0.1"):
        load_config(None, ["algo.loss=dro", "algo.dro.beta=-0.1"])
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match=r"dro_loss: beta must be > 0"):
        dro_loss(x, x, x, x, beta=0.0)
