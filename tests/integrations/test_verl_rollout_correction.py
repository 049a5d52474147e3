"""Rollout correction (docs/methods.md §6d) equal to verl 0.9.1's `rollout_corr_helper` on the same tensors (float64,
three seeds, several option values; run by `make test-verl` in `.venv-verl`), and TRL 1.16's modes and off-policy
mask equal to an independent reference written from TRL's code (cited at each)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

verl = pytest.importorskip("verl", reason="verl is installed in .venv-verl only: run `make test-verl`")
from verl.trainer.ppo.rollout_corr_helper import (  # noqa: E402
    compute_rollout_correction_and_rejection_mask, compute_rollout_correction_weights, compute_rollout_rejection_mask)

from explorl.algos import RolloutBatch, compute_advantages  # noqa: E402
from explorl.algos.methods.rollout_correction import (  # noqa: E402
    OffPolicyMaskOptions, RolloutIsOptions, off_policy_mask, rollout_is_weights, rollout_log_ratio)
from explorl.algos.methods.rollout_rejection import RS_MODES, RolloutRsOptions, rejection_keep  # noqa: E402
from explorl.config import AlgoConfig  # noqa: E402

SEEDS = (0, 1, 2)


def inputs(seed: int, n: int = 8, t: int = 12, scale: float = 0.3):
    """pi_old's and the rollout's log-probs (float64) differing by N(0, scale) per token, a mask with padding (row 0
    one token long), and garbage on the padding, which neither side may read."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(n, t, generator=g, dtype=torch.float64) * 3
    rollout = old + torch.randn(n, t, generator=g, dtype=torch.float64) * scale
    lengths = torch.randint(1, t + 1, (n,), generator=g)
    lengths[0] = 1
    mask = (torch.arange(t)[None, :] < lengths[:, None]).to(torch.float64)
    rollout = torch.where(mask.bool(), rollout, torch.full_like(rollout, 5.0))
    return old, rollout, mask


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("threshold, explorl", [
    (2.0, dict(mode="truncate", upper=2.0)),  # verl's TIS
    (1.2, dict(mode="truncate", upper=1.2)),  # truncates tokens too (scale 0.3)
    ("0.5_2.0", dict(mode="mask", lower=0.5, upper=2.0)),  # verl's IcePop
    ("0.8_1.25", dict(mode="mask", lower=0.8, upper=1.25))])
@pytest.mark.parametrize("normalize", [False, True])
def test_importance_weights_equal_verls(seed, level, threshold, explorl, normalize):
    old, rollout, mask = inputs(seed)
    want, _ = compute_rollout_correction_weights(old - rollout, mask, rollout_is=level, rollout_is_threshold=threshold,
                                                 rollout_is_batch_normalize=normalize)
    got, _ = rollout_is_weights(rollout_log_ratio(old, rollout, mask), mask, level=level, batch_normalize=normalize,
                                **explorl)
    # verl's batch mean divides by the count + 1e-8: relative 1e-8 / count
    assert torch.allclose(got, want, rtol=1e-8 if normalize else 0, atol=1e-12), (got - want).abs().max()


def _verl_spec(modes, upper, lower) -> str:
    lows = iter(lower)
    return ",".join(f"{next(lows)}_{u}" if m.endswith("k1") and lower else f"{u}" for m, u in zip(modes, upper))


RS_CASES = [([m], [u], []) for m, u in zip(RS_MODES, (1.5, 0.02, 0.02, 3.0, 0.2, 0.2, 1.05, 0.05, 0.05, 0.1, 0.1))]
RS_CASES += [(["token_k1"], [1.5], [0.9]), (["seq_mean_k1"], [1.001], [0.999]),  # verl's Geo-RS preset
             (["token_k1", "seq_mean_k3", "seq_max_k2"], [1.5, 0.05, 0.1], [0.7]),
             (["seq_sum_k1", "token_k3"], [2.0, 0.03], [])]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("modes, upper, lower", RS_CASES, ids=lambda v: ",".join(map(str, v)))
def test_rejection_equals_verls(seed, modes, upper, lower):
    old, rollout, mask = inputs(seed)
    want, _ = compute_rollout_rejection_mask(old - rollout, mask, rollout_rs=",".join(modes),
                                             rollout_rs_threshold=_verl_spec(modes, upper, lower))
    keep = rejection_keep(rollout_log_ratio(old, rollout, mask), mask, modes, upper, lower)
    assert torch.equal(mask * keep, want)


def test_rejection_cases_reject_some_and_keep_some():
    # the thresholds above are sized so that each case decides something on these tensors
    old, rollout, mask = inputs(0)
    for modes, upper, lower in RS_CASES:
        keep = rejection_keep(rollout_log_ratio(old, rollout, mask), mask, modes, upper, lower)
        assert 0 < int(keep.sum()) < int(mask.sum()) or modes == ["seq_mean_k1"], modes


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("is_level, rs", [("token", "token_k1"), ("sequence", "seq_mean_k3"),
                                          ("sequence", "token_k1")])
