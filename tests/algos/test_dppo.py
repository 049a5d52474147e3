"""DPPO-Binary-TV and -KL (docs/methods.md §5j): values derived by hand, the trust-region mask and the Binary
divergences on single tokens, the gradient against its closed form, the registered losses' configuration and the
option's validation. verl 0.9.1's own functions are compared in tests/integrations/test_verl.py."""

from __future__ import annotations

import math

import pytest
import torch

from explorl.algos.aggregation import Reduction
from explorl.algos.batch import RolloutBatch
from explorl.algos.methods.dppo import DppoOptions, binary_divergence, dppo_loss, trust_region_mask
from explorl.algos.registry import lookup
from explorl.config import AlgoConfig, ConfigError, load_config

D = torch.float64


def _probs(p):
    return torch.tensor(p, dtype=D).log()


# Row 0 has A = +1, row 1 A = -2; q = pi_old = 0.5 except row 1's last token. TV bounds 0.15/0.15, cap 1.5:
#   row 0: p 0.8 (rose 0.3 > 0.15 with A > 0: out), p 0.6 (rose 0.1: kept, ratio 1.2), p 0.2 (fell: kept, ratio 0.4)
#   row 1: p 0.2 (fell 0.3 > 0.15 with A < 0: out), p 0.45 (fell 0.05: kept, ratio 0.9), p 0.9 (rose: kept, ratio
#          1.8, truncated to 1.5)
# token loss -A * w * log p * keep:
#   row 0: 0, -1 * 1.2 * ln 0.6 = 0.6129910, -1 * 0.4 * ln 0.2 = 0.6437752
#   row 1: 0, 2 * 0.9 * ln 0.45 = -1.4373135, 2 * 1.5 * ln 0.9 = -0.3160815
# token-mean over 6 tokens: -0.4966288 / 6 = -0.0827715; gradient -A * w * keep / 6:
#   row 0: [0, -0.2, -0.0666667], row 1: [0, 0.3, 0.5]
NEW = [[0.8, 0.6, 0.2], [0.2, 0.45, 0.9]]
OLD = [[0.5, 0.5, 0.5], [0.5, 0.5, 0.5]]
ADV = torch.tensor([[1.0] * 3, [-2.0] * 3], dtype=D)


def test_a_hand_derived_batch_tv():
    new = _probs(NEW).requires_grad_(True)
    mask = torch.ones(2, 3)
    loss, stats = dppo_loss(new, _probs(OLD), ADV, mask, divergence="tv", trust_region=(0.15, 0.15), ratio_cap=1.5)
    want = (-1.2 * math.log(0.6) - 0.4 * math.log(0.2) + 1.8 * math.log(0.45) + 3.0 * math.log(0.9)) / 6
    assert loss.item() == pytest.approx(want, abs=1e-12) and want == pytest.approx(-0.0827715, abs=1e-7)
    loss.backward()
    assert torch.allclose(new.grad, torch.tensor([[0, -1.2 / 6, -0.4 / 6], [0, 1.8 / 6, 3.0 / 6]], dtype=D),
                          atol=1e-12)
    assert stats["loss/clip_frac"] == pytest.approx(2 / 6)
    assert stats["loss/clip_frac_high"] == pytest.approx(1 / 6) and stats["loss/clip_frac_low"] == pytest.approx(1 / 6)
    assert stats["loss/truncated_frac"] == pytest.approx(1 / 6)
    assert stats["loss/ratio_max"] == pytest.approx(1.8) and stats["loss/ratio_min"] == pytest.approx(0.4)


def test_the_same_batch_with_the_binary_kl():
    # Bernoulli KL(q || p), q = 0.5: p 0.8 -> 0.5 ln(0.5/0.8) + 0.5 ln(0.5/0.2) = 0.2231436 (> 0.05, rose: out with
    # A > 0); p 0.6 -> 0.0204110 (kept); p 0.2 -> 0.2231436 (fell: out with A < 0, kept with A > 0); p 0.45 ->
    # 0.0050252 (kept); p 0.9 rose (kept with A < 0). The same tokens as TV's at 0.15: the same loss.
    kl = binary_divergence(_probs(NEW), _probs(OLD), "kl")
    want = torch.tensor([[0.2231436, 0.0204110, 0.2231436], [0.2231436, 0.0050252, 0.5108256]], dtype=D)
    assert torch.allclose(kl, want, atol=1e-6)
    tv, _ = dppo_loss(_probs(NEW), _probs(OLD), ADV, torch.ones(2, 3), divergence="tv", trust_region=(0.15, 0.15),
                      ratio_cap=1.5)
    kl_loss, _ = dppo_loss(_probs(NEW), _probs(OLD), ADV, torch.ones(2, 3), divergence="kl", trust_region=(0.05, 0.05),
                           ratio_cap=1.5)
    assert kl_loss.item() == pytest.approx(tv.item(), abs=1e-12)


