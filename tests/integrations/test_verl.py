"""explorl inside verl 0.9, through verl's own code paths, on the CPU (run by `make test-verl` in `.venv-verl`).

Each test computes the same batch twice: through verl (its `compute_advantage` on a `DataProto`, its policy-loss
registry with an `ActorConfig`, its `agg_loss` normalisation) and through explorl's own step
(`explorl.algos.compute_advantages`, `policy_objective`), and compares. Tolerances: float32 on both sides; values
agree to 1e-6 absolute (sums over a few hundred tokens), gradients to 1e-6.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

verl = pytest.importorskip("verl", reason="verl is installed in .venv-verl only: run `make test-verl`")
from omegaconf import OmegaConf  # noqa: E402  (verl's dependency)
from verl import DataProto  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402
from verl.trainer.ppo.ray_trainer import compute_advantage  # noqa: E402
from verl.workers.config.actor import ActorConfig, PolicyLossConfig  # noqa: E402

from explorl.algos import RolloutBatch, compute_advantages, policy_objective  # noqa: E402
from explorl.algos.batch import MissingInputError  # noqa: E402
from explorl.algos.losses import PpoOptions  # noqa: E402
from explorl.config import AlgoConfig, Config, ConfigError, SamplingConfig, from_dict, validate  # noqa: E402
from explorl.integrations.verl import REGISTERED, TRAINER_REGISTERED, explorl_advantages  # noqa: E402
from explorl.integrations.verl.adapters import algo_config, loss_settings  # noqa: E402
from explorl.integrations.verl.step import LOSS_MASK  # noqa: E402
from explorl.integrations.verl.rollout import (  # noqa: E402
    RolloutControl, needs_control, observed_per_prompt, rollout_config)

ATOL = 1e-6


def validated_algo(**fields) -> AlgoConfig:
    """explorl's `algo` section from its fields (each method's options under its name), validated as a config is."""
    algo = from_dict(AlgoConfig, fields, "algo.")
    # as in verl (`adapters.algo_config`): the engine's sampler differs from the trainer's forward, so TIS may act
    cfg = Config(algo=algo, sampling=SamplingConfig(top_p=0.999 if algo.importance_weights != "none" else 1.0))
    validate(cfg)
    return cfg.algo


def make_batch(seed: int = 0, n_groups: int = 4, width: int = 7):
    """Groups of 1-6 responses with binary rewards, variable lengths, the tensors verl's trainer has by the
    advantage step. Returns (DataProto, RolloutBatch of the same tensors)."""
    g = torch.Generator().manual_seed(seed)
    sizes = [1] + [int(x) for x in torch.randint(2, 7, (n_groups - 1,), generator=g)]
    uid = np.array([f"prompt-{i}" for i, s in enumerate(sizes) for _ in range(s)], dtype=object)
    n = len(uid)
    lengths = torch.randint(1, width + 1, (n,), generator=g)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).float()
    rewards = (torch.rand(n, generator=g) > 0.5).float()
    token_rewards = torch.zeros(n, width)
    token_rewards[torch.arange(n), lengths - 1] = rewards  # verl puts the outcome reward on the last token
    old = -torch.rand(n, width, generator=g) * 3 * mask
    tensors = {"token_level_rewards": token_rewards, "response_mask": mask.long(), "old_log_probs": old,
               "entropy": torch.rand(n, width, generator=g) * 2 * mask,
               "ref_log_prob": (old - 0.3 * torch.rand(n, width, generator=g)) * mask,
               "rollout_log_probs": (old + 0.5 * torch.randn(n, width, generator=g)) * mask}
    data = DataProto.from_dict(tensors=tensors, non_tensors={"uid": uid})
    ids = torch.as_tensor(np.unique(uid.astype(str), return_inverse=True)[1])
    batch = RolloutBatch(mask=mask, rewards=rewards, group=ids, max_response_len=width, logprobs=old,
                         behavior_logprobs=tensors["rollout_log_probs"], ref_logprobs=tensors["ref_log_prob"],
                         entropy=tensors["entropy"], lengths=lengths, truncated=lengths >= width)
    return data, batch


def test_every_method_is_registered_under_its_explorl_name():
    estimators = set(core_algos.ADV_ESTIMATOR_REGISTRY)
    assert {"explorl_grpo", "explorl_dr_grpo", "explorl_erpo", "explorl_passk"} <= estimators
    assert {"explorl_ppo", "explorl_clip_cov", "explorl_kl_cov"} <= set(core_algos.POLICY_LOSS_REGISTRY)
    assert set(REGISTERED) <= set(core_algos.ADV_ESTIMATOR_REGISTRY) | set(core_algos.POLICY_LOSS_REGISTRY)
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    assert TRAINER_REGISTERED and "explorl" in TRAINER_REGISTRY


def test_the_plugin_loads_through_verls_entry_point():
    # `import verl` imports every `verl.plugins` entry point: explorl's is in this venv's metadata
    from importlib.metadata import entry_points

    assert "explorl.integrations.verl" in {ep.value for ep in entry_points(group="verl.plugins")}


# ----------------------------------------------------------------------------------------------------------------
# advantages through verl's compute_advantage


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("name, settings", [
    ("grpo", {}), ("dr_grpo", {}), ("passk", {"passk": {"k": 2}}),
    ("grpo", {"shapers": ["position"], "reward_shapers": ["dapo_overlong"], "dapo_overlong": {"buffer": 3}}),
    ("grpo", {"reward_shapers": ["dapo_overlong_filter"]}),
])
def test_estimators_through_verls_compute_advantage_equal_explorls_step(seed, name, settings):
    data, batch = make_batch(seed)
    config = OmegaConf.create({"adv_estimator": f"explorl_{name}", "explorl": settings})
    out = compute_advantage(data, adv_estimator=f"explorl_{name}", config=config)
    want = compute_advantages(batch, validated_algo(advantage=name, **settings), step=1).advantages
    assert torch.allclose(out.batch["advantages"], want, atol=ATOL)
    assert torch.equal(out.batch["returns"], out.batch["advantages"])


def test_explorl_grpo_equals_verls_grpo_except_for_groups_of_one():
    # verl gives a group of one response mean 0 and std 1 (its raw reward); explorl gives it 0 (docs/methods.md §9)
    data, batch = make_batch(1)
    ours = compute_advantage(data, adv_estimator="explorl_grpo", config=OmegaConf.create({}))
    native = compute_advantage(make_batch(1)[0], adv_estimator="grpo", config=OmegaConf.create({}))
    single = torch.as_tensor(data.non_tensor_batch["uid"] == "prompt-0")
    assert torch.allclose(ours.batch["advantages"][~single], native.batch["advantages"][~single], atol=1e-5)
    assert torch.all(ours.batch["advantages"][single] == 0)
    reward = batch.rewards[single].item()
    assert torch.allclose(native.batch["advantages"][single][batch.mask[single] > 0],
                          torch.tensor(reward / (1 + 1e-6)), atol=1e-6)


def test_methods_that_need_more_than_verls_estimator_call_say_which_trainer_to_use():
    data, _ = make_batch(0)
    with pytest.raises(MissingInputError, match="trainer.v1.trainer_mode=explorl"):
        compute_advantage(data, adv_estimator="explorl_erpo", config=OmegaConf.create({}))
    with pytest.raises(ValueError, match="trainer.v1.trainer_mode=explorl"):
        compute_advantage(make_batch(0)[0], adv_estimator="explorl_grpo",
                          config=OmegaConf.create({"explorl": {"position": {"steps": 5}, "shapers": ["position"]}}))
    with pytest.raises(ConfigError, match=r"algorithm.explorl.passk.k"):
        compute_advantage(make_batch(0)[0], adv_estimator="explorl_passk",
                          config=OmegaConf.create({"explorl": {"passk": {"k": 99}}}))


@pytest.mark.parametrize("settings", [
    {"advantage": "erpo"}, {"shapers": ["cw_group", "ppl", "entropy_adv"]}, {"shapers": ["cw"]},
    {"token_filter": "forking", "importance_weights": "tis", "tis": {"cap": 2.0}},
    {"importance_weights": "tis", "tis": {"level": "sequence"}},
    {"advantage": "erpo", "shapers": ["position"], "position": {"start": 3, "steps": 2}},
])
def test_the_explorl_trainer_step_equals_explorls_step(settings):
    """`explorl_advantages` (what `trainer.v1.trainer_mode=explorl` runs) on a DataProto with verl's entropies and
    log-probs gives explorl's advantages; TIS x token-filter weights become verl's `rollout_is_weights`."""
    data, batch = make_batch(2)
    algorithm = OmegaConf.create({"explorl": settings})
    metrics = explorl_advantages(data, algorithm, step=4)
    want = compute_advantages(batch, validated_algo(**settings), step=4)
    assert torch.allclose(data.batch["advantages"], want.advantages, atol=ATOL)
    weights = None
    for w in (want.is_weights, want.token_weights):
        weights = w if weights is None else (weights if w is None else weights * w)
    if weights is None:
        assert "rollout_is_weights" not in data.batch.keys()
    else:
        assert torch.allclose(data.batch["rollout_is_weights"], weights, atol=ATOL)
    assert metrics and all(k.startswith("explorl/") for k in metrics)


@pytest.mark.parametrize("settings", [
    {"reward_shapers": ["rollout_rs"], "rollout_rs": {"modes": ["token_k1"], "threshold": [1.2]}},
    {"reward_shapers": ["rollout_rs"], "rollout_rs": {"modes": ["seq_mean_k1"], "threshold": [1.05]}},
    {"reward_shapers": ["dapo_overlong_filter"]},
])
def test_tokens_a_reward_shaper_removes_leave_verls_loss_as_they_leave_explorls(settings):
    """A reward shaper that takes tokens out of the loss mask (rollout_rs' rejection, DAPO's overlong filter): the
    trainer step hands the mask back (`LOSS_MASK`, written as verl's `response_mask`, as verl's own rejection
    sampling does), and verl's loss, aggregated over that mask by its global-batch normaliser, equals explorl's
    objective on the whole batch: the rejected tokens leave the denominator too."""
    data, batch = make_batch(3)  # 5 of its 13 responses are as long as the limit (the overlong filter's)
    metrics = explorl_advantages(data, OmegaConf.create({"explorl": settings}), step=1)
    want = compute_advantages(batch, validated_algo(**settings), step=1)
    removed = int((want.mask - want.loss_mask).sum())
    assert removed > 0 and metrics  # the settings do reject tokens of this batch
    loss_mask = data.batch[LOSS_MASK]
    assert torch.equal(loss_mask.float(), want.loss_mask)
    new = (batch.logprobs + 0.3 * torch.randn(batch.mask.shape, generator=torch.Generator().manual_seed(0)))
    new = (new * batch.mask).requires_grad_(True)
    algo = replace(validated_algo(**settings), eps_low=0.2, eps_high=0.28, loss_agg="token-mean",
                   options={**validated_algo(**settings).options, "ppo": PpoOptions(dual_clip_c=3.0)})
    whole, _ = policy_objective(new, None, want, algo)
    cfg = actor_config(loss_mode="explorl_ppo")
    cfg.global_batch_info.update({"dp_size": 1, "batch_num_tokens": int(loss_mask.sum()),
                                  "global_batch_size": len(loss_mask), "loss_scale_factor": loss_mask.shape[1]})
    theirs, _ = core_algos.get_policy_loss_fn("explorl_ppo")(batch.logprobs, new, data.batch["advantages"],
                                                             loss_mask, loss_agg_mode="token-mean", config=cfg)
    assert float(theirs.detach()) == pytest.approx(float(whole.detach()), abs=ATOL)
    # over the response mask (what verl summed before) the denominator also counts the removed tokens
    cfg.global_batch_info.update({"batch_num_tokens": int(batch.mask.sum())})
    before, _ = core_algos.get_policy_loss_fn("explorl_ppo")(batch.logprobs, new, data.batch["advantages"],
                                                             batch.mask, loss_agg_mode="token-mean", config=cfg)
    assert float(before.detach()) != pytest.approx(float(whole.detach()), abs=ATOL)


def test_a_shaper_that_keeps_every_token_hands_no_mask_back():
    data, _ = make_batch(4)
    explorl_advantages(data, OmegaConf.create({"explorl": {"shapers": ["position"]}}), step=1)
    assert LOSS_MASK not in data.batch.keys()


# ----------------------------------------------------------------------------------------------------------------
# policy losses through verl's registry and aggregation


def actor_config(**policy_loss) -> ActorConfig:
    return ActorConfig(strategy="fsdp", ppo_micro_batch_size_per_gpu=1, rollout_n=1, clip_ratio_low=0.2,
                       clip_ratio_high=0.28, policy_loss=PolicyLossConfig(**policy_loss))


def loss_inputs(seed: int = 0, n: int = 6, width: int = 9):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, width + 1, (n,), generator=g)
    mask = torch.arange(width)[None, :] < lengths[:, None]
    old = -torch.rand(n, width, generator=g) * 2
    new = (old + 1.2 * torch.randn(n, width, generator=g)).requires_grad_(True)  # ratios up to e^3: dual clip acts
    adv = torch.randn(n, 1, generator=g).expand(n, width).contiguous()
    return old, new, adv, mask


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("name", ["luspo", "vespo"])
def test_losses_verl_does_not_ship_run_through_its_registry_as_explorls_own(name, agg):
    """TRL 1.16's LUSPO and VESPO (docs/methods.md §5y), which verl 0.9.1 does not ship: `explorl_<name>` in verl's
    policy-loss registry is explorl's own loss function on the same micro-batch (verl's clip range 0.2 / 0.28, the
    loss's default options, the rollout weights), loss and gradient, without global-batch information."""
    from explorl.algos.aggregation import Reduction
    from explorl.algos.methods.luspo import luspo_loss
    from explorl.algos.methods.vespo import vespo_loss

    old, new, adv, mask = loss_inputs(seed=4)
    is_w = torch.rand(*mask.shape, generator=torch.Generator().manual_seed(6)) + 0.5
    loss, _ = core_algos.get_policy_loss_fn(f"explorl_{name}")(old, new, adv, mask, loss_agg_mode=agg,
                                                                 config=actor_config(loss_mode=f"explorl_{name}"),
                                                                 rollout_is_weights=is_w)
    (grad,) = torch.autograd.grad(loss, new)
    reduction = Reduction(agg, max_response_len=mask.shape[1], is_weights=is_w)
    direct = {"luspo": lambda: luspo_loss(new, old, adv, mask.float(), eps_low=0.2, eps_high=0.28,
                                          reduction=reduction),
              "vespo": lambda: vespo_loss(new, old, adv, mask.float(), reduction=reduction)}[name]
    want, _ = direct()
    (want_grad,) = torch.autograd.grad(want, new)
    assert torch.allclose(loss, want, atol=1e-12) and torch.allclose(grad, want_grad, atol=1e-12)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("global_info", [{}, {"dp_size": 2, "batch_num_tokens": 80, "global_batch_size": 12}])