def test_through_the_step_as_verl_applies_both(seed, is_level, rs):
    """explorl's step (rollout_rs as a reward shaper, rollout_is as importance weights) against verl's
    `compute_rollout_correction_and_rejection_mask`: the same loss mask and the same weights on it. The one
    difference: explorl computes the weights on the mask after rejection, verl on the response mask, so with
    token-level rejection and sequence-level weights verl's product also runs over the rejected tokens; explorl's
    then equals verl's weights computed on the rejected mask."""
    old, rollout, mask = inputs(seed)
    threshold = 1.5 if rs == "token_k1" else 0.05
    proto, want_mask, _ = compute_rollout_correction_and_rejection_mask(
        old, rollout, mask, rollout_is=is_level, rollout_is_threshold=2.0, rollout_rs=rs,
        rollout_rs_threshold=threshold)
    cfg = replace(AlgoConfig(), importance_weights="rollout_is", reward_shapers=["rollout_rs"],
                  options={"rollout_is": RolloutIsOptions(level=is_level, threshold=2.0),
                           "rollout_rs": RolloutRsOptions(modes=[rs], threshold=[threshold])})
    n = mask.shape[0]
    batch = RolloutBatch(mask=mask, rewards=torch.arange(n, dtype=torch.float64) % 2,
                         group=torch.arange(n) // 4, logprobs=old, behavior_logprobs=rollout)
    out = compute_advantages(batch, cfg, step=1)
    assert torch.equal(out.loss_mask, want_mask)
    want = proto.batch["rollout_is_weights"] * want_mask
    if is_level == "sequence" and rs.startswith("token"):
        assert not torch.allclose(out.is_weights, want)  # the difference acts on these tensors
        want, _ = compute_rollout_correction_weights(old - rollout, want_mask, rollout_is=is_level,
                                                     rollout_is_threshold=2.0)
    assert torch.allclose(out.is_weights, want, rtol=0, atol=1e-12)


def trl_is_ratio(old, sampling, mask, mode, clip_min, clip_max):
    """TRL 1.16 `GRPOTrainer._generate_and_score_completions` (trl/trainer/grpo_trainer.py, "Compute the importance
    sampling ratio when using vLLM"): diff = (old - sampling) * mask; summed per sequence for `sequence_*` (shape
    [B, 1]); exp; `*_truncate`: clamp(min=clip_min, max=clip_max); `*_mask`: 0 where < clip_min or > clip_max (None:
    -inf / +inf). The loss multiplies the token loss by it (`per_token_loss * inputs["importance_sampling_ratio"]`)."""
    diff = (old - sampling) * mask
    diff = torch.nan_to_num(diff, nan=0.0)
    if mode.startswith("sequence"):
        diff = diff.sum(dim=-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode.endswith("truncate"):
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    lo = clip_min if clip_min is not None else -math.inf
    hi = clip_max if clip_max is not None else math.inf
    return ratio.masked_fill((ratio < lo) | (ratio > hi), 0.0)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
@pytest.mark.parametrize("clip_min, clip_max", [(None, 3.0), (0.5, 3.0), (0.8, None), (0.9, 1.2)])
def test_trls_vllm_importance_sampling_modes(seed, mode, clip_min, clip_max):
    old, rollout, mask = inputs(seed, scale=0.1)
    level, how = mode.split("_")
    want = trl_is_ratio(old, rollout, mask, mode, clip_min, clip_max) * mask  # the loss sees only valid tokens
    got, _ = rollout_is_weights(rollout_log_ratio(old, rollout, mask), mask, level=level, mode=how, upper=clip_max,
                                lower=clip_min)
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)


def trl_off_policy_mask(advantages, per_token_logps, sampling_per_token_logps, mask, threshold):
    """TRL 1.16 `GRPOTrainer.get_off_policy_mask` (trl/trainer/grpo_trainer.py; DeepSeek-V3.2 eq. 9):
    kl = sampling - per_token_logps (NaN -> 0); mean over the mask per sequence (count clamped at 1); keep where
    advantages >= 0 or kl <= threshold. Applied as `per_token_loss * off_policy_mask`."""
    kl = torch.nan_to_num(sampling_per_token_logps - per_token_logps.detach(), nan=0.0)
    avg = (kl * mask).sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1.0)
    return ((advantages >= 0) | (avg <= threshold)).to(mask.dtype)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("threshold", [0.0, 0.02, 0.1])
