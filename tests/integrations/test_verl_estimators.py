"""explorl's estimators of verl 0.9.1's outcome advantages (issue 52) equal verl's own functions in
`verl.trainer.ppo.core_algos`, on float64 tensors, three seeds, several option values; run in `.venv-verl`
(`make test-verl`).

Where explorl's convention differs (docs/methods.md §5n-§5s: a group of one response gets 0 where verl keeps its raw
reward), the test checks that the difference is only that: explorl on the batch equals verl on the batch with the
groups of one set as explorl reads them, or the rows of the groups of one are the only ones that differ.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

verl = pytest.importorskip("verl", reason="verl is installed in .venv-verl only: run `make test-verl`")
from omegaconf import OmegaConf  # noqa: E402  (verl's dependency)
from verl import DataProto  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402
from verl.trainer.ppo.ray_trainer import compute_advantage  # noqa: E402

from explorl.algos import compute_advantages  # noqa: E402
from explorl.algos.batch import RolloutBatch  # noqa: E402
from explorl.algos.methods.gdpo import gdpo  # noqa: E402
from explorl.algos.methods.gpg import gpg  # noqa: E402
from explorl.algos.methods.grpo_passk import grpo_passk  # noqa: E402
from explorl.algos.methods.optimal_token_baseline import (optimal_token_baseline,  # noqa: E402
                                                          tir_optimal_token_baseline)
from explorl.algos.methods.opo import opo  # noqa: E402
from explorl.algos.methods.reinforce_pp import reinforce_plus_plus, reinforce_plus_plus_baseline  # noqa: E402
from explorl.algos.methods.remax import remax  # noqa: E402
from explorl.algos.methods.rloo import rloo  # noqa: E402
from explorl.config import AlgoConfig, Config, ConfigError, from_dict, validate  # noqa: E402

F64 = torch.float64
ATOL = 1e-12
SEEDS = range(3)


def make(seed: int, width: int = 9, binary: bool = True):
    """Groups of 1-6 responses (two groups of one), shuffled; variable lengths; rewards binary or continuous.
    Returns (rewards [N], group [N], uid array, mask [N, T], token-level rewards [N, T] with the reward on the last
    valid token, as verl's reward step places it), float64."""
    g = torch.Generator().manual_seed(seed)
    sizes = [1, 1] + [int(x) for x in torch.randint(2, 7, (4,), generator=g)]
    group = torch.tensor([i for i, s in enumerate(sizes) for _ in range(s)])
    perm = torch.randperm(len(group), generator=g)
    group = group[perm]
    n = len(group)
    lengths = torch.randint(1, width + 1, (n,), generator=g)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).to(F64)
    rewards = (torch.rand(n, generator=g) > 0.5).to(F64) if binary else torch.randn(n, generator=g, dtype=F64)
    token_rewards = torch.zeros(n, width, dtype=F64)
    token_rewards[torch.arange(n), lengths - 1] = rewards
    uid = np.array([f"p{int(i)}" for i in group], dtype=object)
    return rewards, group, uid, mask, token_rewards


def singles(group: torch.Tensor) -> torch.Tensor:
    """[N] bool: the response is alone in its group."""
    return torch.bincount(group)[group] == 1