def test_explorl_ppo_equals_verls_vanilla_loss(agg, global_info):
    """Same loss and gradient as verl's `vanilla` PPO (dual clip c = 3 included) on one micro-batch, with and
    without verl's global-batch normalisation (data-parallel size 2, the global batch's tokens and sequences)."""
    old, new, adv, mask = loss_inputs()
    is_w = torch.rand(*mask.shape, generator=torch.Generator().manual_seed(5)) + 0.5
    results = []
    for mode in ("explorl_ppo", "vanilla"):
        cfg = actor_config(loss_mode=mode)
        cfg.global_batch_info.update(global_info)
        new.grad = None
        loss, metrics = core_algos.get_policy_loss_fn(mode)(old, new, adv, mask, loss_agg_mode=agg, config=cfg,
                                                             rollout_is_weights=is_w)
        loss.backward()
        results.append((loss.detach(), new.grad.clone()))
        if mode == "vanilla":
            assert metrics["actor/pg_clipfrac_lower"] > 0  # the data reach verl's dual-clip bound
    assert torch.allclose(results[0][0], results[1][0], atol=ATOL), (results[0][0], results[1][0])
    assert torch.allclose(results[0][1], results[1][1], atol=ATOL)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_explorl_gspo_equals_verls_gspo(agg, seed):
    """Issue 52: explorl's `gspo` (docs/methods.md §5g) gives verl 0.9.1's `gspo` loss and gradient on the same
    tensors (float64, ratios up to e^3 so both clip bounds act, rollout weights on), every aggregation verl shares."""
    old, new, adv, mask = loss_inputs(seed)
    old, adv = old.double(), adv.double()
    new = new.detach().double().requires_grad_(True)
    is_w = torch.rand(*mask.shape, generator=torch.Generator().manual_seed(seed + 5), dtype=torch.float64) + 0.5
    results = []
    for mode in ("explorl_gspo", "gspo"):
        new.grad = None
        loss, _ = core_algos.get_policy_loss_fn(mode)(old, new, adv, mask, loss_agg_mode=agg,
                                                     config=actor_config(loss_mode=mode), rollout_is_weights=is_w)
        loss.backward()
        results.append((loss.detach(), new.grad.clone()))
    assert torch.allclose(results[0][0], results[1][0], atol=1e-12), (results[0][0], results[1][0])
    assert torch.allclose(results[0][1], results[1][1], atol=1e-12)


GLOBAL_INFO = {"dp_size": 2, "batch_num_tokens": 80, "global_batch_size": 12}


def _double_inputs(seed: int):
    """`loss_inputs(seed)` in float64, the advantages one per response with both signs, and rollout weights."""
    old, new, adv, mask = loss_inputs(seed)
    is_w = torch.rand(*mask.shape, generator=torch.Generator().manual_seed(seed + 5), dtype=torch.float64) + 0.5
    return old.double(), new.detach().double().requires_grad_(True), adv.double(), mask, is_w


def _both(modes, new, old, adv, mask, is_w, configs, aggs):
    """Loss and gradient of each verl policy loss `modes[i]` with `configs[i]` and `aggs[i]`."""
    results = []
    for mode, cfg, agg in zip(modes, configs, aggs):
        new.grad = None
        loss, _ = core_algos.get_policy_loss_fn(mode)(old, new, adv, mask, loss_agg_mode=agg, config=cfg,
                                                     rollout_is_weights=is_w)
        loss.backward()
        results.append((loss.detach(), new.grad.clone()))
    return results


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("clip", [(0.2, 0.28), (1.0, 4.0)], ids=["clip-0.2-0.28", "no-lower-bound-1-4"])
@pytest.mark.parametrize("global_info", [{}, GLOBAL_INFO], ids=["local", "global"])
def test_explorl_cispo_equals_verls_cispo(agg, seed, clip, global_info):
    """Issue 52: explorl's `cispo` (docs/methods.md §5h) gives verl 0.9.1's `cispo` loss and gradient on the same
    tensors (float64; ratios up to e^3, so at 0.2/0.28 the weight is clipped at both bounds; the paper's no lower
    bound, eps_low 1; rollout weights on; with and without verl's global-batch normalisation), every aggregation
    verl shares."""
    old, new, adv, mask, is_w = _double_inputs(seed)
    modes = ("explorl_cispo", "cispo")
    configs = [replace(actor_config(loss_mode=m), clip_ratio_low=clip[0], clip_ratio_high=clip[1]) for m in modes]
    for cfg in configs:
        cfg.global_batch_info.update(global_info)
    ours, verls = _both(modes, new, old, adv, mask, is_w, configs, (agg, agg))
    assert torch.allclose(ours[0], verls[0], atol=1e-12), (ours[0], verls[0])
    assert torch.allclose(ours[1], verls[1], atol=1e-12)
    if clip == (0.2, 0.28):  # the data reach both bounds of the weight's clip
        ratio = torch.exp(new.detach() - old)[mask]
        assert bool((ratio < 0.8).any()) and bool((ratio > 1.28).any())


