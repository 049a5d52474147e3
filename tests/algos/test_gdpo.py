"""GDPO (`algo.advantage: gdpo`, docs/methods.md §5r): hand-derived values, several components, groups in any
order, padding, groups of one, and the reward functions' own scores as the components in explorl's loop."""

from __future__ import annotations

import math

import pytest
import torch

from explorl.algos.batch import RolloutBatch
from explorl.algos.methods.gdpo import gdpo
from explorl.algos.methods.grpo import grpo
from explorl.algos.methods.reinforce_pp import batch_whiten
from explorl.algos.registry import lookup
from explorl.config import ConfigError, load_config

F64 = torch.float64


def test_one_component_without_std_hand_derived():
    # group 1: rewards 1, 0 (one token each) -> centred 0.5, -0.5; group 6 (one response, 2 tokens) -> 0
    # tokens 0.5 | -0.5 | 0, 0: mean 0, unbiased var 0.5 / 3 = 1/6 -> A = value / sqrt(1/6 + 1e-8)
    rewards = torch.tensor([1.0, 4.0, 0.0], dtype=F64)
    group = torch.tensor([1, 6, 1])
    mask = torch.tensor([[1, 0], [1, 1], [1, 0]], dtype=F64)
    s = math.sqrt(1 / 6 + 1e-8)
    want = torch.tensor([[0.5 / s, 0], [0, 0], [-0.5 / s, 0]], dtype=F64)
    torch.testing.assert_close(gdpo(rewards, group, mask, scale=False), want, rtol=0, atol=1e-14)
    perm = torch.tensor([1, 2, 0])
    torch.testing.assert_close(gdpo(rewards[perm], group[perm] - 9, mask[perm], scale=False), want[perm],
                               rtol=0, atol=1e-14)


def test_components_are_normalised_apart_then_weighted():
    # components (1, 0) and (0, 1) in one group, weights 1 and 2, no std: 0.5 - 2 * 0.5 = -0.5 and -0.5 + 2 * 0.5 =
    # 0.5; tokens -0.5 | 0.5: mean 0, unbiased var 0.5 -> A = -+0.5 / sqrt(0.5 + 1e-8)
    comps = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=F64)
    mask = torch.ones(2, 1, dtype=F64)
    a = 0.5 / math.sqrt(0.5 + 1e-8)
    got = gdpo(comps, torch.tensor([0, 0]), mask, weights=[1.0, 2.0], scale=False)
    torch.testing.assert_close(got, torch.tensor([[-a], [a]], dtype=F64), rtol=0, atol=1e-14)
    # with the std: each component's z-score is +-0.5 / (std + eps), std = sqrt(0.5); the whitening removes the scale
    got = gdpo(comps, torch.tensor([0, 0]), mask, weights=[1.0, 2.0])
    z = 0.5 / (math.sqrt(0.5) + 1e-6)
    b = z / math.sqrt(2 * z * z + 1e-8)
    torch.testing.assert_close(got, torch.tensor([[-b], [b]], dtype=F64), rtol=0, atol=1e-14)
    with pytest.raises(ValueError, match="1 weight"):
        gdpo(comps, torch.tensor([0, 0]), mask, weights=[1.0])


def test_one_component_is_grpo_whitened_over_the_batch():
    g = torch.Generator().manual_seed(3)
    rewards = (torch.rand(12, generator=g) > 0.5).to(F64)
    group = torch.randint(0, 4, (12,), generator=g)
    mask = (torch.arange(5)[None, :] < torch.randint(1, 6, (12,), generator=g)[:, None]).to(F64)
    want = batch_whiten(grpo(rewards, group, mask), mask)
    torch.testing.assert_close(gdpo(rewards, group, mask), want, rtol=0, atol=0)


def test_selected_by_config_with_one_reward_function():
    cfg = load_config(None, ["algo.advantage=gdpo", "algo.gdpo.norm_adv_by_std=false"]).algo
    batch = RolloutBatch(mask=torch.ones(3, 2), rewards=torch.tensor([1.0, 0.0, 2.0]), group=torch.tensor([0, 0, 1]))
    got = lookup("estimator", "gdpo").bind(cfg)(batch, cfg)
    assert torch.equal(got, gdpo(batch.rewards, batch.group, batch.mask, scale=False))