def zeroed(token_rewards: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """The token rewards with the groups of one set to reward 0."""
    return torch.where(singles(group)[:, None], torch.zeros_like(token_rewards), token_rewards)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("binary", [True, False])
def test_rloo_equals_verls_except_for_groups_of_one(seed, binary):
    rewards, group, uid, mask, tok = make(seed, binary=binary)
    ours = rloo(rewards, group, mask)
    native, _ = core_algos.compute_rloo_outcome_advantage(tok.clone(), mask, uid)
    vectorized, _ = core_algos.compute_rloo_vectorized_outcome_advantage(tok.clone(), mask, uid)
    one = singles(group)
    torch.testing.assert_close(ours[~one], native[~one], rtol=0, atol=ATOL)
    torch.testing.assert_close(native[one], tok[one].sum(-1, keepdim=True) * mask[one], rtol=0, atol=ATOL)  # raw
    assert torch.all(ours[one] == 0)
    torch.testing.assert_close(ours, vectorized, rtol=0, atol=ATOL)  # verl's vectorized RLOO gives 0 too


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("gamma", [1.0, 0.9, 0.5, 0.0])
def test_reinforce_plus_plus_equals_verls(seed, gamma):
    rewards, _, _, mask, tok = make(seed, binary=seed != 1)
    want, _ = core_algos.compute_reinforce_plus_plus_outcome_advantage(tok, mask, OmegaConf.create({"gamma": gamma}))
    # verl's masked mean divides by (count + 1e-8): a relative 1e-8 / count of the mean, below 1e-9 here
    torch.testing.assert_close(reinforce_plus_plus(rewards, mask, gamma=gamma), want, rtol=0, atol=1e-9)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("binary", [True, False])
def test_reinforce_plus_plus_baseline_equals_verls_with_groups_of_one_entering_as_zero(seed, binary):
    rewards, group, uid, mask, tok = make(seed, binary=binary)
    ours = reinforce_plus_plus_baseline(rewards, group, mask)
    want, _ = core_algos.compute_reinforce_plus_plus_baseline_outcome_advantage(zeroed(tok, group), mask, uid)
    torch.testing.assert_close(ours, want, rtol=0, atol=1e-9)
    native, _ = core_algos.compute_reinforce_plus_plus_baseline_outcome_advantage(tok.clone(), mask, uid)
    if bool((rewards[singles(group)] != 0).any()):  # verl's raw reward of a group of one moves the whitening
        assert not torch.allclose(ours, native, atol=1e-6)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("binary", [True, False])
def test_opo_equals_verls_except_for_groups_of_one(seed, binary):
    rewards, group, uid, mask, tok = make(seed, binary=binary)
    ours = opo(rewards, group, mask)
    native, _ = core_algos.compute_opo_outcome_advantage(tok.clone(), mask, uid)
    one = singles(group)
    torch.testing.assert_close(ours[~one], native[~one], rtol=0, atol=ATOL)
    torch.testing.assert_close(native[one], rewards[one][:, None] * mask[one], rtol=0, atol=ATOL)
    assert torch.all(ours[one] == 0)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("f_norm", [1.0, 2.5])
def test_gpg_equals_verls_except_for_groups_of_one(seed, binary, f_norm):
    rewards, group, uid, mask, tok = make(seed, binary=binary)
    ours = gpg(rewards, group, mask, f_norm=f_norm)
    native, _ = core_algos.compute_gpg_outcome_advantage(tok.clone(), mask, uid, f_norm=f_norm)
    one = singles(group)
    # verl's alpha is an integer tensor divided by an integer tensor, hence float32: agreement to its rounding
    torch.testing.assert_close(ours[~one], native[~one], rtol=2e-7, atol=ATOL)
    alpha = len(rewards) / max(1, int((rewards != 0).sum()))
    torch.testing.assert_close(native[one], alpha * rewards[one][:, None] * mask[one] / f_norm, rtol=2e-7, atol=ATOL)
    assert torch.all(ours[one] == 0)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("scale", [True, False])
def test_grpo_passk_equals_verls_where_verl_takes_the_batch(seed, binary, scale):
    rewards, group, uid, mask, tok = make(seed, binary=binary)
    config = OmegaConf.create({"norm_adv_by_std_in_grpo": scale})
    ours = grpo_passk(rewards, group, mask, scale=scale)
    # verl refuses a batch with a group of one (explorl gives it 0): compare on the batch without them
    one = singles(group)
    with pytest.raises(ValueError, match="at least 2 samples per group"):
        core_algos.compute_grpo_passk_outcome_advantage(tok.clone(), mask, uid, config=config)
    native, _ = core_algos.compute_grpo_passk_outcome_advantage(tok[~one].clone(), mask[~one], uid[(~one).numpy()],
                                                               config=config)
    torch.testing.assert_close(ours[~one], native, rtol=0, atol=ATOL)
    assert torch.all(ours[one] == 0)
    assert int((ours != 0).any(-1).sum()) <= len(set(uid.tolist()))  # at most one response per group


def _gdpo_verl(components: list[torch.Tensor], weights, mask, uid, scale: bool):
    """verl's GDPO with its components read as its trainer reads them (`gdpo_reward_keys` in the non-tensor batch)."""
    n, width = mask.shape
    prompts = torch.zeros(n, 3, dtype=torch.long)
    attention = torch.cat([torch.ones(n, 3, dtype=torch.long), mask.long()], dim=1)
    keys = [f"part{k}" for k in range(len(components))]
    config = OmegaConf.create({"gdpo_reward_keys": keys, "gdpo_reward_weights": weights,
                               "norm_adv_by_std_in_grpo": scale})
    non_tensor = {key: c.numpy() for key, c in zip(keys, components)}
    # verl places each component on the token before the last valid one of the full attention mask, i.e. on the last
    # valid response token, in float32 (np.float32 in its code): compare to explorl on the same float32 values
    adv, _ = core_algos.compute_gdpo_outcome_advantage(
        torch.zeros(n, width), mask.float(), uid, norm_adv_by_std_in_grpo=scale, config=config,
        non_tensor_batch=non_tensor, batch={"prompts": prompts, "attention_mask": attention})
    return adv.to(F64)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("scale", [True, False])
@pytest.mark.parametrize("weights", [None, [1.0, 0.5]])
def test_gdpo_equals_verls_with_groups_of_one_entering_as_zero(seed, scale, weights):
    rewards, group, uid, mask, _ = make(seed)
    g = torch.Generator().manual_seed(100 + seed)
    second = torch.rand(len(rewards), generator=g, dtype=F64).round(decimals=1)
    comps = [rewards, second] if weights else [rewards]
    one = singles(group)
    ours = gdpo(torch.stack(comps, dim=1).float().to(F64), group, mask, weights=weights, scale=scale)
    want = _gdpo_verl([torch.where(one, 0.0, c).float() for c in comps], weights, mask, uid, scale)
    # float32 inside verl (its components and weights): agreement to float32 rounding
    torch.testing.assert_close(ours, want, rtol=0, atol=2e-6)


def _otb_inputs(mask, g: torch.Generator, weighted: bool):
    """(pi_old's log-probs, a consistent sum_v pi(v)^2 >= pi^2, rollout IS weights or None) on `mask`'s tokens."""
    logprobs = -torch.rand(mask.shape, generator=g, dtype=F64) * 3 * mask
    pi = logprobs.exp()
    sum_pi_squared = (pi ** 2 + (1 - pi) ** 2 * torch.rand(mask.shape, generator=g, dtype=F64)) * mask
    isw = (0.5 + torch.rand(mask.shape, generator=g, dtype=F64)) * mask if weighted else None
    return logprobs, sum_pi_squared, isw


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("zero_tail", [True, False])
@pytest.mark.parametrize("weighted", [False, True])
def test_optimal_token_baseline_equals_verls_except_for_groups_of_one(seed, zero_tail, weighted):
    rewards, group, uid, mask, tok = make(seed, binary=seed != 2)
    logprobs, sum_pi_squared, isw = _otb_inputs(mask, torch.Generator().manual_seed(200 + seed), weighted)
    ours = optimal_token_baseline(rewards, group, mask, logprobs, sum_pi_squared, is_weights=isw,
                                  handle_zero_tail=zero_tail)
    native, _ = core_algos.compute_optimal_token_baseline_advantage(
        tok, mask, uid, logprobs, sum_pi_squared, rollout_is_weights=isw, handle_zero_tail=zero_tail)
    one = singles(group)
    torch.testing.assert_close(ours[~one], native[~one], rtol=0, atol=ATOL)
    torch.testing.assert_close(native[one], rewards[one][:, None] * mask[one], rtol=0, atol=ATOL)
    assert torch.all(ours[one] == 0)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("zero_tail", [True, False])
@pytest.mark.parametrize("weighted", [False, True])
def test_tir_optimal_token_baseline_equals_verls_on_masks_with_holes(seed, zero_tail, weighted):
    # the same batches with a hole of 1-3 masked tokens inside some responses (tool output in verl's multi-turn
    # rollouts): verl regroups each response's valid tokens before the baseline, and so does explorl's
    rewards, group, uid, mask, _ = make(seed, binary=seed != 2)
    g = torch.Generator().manual_seed(300 + seed)
    lengths = mask.sum(-1).long()
    for i in range(len(group)):
        if lengths[i] >= 4 and bool(torch.rand(1, generator=g) < 0.6):
            start = int(torch.randint(1, int(lengths[i]) - 2, (1,), generator=g))
            mask[i, start:start + int(torch.randint(1, 3, (1,), generator=g))] = 0.0
    tok = torch.zeros_like(mask)
    last = (mask * torch.arange(mask.shape[1], dtype=F64)).argmax(-1)
    tok[torch.arange(len(group)), last] = rewards  # the reward on the last valid token
    logprobs, sum_pi_squared, isw = _otb_inputs(mask, g, weighted)
    ours = tir_optimal_token_baseline(rewards, group, mask, logprobs, sum_pi_squared, is_weights=isw,
                                      handle_zero_tail=zero_tail)
    native, _ = core_algos.compute_multi_turn_optimal_token_baseline_advantage(
        tok, mask, uid, logprobs, sum_pi_squared, rollout_is_weights=isw, handle_zero_tail=zero_tail)
    one = singles(group)
    assert bool(((mask[:, 1:] > mask[:, :-1]).any(-1)).any())  # some response has a hole
    torch.testing.assert_close(ours[~one], native[~one], rtol=0, atol=ATOL)
    assert torch.all(ours[one] == 0)  # explorl's group of one (verl: no baseline)


# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("binary", [True, False])
def test_remax_equals_verls(seed, binary):
    # every response has a baseline (its prompt's greedy reward), so no group convention is involved
    rewards, group, uid, mask, tok = make(seed, binary=binary)
    baseline = torch.randn(int(group.max()) + 1, generator=torch.Generator().manual_seed(seed), dtype=F64)[group]
    ours = remax(rewards, baseline, mask)
    theirs, _ = core_algos.compute_remax_outcome_advantage(tok.clone(), baseline, mask)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=ATOL)