@pytest.mark.parametrize("verl_agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("taus", [(1.0, 1.05), (0.6, 2.5)], ids=["defaults", "tau-0.6-2.5"])
@pytest.mark.parametrize("global_info", [{}, GLOBAL_INFO], ids=["local", "global"])
def test_explorl_sapo_equals_verls_sapo(verl_agg, seed, taus, global_info):
    """Issue 52: explorl's `sapo` (docs/methods.md §5i) at its paper's aggregation, seq-mean-token-mean, gives verl
    0.9.1's `sapo` loss and gradient (float64, both advantage signs, verl's `tau_pos` / `tau_neg` read by explorl's
    loss, rollout weights on, with and without verl's global-batch normalisation). verl's `sapo` aggregates
    seq-mean-token-mean whatever its `loss_agg_mode`: that is the one aggregation it shares, checked against each
    mode verl is given."""
    old, new, adv, mask, is_w = _double_inputs(seed)
    modes = ("explorl_sapo", "sapo")
    configs = [replace(actor_config(loss_mode=m), tau_pos=taus[0], tau_neg=taus[1]) for m in modes]
    for cfg in configs:
        cfg.global_batch_info.update(global_info)
    ours, verls = _both(modes, new, old, adv, mask, is_w, configs, ("seq-mean-token-mean", verl_agg))
    assert torch.allclose(ours[0], verls[0], atol=1e-12), (ours[0], verls[0])
    assert torch.allclose(ours[1], verls[1], atol=1e-12)
    assert bool((adv[mask] > 0).any()) and bool((adv[mask] < 0).any())  # both temperatures act


def test_explorl_sapo_honours_verls_loss_agg_mode_where_verls_sapo_does_not():
    # docs/methods.md §5i: explorl's `sapo` takes verl's loss_agg_mode (algo.loss_agg), verl's always
    # seq-mean-token-mean, so the two differ at token-mean
    old, new, adv, mask, is_w = _double_inputs(0)
    modes = ("explorl_sapo", "sapo")
    ours, verls = _both(modes, new, old, adv, mask, is_w, [actor_config(loss_mode=m) for m in modes],
                        ("token-mean", "token-mean"))
    assert not torch.allclose(ours[0], verls[0], atol=1e-6)


@pytest.mark.parametrize("recipe, overrides, fields", [
    ("cispo", [], {"policy_loss.loss_mode": "explorl_cispo", "clip_ratio_low": 1.0, "clip_ratio_high": 4.0,
                   "loss_agg_mode": "token-mean"}),
    ("sapo", ["algo.sapo.tau_pos=0.9", "algo.sapo.tau_neg=1.3"],
     {"policy_loss.loss_mode": "explorl_sapo", "tau_pos": 0.9, "tau_neg": 1.3, "loss_agg_mode": "seq-mean-token-mean"}),
])
def test_cispo_and_sapo_settings_reach_verls_actor_fields(recipe, overrides, fields, tmp_path, verl_model_dir):
    """The recipes' losses become verl's `explorl_<loss>` with their clip range or temperatures in the actor fields
    verl's own `cispo` / `sapo` read (`loss_fields.VERL_LOSS_FIELDS`), which `explorl_sapo` reads back."""
    from explorl.integrations.verl.launch import prepare

    path = RECIPES[[p.stem for p in RECIPES].index(recipe)]
    launch = prepare(path, [f"model.path={verl_model_dir}", "task.train_size=64", "task.eval_size=16",
                            f"run.out_dir={tmp_path / 'run'}", *overrides], write=False, run_dir=False)
    actor = compose_verl(launch.command[3:]).actor_rollout_ref.actor
    for key, want in fields.items():
        got = actor
        for part in key.split("."):
            got = got[part]
        assert got == want, key


VERL_AGGS = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
BATCH_INFO = {"dp_size": 2, "batch_num_tokens": 80, "global_batch_size": 12}


def _loss_and_grad(mode: str, cfg, agg: str, seed: int, token_adv: bool = False):
    """verl policy loss `mode` on `loss_inputs(seed)` in float64 with rollout weights: (loss, gradient). With
    `token_adv`, advantages differ per token (both signs in every response)."""
    old, new, adv, mask = loss_inputs(seed)
    g = torch.Generator().manual_seed(seed + 5)
    is_w = torch.rand(*mask.shape, generator=g, dtype=torch.float64) + 0.5
    adv = torch.randn(*mask.shape, generator=g) if token_adv else adv
    new = new.detach().double().requires_grad_(True)
    loss, _ = core_algos.get_policy_loss_fn(mode)(old.double(), new, adv.double(), mask, loss_agg_mode=agg,
                                                 config=cfg, rollout_is_weights=is_w)
    loss.backward()
    return loss.detach(), new.grad


def _verl_actor(mode: str, global_info: dict | None = None, **fields) -> ActorConfig:
    """`actor_config` with loss mode `mode`, the actor `fields` (clip_ratio_*, ...) and verl's global-batch info."""
    policy = {k: fields.pop(k) for k in list(fields) if k.startswith("dro_")}
    cfg = replace(actor_config(loss_mode=mode, **policy), **fields)
    cfg.global_batch_info.update(global_info or {})
    return cfg


@pytest.mark.parametrize("agg", VERL_AGGS)
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("divergence, bounds", [
    ("tv", (0.15, 0.15, 3.0)), ("tv", (0.05, 0.3, 10000.0)), ("tv", (0.3, 0.05, 1.5)),
    ("kl", (0.05, 0.05, 3.0)), ("kl", (0.02, 0.2, 10000.0)), ("kl", (0.2, 0.02, 1.5))])
@pytest.mark.parametrize("global_info", [{}, BATCH_INFO], ids=["local", "global"])
def test_explorl_dppo_equals_verls_dppo(agg, seed, divergence, bounds, global_info):
    """Issue 52: explorl's `dppo_tv` / `dppo_kl` (docs/methods.md §5j) give verl 0.9.1's loss and gradient on the
    same tensors (float64, 1e-12; ratios up to e^3, so the trust region drops tokens of both advantage signs and the
    cap truncates; verl's clip_ratio_low/high as the bounds and clip_ratio_c as the cap, read by explorl's loss;
    rollout weights on; with and without verl's global-batch normalisation), every aggregation verl shares."""
    low, high, cap = bounds
    fields = {"clip_ratio_low": low, "clip_ratio_high": high, "clip_ratio_c": cap}
    ours = _loss_and_grad(f"explorl_dppo_{divergence}", _verl_actor(f"explorl_dppo_{divergence}", global_info,
                                                                   **fields), agg, seed)
    verls = _loss_and_grad(f"dppo_{divergence}", _verl_actor(f"dppo_{divergence}", global_info, **fields), agg, seed)
    assert torch.allclose(ours[0], verls[0], atol=1e-12), (ours[0], verls[0])
    assert torch.allclose(ours[1], verls[1], atol=1e-12)
    old, new, adv, mask = loss_inputs(seed)
    dropped = (ours[1] == 0) & mask  # a valid token without gradient: out of the trust region
    assert bool(dropped.any()) and bool((ours[1][mask] != 0).any())


@pytest.mark.parametrize("verl_agg", VERL_AGGS)
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("clip", [(0.4, 0.4), (0.2, 0.28)])
@pytest.mark.parametrize("token_adv", [False, True], ids=["response-adv", "token-adv"])
def test_explorl_geo_mean_equals_verls_geo_mean(verl_agg, seed, clip, token_adv):
    """Issue 52: explorl's `geo_mean` (GMPO, docs/methods.md §5k) at its one aggregation, seq-mean-token-mean, gives
    verl 0.9.1's `geo_mean` loss and gradient (float64; the log-space clip 0.4 of the paper and 0.2/0.28; one
    advantage per response and per-token ones, whose signs pick each token's clip; rollout weights on), for each
    loss_agg_mode verl is given (its `geo_mean` ignores it). Tolerance 1e-9 relative: verl divides the length sums by
    `length + 1e-8` and logs the weights plus 1e-10 (explorl exactly), which moves its values by about 1.5e-10
    relative on these tensors."""
    fields = {"clip_ratio_low": clip[0], "clip_ratio_high": clip[1]}
    ours = _loss_and_grad("explorl_geo_mean", _verl_actor("explorl_geo_mean", **fields), "seq-mean-token-mean", seed,
                          token_adv)
    verls = _loss_and_grad("geo_mean", _verl_actor("geo_mean", **fields), verl_agg, seed, token_adv)
    assert torch.allclose(ours[0], verls[0], rtol=1e-9, atol=1e-12), (ours[0], verls[0])
    assert torch.allclose(ours[1], verls[1], rtol=1e-9, atol=1e-12)
    assert bool((ours[1] != 0).any())


def test_explorl_geo_mean_refuses_the_aggregations_gmpo_has_no_place_for():
    old, new, adv, mask = loss_inputs(0)
    with pytest.raises(ConfigError, match="GMPO's objective is the mean over responses"):
        core_algos.get_policy_loss_fn("explorl_geo_mean")(old, new, adv, mask, loss_agg_mode="token-mean",
                                                          config=_verl_actor("explorl_geo_mean"))


@pytest.mark.parametrize("agg", VERL_AGGS)
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("beta", [0.05, 0.5])
@pytest.mark.parametrize("global_info", [{}, BATCH_INFO], ids=["local", "global"])
def test_explorl_dro_equals_verls_dro(agg, seed, beta, global_info):
    """Issue 52: explorl's `dro` (docs/methods.md §5l) gives verl 0.9.1's `dro` loss and gradient (float64, 1e-12,
    verl's `policy_loss.dro_beta` read by explorl's loss, rollout weights on, with and without verl's global-batch
    normalisation), every aggregation verl shares."""
    ours = _loss_and_grad("explorl_dro", _verl_actor("explorl_dro", global_info, dro_beta=beta), agg, seed)
    verls = _loss_and_grad("dro", _verl_actor("dro", global_info, dro_beta=beta), agg, seed)
    assert torch.allclose(ours[0], verls[0], atol=1e-12), (ours[0], verls[0])
    assert torch.allclose(ours[1], verls[1], atol=1e-12)


def test_explorl_dro_needs_beta_as_verls_dro_does():
    old, new, adv, mask = loss_inputs(0)
    with pytest.raises(ValueError, match="dro_beta must be a positive value"):
        core_algos.get_policy_loss_fn("dro")(old, new, adv, mask, config=_verl_actor("dro"))
    with pytest.raises(ConfigError, match=r"dro.beta: DRO needs its penalty coefficient, > 0 .*got None"):
        core_algos.get_policy_loss_fn("explorl_dro")(old, new, adv, mask, config=_verl_actor("explorl_dro"))


@pytest.mark.parametrize("agg", VERL_AGGS)
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("global_info", [{}, BATCH_INFO], ids=["local", "global"])
def test_explorl_gpg_equals_verls_gpg_loss(agg, seed, global_info):
    """Issue 52: explorl's `gpg` loss (docs/methods.md §5m) gives verl 0.9.1's `gpg` policy loss and gradient
    (float64, 1e-12, rollout weights on, with and without verl's global-batch normalisation), every aggregation
    verl shares."""
    ours = _loss_and_grad("explorl_gpg", _verl_actor("explorl_gpg", global_info), agg, seed)
    verls = _loss_and_grad("gpg", _verl_actor("gpg", global_info), agg, seed)
    assert torch.allclose(ours[0], verls[0], atol=1e-12), (ours[0], verls[0])
    assert torch.allclose(ours[1], verls[1], atol=1e-12)


def test_explorl_kl_cov_equals_verls_kl_cov():
    # explorl's k_percent is a percentage, verl's kl_cov_ratio a fraction: 0.05 -> 5%; coefficient ppo_kl_coef
    old, new, adv, mask = loss_inputs(1)
    losses = []
    for mode in ("explorl_kl_cov", "kl_cov"):
        cfg = actor_config(loss_mode=mode, kl_cov_ratio=0.05, ppo_kl_coef=1.0)
        loss, _ = core_algos.get_policy_loss_fn(mode)(old, new, adv, mask, loss_agg_mode="token-mean", config=cfg)
        losses.append(float(loss.detach()))
    assert losses[0] == pytest.approx(losses[1], abs=ATOL)


def test_explorl_clip_cov_equals_verls_when_every_candidate_is_detached():
    # Clip-Cov detaches a random subset of the candidates; with ratio 1 every candidate goes, so no randomness
    old, new, adv, mask = loss_inputs(2)
    losses, grads = [], []
    for mode in ("explorl_clip_cov", "clip_cov"):
        cfg = actor_config(loss_mode=mode, clip_cov_ratio=1.0, clip_cov_lb=-10.0, clip_cov_ub=10.0)
        new.grad = None
        loss, _ = core_algos.get_policy_loss_fn(mode)(old, new, adv, mask, loss_agg_mode="token-mean", config=cfg)
        loss.backward()
        losses.append(float(loss))
        grads.append(new.grad.clone())
    assert losses[0] == pytest.approx(losses[1], abs=ATOL)
    assert torch.allclose(grads[0], grads[1], atol=ATOL)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_micro_batches_in_verl_sum_to_explorls_whole_batch_objective(agg):
    """verl splits a mini-batch into micro-batches, each normalised by the global batch; the sum of their explorl
    losses is explorl's own loop objective on the whole batch (`policy_objective`, dual clip 3 as verl)."""
    old, new, adv, mask = loss_inputs(3, n=8)
    width = mask.shape[1]
    batch = RolloutBatch(mask=mask.float(), rewards=torch.zeros(8), group=torch.zeros(8, dtype=torch.long),
                         max_response_len=width, logprobs=old, advantages=adv * mask, base_advantages=adv * mask,
                         loss_mask=mask.float(), shaped_rewards=torch.zeros(8))
    algo = replace(AlgoConfig(), loss_agg=agg, eps_low=0.2, eps_high=0.28,
                   options={"ppo": PpoOptions(dual_clip_c=3.0)})
    whole, _ = policy_objective(new, None, batch, algo)
    total = 0.0
    info = {"dp_size": 1, "batch_num_tokens": int(mask.sum()), "global_batch_size": int((mask.sum(-1) > 0).sum()),
            "loss_scale_factor": width}
    for rows in (torch.arange(0, 3), torch.arange(3, 8)):
        cfg = actor_config(loss_mode="explorl_ppo")
        cfg.global_batch_info.update(info)
        part, _ = core_algos.get_policy_loss_fn("explorl_ppo")(old[rows], new[rows], adv[rows], mask[rows],
                                                                loss_agg_mode=agg, config=cfg)
        total += float(part)
    assert total == pytest.approx(float(whole), abs=ATOL)


def test_unsupported_aggregation_and_bad_settings_are_named():
    old, new, adv, mask = loss_inputs()
    with pytest.raises(ValueError, match="loss_agg_mode='token-sum'"):
        core_algos.get_policy_loss_fn("explorl_ppo")(old, new, adv, mask, loss_agg_mode="token-sum",
                                                      config=actor_config(loss_mode="explorl_ppo"))
    with pytest.raises(ConfigError, match="algorithm.explorl.shapers"):
        algo_config({"shapers": ["nope"]})
    assert math.isclose(algo_config({"advantage": "erpo", "erpo": {"gamma": 3}}).options["erpo"].gamma, 3.0)
    with pytest.raises(ConfigError, match=r"unknown key 'algorithm\.explorl\.erpo_gamma'"):
        algo_config({"erpo_gamma": 3})


# ----------------------------------------------------------------------------------------------------------------
# a user's own explorl config as a verl run (explorl.integrations.verl.launch, examples/verl/launch.py)

RECIPES = sorted((Path(__file__).resolve().parents[2] / "configs" / "recipes").glob("*.yaml"))


def _byte_level_model_dir(path: Path) -> Path:
    """A model directory verl's AutoTokenizer loads as it is: a byte-level Qwen2 tokenizer (the 256 byte symbols,
    no merges, a chat template) and a tiny Qwen2 config (no weights: nothing here loads the model)."""
    from transformers import Qwen2Config, Qwen2Tokenizer

    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs = bs[:] + [256 + i for i in range(256 - len(bs))]
    bs += [b for b in range(256) if b not in bs]
    vocab = {chr(c): i for i, c in enumerate(cs)}
    for special in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        vocab[special] = len(vocab)
    tok = Qwen2Tokenizer(vocab=vocab, merges=[])
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                         "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    tok.save_pretrained(path)
    Qwen2Config(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=1, intermediate_size=32).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def verl_model_dir(tmp_path_factory):
    return _byte_level_model_dir(tmp_path_factory.mktemp("byte_level_qwen2"))


USER_REWARDS = '''
from explorl.rewards import batched


def answer(completion, answer, **meta):
    if "BOOM" in completion:
        raise RuntimeError("the user's checker broke")
    return float(completion.strip().endswith(str(answer)))


@batched
def fmt(completions, answers, **meta):
    return [0.5 if "Answer:" in c else 0.0 for c in completions]
'''


def user_run(tmp_path: Path, model_dir: Path, **sections) -> Path:
    """A user's own run: their model directory, a JSONL with their field names (`question`, `final`), a reward
    module next to the config with two functions (one batched) and weights, a system prompt."""
    import yaml

    (tmp_path / "my_rewards.py").write_text(USER_REWARDS)
    with open(tmp_path / "train.jsonl", "w") as f:
        for i in range(40):
            f.write(json.dumps({"question": f"What is {i} + {i + 1}?", "final": str(2 * i + 1)}) + "\n")
    config = {"model": {"path": str(model_dir)},
              "task": {"name": "file", "path": "train.jsonl", "prompt_field": "question", "answer_field": "final",
                       "eval_size": 8, "system_prompt": "Reply with a number.",
                       "reward": ["my_rewards:answer", "my_rewards:fmt"], "reward_weights": [1.0, 0.5]},
              "sampling": {"group_size": 4, "max_new_tokens": 48, "temperature": 0.9},
              "algo": {"mini_batches": 2, "eps_high": 0.25},
              "optim": {"lr": 3.0e-6, "warmup_steps": 2},
              "run": {"batch_size": 8, "steps": 3, "out_dir": str(tmp_path / "run")}}
    for name, values in sections.items():
        config.setdefault(name, {}).update(values)
    (tmp_path / "my_run.yaml").write_text(yaml.safe_dump(config))
    return tmp_path / "my_run.yaml"


def compose_verl(overrides: list[str]):
    """verl's Hydra config (`ppo_trainer`) with `overrides`: Hydra refuses keys verl's schema does not have."""
    from hydra import compose, initialize_config_dir

    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def check_verl_config(cfg) -> None:
    """What verl itself checks before a run (`validate_config`, the actor's dataclass), the method names are
    registered, the explorl sections pass explorl's validation, the controllers' settings validate."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    estimator = cfg.algorithm.adv_estimator
    assert estimator in core_algos.ADV_ESTIMATOR_REGISTRY and estimator.startswith("explorl_")
    actor = cfg.actor_rollout_ref.actor
    policy_loss = omega_conf_to_dataclass(actor.policy_loss, PolicyLossConfig)
    assert policy_loss.loss_mode in core_algos.POLICY_LOSS_REGISTRY
    name = policy_loss.loss_mode.removeprefix("explorl_")
    algo_config(loss_settings(actor, name), prefix="actor_rollout_ref.actor.", loss=name, loss_agg=actor.loss_agg_mode)
    algo_config(cfg.algorithm.get("explorl"), advantage=estimator.removeprefix("explorl_"))
    settings = cfg.algorithm.get("explorl")
    if needs_control(settings):
        rollout = cfg.actor_rollout_ref.rollout
        rollout_config(settings, temperature=rollout.temperature, group_size=rollout.n,
                       max_new_tokens=rollout.response_length, top_p=rollout.top_p, total_steps=100)


def test_a_users_yaml_composes_with_verls_hydra_config(tmp_path, verl_model_dir):
    from explorl.integrations.verl.launch import prepare

    launch = prepare(user_run(tmp_path, verl_model_dir), ["algo.eps_high=0.28", "optim.lr=2e-6"],
                     ["trainer.n_gpus_per_node=4"], write=False)
    assert launch.command[1:3] == ["-m", "verl.trainer.main_ppo"]
    cfg = compose_verl(launch.command[3:])
    check_verl_config(cfg)
    actor, rollout = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    assert actor.optim.lr == pytest.approx(2e-6) and list(actor.optim.betas) == [0.9, 0.999]
    assert actor.optim.lr_warmup_steps == 1  # 2 optimizer steps = 1 training step of 2 mini-batches
    assert rollout.n == 4 and rollout.temperature == pytest.approx(0.9) and cfg.data.max_response_length == 48
    assert cfg.data.train_batch_size == 8 and actor.ppo_mini_batch_size == 4  # prompts, 8 / algo.mini_batches
    assert actor.clip_ratio_low == pytest.approx(0.2) and actor.clip_ratio_high == pytest.approx(0.28)
    assert cfg.algorithm.adv_estimator == "explorl_grpo" and actor.policy_loss.loss_mode == "explorl_ppo"
    assert actor.loss_agg_mode == "token-mean" and actor.use_kl_loss is False
    assert cfg.trainer.total_training_steps == 3 and cfg.trainer.n_gpus_per_node == 4
    assert cfg.trainer.v1.trainer_mode == "explorl" and cfg.explorl.config == str(launch.data.config)
    reward = cfg.reward.custom_reward_function
    assert reward.path == "pkg://explorl.integrations.verl.reward" and reward.name == "compute_score"
    assert reward.reward_kwargs.explorl_config == str(launch.data.config)
    assert cfg.data.train_files == str(tmp_path / "run" / "verl" / "train.parquet")
    # 32 training rows (40 less the 8 held out), a full batch of 8 per step
    assert launch.data.train_rows == 32 and launch.data.val_rows == 8 and cfg.trainer.total_epochs == 1
    # the estimator's explorl section is the user's algo (less what verl's own keys carry)
    algo = algo_config(cfg.algorithm.explorl)
    assert algo.eps_high == 0.2 and algo.adv_eps == launch.cfg.algo.adv_eps and algo.shapers == []
    assert not launch.data.dir.exists()  # --print writes nothing


def test_settings_verl_has_no_counterpart_for_are_refused_by_name(tmp_path, verl_model_dir):
    from explorl.integrations.verl.launch import prepare

    run = user_run(tmp_path, verl_model_dir)
    with pytest.raises(ConfigError, match=r"algo\.loss_agg=seq-mean-token-mean-per-question"):
        prepare(run, ["algo.loss_agg=seq-mean-token-mean-per-question"], write=False)
    with pytest.raises(ConfigError, match=r"model\.device=cpu"):
        prepare(run, ["model.device=cpu"], write=False)
    with pytest.raises(ConfigError, match=r"algo\.kl_clamp=5"):
        prepare(run, ["algo.kl_coef=0.01", "algo.kl_clamp=5"], write=False)
    with pytest.raises(ConfigError, match=r"algo\.kl_importance_weighted=true: verl 0\.9\.1's KL loss"):
        prepare(run, ["algo.kl_coef=0.01", "algo.kl_importance_weighted=true"], write=False)
    with pytest.raises(ConfigError, match=r"algo\.advantage=gdpo with 2 task\.reward functions .*--no-run-dir"):
        prepare(run, ["algo.advantage=gdpo", "task.reward=[auto,exact]"], write=False, run_dir=False)
    gdpo = prepare(run, ["algo.advantage=gdpo", "task.reward=[auto,exact]"], write=False).overrides
    assert gdpo.get("trainer.v1.trainer_mode") == "explorl" and gdpo.get("algorithm.adv_estimator") == "explorl_gdpo"
    assert any("reads each task.reward function's own scores" in note for note in gdpo.notes)
    with pytest.raises(ConfigError, match=r"model\.lm_head_fp32=true: verl 0\.9\.1's FSDP actor"):
        prepare(run, ["model.lm_head_fp32=true"], write=False)
    with pytest.raises(ConfigError, match=r"algo\.mini_batches=3"):
        prepare(run, ["algo.mini_batches=3"], write=False)
    with pytest.raises(ConfigError, match=r"algo\.loss=bypass_mode: .*rollout_correction\.bypass_mode=true"):
        prepare(run, ["algo.loss=bypass_mode"], write=False)  # docs/methods.md §6d: verl has its own
    with pytest.raises(ConfigError, match=r"algo\.advantage=remax: .*legacy trainer \(trainer\.use_v1=false"):
        prepare(run, ["algo.advantage=remax"], write=False)  # docs/methods.md §5n: verl's v1 trainer samples none
    with pytest.raises(ConfigError, match=r"algo\.advantage=optimal_token_baseline: .*sum_pi_squared.*legacy"):
        prepare(run, ["algo.advantage=optimal_token_baseline"], write=False)  # §5s: verl's v1 computes none
    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.actor\.optim\.lr.*optim\.lr"):
        prepare(run, [], ["actor_rollout_ref.actor.optim.lr=1e-3"], write=False)
    with pytest.raises(ConfigError, match=r"model\.path.*AutoTokenizer"):  # transformers 5 mangles its tokenizer
        prepare(run, ["model.path=embedded"], write=False)


def test_the_converted_parquet_loads_in_verls_dataset(tmp_path, verl_model_dir):
    """The parquet loads in verl's `RLHFDataset`; rows carry their index (E3's budgets key on it), the chat
    messages with the user's system prompt, the answer, and the problem's meta; verl's tokens of a prompt are
    explorl's, with the chat template on and off."""
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from explorl.config import load_config
    from explorl.integrations.verl.launch import prepare, verl_tokenizer
    from explorl.models import load_tokenizer
    from explorl.tasks import load_task
    from explorl.tasks.chat import prompt_encoder

    for chat in ("on", "off"):
        out = tmp_path / chat
        out.mkdir()
        launch = prepare(user_run(out, verl_model_dir, task={"chat_template": chat}), write=True)
        cfg = compose_verl(launch.command[3:])
        assert (cfg.actor_rollout_ref.model.get("custom_chat_template") is None) == (chat == "on")
        tok = verl_tokenizer(verl_model_dir, cfg.actor_rollout_ref.model.get("custom_chat_template"))
        data = RLHFDataset(str(launch.data.train), tok, cfg.data)
        task = load_task(load_config(launch.data.config).task)
        assert len(data) == len(task.train) == 32 and load_config(launch.data.config).task.chat_template == chat
        encode = prompt_encoder(load_tokenizer(verl_model_dir), launch.cfg.task)
        for i in (0, 17, 31):
            row = data[i]
            assert row["index"] == i and row["extra_info"]["index"] == i and row["extra_info"]["split"] == "train"
            assert row["reward_model"]["ground_truth"] == task.train[i].answer == str(2 * (i + 0) + 1)
            assert json.loads(row["extra_info"]["meta"]) == task.train[i].meta
            ids = tok.apply_chat_template(list(row["raw_prompt"]), tokenize=True, add_generation_prompt=True)
            assert list(ids["input_ids"]) == encode(task.train[i])
            text = tok.decode(ids["input_ids"])
            assert "Reply with a number." in text and f"What is {i} + {i + 1}?" in text
        assert cfg.data.max_prompt_length == max(len(encode(p)) for p in [*task.train, *task.eval])
        assert len(RLHFDataset(str(launch.data.val), tok, cfg.data)) == 8


