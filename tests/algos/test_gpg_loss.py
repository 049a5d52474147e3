"""GPG's policy loss (docs/methods.md §5m): values derived by hand, the gradient against its closed form (no ratio:
the old log-probs do not enter it), and the registered loss. verl 0.9.1's own function is compared in
tests/integrations/test_verl.py; GPG's estimator is tests/algos/test_gpg.py."""

from __future__ import annotations

import math

import pytest
import torch

from explorl.algos.aggregation import Reduction
from explorl.algos.batch import RolloutBatch
from explorl.algos.methods.gpg_loss import gpg_loss
from explorl.algos.registry import lookup
from explorl.config import AlgoConfig, load_config

D = torch.float64


def test_a_hand_derived_batch():
    # row 0: A = 2 on log-probs ln 0.5, ln 0.25 (a third token is padding); row 1: A = -1 on ln 0.5:
    #   token losses -A * logp: 2 ln 2 = 1.3862944, 4 ln 2 = 2.7725887, -ln 2 = -0.6931472
    #   token-mean over 3 tokens: 5 ln 2 / 3 = 1.1552453; seq-mean-token-mean: (3 ln 2 - ln 2) / 2 = ln 2
    #   gradient (token-mean): -A / 3 = [-2/3, -2/3, 0], [1/3, 0, 0]
    new = torch.tensor([[math.log(0.5), math.log(0.25), 7.0], [math.log(0.5), 3.0, 3.0]], dtype=D,
                       requires_grad=True)
    old = torch.full((2, 3), -1.0, dtype=D)
    adv = torch.tensor([[2.0] * 3, [-1.0] * 3], dtype=D)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    loss, stats = gpg_loss(new, old, adv, mask)
    assert loss.item() == pytest.approx(5 * math.log(2) / 3, abs=1e-12)
    loss.backward()
    assert torch.allclose(new.grad, torch.tensor([[-2 / 3, -2 / 3, 0.0], [1 / 3, 0.0, 0.0]], dtype=D), atol=1e-12)
    seq, _ = gpg_loss(new, old, adv, mask, reduction=Reduction("seq-mean-token-mean"))
    assert seq.item() == pytest.approx(math.log(2), abs=1e-12)
    # the ratio statistics show how far the policy moved (they do not enter the loss): ln 0.5 + 1 = 0.3068528, ...
    assert stats["loss/ratio_max"] == pytest.approx(0.5 * math.e)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_the_gradient_is_the_weighted_policy_gradient_whatever_the_old_policy(agg):
    g = torch.Generator().manual_seed(5)
    n, width = 5, 6
    lengths = torch.randint(1, width + 1, (n,), generator=g)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).to(D)
    new = (-torch.rand(n, width, generator=g, dtype=D) * 2).requires_grad_(True)
    adv, w = torch.randn(n, width, generator=g, dtype=D), torch.rand(n, width, generator=g, dtype=D)
    d_agg = {"token-mean": mask / mask.sum(),
             "seq-mean-token-mean": mask / mask.sum(-1, keepdim=True) / n,
             "seq-mean-token-sum-norm": mask / (n * width)}[agg]
    grads = []
    for old in (new.detach(), new.detach() - 3.0):
        loss, _ = gpg_loss(new, old, adv, mask, reduction=Reduction(agg, max_response_len=width, token_weights=w))
        grads.append(torch.autograd.grad(loss, new)[0])
    assert torch.allclose(grads[0], -adv * w * d_agg, atol=1e-12) and torch.equal(grads[0], grads[1])


def test_the_registered_loss_reads_the_aggregation():
    g = torch.Generator().manual_seed(0)
    old, adv = -torch.rand(3, 4, generator=g, dtype=D), torch.randn(3, 4, generator=g, dtype=D)
    new, mask = old + 0.2 * torch.randn(3, 4, generator=g, dtype=D), torch.ones(3, 4)
    entry = lookup("policy_loss", "gpg")
    assert entry.options is None and entry.rowwise and entry.cites[0].paper == "GPG"
    cfg = AlgoConfig(loss="gpg", loss_agg="seq-mean-token-sum-norm")
    got = entry.fn(new, RolloutBatch.for_loss(mask, adv, logprobs=old, max_response_len=4), cfg)
    want = gpg_loss(new, old, adv, mask, reduction=Reduction("seq-mean-token-sum-norm", max_response_len=4))
    assert torch.equal(got[0], want[0]) and got[1] == want[1]
    assert load_config(None, ["algo.loss=gpg"]).algo.loss == "gpg"  # no options, nothing to refuse