def test_several_reward_functions_are_normalised_one_by_one():
    # two functions, weights 1 and 3: group 0 = rows 0, 1; group 1 = rows 2, 3 (one token each, no padding).
    # Component 1 (scores 1, 0 | 1, 1): deviations +-0.5 over the unbiased std sqrt(0.5) (+ eps 1e-6) | 0.
    # Component 2 (scores 0.2, 0.1 | 0.3, 0.0): +-0.05 over sqrt(0.005) and +-0.15 over sqrt(0.045), each about
    # +-0.707 like component 1's: GDPO's point, a small-range score weighs as much as a large one once normalised.
    # Weighted sum, then whitened over the 4 tokens (unbiased variance + 1e-8).
    comps = torch.tensor([[1.0, 0.2], [0.0, 0.1], [1.0, 0.3], [1.0, 0.0]])
    weights = (1.0, 3.0)
    batch = RolloutBatch(mask=torch.ones(4, 1), rewards=comps @ torch.tensor(weights), group=torch.tensor([0, 0, 1, 1]),
                         reward_components=comps, reward_weights=weights)
    cfg = load_config(None, ["algo.advantage=gdpo"]).algo
    got = lookup("estimator", "gdpo").bind(cfg)(batch, cfg)
    torch.testing.assert_close(got, gdpo(comps, batch.group, batch.mask, weights=weights).to(got.dtype))
    # by hand before the whitening: row 0: 1 * 1/(sqrt .5 + 1e-6) + 3 * 0.05/(sqrt(0.005) + 1e-6)
    z = lambda dev, std: dev / (std + 1e-6)  # noqa: E731
    raw = torch.tensor([z(0.5, math.sqrt(0.5)) + 3 * z(0.05, math.sqrt(0.005)),
                        -z(0.5, math.sqrt(0.5)) - 3 * z(0.05, math.sqrt(0.005)),
                        3 * z(0.15, math.sqrt(0.045)), -3 * z(0.15, math.sqrt(0.045))], dtype=F64)
    want = (raw - raw.mean()) / torch.sqrt(raw.var() + 1e-8)
    torch.testing.assert_close(got[:, 0].to(F64), want, rtol=1e-5, atol=1e-5)
    # the summed reward alone (GRPO of it, whitened) is another advantage: the components matter
    alone = gdpo(batch.rewards, batch.group, batch.mask)
    assert (alone - got).abs().max() > 0.1


def test_a_reward_the_shapers_changed_is_refused():
    comps = torch.tensor([[1.0, 0.2], [0.0, 0.1]])
    batch = RolloutBatch(mask=torch.ones(2, 1), rewards=torch.tensor([0.5, 0.1]), group=torch.tensor([0, 0]),
                         reward_components=comps, reward_weights=(1.0, 1.0))
    cfg = load_config(None, ["algo.advantage=gdpo"]).algo
    with pytest.raises(ValueError, match="not the weighted sum of the reward functions' scores"):
        lookup("estimator", "gdpo").bind(cfg)(batch, cfg)
    with pytest.raises(ConfigError, match=r"algo\.reward_shapers: dapo_overlong adds its penalty"):
        load_config(None, ["algo.advantage=gdpo", "task.reward=[auto,exact]", "algo.reward_shapers=[dapo_overlong]"])
    load_config(None, ["algo.advantage=gdpo", "task.reward=[auto,exact]"])  # several functions: accepted


def test_the_loop_hands_gdpo_each_reward_functions_scores(tiny_model_dir, tmp_path):
    # explorl's loop with two reward functions (weights 0.1 and 3): the scored batch carries each function's own
    # scores, and its reward is their weighted sum
    from explorl.train.loop import train

    cfg = load_config(None, [
        f"model.path={tiny_model_dir}", f"run.out_dir={tmp_path / 'run'}", "run.steps=1", "run.batch_size=2",
        "sampling.group_size=4", "sampling.max_new_tokens=8", "task.eval_size=2", "task.train_size=8",
        "task.difficulties=[1]", "run.eval_n=2", "run.eval_k=[1]", "run.save_every=0", "algo.advantage=gdpo",
        "task.reward=[rewards_for_tests:has_equals,rewards_for_tests:contains_digit]", "task.reward_weights=[0.1,3.0]"])
    seen = []
    from explorl.algos.methods import gdpo as module

    original = module.gdpo
    module.gdpo = lambda comps, *a, **k: (seen.append((comps.clone(), k.get("weights"))), original(comps, *a, **k))[1]
    try:
        train(cfg, progress=False)
    finally:
        module.gdpo = original
    comps, weights = seen[0]
    assert comps.shape == (8, 2) and weights.tolist() == [0.1, 3.0]
    assert set(comps.flatten().tolist()) <= {0.0, 1.0}  # both test functions score 0 or 1
