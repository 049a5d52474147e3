"""PSR, NSR and W-REINFORCE (docs/methods.md §5t): hand-derived advantages, the decomposition they share, the
registered estimators, their options and the recipes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from explorl.algos.batch import RolloutBatch
from explorl.algos.methods.nsr import sample_reinforcement
from explorl.algos.registry import lookup
from explorl.config import ConfigError, load_config

RECIPES = Path(__file__).resolve().parents[2] / "configs" / "recipes"


def _batch():
    # rewards 1, 0, 0.7, 0.5, 0: correct (> 0.5) are rows 0 and 2; row 3 (exactly 0.5) counts as wrong
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 1, 1]], dtype=torch.float32)
    return RolloutBatch(mask=mask, rewards=torch.tensor([1.0, 0.0, 0.7, 0.5, 0.0]), group=torch.tensor([3, 3, 9, 9, 9]))


def test_hand_derived_advantages_of_the_three_estimators():
    batch = _batch()
    correct = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0])[:, None]
    # PSR: +1 on correct, 0 on wrong; NSR: 0 on correct, -1 on wrong; W-REINFORCE: +0.1 on correct, -1 on wrong
    want = {"psr": correct * batch.mask, "nsr": -(1 - correct) * batch.mask,
            "w_reinforce": (0.1 * correct - (1 - correct)) * batch.mask}
    cfg = load_config(None, []).algo
    for name, expected in want.items():
        got = lookup("estimator", name).bind(cfg)(batch, cfg)
        assert torch.allclose(got, expected, atol=1e-7), name
        assert got.dtype == torch.float32 and not got[batch.mask == 0].any()


def test_w_reinforce_interpolates_psr_plus_nsr():
    # W-REINFORCE with lambda = lam * PSR + NSR (eq. 9 is lambda L_PSR + L_NSR); lambda 1 is REINFORCE on +-1
    g = torch.Generator().manual_seed(0)
    rewards = (torch.rand(12, generator=g) > 0.5).double()
    mask = torch.ones(12, 4, dtype=torch.float64)
    psr = sample_reinforcement(rewards, mask, positive=1.0, negative=0.0)
    nsr = sample_reinforcement(rewards, mask, positive=0.0, negative=1.0)
    for lam in (0.0, 0.1, 1.0):
        w = sample_reinforcement(rewards, mask, positive=lam, negative=1.0)
        assert torch.allclose(w, lam * psr + nsr, atol=0)
    reinforce = sample_reinforcement(rewards, mask, positive=1.0, negative=1.0)
    assert torch.equal(reinforce, (2 * rewards - 1)[:, None].expand(12, 4))  # the paper's +-1 reward


def test_groups_play_no_part():
    batch = _batch()
    cfg = load_config(None, []).algo
    fn = lookup("estimator", "w_reinforce").bind(cfg)
    assert torch.equal(fn(batch, cfg), fn(batch.replace(group=torch.arange(5)), cfg))
    assert not lookup("estimator", "nsr").needs_old_logprobs


def test_options_and_errors():
    cfg = load_config(None, ["algo.advantage=w_reinforce", "algo.w_reinforce.lam=0.5"]).algo
    assert cfg.options["w_reinforce"].lam == 0.5
    assert load_config(None, ["algo.advantage=w_reinforce"]).algo.options["w_reinforce"].lam == 0.1
    with pytest.raises(ConfigError, match="algo.w_reinforce.lam: must be >= 0"):
        load_config(None, ["algo.advantage=w_reinforce", "algo.w_reinforce.lam=-1"])
    with pytest.raises(ConfigError, match="algo.nsr: the estimator 'nsr' has no options"):
        load_config(None, ["algo.advantage=nsr", "algo.nsr.lam=1"])
    with pytest.raises(ValueError, match=">= 0"):
        sample_reinforcement(torch.zeros(2), torch.ones(2, 2), positive=-1.0, negative=1.0)


@pytest.mark.parametrize("name", ["psr", "nsr", "w_reinforce"])
def test_the_recipes_are_the_authors_setting(name):
    a = load_config(RECIPES / f"{name}.yaml").algo
    assert (a.advantage, a.loss, a.loss_agg, a.eps_low, a.eps_high, a.kl_coef, a.entropy_coef,
            a.mini_batches * a.epochs) == (name, "ppo", "token-mean", 0.2, 0.2, 0.0, 0.001, 4)
