"""Rollout correction (docs/methods.md §6d): the importance weights `rollout_is`, the rejection sampling `rollout_rs`
and the off-policy sequence mask `off_policy_mask`, by hand, through the step, and their option errors. Equality with
verl 0.9.1's functions: tests/integrations/test_verl_rollout_correction.py."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

import explorl.algos  # noqa: F401  (registers the methods)
from explorl.algos import RolloutBatch, compute_advantages, requirements
from explorl.algos.methods.rollout_correction import (OffPolicyMaskOptions, RolloutIsOptions, off_policy_mask,
                                                      rollout_is_weights, rollout_log_ratio)
from explorl.algos.methods.rollout_rejection import RolloutRsOptions, rejection_keep
from explorl.config import AlgoConfig, ConfigError, load_config

# two responses: ratios r = pi_old / mu of row 0: 3, 0.5 (then padding), of row 1: 1.5, 4, 0.5
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]], dtype=torch.float64)
R = torch.tensor([[3.0, 0.5, 7.0], [1.5, 4.0, 0.5]], dtype=torch.float64)  # 7.0 on padding must not matter
LR = torch.log(R)


def _eq(t: torch.Tensor, want, atol: float = 1e-12) -> None:
    assert torch.allclose(t.double(), torch.tensor(want, dtype=torch.float64), atol=atol), t


def _w(**kw):
    return rollout_is_weights(LR, MASK, **kw)


def test_log_ratio_is_old_minus_behaviour_zero_on_padding():
    old, beh = torch.log(torch.tensor([[0.6, 0.2]])), torch.log(torch.tensor([[0.2, 0.4]]))
    got = rollout_log_ratio(old, beh, torch.tensor([[1.0, 0.0]]))
    _eq(got, [[math.log(3.0), 0.0]], 1e-6)


@pytest.mark.parametrize("kw, want, outside", [
    # token, truncate at 2 (verl's TIS): min(r, 2); outside = ratios above 2 (3 and 4)
    (dict(level="token", mode="truncate", upper=2.0), [[2, 0.5, 0], [1.5, 2, 0.5]], [[1, 0, 0], [0, 1, 0]]),
    # TRL's token_truncate with clip_min 0.6: clamp(r, 0.6, 2): 0.5 -> 0.6 (twice)
    (dict(level="token", mode="truncate", upper=2.0, lower=0.6), [[2, 0.6, 0], [1.5, 2, 0.6]],
     [[1, 1, 0], [0, 1, 1]]),
    # token, mask in [0.4, 2] (IcePop): r outside -> 0
    (dict(level="token", mode="mask", upper=2.0, lower=0.4), [[0, 0.5, 0], [1.5, 0, 0.5]], [[1, 0, 0], [0, 1, 0]]),
    # TRL's token_mask with clip_max None, clip_min 0.6: only r < 0.6 is masked
    (dict(level="token", mode="mask", upper=None, lower=0.6), [[3, 0, 0], [1.5, 4, 0]], [[0, 1, 0], [0, 0, 1]]),
    # sequence: row 0's product 3 * 0.5 = 1.5, row 1's 1.5 * 4 * 0.5 = 3 -> truncated to 2, on every valid token
    (dict(level="sequence", mode="truncate", upper=2.0), [[1.5, 1.5, 0], [2, 2, 2]], [[0, 0, 0], [1, 1, 1]]),
    # sequence mask in [0.4, 2]: row 1 (3) is masked whole
    (dict(level="sequence", mode="mask", upper=2.0, lower=0.4), [[1.5, 1.5, 0], [0, 0, 0]], [[0, 0, 0], [1, 1, 1]]),
])
def test_importance_weights_by_hand(kw, want, outside):
    w, out = _w(**kw)
    _eq(w, want)
    assert out.tolist() == [[bool(v) for v in row] for row in outside]


def test_batch_normalisation_by_hand():
    # token: truncated weights 2, 0.5, 1.5, 2, 0.5 on the 5 valid tokens, mean 6.5 / 5 = 1.3
    w, _ = _w(level="token", upper=2.0, batch_normalize=True)
    _eq(w, [[2 / 1.3, 0.5 / 1.3, 0], [1.5 / 1.3, 2 / 1.3, 0.5 / 1.3]])
    # sequence: one weight per response, 1.5 and 2, mean 1.75 (not the token mean (2 * 1.5 + 3 * 2) / 5 = 1.8)
    w, _ = _w(level="sequence", upper=2.0, batch_normalize=True)
    _eq(w, [[1.5 / 1.75, 1.5 / 1.75, 0], [2 / 1.75, 2 / 1.75, 2 / 1.75]])
    # every weight masked: the mean 0 is not divided by
    w, _ = _w(level="sequence", mode="mask", upper=1.1, lower=1.0, batch_normalize=True)
    assert torch.equal(w, torch.zeros_like(w))


def test_sequence_weight_of_a_long_response_cannot_overflow():
    # 100 tokens of ratio e each: log 100 is clamped to 20 before exp, then truncated
    lr = torch.ones(1, 100, dtype=torch.float64)
    w, out = rollout_is_weights(lr, torch.ones(1, 100), level="sequence", mode="mask", upper=None, lower=0.5)
    assert w[0, 0] == pytest.approx(math.exp(20.0)) and not out.any()
    lr16 = torch.full((1, 300), 0.5, dtype=torch.bfloat16)  # summed in float32, not bfloat16
    w16, _ = rollout_is_weights(lr16, torch.ones(1, 300), level="sequence", upper=1e30)
    assert w16.dtype == torch.bfloat16 and torch.isfinite(w16).all()


def test_importance_weights_refuse_bad_arguments():
    with pytest.raises(ValueError, match="unknown level"):
        _w(level="seq")
    with pytest.raises(ValueError, match="unknown mode"):
        _w(mode="clip")
    with pytest.raises(ValueError, match="give threshold"):
        _w(upper=None, lower=None)
    with pytest.raises(ValueError, match="threshold_lower 3.0 > threshold 2.0"):
        _w(upper=2.0, lower=3.0)
    with pytest.raises(ValueError, match="like mask"):
        rollout_is_weights(LR[:, :2], MASK)


# rejection sampling. k1 = -log r: row 0: -log 3, log 2; row 1: -log 1.5, -log 4, log 2.
# k2 = (log r)^2 / 2: row 0: 0.6035, 0.2402; row 1: 0.0822, 0.9609, 0.2402.
# k3 = r - 1 - log r: row 0: 0.9014, 0.1931 (sum 1.0945); row 1: 0.0945, 1.6137, 0.1931 (sum 1.9013).
@pytest.mark.parametrize("modes, upper, lower, want", [
    # token_k1 with threshold 2 (lower 1/2): keep 0.5 <= 1/r <= 2: 1/3 and 1/4 rejected
    (["token_k1"], [2.0], [], [[0, 1, 0], [1, 0, 1]]),
    # an explicit lower 0.2 lets 1/4 through, 1/3 too
    (["token_k1"], [2.0], [0.2], [[1, 1, 0], [1, 1, 1]]),
    # token_k2 <= 0.5: 0.6035 and 0.9609 rejected
    (["token_k2"], [0.5], [], [[0, 1, 0], [1, 0, 1]]),
    # geometric (seq_mean_k1) in [1/1.3, 1.3]: mu/pi_old's geometric mean 1.5^-1/2 = 0.8165 (kept), 3^-1/3 = 0.6934
    (["seq_mean_k1"], [1.3], [], [[1, 1, 0], [0, 0, 0]]),
    # seq_sum_k3 <= 1.5: 1.0945 kept, 1.9013 rejected
    (["seq_sum_k3"], [1.5], [], [[1, 1, 0], [0, 0, 0]]),
    # seq_max_k2 <= 0.7: 0.6035 kept, 0.9609 rejected
    (["seq_max_k2"], [0.7], [], [[1, 1, 0], [0, 0, 0]]),
    # seq_mean_k3 <= 0.6: 0.5473 kept, 0.6338 rejected
    (["seq_mean_k3"], [0.6], [], [[1, 1, 0], [0, 0, 0]]),
    # two criteria: a token is kept when both keep it
    (["token_k1", "seq_sum_k3"], [2.0, 1.5], [], [[0, 1, 0], [0, 0, 0]]),
])
def test_rejection_by_hand(modes, upper, lower, want):
    keep = rejection_keep(LR, MASK, modes, upper, lower)
    assert keep.tolist() == [[bool(v) for v in row] for row in want]


def test_rejection_refuses_what_does_not_fit():
    for args in ([["token_k9"], [1.0], []], [["token_k1", "token_k1"], [2.0], []], [[], [2.0], []],
                 [["token_k2", "token_k3"], [1.0, 2.0, 3.0], []], [["token_k2"], [1.0], [0.5]],
                 [["token_k1"], [2.0], [3.0]], [["token_k3"], [-1.0], []]):
        with pytest.raises(ValueError, match="rollout_rs"):
            rejection_keep(LR, MASK, *args)


def test_off_policy_mask_by_hand():
    # kl_i = mean (log mu - log pi_old): rows 0 and 1: log 2 = 0.693 > 0.5; row 2: log 1.25 = 0.223 <= 0.5
    old = torch.log(torch.tensor([[0.5, 0.5], [0.5, 0.5], [0.8, 0.8]]))
    beh = torch.log(torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 0.3]]))
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    adv = torch.tensor([[-1.0, -1.0], [1.0, 1.0], [-1.0, -1.0]])
    keep = off_policy_mask(adv, old, beh, mask, 0.5)
    # row 0: negative and far off-policy -> dropped; row 1: positive -> kept; row 2: near -> kept
    assert keep.tolist() == [[False, False], [True, True], [True, True]]
    # a zero advantage counts as non-negative, as TRL's `advantages >= 0`
    assert off_policy_mask(torch.zeros(3, 2), old, beh, mask, 0.5).all()


def _batch() -> RolloutBatch:
    return RolloutBatch(mask=MASK.float(), rewards=torch.tensor([1.0, 0.0]), group=torch.tensor([0, 0]),
                        logprobs=LR.float(), behavior_logprobs=torch.zeros(2, 3))


def test_through_the_step_they_compose():
    # rejection (token_k1, threshold 2) removes tokens (0, 0) and (1, 1) from the loss mask before the estimator;
    # GRPO then gives row 0 +0.7071 and row 1 -0.7071 on the tokens left; the importance weights (token, truncate
    # at 2) are computed on that mask; the off-policy mask (delta 0.1) drops row 1, whose mean log(mu / pi_old)
    # over its kept tokens is -(log 1.5 + log 0.5) / 2 = 0.1438 > 0.1, with a negative advantage.
    cfg = replace(AlgoConfig(), importance_weights="rollout_is", reward_shapers=["rollout_rs"],
                  shapers=["off_policy_mask"],
                  options={"rollout_is": RolloutIsOptions(level="token"),
                           "rollout_rs": RolloutRsOptions(modes=["token_k1"], threshold=[2.0]),
                           "off_policy_mask": OffPolicyMaskOptions(threshold=0.1)})
    out = compute_advantages(_batch(), cfg, step=1)
    assert out.loss_mask.tolist() == [[0, 1, 0], [1, 0, 1]]
    assert out.base_advantages[0, 1] == pytest.approx(1 / math.sqrt(2), abs=1e-4)
    _eq(out.advantages, [[0, out.base_advantages[0, 1].item(), 0], [0, 0, 0]], 1e-6)
    _eq(out.is_weights, [[0, 0.5, 0], [1.5, 0, 0.5]], 1e-6)
    assert out.stats["tokens/masked_frac"] == pytest.approx(2 / 5)
    assert out.stats["is/weight_mean"] == pytest.approx(2.5 / 3) and out.stats["is/outside_frac"] == 0.0
    need = requirements(cfg)
    assert need.behavior and need.old_logprobs


def test_options_are_checked_at_validation():
    ok = load_config(None, ["algo.importance_weights=rollout_is", "algo.rollout_is.mode=mask",
                            "algo.rollout_is.threshold_lower=0.5", "algo.reward_shapers=[rollout_rs]",
                            "algo.rollout_rs.modes=token_k1,seq_max_k3", "algo.rollout_rs.threshold=[2.0,0.1]"])
    assert ok.algo.options["rollout_rs"].modes == ["token_k1", "seq_max_k3"]
    assert ok.algo.options["rollout_is"] == RolloutIsOptions(mode="mask", threshold_lower=0.5)
    for overrides, match in (
            (["algo.rollout_is.threshold=null"], "bounds nothing"),
            (["algo.rollout_is.threshold=-1"], "algo.rollout_is.threshold: must be > 0"),
            (["algo.rollout_is.threshold_lower=3"], "threshold_lower: 3.0 is above"),
            (["algo.rollout_is.threshold=0.9"], r"leave out the ratio 1"),
            (["algo.rollout_is.threshold_lower=1.1"], r"leave out the ratio 1"),
            (["algo.rollout_is.level=seq"], "not a valid choice")):
        with pytest.raises(ConfigError, match=match):
            load_config(None, ["algo.importance_weights=rollout_is", *overrides])
    for overrides, match in (
            (["algo.rollout_rs.modes=token_k2", "algo.rollout_rs.threshold=[1,2]"], "need 1 or 1 thresholds"),
            (["algo.rollout_rs.modes=token_k2", "algo.rollout_rs.threshold_lower=[0.5]"], "0, 1 or 0 lower"),
            (["algo.rollout_rs.modes=seq_max_k1"], "not a valid choice"),
            (["algo.rollout_rs.modes=token_k1", "algo.rollout_rs.threshold_lower=[1.2]",
              "algo.rollout_rs.threshold=[2]"], "bounds of token_k1 leave out 1")):
        with pytest.raises(ConfigError, match=match):
            load_config(None, ["algo.reward_shapers=[rollout_rs]", *overrides])
    with pytest.raises(ConfigError, match="algo.off_policy_mask.threshold: must be >= 0"):
        load_config(None, ["algo.shapers=[off_policy_mask]", "algo.off_policy_mask.threshold=-1"])


# verl's bypass mode (`algo.loss=bypass_mode`): pi_old is the rollout's log-probs; equality with verl's
# `compute_policy_loss_bypass_mode`: tests/integrations/test_verl_rollout_correction.py
def test_bypass_reinforce_with_token_weights_by_hand():
    from explorl.algos.methods.bypass import BypassOptions, bypass_loss

    # pi_theta = 0.5, 0.25 on the two tokens, mu = 0.25, 0.25: ratios 2, 1; token weights truncated at 1.5: 1.5, 1.
    # token-mean of -w * A * log pi_theta with A = 1: (1.5 * log 2 + log 4) / 2 = 1.2130; gradient -w * A / 2
    new = torch.log(torch.tensor([[0.5, 0.25]], dtype=torch.float64)).requires_grad_(True)
    roll = torch.log(torch.tensor([[0.25, 0.25]], dtype=torch.float64))
    loss, stats = bypass_loss(new, roll, torch.ones(1, 2, dtype=torch.float64), torch.ones(1, 2),
                              options=BypassOptions(loss_type="reinforce", rollout_is="token",
                                                    rollout_is_threshold=1.5))
    loss.backward()
    assert float(loss.detach()) == pytest.approx((1.5 * math.log(2) + math.log(4)) / 2, abs=1e-12)
    _eq(new.grad, [[-0.75, -0.5]])
    assert stats["is/weight_mean"] == pytest.approx(1.25) and stats["is/outside_frac"] == pytest.approx(0.5)


def test_bypass_ppo_clip_with_rejection_by_hand():
    from explorl.algos.methods.bypass import BypassOptions, bypass_loss

    # token_k1 with threshold 1.5 keeps mu / pi_theta in [2/3, 1.5]: token 0 (1/2) is rejected, token 1 (1) kept;
    # PPO-clip on token 1 alone: -A * ratio = -1, gradient -1 there, 0 on the rejected token
    new = torch.log(torch.tensor([[0.5, 0.25]], dtype=torch.float64)).requires_grad_(True)
    roll = torch.log(torch.tensor([[0.25, 0.25]], dtype=torch.float64))
    loss, stats = bypass_loss(new, roll, torch.ones(1, 2, dtype=torch.float64), torch.ones(1, 2),
                              options=BypassOptions(rollout_rs=["token_k1"], rollout_rs_threshold=[1.5]))
    loss.backward()
    assert float(loss.detach()) == pytest.approx(-1.0) and stats["is/rejected_frac"] == 0.5
    _eq(new.grad, [[0.0, -1.0]])
    with pytest.raises(ValueError, match="unknown loss_type"):
        bypass_loss(new, roll, torch.ones(1, 2), torch.ones(1, 2), options=BypassOptions(loss_type="dpo"))


def test_bypass_takes_pi_old_from_the_rollout_without_a_forward():
    from explorl.train.update import fill_logprobs

    cfg = load_config(None, ["algo.loss=bypass_mode"])
    beh = torch.log(torch.tensor([[0.5, 0.25]]))
    ro = RolloutBatch(mask=torch.ones(1, 2), rewards=torch.ones(1), group=torch.zeros(1, dtype=torch.long),
                      max_response_len=2, prompt_ids=torch.ones(1, 2, dtype=torch.long),
                      prompt_mask=torch.ones(1, 2, dtype=torch.long), response_ids=torch.ones(1, 2, dtype=torch.long),
                      behavior_logprobs=beh, behavior_entropy=torch.zeros(1, 2), temperatures=torch.ones(1, 2))
    batch = fill_logprobs(None, None, ro, 1.0, cfg, False)  # no model: no forward may run
    assert batch.logprobs is beh and requirements(cfg.algo).behavior
    # pi_old is the rollout: no mismatch of the rollout with itself is logged before the update
    assert not any(k.startswith("mismatch/") for k in compute_advantages(batch, cfg.algo, step=1).stats)
    for overrides, match in ((["algo.importance_weights=rollout_is"], "would compare them with themselves"),
                             (["algo.reward_shapers=[rollout_rs]"], r"algo.reward_shapers=\[rollout_rs\]"),
                             (["algo.bypass_mode.rollout_rs=token_k2"], "need 1 or 1 thresholds"),
                             (["algo.bypass_mode.loss_type=dpo"], "not a valid choice")):
        with pytest.raises(ConfigError, match=match):
            load_config(None, ["algo.loss=bypass_mode", *overrides])


@pytest.mark.parametrize("extra", [
    ["algo.importance_weights=rollout_is", "algo.reward_shapers=[rollout_rs]", "algo.shapers=[off_policy_mask]",
     "algo.rollout_rs.modes=token_k1", "algo.rollout_rs.threshold=[1.5]", "algo.off_policy_mask.threshold=0.01"],
    ["algo.loss=bypass_mode", "algo.bypass_mode.loss_type=reinforce", "algo.bypass_mode.rollout_is=token",
     "algo.bypass_mode.rollout_rs=seq_mean_k1", "algo.bypass_mode.rollout_rs_threshold=[1.5]"],
], ids=["decoupled", "bypass"])
def test_explorls_loop_trains_with_them(tiny_model_dir, tmp_path, extra):
    # EAD's per-token temperatures make the sampled distribution differ from pi_old, so every piece acts
    import json

    from explorl.train.loop import train

    cfg = load_config(None, [
        f"model.path={tiny_model_dir}", f"run.out_dir={tmp_path / 'run'}", "run.steps=2", "run.batch_size=2",
        "sampling.group_size=4", "sampling.max_new_tokens=8", "task.eval_size=2", "task.train_size=16",
        "task.difficulties=[1]", "run.eval_n=1", "run.eval_k=[1]", "run.save_every=0",
        "task.reward=rewards_for_tests:contains_digit", "sampling.schedule=ead", "sampling.ead.c=1",
        "sampling.ead.d0=2", "sampling.ead.tau_min=0.5", *extra])
    run = train(cfg, progress=False)
    steps = [r for r in (json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()) if "step" in r
             and "loss/pg" in r]
    assert len(steps) == 2 and all(math.isfinite(r["loss/pg"]) for r in steps)
    assert all("is/weight_mean" in r for r in steps)