def _response(tok, text: str, prompt_len: int = 3) -> DataProto:
    """One response as verl's reward loop hands it to a reward manager (`run_single`)."""
    ids = tok.encode(text, add_special_tokens=False)
    responses = torch.tensor([ids + [tok.pad_token_id] * 2])
    mask = torch.cat([torch.ones(1, prompt_len), torch.tensor([[1] * len(ids) + [0, 0]])], dim=1).long()
    return DataProto.from_dict(tensors={"responses": responses, "attention_mask": mask,
                                        "prompts": torch.zeros(1, prompt_len, dtype=torch.long)},
                               non_tensors={"data_source": np.array(["explorl/file"], dtype=object)})


def test_the_reward_bridge_scores_as_explorls_loop_through_verls_reward_manager(tmp_path, verl_model_dir):
    """verl's reward manager (`naive`, as its reward loop builds it from the config) calls the bridge with each
    decoded response: the weighted reward, each function's score, `correct` by the task's rule and the failure
    counts equal what explorl's loop gets from the task's `RewardRunner` on the same completions; a raising
    function scores 0 on its sample and is counted."""
    import pyarrow.parquet as pq
    from verl.trainer.ppo.reward import load_reward_manager

    from explorl.config import load_config
    from explorl.integrations.verl.launch import prepare, verl_tokenizer
    from explorl.tasks import load_task

    # the format bonus (weight 2) lifts a wrong answer's reward to 1.0; correctness is the answer's own score
    # a generous time limit: the functions run in worker processes, which a loaded machine starts slowly (a timeout
    # would score 0 on both sides and hide what is compared)
    run = user_run(tmp_path, verl_model_dir, task={"correct_by": "my_rewards:answer", "reward_weights": [1.0, 2.0],
                                                   "reward_timeout_s": 60.0})
    launch = prepare(run, write=True)
    cfg = compose_verl(launch.command[3:])
    tok = verl_tokenizer(verl_model_dir)
    manager = load_reward_manager(cfg, tok)
    rows = pq.read_table(launch.data.train).to_pylist()
    completions = ["So 1. Answer: 1", "Answer: 2", "BOOM Answer: 5", "no idea"]
    picked = [rows[0], rows[0], rows[2], rows[3]]
    got = []
    for text, row in zip(completions, picked):
        item = _response(tok, text)
        item.non_tensor_batch["reward_model"] = np.array([row["reward_model"]], dtype=object)
        item.non_tensor_batch["extra_info"] = np.array([dict(row["extra_info"])], dtype=object)
        got.append(manager.loop.run_until_complete(manager.run_single(item)))
    task = load_task(load_config(launch.data.config).task)
    metas = [json.loads(r["extra_info"]["meta"]) for r in picked]
    want = task.reward_runner(60.0)(completions, [r["reward_model"]["ground_truth"] for r in picked], metas)
    assert [g["reward_score"] for g in got] == pytest.approx(want.rewards)
    assert want.rewards == pytest.approx([2.0, 1.0, 1.0, 0.0])  # answer + 2 x fmt (0.5); a raise scores 0
    info = [g["reward_extra_info"] for g in got]
    assert [i["my_rewards.answer"] for i in info] == want.by_function["my_rewards.answer"] == [1.0, 0.0, 0.0, 0.0]
    assert [i["my_rewards.fmt"] for i in info] == want.by_function["my_rewards.fmt"]
    assert [i["correct"] for i in info] == [float(c) for c in task.correct(want)] == [1.0, 0.0, 0.0, 0.0]
    assert [i["reward_failed"] for i in info] == [0.0, 0.0, 1.0, 0.0]
    assert sum(i["reward_errors"] for i in info) == want.errors == 1