def test_trls_off_policy_mask(seed, threshold):
    old, rollout, mask = inputs(seed, scale=0.3)
    g = torch.Generator().manual_seed(seed + 10)
    adv = torch.randn(mask.shape[0], 1, generator=g, dtype=torch.float64)  # TRL's one advantage per sequence
    want = trl_off_policy_mask(adv, old, rollout, mask, threshold).expand_as(mask) * mask
    got = off_policy_mask(adv.expand_as(mask), old, rollout, mask, threshold) * mask
    assert torch.equal(got, want)
    # and through the step: the shaper zeroes the advantages the mask drops (GRPO's, one per response)
    cfg = replace(AlgoConfig(), shapers=["off_policy_mask"],
                  options={"off_policy_mask": OffPolicyMaskOptions(threshold=threshold)})
    n = mask.shape[0]
    batch = RolloutBatch(mask=mask, rewards=torch.rand(n, generator=g, dtype=torch.float64),
                         group=torch.arange(n) // 4, logprobs=old, behavior_logprobs=rollout)
    out = compute_advantages(batch, cfg, step=1)
    base = out.base_advantages
    seq_adv = base.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True)
    assert torch.allclose(out.advantages, base * trl_off_policy_mask(seq_adv, old, rollout, mask, threshold))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("loss_type, corr", [
    ("ppo_clip", {}),  # verl's bypass_ppo_clip preset
    ("ppo_clip", {"rollout_rs": "seq_mean_k1", "rollout_rs_threshold": "0.9_1.1"}),  # bypass_ppo_clip_geo_rs
    ("reinforce", {"rollout_is": "sequence", "rollout_is_threshold": 2.0}),  # bypass_pg_is
    ("reinforce", {"rollout_is": "token", "rollout_is_threshold": "0.8_1.25"}),  # bypass_pg_token_icepop
    ("reinforce", {"rollout_is": "token", "rollout_is_threshold": 1.2, "rollout_is_batch_normalize": True,
                   "rollout_rs": "token_k1,seq_max_k2", "rollout_rs_threshold": "1.3,0.1"}),
])
def test_bypass_mode_equals_verls(seed, agg, loss_type, corr):
    """explorl's `bypass_mode` loss gives verl 0.9.1's `compute_policy_loss_bypass_mode` loss and gradient (float64;
    verl's vanilla PPO has its dual clip c = 3 always on, so explorl's is set to 3)."""
    from verl.trainer.config.algorithm import RolloutCorrectionConfig
    from verl.trainer.ppo.core_algos import compute_policy_loss_bypass_mode
    from verl.workers.config.actor import ActorConfig, PolicyLossConfig

    from explorl.algos.aggregation import Reduction
    from explorl.algos.methods.bypass import BypassOptions, bypass_loss

    new0, rollout, mask = inputs(seed, scale=0.2)
    g = torch.Generator().manual_seed(seed + 20)
    adv = torch.randn(mask.shape[0], 1, generator=g, dtype=torch.float64).expand_as(mask).contiguous()
    config = ActorConfig(strategy="fsdp", ppo_micro_batch_size_per_gpu=1, rollout_n=1, clip_ratio_low=0.2,
                         clip_ratio_high=0.28, policy_loss=PolicyLossConfig(
                             loss_mode="bypass_mode",
                             rollout_correction=RolloutCorrectionConfig(bypass_mode=True, loss_type=loss_type,
                                                                        **{"rollout_is": None, **corr})))
    threshold = str(corr.get("rollout_is_threshold", "2.0"))
    lower, _, upper = threshold.rpartition("_")
    modes = [m for m in corr.get("rollout_rs", "").split(",") if m]
    specs = str(corr.get("rollout_rs_threshold", "")).split(",") if modes else []
    options = BypassOptions(loss_type=loss_type, dual_clip_c=3.0, rollout_is=corr.get("rollout_is"),
                            rollout_is_mode="mask" if lower else "truncate", rollout_is_threshold=float(upper),
                            rollout_is_threshold_lower=float(lower) if lower else None,
                            rollout_is_batch_normalize=corr.get("rollout_is_batch_normalize", False),
                            rollout_rs=modes, rollout_rs_threshold=[float(s.rpartition("_")[2]) for s in specs],
                            rollout_rs_threshold_lower=[float(s.rpartition("_")[0]) for s in specs if "_" in s])
    results = []
    for side in ("verl", "explorl"):
        new = new0.detach().clone().requires_grad_(True)
        if side == "verl":
            rollout_log_prob = torch.where(mask.bool(), rollout, torch.zeros_like(rollout))
            loss, _ = compute_policy_loss_bypass_mode(rollout_log_prob, new, adv, mask, loss_agg_mode=agg,
                                                      config=config)
        else:
            loss, _ = bypass_loss(new, rollout, adv, mask, eps_low=0.2, eps_high=0.28, options=options,
                                  reduction=Reduction(agg))
        loss.backward()
        results.append((loss.detach(), new.grad.clone()))
    # verl divides by a count + 1e-8 (its batch mean; seq-mean-token-mean's token means): relative 1e-8 / count
    # (a one-token response's mean is off by 1e-8 of itself: measured up to 7e-9 on the loss, hence 1e-7)
    atol = 1e-7 if options.rollout_is_batch_normalize or agg != "token-mean" else 1e-12
    assert torch.allclose(results[0][0], results[1][0], rtol=0, atol=atol), (results[0][0] - results[1][0])
    assert torch.allclose(results[0][1], results[1][1], rtol=0, atol=atol)
