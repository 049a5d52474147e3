"""RL-ZVP (docs/methods.md §5v): hand-derived token advantages, an independent loop over eq. 1 and eq. 5, GRPO on the
groups with contrast, the registered estimator (the entropy it needs, refused when not finite) and the recipe."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from explorl.algos.batch import MissingInputError, RolloutBatch
from explorl.algos.methods.grpo import grpo
from explorl.algos.methods.rl_zvp import rl_zvp
from explorl.algos.registry import lookup
from explorl.config import ConfigError, load_config

F64 = torch.float64


def test_hand_derived_token_advantages():
    # group 0: all correct (reward 1), zero variance: A = alpha * H = 0.1 * H on each valid token
    #   response 0: H [2.0, 0.5, (pad 9.0)] -> [0.2, 0.05, 0]
    # group 1: all wrong (reward 0): A = -alpha * (max_k H_k - H_t) over the response's valid tokens
    #   response 1: H [1.0, 3.0, 0.0] -> max 3 -> -0.1 * [2, 0, 3] = [-0.2, 0, -0.3]
    #   response 2: H [0.4, (pad 50)] -> max 0.4 (the padding's 50 is not a token) -> [0, 0]
    # group 2: rewards [1, 0]: GRPO, mean 0.5, unbiased std sqrt(0.5) = 0.707107 -> +-0.5 / (0.707107 + 1e-6)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0], dtype=F64)
    group = torch.tensor([0, 1, 1, 2, 2])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1], [1, 1, 0]], dtype=F64)
    entropy = torch.tensor([[2.0, 0.5, 9.0], [1.0, 3.0, 0.0], [0.4, 50.0, 50.0], [5.0, 5.0, 5.0], [1.0, 1.0, 1.0]],
                           dtype=F64)
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    want = torch.tensor([[0.2, 0.05, 0.0], [-0.2, 0.0, -0.3], [0.0, 0.0, 0.0], [a, a, a], [-a, -a, 0.0]], dtype=F64)
    assert torch.allclose(rl_zvp(rewards, group, mask, entropy, alpha=0.1), want, atol=1e-12)


def _loop_reference(rewards, group, mask, entropy, alpha, eps):
    """Algorithm 1 one response at a time: eq. 1 when the group's rewards differ, eq. 5 when they do not."""
    n, t = mask.shape
    out = torch.zeros(n, t, dtype=F64)
    for i in range(n):
        members = [j for j in range(n) if group[j] == group[i]]
        rs = torch.tensor([float(rewards[j]) for j in members], dtype=F64)
        tokens = [s for s in range(t) if mask[i, s] > 0]
        if float(rs.max()) != float(rs.min()):
            value = (float(rewards[i]) - float(rs.mean())) / (float(rs.std(unbiased=True)) + eps)
            for s in tokens:
                out[i, s] = value
        else:
            h_max = max(float(entropy[i, s]) for s in tokens) if tokens else 0.0
            for s in tokens:
                h = float(entropy[i, s])
                out[i, s] = alpha * h if float(rewards[i]) > 0 else -alpha * (h_max - h)
    return out


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 10_000), alpha=st.sampled_from([0.05, 0.1, 0.3]))
def test_equals_the_loop_reference(seed, alpha):
    g = torch.Generator().manual_seed(seed)
    n, t = 10, 6
    group = torch.randint(0, 4, (n,), generator=g) * 5 + 2
    rewards = (torch.rand(n, generator=g) > 0.6).to(F64)
    lengths = torch.randint(0, t + 1, (n,), generator=g)
    mask = (torch.arange(t)[None, :] < lengths[:, None]).to(F64)
    entropy = torch.rand(n, t, generator=g, dtype=F64) * 4
    got = rl_zvp(rewards, group, mask, entropy, alpha=alpha, eps=1e-6)
    assert torch.allclose(got, _loop_reference(rewards, group, mask, entropy, alpha, 1e-6), atol=1e-12)


def test_equals_grpo_where_no_group_is_zero_variance_and_signs_follow_correctness():
    g = torch.Generator().manual_seed(3)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0], dtype=F64)
    group = torch.tensor([0, 0, 1, 1, 2, 2])
    mask, entropy = torch.ones(6, 4, dtype=F64), torch.rand(6, 4, generator=g, dtype=F64)
    assert torch.equal(rl_zvp(rewards, group, mask, entropy), grpo(rewards, group, mask))
    # every group zero-variance: correct responses >= 0, wrong ones <= 0, and the wrong response's
    # highest-entropy token gets 0
    adv = rl_zvp(torch.tensor([1.0, 1.0, 0.0, 0.0], dtype=F64), torch.tensor([0, 0, 1, 1]), mask[:4], entropy[:4])
    assert (adv[:2] > 0).all() and (adv[2:] <= 0).all()
    assert adv[2, entropy[2].argmax()] == 0.0 and adv[3, entropy[3].argmax()] == 0.0


def test_registered_reads_the_batch_entropy_and_refuses_a_missing_one():
    cfg = load_config(None, ["algo.advantage=rl_zvp"]).algo
    entry = lookup("estimator", "rl_zvp")
    assert entry.needs_old_logprobs is False and cfg.options["rl_zvp"].alpha == 0.1
    mask = torch.ones(2, 2)
    batch = RolloutBatch(mask=mask, rewards=torch.tensor([1.0, 1.0]), group=torch.tensor([0, 0]),
                         entropy=torch.tensor([[1.0, 2.0], [0.5, 0.0]]))
    assert torch.allclose(entry.bind(cfg)(batch, cfg), torch.tensor([[0.1, 0.2], [0.05, 0.0]]))
    with pytest.raises(MissingInputError, match="rl_zvp needs RolloutBatch fields \\['entropy'\\]"):
        entry.bind(cfg)(batch.replace(entropy=None), cfg)
    nan = batch.replace(entropy=torch.full((2, 2), float("nan")))
    with pytest.raises(MissingInputError, match="finite token entropies"):
        entry.bind(cfg)(nan, cfg)
    # a group with contrast never reads the entropy: NaN there is harmless
    contrast = nan.replace(rewards=torch.tensor([1.0, 0.0]))
    assert torch.isfinite(entry.bind(cfg)(contrast, cfg)).all()


def test_configuration_errors_and_the_recipe():
    with pytest.raises(ConfigError, match="algo.rl_zvp.alpha: must be > 0"):
        load_config(None, ["algo.advantage=rl_zvp", "algo.rl_zvp.alpha=0"])
    a = load_config(Path(__file__).resolve().parents[2] / "configs" / "recipes" / "rl_zvp.yaml").algo
    assert (a.advantage, a.options["rl_zvp"].alpha, a.loss_agg, a.mini_batches * a.epochs) == (
        "rl_zvp", 0.1, "seq-mean-token-mean", 16)