def test_the_explorl_trainer_is_verls_synchronous_trainer(tmp_path, verl_model_dir):
    """verl's base class builds its replay buffer, refills and checkpoints by the mode's name; explorl's trainer
    gets the synchronous ones (the asynchronous buffer would drop and refill prompts one by one)."""
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    from explorl.integrations.verl.launch import prepare

    launch = prepare(user_run(tmp_path, verl_model_dir, budget={"policy": "dapo"}), write=False)
    cfg = compose_verl(launch.command[3:])
    assert cfg.trainer.v1.trainer_mode == "explorl" and cfg.algorithm.filter_groups.enable
    trainer = TRAINER_REGISTRY["explorl"](config=cfg)
    assert trainer.trainer_mode == "sync" and trainer.parameter_sync_step == 1
    assert type(trainer.replay_buffer) is ReplayBuffer and not isinstance(trainer.replay_buffer, ReplayBufferAsync)
    assert trainer.replay_buffer.filter_groups_metric == "reward"  # DAPO's dynamic sampling, verl's own filter


def _trainer_for_run(tmp_path, config_path, settings=None, response_length=7):
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    trainer = object.__new__(TRAINER_REGISTRY["explorl"])
    trainer.config = OmegaConf.create({
        "algorithm": {"explorl": settings or {}}, "explorl": {"config": str(config_path)},
        "actor_rollout_ref": {"rollout": {"temperature": 0.8, "n": 4, "response_length": response_length,
                                          "top_p": 1.0}},
        "trainer": {"nnodes": 1, "n_gpus_per_node": 8, "default_local_dir": str(tmp_path / "ckpt")}})
    trainer.global_steps = 1
    return trainer