def test_remax_is_refused_by_name_in_verl_with_verls_own_named():
    data, _ = _data(0)  # verl hands `reward_baselines` to its own `remax` only
    with pytest.raises(ConfigError, match="remax.*baseline_rewards.*legacy trainer"):
        compute_advantage(data, adv_estimator="explorl_remax", config=OmegaConf.create({}))


# through verl's compute_advantage as `explorl_<name>`


def _data(seed: int):
    rewards, group, uid, mask, tok = make(seed)
    tensors = {"token_level_rewards": tok.float(), "response_mask": mask.long(),
               "old_log_probs": torch.zeros(mask.shape)}
    data = DataProto.from_dict(tensors=tensors, non_tensors={"uid": uid})
    ids = torch.as_tensor(np.unique(uid.astype(str), return_inverse=True)[1])
    lengths = mask.sum(-1).long()
    return data, RolloutBatch(mask=mask.float(), rewards=rewards.float(), group=ids, max_response_len=mask.shape[1],
                              lengths=lengths, truncated=lengths >= mask.shape[1])


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name, settings", [
    ("rloo", {}), ("reinforce_plus_plus", {}), ("reinforce_plus_plus", {"reinforce_plus_plus": {"gamma": 0.7}}),
    ("reinforce_plus_plus_baseline", {}), ("opo", {}), ("gpg", {"gpg": {"f_norm": 2.0}}), ("gdpo", {}),
    ("gdpo", {"gdpo": {"norm_adv_by_std": False}}),
    ("grpo_passk", {}), ("grpo_passk", {"grpo_passk": {"norm_adv_by_std": False}}),
    # composed with explorl's shapers and overlong shaping, which act before and after the estimator
    ("opo", {"shapers": ["position"], "reward_shapers": ["dapo_overlong_filter"]}),
    ("reinforce_plus_plus_baseline", {"shapers": ["position"], "reward_shapers": ["dapo_overlong"],
                                      "dapo_overlong": {"buffer": 3}}),
])
def test_the_estimators_run_in_verl_as_explorls_step(seed, name, settings):
    data, batch = _data(seed)
    out = compute_advantage(data, adv_estimator=f"explorl_{name}", config=OmegaConf.create({"explorl": settings}))
    algo = from_dict(AlgoConfig, {"advantage": name, **settings}, "algo.")
    validate(Config(algo=algo))
    want = compute_advantages(batch, algo, step=1).advantages
    torch.testing.assert_close(out.batch["advantages"], want, rtol=0, atol=1e-6)


def test_the_optimal_token_baseline_is_refused_by_name_in_verl():
    data, _ = _data(0)
    with pytest.raises(ConfigError, match="optimal_token_baseline needs .*sum_pi_squared"):
        compute_advantage(data, adv_estimator="explorl_optimal_token_baseline", config=OmegaConf.create({}))


def test_sum_pi_squared_of_explorls_forward_is_verls():
    # the per-block formula pi_old's forward uses (explorl.rollout.logprobs) against verl 0.9.1's
    # calculate_sum_pi_squared_from_logits on the same temperature-scaled float32 logits
    from verl.utils.torch_functional import calculate_sum_pi_squared_from_logits  # verl's, imported where compared

    from explorl.rollout.logprobs import _logit_stats  # the private per-block helper is what is compared

    logits = 4 * torch.randn((3, 5, 50), generator=torch.Generator().manual_seed(0))
    _, _, ours = _logit_stats(logits, torch.zeros((3, 5), dtype=torch.long), False, True)
    torch.testing.assert_close(ours, calculate_sum_pi_squared_from_logits(logits), rtol=1e-6, atol=0)