def test_tv_and_kl_differ_on_a_rare_token():
    # the paper's point: q = 0.01 -> p = 0.1 is a small TV move (0.09 <= 0.15: kept) but a large KL one:
    # 0.01 ln(0.01/0.1) + 0.99 ln(0.99/0.9) = -0.0230259 + 0.0943572 = 0.0713313 > 0.05 (out, A > 0); and
    # q = 0.9 -> p = 0.99 is 0.09 in TV (kept) and 0.9 ln(0.9/0.99) + 0.1 ln(0.1/0.01) = -0.0857792 + 0.2302585
    # = 0.1444793 in KL (out)
    new, old = _probs([[0.1, 0.99]]), _probs([[0.01, 0.9]])
    adv = torch.ones(1, 2, dtype=D)
    assert binary_divergence(new, old, "tv")[0].tolist() == pytest.approx([0.09, 0.09])
    assert binary_divergence(new, old, "kl")[0].tolist() == pytest.approx([0.0713313, 0.1444793], abs=1e-6)
    assert trust_region_mask(new, old, adv, "tv", 0.15, 0.15).tolist() == [[True, True]]
    assert trust_region_mask(new, old, adv, "kl", 0.05, 0.05).tolist() == [[False, False]]
    # the same moves against a negative advantage pull the token back: kept by both
    assert trust_region_mask(new, old, -adv, "kl", 0.05, 0.05).tolist() == [[True, True]]
    # the bounds are one-sided: delta_low acts on falls, delta_high on rises
    assert trust_region_mask(old, new, -adv, "tv", 0.05, 1.0).tolist() == [[False, False]]
    assert trust_region_mask(old, new, -adv, "tv", 1.0, 0.05).tolist() == [[True, True]]


@pytest.mark.parametrize("divergence", ["tv", "kl"])
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("cap", [None, 1.2])
def test_the_gradient_is_the_masked_truncated_policy_gradient(divergence, agg, cap):
    """d loss / d logp_t = -A_t * min(r_t, C) * keep_t * d agg / d token_t, with the weights' product."""
    g = torch.Generator().manual_seed(7)
    n, width = 6, 8
    lengths = torch.randint(1, width + 1, (n,), generator=g)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).to(D)
    old = -torch.rand(n, width, generator=g, dtype=D) * 3
    new = (old + 0.4 * torch.randn(n, width, generator=g, dtype=D)).clamp(max=-1e-3).requires_grad_(True)
    adv = torch.randn(n, width, generator=g, dtype=D)
    is_w = torch.rand(n, width, generator=g, dtype=D) + 0.5
    loss, _ = dppo_loss(new, old, adv, mask, divergence=divergence, trust_region=(0.1, 0.05), ratio_cap=cap,
                        reduction=Reduction(agg, max_response_len=width, is_weights=is_w))
    (grad,) = torch.autograd.grad(loss, new)
    keep = trust_region_mask(new.detach(), old, adv, divergence, 0.1, 0.05).to(D)
    ratio = torch.exp(new.detach() - old)
    w = ratio if cap is None else ratio.clamp(max=cap)
    d_agg = {"token-mean": mask / mask.sum(),
             "seq-mean-token-mean": mask / mask.sum(-1, keepdim=True) / n,
             "seq-mean-token-sum-norm": mask / (n * width)}[agg]
    assert torch.allclose(grad, -adv * w * keep * is_w * d_agg, atol=1e-12)
    assert 0 < float(keep[mask.bool()].mean()) < 1  # both kinds of token are in the batch


def test_the_registered_losses_read_the_core_bounds_and_their_options():
    gen = torch.Generator().manual_seed(1)
    old = -torch.rand(3, 4, generator=gen, dtype=D)
    new = old + 0.3 * torch.randn(3, 4, generator=gen, dtype=D)
    adv, mask = torch.randn(3, 4, generator=gen, dtype=D), torch.ones(3, 4)
    for name, divergence in (("dppo_tv", "tv"), ("dppo_kl", "kl")):
        entry = lookup("policy_loss", name)
        assert entry.options is DppoOptions and entry.rowwise and entry.cites[0].paper == "DPPO"
        cfg = AlgoConfig(loss=name, loss_agg="seq-mean-token-mean", eps_low=0.07, eps_high=0.03)
        got = entry.fn(new, RolloutBatch.for_loss(mask, adv, logprobs=old, max_response_len=4), cfg,
                       options=DppoOptions(ratio_cap=1.1))
        want = dppo_loss(new, old, adv, mask, divergence=divergence, trust_region=(0.07, 0.03), ratio_cap=1.1,
                         reduction=Reduction("seq-mean-token-mean", max_response_len=4))
        assert torch.equal(got[0], want[0]) and got[1] == want[1]


def test_options_and_their_validation():
    cfg = load_config(None, ["algo.loss=dppo_kl", "algo.dppo_kl.ratio_cap=null"])
    assert cfg.algo.options["dppo_kl"].ratio_cap is None
    assert load_config(None, ["algo.loss=dppo_tv"]).algo.options["dppo_tv"].ratio_cap == 3.0  # verl's clip_ratio_c
    with pytest.raises(ConfigError, match=r"algo.dppo_tv.ratio_cap: must be > 0 .*or null for no truncation, got 0"):
        load_config(None, ["algo.loss=dppo_tv", "algo.dppo_tv.ratio_cap=0"])
    with pytest.raises(ConfigError, match=r"algo.dppo_kl.ratio_cap: must be > 0"):
        load_config(None, ["algo.loss=dppo_kl", "algo.dppo_kl.ratio_cap=-1"])
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="divergence must be one of tv, kl"):
        dppo_loss(x, x, x, x, divergence="js")
    with pytest.raises(ValueError, match="ratio_cap must be > 0"):
        dppo_loss(x, x, x, x, ratio_cap=0.0)


def test_on_policy_every_token_is_kept_and_the_loss_is_the_plain_policy_gradient():
    logp = -torch.rand(2, 3, generator=torch.Generator().manual_seed(0), dtype=D)
    adv = torch.tensor([[1.0] * 3, [-1.0] * 3], dtype=D)
    loss, stats = dppo_loss(logp, logp, adv, torch.ones(2, 3), divergence="kl", trust_region=(0.0, 0.0))
    assert loss.item() == pytest.approx(float((-adv * logp).mean()), abs=1e-12)
    assert stats["loss/clip_frac"] == 0.0 and stats["loss/ratio_mean"] == 1.0