def test_gdpo_in_the_trainer_takes_the_reward_functions_apart(tmp_path, tiny_model_dir):
    """Several task.reward functions: the trainer step reads each one's score from the reward bridge's extra info
    (its metric name) and the weights from the run's explorl config, so `gdpo` normalises each function within
    its group (explorl's `gdpo` of the components), not their weighted sum; verl's padding rows score 0."""
    import yaml

    from explorl.algos.methods.gdpo import gdpo
    from explorl.integrations.verl.trainer import REWARD_INFO

    config = {"model": {"path": str(tiny_model_dir)}, "task": {"reward": ["exact", "my_rewards:fmt"],
                                                               "reward_weights": [1.0, 2.0]},
              "sampling": {"max_new_tokens": 8}, "run": {"out_dir": str(tmp_path / "run"), "steps": 1}}
    (tmp_path / "explorl.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "my_rewards.py").write_text(USER_REWARDS)
    data, batch = make_batch(5)
    n = len(data)
    g = torch.Generator().manual_seed(5)
    exact, fmt = batch.rewards, (torch.rand(n, generator=g) > 0.5).float() * 0.5
    total = exact + 2.0 * fmt
    lengths = batch.mask.sum(-1).long()
    rewards = torch.zeros_like(data.batch["token_level_rewards"])
    rewards[torch.arange(n), lengths - 1] = total
    data.batch["token_level_rewards"] = rewards
    infos = [{"score": float(total[i]), "correct": float(exact[i]), "reward_failed": 0.0, "reward_errors": 0.0,
              "reward_timeouts": 0.0, "exact": float(exact[i]), "my_rewards.fmt": float(fmt[i])} for i in range(n)]
    pad = DataProto.from_dict(tensors={k: torch.zeros_like(v[:1]) for k, v in data.batch.items()},
                              non_tensors={"uid": np.array(["pad0"], dtype=object)})
    data = DataProto.concat([data, pad])
    data.non_tensor_batch[REWARD_INFO] = np.array(infos + [{}], dtype=object)
    keep = np.array([True] * n + [False])
    trainer = _trainer_for_run(tmp_path, tmp_path / "explorl.yaml", settings={"advantage": "gdpo"})
    trainer._explorl_step(data, keep)
    want = gdpo(torch.stack([exact, fmt], -1), batch.group, batch.mask, weights=(1.0, 2.0))
    assert torch.allclose(data.batch["advantages"][:n], want, atol=ATOL)
    of_sum = gdpo(total[:, None], batch.group, batch.mask, weights=(1.0,))
    assert not torch.allclose(want, of_sum, atol=1e-3)  # the components matter on this batch
    # the bridge's info lacks a function's score: named
    data.non_tensor_batch[REWARD_INFO] = np.array([{k: v for k, v in i.items() if k != "my_rewards.fmt"}
                                                   for i in infos] + [{}], dtype=object)
    trainer.global_steps = 2
    with pytest.raises(ValueError, match="no score of reward function 'my_rewards.fmt'"):
        trainer._explorl_step(data, keep)


def test_the_legacy_only_estimators_are_absent_from_verls_v1_trainer():
    """Why the launcher and the plugin refuse ReMax and the optimal token baseline (docs/methods.md §5n, §5s): verl
    0.9.1 samples the greedy baseline and computes sum_pi_squared in its legacy trainer only."""
    import inspect

    from verl.trainer.ppo import ray_trainer
    from verl.trainer.ppo.v1 import trainer_base

    v1, legacy = inspect.getsource(trainer_base), inspect.getsource(ray_trainer)
    assert "REMAX" in legacy and "calculate_sum_pi_squared" in legacy
    assert "REMAX" not in v1 and "remax" not in v1.lower() and "sum_pi_squared" not in v1


def test_a_verl_step_writes_explorls_run_directory(tmp_path, tiny_model_dir):
    """A verl batch after the advantage step (a fabricated `DataProto`, with the reward bridge's extra info and one
    of verl's no-op padding rows) becomes a metrics record with the keys of explorl's own loop, which
    `explorl.report.runs.load_run` reads; then `finish` evaluates verl's exported weights into final/ and eval.json."""
    import shutil

    import yaml

    from explorl.integrations.verl.launch import finish, hf_export
    from explorl.integrations.verl.trainer import REWARD_INFO
    from explorl.report.runs import load_run

    out = tmp_path / "run"
    config = {"model": {"path": str(tiny_model_dir)}, "task": {"eval_size": 4, "train_size": 32,
                                                               "reward": ["exact", "my_rewards:fmt"]},
              "sampling": {"max_new_tokens": 8}, "run": {"out_dir": str(out), "steps": 1, "eval_n": 2,
                                                         "eval_k": [1, 2]}}
    (tmp_path / "explorl.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "my_rewards.py").write_text(USER_REWARDS)
    data, _ = make_batch(3)
    n = len(data)
    pad = DataProto.from_dict(tensors={k: torch.zeros_like(v[:1]) for k, v in data.batch.items()},
                              non_tensors={"uid": np.array(["pad0"], dtype=object)})
    data = DataProto.concat([data, pad])
    keep = np.array([True] * n + [False])
    correct = [bool(x) for x in (data.batch["token_level_rewards"].sum(-1) > 0)]
    infos = [{"score": 0.0, "correct": float(c), "reward_failed": float(i == 1), "reward_errors": float(i == 1),
              "reward_timeouts": 0.0, "exact": float(c), "my_rewards.fmt": 0.5} for i, c in enumerate(correct)]
    data.non_tensor_batch[REWARD_INFO] = np.array(infos, dtype=object)
    trainer = _trainer_for_run(tmp_path, tmp_path / "explorl.yaml")
    metrics = trainer._explorl_step(data, keep)
    run = load_run(out)
    (record,) = run.steps
    explorl_loop_keys = {"adv/mean", "adv/std", "entropy/behavior_mean", "entropy/by_position", "entropy/mean",
                         "entropy/neg", "entropy/pos", "length/max", "length/mean", "length/truncated_frac",
                         "reward/all_correct_frac", "reward/all_wrong_frac", "reward/correct_frac",
                         "reward/errors", "reward/mean", "reward/std", "reward/timeouts", "rollouts/per_prompt_max",
                         "rollouts/per_prompt_mean", "rollouts/per_prompt_min", "rollouts/total", "step",
                         "temperature/mean", "temperature/train", "tokens/downweighted_frac", "tokens/masked_frac"}
    assert explorl_loop_keys <= set(record) and {"reward/exact", "reward/my_rewards.fmt"} <= set(record)
    assert record["step"] == 1 and record["rollouts/total"] == n  # the padding row is not a response
    assert record["reward/correct_frac"] == pytest.approx(sum(correct) / n) and record["reward/errors"] == 1
    assert record["reward/my_rewards.fmt"] == 0.5 and record["length/truncated_frac"] > 0  # width 7 = the limit
    assert record["temperature/mean"] == pytest.approx(0.8) and record["temperature/train"] == pytest.approx(0.8)
    assert metrics["explorl/reward/correct_frac"] == record["reward/correct_frac"]
    assert json.loads((out / "engine.json").read_text())["engine"] == "verl"
    assert yaml.safe_load((out / "config.yaml").read_text())["model"]["fingerprint"]
    # a longer limit: nothing was truncated (verl v1 pads to the batch's longest response, not to the limit)
    trainer = _trainer_for_run(tmp_path, tmp_path / "explorl.yaml", response_length=64)
    trainer.global_steps = 2
    trainer._explorl_step(data, keep)
    assert load_run(out).steps[-1]["length/truncated_frac"] == 0
    # the rewards failed on too many samples: the run stops before the update
    data.non_tensor_batch[REWARD_INFO] = np.array([{**i, "reward_failed": 1.0} for i in infos] + [{}], dtype=object)
    trainer.global_steps = 3
    with pytest.raises(ValueError, match="max_reward_failure_frac"):
        trainer._explorl_step(data, keep)
    # the final evaluation of verl's Hugging Face export of the last step
    shutil.copytree(tiny_model_dir, hf_export(out, 1))
    _refused_while_another_process_holds_it(out, finish)
    final = finish(out)
    assert "pass@1" in final and (out / "final" / "config.json").exists()
    assert json.loads((out / "eval.json").read_text())["step"] == 1
    assert load_run(out).final["pass@2"] == final["pass@2"]


@pytest.mark.parametrize("recipe", RECIPES, ids=[p.stem for p in RECIPES])
def test_each_recipe_composes_through_the_launcher(recipe, tmp_path, verl_model_dir):
    """Every recipe of configs/recipes (its model swapped for one verl's tokenizer reads, a smaller data set)
    becomes a verl config that verl's Hydra schema and `validate_config` accept, or is refused by name; methods the
    plain estimator call cannot run get explorl's trainer, the others run in verl's own (no run directory here)."""
    from verl.trainer.ppo.ray_trainer import compute_advantage

    from explorl.integrations.verl.launch import prepare, trainer_needs

    overrides = [f"model.path={verl_model_dir}", "task.train_size=64", "task.eval_size=16",
                 f"run.out_dir={tmp_path / 'run'}"]
    if recipe.stem in ("adaptive_entropy", "prorl_reset", "simko", "outcome_bonus", "fr3e", "line_start_kl"):
        # explorl's loop only (docs/methods.md §5aa, §5ab; SimKO's top-K log-probs, §5w; the outcome bonus's answers
        # and counts, §5ac; FR3E's branching, §5ad; the line starts of the KL term, §5ae)
        with pytest.raises(ConfigError, match="explorl train"):
            prepare(recipe, overrides, write=False, run_dir=False)
        return
    if recipe.stem in ("remax", "optimal_token_baseline"):  # verl 0.9.1's v1 trainer feeds neither (§5n, §5s)
        with pytest.raises(ConfigError, match="legacy trainer .*explorl train"):
            prepare(recipe, overrides, write=False, run_dir=False)
        return
    try:
        launch = prepare(recipe, overrides, write=False, run_dir=False)
    except ConfigError as e:
        assert recipe.stem == "e3" and "algo.loss_agg=seq-mean-token-mean-per-question" in str(e)
        launch = prepare(recipe, [*overrides, "algo.loss_agg=seq-mean-token-mean"], write=False, run_dir=False)
    cfg = compose_verl(launch.command[3:])
    check_verl_config(cfg)
    explorl_cfg = launch.cfg
    assert cfg.algorithm.adv_estimator == f"explorl_{explorl_cfg.algo.advantage}"
    assert cfg.actor_rollout_ref.rollout.n == explorl_cfg.sampling.group_size == 8
    needs = trainer_needs(explorl_cfg)
    assert (cfg.trainer.v1.trainer_mode == "explorl") == bool(needs)
    data, _ = make_batch(0)
    if not needs:  # verl's own trainer: its plain estimator call runs the method on verl's batch
        compute_advantage(data, adv_estimator=cfg.algorithm.adv_estimator, config=cfg.algorithm)
    elif any(r.startswith("verl's estimator call lacks") or "step window" in r for r in needs):
        with pytest.raises((MissingInputError, ValueError), match="trainer.v1.trainer_mode=explorl"):
            compute_advantage(data, adv_estimator=cfg.algorithm.adv_estimator, config=cfg.algorithm)
    if explorl_cfg.algo.importance_weights == "tis":
        assert cfg.actor_rollout_ref.rollout.calculate_log_probs
    if "ead" in (explorl_cfg.sampling.schedule, getattr(explorl_cfg.sampling.options.get("adaptive"), "base", "")):
        assert "explorl.integrations.vllm:EADLogitsProcessor" in \
            cfg.actor_rollout_ref.rollout.engine_kwargs.vllm.logits_processors
    assert cfg.algorithm.filter_groups.enable == (explorl_cfg.budget.policy == "dapo")
    assert (cfg.actor_rollout_ref.actor.use_kl_loss and cfg.actor_rollout_ref.actor.kl_loss_coef ==
            pytest.approx(explorl_cfg.algo.kl_coef)) or explorl_cfg.algo.kl_coef == 0


def test_a_users_plugins_are_imported_in_every_verl_process(tmp_path, verl_model_dir, monkeypatch):
    """`run.plugins` reach verl's processes through Ray's runtime environment; the plugin entry point imports them
    before registering the methods."""
    from explorl.integrations.verl import import_env_plugins
    from explorl.integrations.verl.launch import prepare

    plugin_dir = tmp_path / "plugins"
    plugin_dir.mkdir()
    (plugin_dir / "explorl_verl_test_plugin.py").write_text("IMPORTED = True\n")
    monkeypatch.setattr(sys, "path", list(sys.path))
    launch = prepare(user_run(tmp_path, verl_model_dir, run={"plugins": ["explorl_verl_test_plugin"],
                                                              "python_path": [str(plugin_dir)]}), write=False)
    cfg = compose_verl(launch.command[3:])
    env = cfg.ray_kwargs.ray_init.runtime_env.env_vars
    assert env.EXPLORL_PLUGINS == "explorl_verl_test_plugin"
    assert str(plugin_dir) in env.EXPLORL_PYTHON_PATH.split(os.pathsep)
    monkeypatch.setenv("EXPLORL_PLUGINS", env.EXPLORL_PLUGINS)
    monkeypatch.setenv("EXPLORL_PYTHON_PATH", env.EXPLORL_PYTHON_PATH)
    sys.path[:] = [p for p in sys.path if p != str(plugin_dir)]
    monkeypatch.delitem(sys.modules, "explorl_verl_test_plugin", raising=False)
    assert import_env_plugins() == ["explorl_verl_test_plugin"] and sys.modules["explorl_verl_test_plugin"].IMPORTED
    assert str(plugin_dir) in sys.path


def test_hydra_values_read_back_as_written():
    from explorl.integrations.verl.launch import hydra_value

    values = {"a": "10", "b": "true", "c": None, "d": 1e-6, "e": [0.9, 0.95], "f": "a,b", "g": "pkg://x.y:z",
              "h": {}, "i": "it's {{ m.content }}", "j": [], "k": False, "l": "/p q/r.parquet", "m": 3}
    cfg = compose_verl([f"+explorl.{k}={hydra_value(v)}" for k, v in values.items()])
    assert OmegaConf.to_container(cfg.explorl) == values


def test_the_launcher_prints_without_writing(tmp_path, verl_model_dir, capsys):
    from explorl.integrations.verl.launch import main

    run = user_run(tmp_path, verl_model_dir, budget={"policy": "dapo"})
    assert main([str(run), "algo.eps_high=0.3", "--print", "--", "trainer.nnodes=2"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert any("budget.dapo.max_rounds=3 dropped" in line for line in out if line.startswith("# "))
    command = shlex.split(out[-1])
    assert "actor_rollout_ref.actor.clip_ratio_high=0.3" in command and command[-1] == "trainer.nnodes=2"
    assert not (tmp_path / "run").exists()
    assert main([str(run), "--print", "--", "data.train_batch_size=4"]) == 2  # owned by run.batch_size
    assert "run.batch_size" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------------
# explorl's rollout controllers in verl: E3's temperature and budgets, EAD, per-prompt temperature

E3_SETTINGS = {"sampling": {"schedule": "e3", "e3": {"anneal": True}},
               "budget": {"policy": "e3", "e3": {"g_min_limit": 4, "g_max_limit": 12, "g_step": 2}}}


def e3_config(settings=E3_SETTINGS, steps: int = 8):
    return rollout_config(settings, temperature=1.0, group_size=8, max_new_tokens=32, top_p=1.0, total_steps=steps)


def test_rollout_settings_are_validated_with_verls_names():
    with pytest.raises(ConfigError, match=r"algorithm\.explorl\.sampling\.temperature: verl sets this; set "
                                          r"`actor_rollout_ref\.rollout\.temperature`"):
        rollout_config({"sampling": {"temperature": 0.7}}, temperature=1.0, group_size=8, max_new_tokens=8,
                       top_p=1.0, total_steps=1)
    with pytest.raises(ConfigError,
                       match=r"algorithm\.explorl\.sampling\.e3\.etaa.*algorithm\.explorl\.sampling\.e3\.eta"):
        e3_config({"sampling": {"schedule": "e3", "e3": {"etaa": 0.5}}})
    with pytest.raises(ConfigError, match=r"budget\.policy=dapo.*explorl train"):
        e3_config({"budget": {"policy": "dapo"}})
    with pytest.raises(ConfigError, match=r"algorithm\.explorl\.budget\.e3: need 1 <= g_min_limit <= "
                                          r"actor_rollout_ref\.rollout\.n <= g_max_limit, got 2, 8, 6"):
        e3_config({"budget": {"policy": "e3", "e3": {"g_min_limit": 2, "g_max_limit": 6}}})
    assert not needs_control({"erpo_gamma": 5.0}) and needs_control(E3_SETTINGS)
    # the controller sections do not reach the estimator's AlgoConfig
    assert algo_config({**E3_SETTINGS, "shapers": ["cw_group"]}).shapers == ["cw_group"]


def test_rollout_control_steers_as_explorls_own_loop():
    """Six steps of E3 (temperature controller + dynamic budgets, 12 prompts, 4 per step, so a new pass begins
    at steps 3 and 6): the plan verl gets equals what explorl's loop (`collect_rollouts`: PromptStream, end of
    pass, budgets, schedule) samples with, fed the same rewards and entropies."""
    from explorl.rollout.controllers import PromptStream
    from explorl.rollout.schedule import ScheduleDriver

    cfg = e3_config()
    control = RolloutControl(cfg, vocab_size=1000, num_prompts=12)
    own, stream = ScheduleDriver(cfg, 1000, 12), PromptStream(12, seed=3)
    g = torch.Generator().manual_seed(0)
    widened = []
    for step in range(6):
        epoch = stream.epoch
        ids = stream.next(4)
        if stream.epoch != epoch:
            own.budget.end_of_pass()
        budgets = own.budget.budgets(ids)
        temp_arg, train_temp, _ = own.schedule.at(step)
        plan = control.plan(step, ids)
        assert plan.rollout_n == budgets and plan.train_temperature == train_temp
        assert plan.temperature == [temp_arg] * 4 and plan.anneal == [None] * 4
        assert sum(plan.rollout_n) == 4 * 8  # E3 redistributes a fixed total: verl's mini-batches stay whole
        widened.append(control.driver.budget.curriculum.bounds())
        rewards = [(torch.rand(n, generator=g) < 0.3 + 0.1 * j).float().tolist() for j, n in enumerate(budgets)]
        entropy = 0.5 + 0.3 * float(torch.rand((), generator=g))
        for c in (own.budget, own.schedule):
            c.observe_rewards(ids, rewards)
        own.schedule.observe(step + 1, entropy)
        control.observe(step, ids, rewards, entropy)
    state = control.state_dict()
    assert (state["schedule"], state["budget"]) == (own.schedule.state_dict(), own.budget.state_dict())
    assert widened[0] == (4, 12) or widened[0] != widened[-1]  # the curriculum moved at a pass boundary
    assert len(set(plan.rollout_n)) > 1 and plan.train_temperature != 1.0  # budgets and tau both moved


def test_rollout_control_state_resumes_exactly():
    cfg = e3_config()
    first = RolloutControl(cfg, 1000, 8)
    for step in range(3):
        first.plan(step, [2 * step % 8, (2 * step + 1) % 8])
        first.observe(step, [2 * step % 8, (2 * step + 1) % 8], [[1.0, 0.0] * 4, [0.0] * 8], 0.6 - 0.1 * step)
    resumed = RolloutControl(cfg, 1000, 8)
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))  # as saved in explorl_rollout.json
    assert resumed.plan(3, [6, 7]) == first.plan(3, [6, 7])


def test_prompt_indices_outside_the_dataset_are_refused():
    with pytest.raises(ValueError, match=r"extra_info\.index"):
        RolloutControl(e3_config(), 1000, 4).plan(0, [0, 9])
    with pytest.raises(ValueError, match=r"every prompt of the batch has dataset index 0"):
        RolloutControl(e3_config(), 1000, 4).plan(0, [0, 0, 0])  # rows without extra_info.index


def test_observed_per_prompt_by_hand():
    # uids a, b, a, b, c: rewards on each response's last token; entropy mean over the 6 valid tokens
    uids = np.array(["a", "b", "a", "b", "c"], dtype=object)
    rewards = torch.tensor([[0, 1.0], [0, 0], [1.0, 0], [0, 0], [0, 1.0]])
    mask = torch.tensor([[1, 1], [1, 0], [1, 0], [1, 0], [1, 0]])
    entropy = torch.tensor([[0.6, 0.3], [0.9, 5.0], [0.3, 5.0], [0.6, 5.0], [0.9, 5.0]])
    index = {"a": 4, "b": 0, "c": 2, "z": 1}
    ids, per_prompt, h = observed_per_prompt(uids, index, rewards, entropy, mask)
    assert ids == [4, 0, 2] and per_prompt == [[1.0, 1.0], [0.0, 0.0], [1.0]]
    assert h == pytest.approx((0.6 + 0.3 + 0.9 + 0.3 + 0.6 + 0.9) / 6)
    assert index == {"z": 1}  # observed prompts leave the map
    with pytest.raises(KeyError, match="not planned"):
        observed_per_prompt(uids, {}, rewards, entropy, mask)


def _trainer_without_ray(tmp_path, settings, n_prompts=6):
    """explorl's verl trainer with only what `_next_train_batch` reads (no Ray, no workers); verl's own
    `_next_train_batch` replaced by a dataloader stand-in giving verl's batch layout."""
    from transformers import Qwen2Config
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY
    from verl.utils import tensordict_utils as tu

    Qwen2Config(vocab_size=64, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                intermediate_size=16).save_pretrained(tmp_path)
    cls = TRAINER_REGISTRY["explorl"]
    trainer = object.__new__(cls)
    trainer.config = OmegaConf.create({
        "algorithm": {"explorl": settings},
        "actor_rollout_ref": {"model": {"path": str(tmp_path)},
                              "rollout": {"temperature": 1.0, "n": 8, "response_length": 32, "top_p": 1.0}},
        "trainer": {"default_local_dir": str(tmp_path / "ckpt"), "resume_mode": "auto"}})
    OmegaConf.set_struct(trainer.config, True)  # as verl's trainer sets it
    trainer.train_dataset, trainer.total_training_steps, trainer.global_steps = [None] * n_prompts, 10, 1

    def next_batch(self, num_prompts=None):
        return tu.get_tensordict({"index": torch.tensor([4, 1]),
                                  "uid": np.array(["u-a", "u-b"], dtype=object),
                                  "raw_prompt": np.array([[{"role": "user", "content": "1+1"}]] * 2, dtype=object)})

    parent = cls.__mro__[1]
    return trainer, parent, next_batch


def _per_prompt_kwargs(batch, i):
    # how verl's agent-loop worker turns batch row i into the agent loop's keyword arguments
    # (verl/trainer/ppo/v1/agent_loop_tq.py, AgentLoopWorkerTQ.generate_sequences)
    from tensordict import NonTensorData, NonTensorStack

    prompt = {}
    for k, v in batch.items():
        if isinstance(v, torch.Tensor):
            prompt[k] = v[i]
        elif isinstance(v, NonTensorStack):
            prompt[k] = v[i].data
        elif isinstance(v, NonTensorData):
            prompt[k] = v.data
    return prompt


def test_the_trainer_plans_e3_and_the_agent_loop_samples_with_it(tmp_path, monkeypatch):
    import asyncio

    from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

    from explorl.integrations.verl.agent_loop import ExplorlAgentLoop
    from explorl.integrations.verl.rollout import AGENT_LOOP, ANNEAL_FIELD, TEMPERATURE_FIELD

    trainer, parent, next_batch = _trainer_without_ray(tmp_path, E3_SETTINGS)
    monkeypatch.setattr(parent, "_next_train_batch", next_batch)
    control = None
    for step in range(3):  # E3 moves tau after each observed batch; the trainer applies it to the actor
        trainer.global_steps = step + 1
        batch = trainer._next_train_batch()
        control = trainer._control
        assert trainer.config.actor_rollout_ref.rollout.temperature == control.driver.schedule.controller.tau
        control.observe(step, [4, 1], [[1.0] * 8, [0.0] * 8], 0.8 + 0.2 * step)  # entropy rises: tau falls
    assert trainer.config.actor_rollout_ref.rollout.temperature < 1.0
    assert batch["__rollout_n__"].tolist() == [8, 8] and ANNEAL_FIELD not in batch.keys()
    assert trainer._prompt_index["u-a"] == 4 and trainer._prompt_index["u-b"] == 1

    seen = {}

    async def fake_run(self, sampling_params, priority=0, **kwargs):
        seen.update(params=sampling_params, kwargs=kwargs)
        return "output"

    monkeypatch.setattr(SingleTurnAgentLoop, "run", fake_run)
    prompt = _per_prompt_kwargs(batch, 0)
    assert prompt["agent_name"] == AGENT_LOOP and int(prompt.pop("__rollout_n__")) == 8  # verl pops it
    prompt.pop("agent_name")
    loop = object.__new__(ExplorlAgentLoop)
    base = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
    assert asyncio.run(loop.run(dict(base), **prompt)) == "output"
    assert seen["params"] == {**base, "temperature": pytest.approx(float(batch[TEMPERATURE_FIELD][0]))}
    assert TEMPERATURE_FIELD not in seen["kwargs"] and seen["kwargs"]["raw_prompt"][0]["content"] == "1+1"


def test_the_trainer_gives_ead_prompts_their_annealing(tmp_path, monkeypatch):
    import asyncio

    from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

    from explorl.integrations.verl.agent_loop import ExplorlAgentLoop
    from explorl.integrations.vllm import EAD_ARG, token_factors
    from explorl.rollout.temperature import ead_schedule

    trainer, parent, next_batch = _trainer_without_ray(tmp_path, {"sampling": {"schedule": "ead"}})
    monkeypatch.setattr(parent, "_next_train_batch", next_batch)
    trainer.global_steps = 4
    batch = trainer._next_train_batch()
    assert trainer.config.actor_rollout_ref.rollout.temperature == 1.0  # EAD trains at the base temperature
    seen = {}

    async def fake_run(self, sampling_params, priority=0, **kwargs):
        seen.update(params=sampling_params)

    monkeypatch.setattr(SingleTurnAgentLoop, "run", fake_run)
    prompt = _per_prompt_kwargs(batch, 1)
    for k in ("__rollout_n__", "agent_name"):
        prompt.pop(k)
    asyncio.run(object.__new__(ExplorlAgentLoop).run({"temperature": 1.0}, **prompt))
    anneal = seen["params"]["extra_args"][EAD_ARG]
    assert anneal["schedule"] == "ead" and anneal["step"] == 3  # verl's step 4 is explorl's 0-based step 3
    # what vLLM's processor applies per token is explorl's own sampler table for that step (32 tokens)
    factors = token_factors([anneal] * 32, list(range(32))) * seen["params"]["temperature"]
    torch.testing.assert_close(factors, ead_schedule(3, 32), rtol=1e-6, atol=0)


def test_the_trainer_refuses_a_dataset_that_picks_its_own_agent_loop(tmp_path, monkeypatch):
    from verl.utils import tensordict_utils as tu

    trainer, parent, next_batch = _trainer_without_ray(tmp_path, E3_SETTINGS)

    def with_agent(self, num_prompts=None):
        batch = next_batch(self)
        tu.assign_non_tensor_data(batch, "agent_name", "tool_agent")
        return batch

    monkeypatch.setattr(parent, "_next_train_batch", with_agent)
    with pytest.raises(ValueError, match="agent_name"):
        trainer._next_train_batch()


def test_without_controller_settings_the_trainer_leaves_sampling_to_verl(tmp_path, monkeypatch):
    trainer, parent, next_batch = _trainer_without_ray(tmp_path, {"shapers": ["cw_group"]})
    monkeypatch.setattr(parent, "_next_train_batch", next_batch)
    batch = trainer._next_train_batch()
    assert "__rollout_n__" not in batch.keys() and "agent_name" not in batch.keys()


def test_a_users_per_token_schedule_is_planned_for_verls_agent_loop(monkeypatch):
    """A per-token schedule registered in the user's module (tests/schedule_for_tests.py) reaches verl's requests
    with the processor's arguments, and needs control, with no change to explorl.integrations."""
    from pathlib import Path

    from explorl.integrations.vllm import check_anneal_args

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1]))
    import schedule_for_tests  # noqa: F401  (registers `test_warm_start`)

    settings = {"sampling": {"schedule": "test_warm_start", "test_warm_start": {"until": 4}}}
    assert needs_control(settings)
    plan = RolloutControl(e3_config(settings), 1000, 4).plan(3, [0, 1])
    assert plan.rollout_n == [8, 8] and plan.temperature == [1.0, 1.0] and plan.train_temperature == 1.0
    assert [check_anneal_args(a) for a in plan.anneal] == [{"schedule": "test_warm_start", "step": 3, "hot": 2.0,
                                                             "until": 4}] * 2


def _refused_while_another_process_holds_it(run_dir, finish) -> None:
    """`finish` takes the run directory's lock: while verl's trainer still writes the directory (here: this process,
    whose trainer opened it), a `finish` in another process is refused naming this one, and writes nothing."""
    import os
    import subprocess
    import sys

    del finish  # the same function, called in a second process
    code = "import sys; from explorl.integrations.verl.launch import finish; finish(sys.argv[1])"
    proc = subprocess.run([sys.executable, "-c", code, str(run_dir)], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "RunDirLocked" in proc.stderr and f"pid {os.getpid()}" in proc.stderr, proc.stderr
    assert not (run_dir / "final").exists() and not (run_dir / "eval.json").exists()
