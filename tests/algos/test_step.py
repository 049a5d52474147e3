"""The algorithm step (`explorl.algos.step`): RolloutBatch validation, compute_advantages and policy_objective on
hand-derived batches, and what the registry says a configured method needs."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from explorl.algos import MissingInputError, RolloutBatch, compute_advantages, policy_objective, requirements
from explorl.algos.advantages import PositionOptions
from explorl.algos.losses import ForkingOptions, OverlongOptions, PpoOptions, TisOptions
from explorl.algos.step import single_update_shortcut
from explorl.config import AlgoConfig, ConfigError, load_config
from explorl.train.loop import on_policy_single_update

RECIPES = sorted((Path(__file__).resolve().parents[2] / "configs" / "recipes").glob("*.yaml"))


def _batch(**changes) -> RolloutBatch:
    # two groups of two; response 3 ran into the limit of 3 tokens
    fields = dict(mask=torch.tensor([[1.0, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 1]]),
                  rewards=torch.tensor([1.0, 0.0, 1.0, 0.0]), group=torch.tensor([0, 0, 5, 5]),
                  max_response_len=3, truncated=torch.tensor([False, False, False, True]))
    fields.update(changes)
    return RolloutBatch(**fields)


def test_rollout_batch_validates_shapes_and_fills_defaults():
    b = _batch()
    assert b.lengths.tolist() == [2, 1, 3, 3]
    assert RolloutBatch(mask=torch.ones(2, 3), rewards=torch.zeros(2), group=torch.zeros(2, dtype=torch.long)
                        ).truncated.tolist() == [False, False]
    with pytest.raises(ValueError, match=r"RolloutBatch.rewards: expected shape \[N\] = \(4,\), got \(3,\)"):
        _batch(rewards=torch.zeros(3))
    with pytest.raises(ValueError, match=r"RolloutBatch.entropy: expected shape \[N, T\] = \(4, 3\)"):
        _batch(entropy=torch.zeros(4, 2))
    with pytest.raises(ValueError, match="RolloutBatch.group: expected integer"):
        _batch(group=torch.zeros(4))
    with pytest.raises(ValueError, match="RolloutBatch.mask"):
        _batch(mask=torch.ones(4))


def test_select_cuts_rows_and_token_columns():
    b = _batch(entropy=torch.arange(12.0).reshape(4, 3))
    micro = b.select(torch.tensor([2, 0]), width=2)
    assert micro.mask.tolist() == [[1.0, 1.0], [1.0, 1.0]]
    assert micro.entropy.tolist() == [[6.0, 7.0], [0.0, 1.0]]
    assert micro.rewards.tolist() == [1.0, 1.0] and micro.lengths.tolist() == [3, 2]
    assert micro.max_response_len == 3


def test_compute_advantages_grpo_by_hand():
    # group 0: r = (1, 0), mean 0.5, unbiased std sqrt(0.5) = 0.70711: A = +-0.5 / (0.70711 + 1e-6) = +-0.70711;
    # group 5 the same. Broadcast over each response's valid tokens, 0 on padding.
    out = compute_advantages(_batch(), AlgoConfig(), step=1)
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    want = torch.tensor([[a, a, 0], [-a, 0, 0], [a, a, a], [-a, -a, -a]])
    assert torch.allclose(out.advantages, want, atol=1e-6)
    assert torch.equal(out.loss_mask, _batch().mask) and out.token_weights is None and out.is_weights is None
    assert out.stats == {"tokens/masked_frac": 0.0, "tokens/downweighted_frac": 0.0}


def test_overlong_mask_removes_the_truncated_response_from_the_loss():
    out = compute_advantages(_batch(), replace(AlgoConfig(), reward_shapers=["dapo_overlong_filter"]), step=1)
    assert out.loss_mask[3].tolist() == [0.0, 0.0, 0.0] and out.advantages[3].tolist() == [0.0, 0.0, 0.0]
    assert out.stats["tokens/masked_frac"] == pytest.approx(3 / 9)  # 3 of the batch's 9 response tokens


def test_overlong_penalty_shapes_the_reward_before_the_estimator():
    # DAPO eq. 13 with limit 3, buffer 1: length 3 is at the limit -> -1 * (3 - 2) / 1 = -1; response 3 is also
    # flagged truncated (-1). Group 5's rewards become (1 - 1, 0 - 1) = (0, -1): still a spread of 1.
    cfg = replace(AlgoConfig(), reward_shapers=["dapo_overlong"],
                  options={"dapo_overlong": OverlongOptions(buffer=1, penalty=1.0)})
    out = compute_advantages(_batch(), cfg, step=1)
    assert out.shaped_rewards.tolist() == [1.0, 0.0, 0.0, -1.0]
    assert out.advantages[2, 0].item() == pytest.approx(0.5 / (math.sqrt(0.5) + 1e-6), abs=1e-6)


def test_reward_shapers_run_in_order_each_on_what_the_previous_returned():
    # the penalty as above (rewards 1, 0, 0, -1), then the filter drops the truncated response 3 from the loss (its
    # reward still counts in its group's statistics, as DAPO's filtering masks the loss only): group 5's rewards
    # (0, -1) give response 2 the advantage +a on its 3 tokens and response 3 none; group 0 is untouched
    cfg = replace(AlgoConfig(), reward_shapers=["dapo_overlong", "dapo_overlong_filter"],
                  options={"dapo_overlong": OverlongOptions(buffer=1, penalty=1.0)})
    out = compute_advantages(_batch(), cfg, step=1)
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert out.shaped_rewards.tolist() == [1.0, 0.0, 0.0, -1.0] and out.loss_mask[3].tolist() == [0.0, 0.0, 0.0]
    assert out.advantages[2:].flatten().tolist() == pytest.approx([a, a, a, 0.0, 0.0, 0.0], abs=1e-6)
    assert out.advantages[0, 0].item() == pytest.approx(a, abs=1e-6)
    with pytest.raises(ValueError, match="dapo_overlong .*max_response_len"):
        compute_advantages(_batch(max_response_len=None), cfg, step=1)


def test_shapers_run_in_order_and_missing_inputs_are_named():
    cfg = replace(AlgoConfig(), shapers=["cw"])
    with pytest.raises(MissingInputError, match=r"shaper 'cw' needs RolloutBatch fields \['logprobs'\]"):
        compute_advantages(_batch(), cfg, step=1)
    with pytest.raises(MissingInputError, match="ref_logprobs.*frozen reference"):
        compute_advantages(_batch(entropy=torch.ones(4, 3), logprobs=-torch.ones(4, 3)),
                           replace(AlgoConfig(), advantage="erpo"), step=1)
    # entropy_adv (A + min(alpha H, |A| / kappa)) then position outside its window (identity): the base stays GRPO
    h = torch.full((4, 3), 0.5)
    cfg = replace(AlgoConfig(), shapers=["entropy_adv", "position"], options={"position": PositionOptions(start=10,
                                                                                                   steps=5)})
    out = compute_advantages(_batch(entropy=h), cfg, step=1)
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert out.base_advantages[0, 0].item() == pytest.approx(a, abs=1e-6)
    assert out.advantages[0, 0].item() == pytest.approx(a + min(0.4 * 0.5, a / 2), abs=1e-6)  # a + 0.2
    assert out.advantages[1, 0].item() == pytest.approx(-a + 0.2, abs=1e-6)


def test_tis_weights_and_forking_filter():
    lp = torch.log(torch.full((4, 3), 0.5))
    behavior = torch.log(torch.tensor([[0.1, 0.5, 0.5], [0.5, 0.5, 0.5], [1.0, 0.5, 0.5], [0.5, 0.5, 0.5]]))
    entropy = torch.tensor([[0.1, 0.9, 0.0], [0.2, 0, 0], [0.3, 0.4, 0.5], [0.6, 0.7, 0.8]])
    cfg = replace(AlgoConfig(), importance_weights="tis", token_filter="forking",
                  options={"forking": ForkingOptions(top_frac=0.25), "tis": TisOptions(cap=2.0)})
    out = compute_advantages(_batch(logprobs=lp, behavior_logprobs=behavior, entropy=entropy), cfg, step=1)
    # w = min(0.5 / mu, 2): 0.5 / 0.1 = 5 -> 2; 0.5 / 1.0 = 0.5; 1 elsewhere on valid tokens
    assert out.is_weights[0].tolist() == pytest.approx([2.0, 1.0, 0.0])
    assert out.is_weights[2, 0].item() == pytest.approx(0.5)
    # 9 valid tokens, k = int(9 * 0.25) = 2: the entropies 0.9 and 0.8 are kept
    assert out.token_weights.nonzero().tolist() == [[0, 1], [3, 2]]
    assert out.stats["tokens/masked_frac"] == pytest.approx(7 / 9)
    assert {"is/weight_mean", "is/truncated_frac"} <= set(out.stats)


def test_policy_objective_by_hand():
    # On policy (ratio 1), token-mean: the PPO term is -sum(A) / 9 over the 9 valid tokens; with A = +-a per group
    # the valid tokens carry +a x 5 and -a x 4, so it is -a / 9. The reference equals the policy: KL 0. The entropy
    # bonus subtracts 0.01 * mean(H) = 0.01 * 0.5.
    lp = torch.log(torch.full((4, 3), 0.25))
    batch = _batch(logprobs=lp, ref_logprobs=lp)
    cfg = replace(AlgoConfig(), kl_coef=0.1, entropy_coef=0.01)
    prepared = compute_advantages(batch, cfg, step=1)
    new = lp.clone().requires_grad_(True)
    loss, stats = policy_objective(new, torch.full((4, 3), 0.5), prepared, cfg)
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert loss.item() == pytest.approx(-a / 9 - 0.01 * 0.5, abs=1e-6)
    assert stats["kl/mean"] == 0.0 and stats["loss/entropy"] == pytest.approx(0.5)
    loss.backward()
    assert torch.all(new.grad[batch.mask == 0] == 0)
    with pytest.raises(ValueError, match="entropies"):
        policy_objective(new, None, prepared, cfg)


def test_policy_objective_per_micro_batch_sums_to_the_whole():
    """Micro-batches weighted by `micro_batch_share` give the whole batch's loss (token-mean and seq-mean)."""
    from explorl.algos.losses import micro_batch_share

    g = torch.Generator().manual_seed(0)
    lp = -torch.rand(4, 3, generator=g)
    batch = _batch(logprobs=lp)
    for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        cfg = replace(AlgoConfig(), loss_agg=agg)
        prepared = compute_advantages(batch, cfg, step=1)
        new = lp + 0.1 * torch.rand(4, 3, generator=g)
        whole, _ = policy_objective(new, None, prepared, cfg)
        parts = 0.0
        for rows in (torch.tensor([0, 3]), torch.tensor([1, 2])):
            width = int(batch.mask[rows].sum(-1).max())
            part, _ = policy_objective(new[rows, :width], None, prepared.select(rows, width), cfg)
            parts += float(part) * micro_batch_share(batch.mask, rows, agg)
        assert parts == pytest.approx(float(whole), abs=1e-6), agg


def test_requirements_come_from_the_registry():
    assert requirements(AlgoConfig()) == requirements(replace(AlgoConfig(), shapers=["position"]))
    base = requirements(AlgoConfig())
    assert not (base.ref or base.old_logprobs or base.behavior or base.update_entropy)
    assert requirements(replace(AlgoConfig(), advantage="erpo")).ref
    assert requirements(replace(AlgoConfig(), kl_coef=0.01)).ref
    tis = requirements(replace(AlgoConfig(), importance_weights="tis"))
    assert tis.old_logprobs and tis.behavior
    assert requirements(replace(AlgoConfig(), shapers=["ppl"])).old_logprobs
    assert requirements(replace(AlgoConfig(), entropy_coef=1e-4)).update_entropy


def load_reselected(recipe, extra: list[str]):
    """`load_config(recipe, extra)`, where an override that selects another method drops the options the recipe
    gave the method it replaced (`<section>.<name>=null`), as a user does."""
    import re

    for _ in range(5):
        try:
            return load_config(recipe, extra)
        except ConfigError as e:
            stray = re.match(r"^(\w+\.\w+): options of .* which is not selected", str(e))
            if stray is None:
                raise
            extra = [*extra, f"{stray.group(1)}=null"]
    raise AssertionError(f"{recipe}: options kept refusing {extra}")


def _rule_before_issue_17(cfg) -> bool:
    """`trainer.on_policy_single_update` as it was written before the registry (method names in the trainer)."""
    a, s = cfg.algo, cfg.sampling
    return (a.epochs == 1 and a.mini_batches == 1 and s.schedule in ("fixed", "e3") and a.importance_weights == "none"
            and a.advantage in ("grpo", "dr_grpo", "passk") and set(a.shapers) <= {"entropy_adv", "position"})


# estimators added after that rule (issue 52): they read rewards only, so the shortcut holds for them where it held
# for GRPO; the rule, which named its estimators, cannot speak for them
LATER_ESTIMATORS = {"rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "opo", "gpg", "gdpo",
                    "grpo_passk",
                    # issue 53: they read rewards (RL-ZVP also the batch's token entropy, as the entropy_adv shaper)
                    "psr", "nsr", "w_reinforce", "qae", "rl_zvp", "maxrl",
                    "remax"}  # reads rewards and the greedy baseline


# shapers added after that rule that read no log-probs (the shortcut holds for them as for GRPO alone): outcome-based
# exploration reads the answers and their counts
LATER_SHAPERS = {"outcome_bonus"}


@pytest.mark.parametrize("recipe", [r for r in RECIPES if r.stem not in LATER_ESTIMATORS | LATER_SHAPERS],
                         ids=lambda p: p.stem)
@pytest.mark.parametrize("extra", [[], ["algo.epochs=2"], ["algo.shapers=[entropy_adv,position]"],
                                   ["sampling.schedule=ead"], ["algo.token_filter=forking", "algo.loss=kl_cov"]])
def test_the_single_update_shortcut_is_the_rule_it_replaced(recipe, extra):
    cfg = load_reselected(recipe, extra)
    assert on_policy_single_update(cfg) == _rule_before_issue_17(cfg)
    assert single_update_shortcut(cfg.algo, True) == (cfg.algo.epochs == 1 and cfg.algo.mini_batches == 1
                                                      and not requirements(cfg.algo).old_logprobs)


@pytest.mark.parametrize("shaper", sorted(LATER_SHAPERS))
def test_a_later_shaper_takes_the_shortcut_where_grpo_does(shaper):
    cfg = load_reselected(RECIPES[0].parent.parent / "quickstart.yaml", [f"algo.shapers=[{shaper}]"])
    assert on_policy_single_update(cfg)
    assert not on_policy_single_update(load_reselected(RECIPES[0].parent.parent / "quickstart.yaml",
                                                       [f"algo.shapers=[{shaper}]", "algo.epochs=2"]))


@pytest.mark.parametrize("estimator", sorted(LATER_ESTIMATORS))
def test_a_later_estimator_takes_the_shortcut_where_grpo_does(estimator):
    # quickstart with GRPO swapped for the estimator (and GPG's own loss, which its layer sets, left out): one update
    # per batch, no old log-probs read, so the old-policy pass is skipped exactly as it is for GRPO
    grpo = load_reselected(RECIPES[0].parent.parent / "quickstart.yaml", [])
    cfg = load_reselected(RECIPES[0].parent.parent / "quickstart.yaml", [f"algo.advantage={estimator}"])
    assert on_policy_single_update(grpo) and on_policy_single_update(cfg)
    assert not on_policy_single_update(load_reselected(RECIPES[0].parent.parent / "quickstart.yaml",
                                                       [f"algo.advantage={estimator}", "algo.epochs=2"]))


# ----------------------------------------------------------------------------------------------------------------
# the engines' conventions as options (docs/methods.md §6, §9): the step passes algo.tis.level, algo.ppo.dual_clip_c
# and algo.kl_clamp on; the formulas themselves are tested in test_conventions.py


def test_sequence_level_tis_through_the_step():
    # pi_old = 0.5 on every token; mu as below. Sequence ratios over the valid tokens of each response:
    # row 0: (0.5 / 0.1) * (0.5 / 0.5) = 5 -> cap 2 on its 2 tokens; row 1: 1; row 2: (0.5 / 1.0) * 1 * 1 = 0.5 on
    # its 3 tokens; row 3: 1. Padding 0.
    lp = torch.log(torch.full((4, 3), 0.5))
    behavior = torch.log(torch.tensor([[0.1, 0.5, 0.5], [0.5, 0.5, 0.5], [1.0, 0.5, 0.5], [0.5, 0.5, 0.5]]))
    cfg = replace(AlgoConfig(), importance_weights="tis", options={"tis": TisOptions(cap=2.0, level="sequence")})
    out = compute_advantages(_batch(logprobs=lp, behavior_logprobs=behavior), cfg, step=1)
    want = torch.tensor([[2.0, 2.0, 0.0], [1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [1.0, 1.0, 1.0]])
    assert torch.allclose(out.is_weights, want, atol=1e-6)
    # is/* describe these weights: (2 * 2 + 1 + 3 * 0.5 + 3 * 1) / 9 valid tokens = 9.5 / 9; 2 of 9 truncated
    assert out.stats["is/weight_mean"] == pytest.approx(9.5 / 9, abs=1e-6)
    assert out.stats["is/truncated_frac"] == pytest.approx(2 / 9)
    token = compute_advantages(_batch(logprobs=lp, behavior_logprobs=behavior),
                               replace(cfg, options={"tis": TisOptions(cap=2.0, level="token")}), 1)
    assert token.is_weights[0].tolist() == pytest.approx([2.0, 1.0, 0.0])


def test_dual_clip_and_kl_clamp_through_the_step():
    # pi_old = 0.25 everywhere; the new policy puts ratio 10 on every token. The reference equals the new policy
    # except on row 3, 30 nats below it. policy_objective's KL (d = ref - logp_new): 0 on rows 0-2; d = -30 on row
    # 3: k3 = e^-30 + 29 unclamped, 10 with kl_clamp 10 (d is clamped to -20 first: 19 + e^-20, then to 10).
    lp = torch.log(torch.full((4, 3), 0.25))
    new = lp + math.log(10.0)
    ref = new.clone()
    ref[3] = new[3] - 30.0
    batch = _batch(logprobs=lp, ref_logprobs=ref)
    base = replace(AlgoConfig(), kl_coef=0.1)
    cfg = replace(base, kl_clamp=10.0, options={"ppo": PpoOptions(dual_clip_c=3.0)})
    prepared0, prepared1 = compute_advantages(batch, base, step=1), compute_advantages(batch, cfg, step=1)
    loss0, stats0 = policy_objective(new, None, prepared0, base)
    loss1, stats1 = policy_objective(new, None, prepared1, cfg)
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    # KL, token-mean over the 9 valid tokens, only row 3's 3 tokens count
    assert stats0["kl/mean"] == pytest.approx(3 * (math.exp(-30) + 29) / 9, rel=1e-5)
    assert stats1["kl/mean"] == pytest.approx(3 * 10 / 9, rel=1e-6)
    # compute_advantages' kl/mean is of pi_old (d = ref - lp): ln 10 on the 6 valid tokens of rows 0-2, k3 =
    # 10 - ln 10 - 1 = 6.6974 (below the clamp); ln 10 - 30 on row 3: k3 = e^d + 29 - ln 10 = 26.697 -> 10
    k_top, k_row3 = 10 - math.log(10) - 1, math.exp(math.log(10) - 30) + 29 - math.log(10)
    assert prepared0.stats["kl/mean"] == pytest.approx((6 * k_top + 3 * k_row3) / 9, rel=1e-5)
    assert prepared1.stats["kl/mean"] == pytest.approx((6 * k_top + 3 * 10) / 9, rel=1e-5)
    # PPO (rho = 10): A > 0 tokens (5) clip at 1.2 -> -1.2 a; A < 0 tokens (4) give 10 a; dual clip: 3 a
    assert "loss/dual_clip_frac" not in stats0 and stats1["loss/dual_clip_frac"] == pytest.approx(4 / 9)
    assert float(loss0) == pytest.approx((5 * -1.2 * a + 4 * 10 * a) / 9 + 0.1 * 3 * 29 / 9, rel=1e-5)
    assert float(loss1) == pytest.approx((5 * -1.2 * a + 4 * 3 * a) / 9 + 0.1 * 3 * 10 / 9, rel=1e-5)


def test_importance_weighted_kl_by_hand():
    # pi_old = 0.25 everywhere; the new policy puts log-ratio g on every token (ratio rho = e^g); the reference is
    # d = ref - logp_new = 0.5 above the new policy. Per valid token: k3 = e^d - d - 1, weighted rho * k3. Advantages cancel out of the KL, so compare the KL parts only:
    # loss(kl_coef) - loss(0) = kl_coef * token-mean(rho * k3) = 0.1 * e^g * k3 (every valid token equal).
    g, d = 0.3, 0.5
    lp = torch.log(torch.full((4, 3), 0.25))
    new = (lp + g).requires_grad_(True)
    batch = _batch(logprobs=lp, ref_logprobs=new.detach() + d)
    plain = replace(AlgoConfig(), kl_coef=0.1)
    weighted = replace(plain, kl_importance_weighted=True)
    k3 = math.exp(d) - d - 1
    losses = {}
    for name, cfg in (("none", replace(plain, kl_coef=0.0)), ("plain", plain), ("weighted", weighted)):
        new.grad = None
        loss, stats = policy_objective(new, None, compute_advantages(batch, cfg, step=1), cfg)
        loss.backward()
        losses[name] = (loss.item(), new.grad.clone(), stats)
    assert losses["plain"][0] - losses["none"][0] == pytest.approx(0.1 * k3, rel=1e-6)
    assert losses["weighted"][0] - losses["none"][0] == pytest.approx(0.1 * math.exp(g) * k3, rel=1e-6)
    assert losses["weighted"][2]["kl/mean"] == pytest.approx(math.exp(g) * k3, rel=1e-6)
    # gradient of the KL part per valid token (token-mean over 9): plain d/dlogp k3 = 1 - e^d; weighted
    # d/dlogp (e^(logp - old) * k3) = rho * (k3 + 1 - e^d)
    valid = batch.mask.bool()
    kl_grad = {n: (losses[n][1] - losses["none"][1])[valid] * 9 / 0.1 for n in ("plain", "weighted")}
    assert torch.allclose(kl_grad["plain"], torch.full((9,), 1 - math.exp(d)), atol=1e-5)
    assert torch.allclose(kl_grad["weighted"], torch.full((9,), math.exp(g) * (k3 + 1 - math.exp(d))), atol=1e-5)


def test_importance_weighted_kl_on_policy_is_the_reverse_kl_gradient():
    # On the first update (rho = 1) the weighted token term's derivative is logp - ref (the REINFORCE gradient of
    # KL(pi || ref) per sampled token: d/dlogp [e^(logp - old) k3] at logp = old is k3 + 1 - e^d = -d), where the
    # plain k3's is 1 - e^d; the two agree only to first order in d.
    torch.manual_seed(0)
    lp = torch.log_softmax(torch.randn(4, 3, 5), -1)[..., 0]
    ref = lp + 0.4 * torch.randn(4, 3)
    batch = _batch(logprobs=lp, ref_logprobs=ref)
    cfg = replace(AlgoConfig(), kl_coef=1.0, kl_importance_weighted=True)
    base = replace(cfg, kl_coef=0.0, kl_importance_weighted=False)
    grads = []
    for c in (cfg, base):
        new = lp.clone().requires_grad_(True)
        policy_objective(new, None, compute_advantages(batch, c, step=1), c)[0].backward()
        grads.append(new.grad)
    valid = batch.mask.bool()
    assert torch.allclose(((grads[0] - grads[1]) * 9)[valid], (lp - ref)[valid], atol=1e-5)


def trl_kl_term(per_token_logps, old_per_token_logps, ref_per_token_logps, mask, beta):
    """TRL 1.16's KL term as `GRPOTrainer._compute_loss` builds it (trl/trainer/grpo_trainer.py, token-level
    importance sampling, `use_bias_correction_kl=True`, `loss_type="dapo"`'s sum over the batch's tokens / their
    count), rewritten here from its code: `per_token_kl = exp(ref - logp) - (ref - logp) - 1`, times
    `coef_1 = exp(logp - old)`, then `beta * per_token_kl` in the token loss, masked and token-meaned."""
    coef_1 = torch.exp(per_token_logps - old_per_token_logps)
    per_token_kl = torch.exp(ref_per_token_logps - per_token_logps) - (ref_per_token_logps - per_token_logps) - 1
    return beta * (per_token_kl * coef_1 * mask).sum() / mask.sum().clamp(min=1.0)


def test_importance_weighted_kl_equals_trls():
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        lp = torch.log_softmax(torch.randn(4, 3, 6, generator=g, dtype=torch.float64), -1)[..., 0]
        new = (lp + 0.2 * torch.randn(4, 3, generator=g, dtype=torch.float64)).requires_grad_(True)
        ref = lp + 0.5 * torch.randn(4, 3, generator=g, dtype=torch.float64)
        batch = _batch(logprobs=lp, ref_logprobs=ref)
        kl_only = []
        for cfg in (replace(AlgoConfig(), kl_coef=0.05, kl_importance_weighted=True), AlgoConfig()):
            new.grad = None
            loss = policy_objective(new, None, compute_advantages(batch, cfg, step=1), cfg)[0]
            loss.backward()
            kl_only.append((loss.detach(), new.grad.clone()))
        new.grad = None
        want = trl_kl_term(new, lp, ref, batch.mask.to(torch.float64), 0.05)
        want.backward()
        assert float(kl_only[0][0] - kl_only[1][0]) == pytest.approx(float(want), rel=1e-10)
        assert torch.allclose(kl_only[0][1] - kl_only[1][1], new.grad, atol=1e-12)


def test_new_options_at_their_defaults_change_nothing():
    g = torch.Generator().manual_seed(1)
    lp = -torch.rand(4, 3, generator=g) - 0.5
    behavior = lp + 0.3 * torch.randn(4, 3, generator=g)
    ref = lp + torch.randn(4, 3, generator=g)
    batch = _batch(logprobs=lp, behavior_logprobs=behavior, ref_logprobs=ref)
    cfg = replace(AlgoConfig(), importance_weights="tis", options={"tis": TisOptions(cap=1.5)}, kl_coef=0.05)
    explicit = replace(cfg, kl_clamp=None, options={"ppo": PpoOptions(dual_clip_c=None),
                                                    "tis": TisOptions(cap=1.5, level="token")})
    assert TisOptions().level == "token" and PpoOptions().dual_clip_c is None and AlgoConfig().kl_clamp is None
    p0, p1 = compute_advantages(batch, cfg, step=1), compute_advantages(batch, explicit, step=1)
    assert torch.equal(p0.is_weights, p1.is_weights) and p0.stats == p1.stats
    new = lp + 0.2 * torch.randn(4, 3, generator=g)
    l0, s0 = policy_objective(new, None, p0, cfg)
    l1, s1 = policy_objective(new, None, p1, explicit)
    assert torch.equal(l0, l1) and s0 == s1


# ----------------------------------------------------------------------------------------------------------------
# E3 eq. 1 with a rollout count per question (E3's dynamic budgets): every question weighs the same


def test_per_question_weights_by_hand():
    # questions of 2 and 6 responses with token means m = (1, 3) and (0, 0, 0, 0, 0, 6):
    # eq. 1 = ((1 + 3) / 2 + 6 / 6) / 2 = (2 + 1) / 2 = 1.5; the plain seq-mean-token-mean (1 + 3 + 6) / 8 = 1.25.
    # Weights n / (Q G_q): 8 / (2 * 2) = 2 for the first question, 8 / (2 * 6) = 2/3 for the second.
    from explorl.algos.losses import PER_QUESTION, aggregate, question_weights

    group = torch.tensor([4, 4, 9, 9, 9, 9, 9, 9])
    w = question_weights(group, torch.ones(8, dtype=torch.bool))
    assert w.tolist() == pytest.approx([2, 2] + [2 / 3] * 6)
    means = torch.tensor([1.0, 3, 0, 0, 0, 0, 0, 6])
    mask = torch.tensor([[1.0, 1, 0]] * 8)  # every response 2 tokens long
    values = means[:, None].expand(8, 3) * mask
    assert float(aggregate(values, mask, "seq-mean-token-mean")) == pytest.approx(1.25)
    assert float(aggregate(values * w[:, None].float(), mask, PER_QUESTION)) == pytest.approx(1.5)
    # equal groups: every weight 1 (the plain seq-mean-token-mean); an empty response weighs 0
    assert question_weights(torch.tensor([0, 0, 1, 1]), torch.ones(4, dtype=torch.bool)).tolist() == [1.0] * 4
    assert question_weights(torch.tensor([0, 0, 1]), torch.tensor([True, False, True])).tolist() == [1.0, 0.0, 1.0]


def test_the_step_weighs_every_question_equally_under_the_per_question_aggregation():
    """Through compute_advantages and policy_objective: the loss is eq. 1's mean over questions of the mean over
    their responses of each response's token mean, computed here by plain loops."""
    g = torch.Generator().manual_seed(5)
    lengths = [2, 3, 1, 3, 2, 3, 1, 2]  # 2 responses to question 0, 6 to question 1
    mask = torch.tensor([[1.0] * n + [0.0] * (3 - n) for n in lengths])
    group = torch.tensor([0, 0, 1, 1, 1, 1, 1, 1])
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0])
    old = -torch.rand(8, 3, generator=g) - 0.5
    new = old + 0.05 * torch.randn(8, 3, generator=g)  # ratios within the clip: the loss is -rho * A
    batch = RolloutBatch(mask=mask, rewards=rewards, group=group, max_response_len=3, logprobs=old)
    cfg = replace(AlgoConfig(), loss_agg="seq-mean-token-mean-per-question", shapers=["position"])  # A varies by token
    prepared = compute_advantages(batch, cfg, step=1)
    loss, _ = policy_objective(new, None, prepared, cfg)
    token_loss = -torch.exp(new - old) * prepared.advantages
    per_response = [float(token_loss[i, :lengths[i]].mean()) for i in range(8)]
    q0, q1 = per_response[:2], per_response[2:]
    want = (sum(q0) / 2 + sum(q1) / 6) / 2
    assert float(loss) == pytest.approx(want, rel=1e-5)
    plain_cfg = replace(cfg, loss_agg="seq-mean-token-mean")
    plain, _ = policy_objective(new, None, compute_advantages(batch, plain_cfg, step=1), plain_cfg)
    assert float(plain) == pytest.approx(sum(per_response) / 8, rel=1e-5) and abs(float(plain) - want) > 1e-4


def test_idle_rows_are_the_responses_whose_advantages_are_all_zero():
    """Under GRPO a group whose rewards agree gets advantage 0 on every token: those responses are idle. Group 0
    (rewards 1, 1) agrees, group 5 (1, 0) does not; a response with one non-zero token is not idle."""
    from explorl.algos.step import idle_rows

    batch = _batch(rewards=torch.tensor([1.0, 1.0, 1.0, 0.0]))
    cfg = AlgoConfig()
    prepared = compute_advantages(batch, cfg, 1)
    assert idle_rows(prepared, cfg).tolist() == [True, True, False, False]
    one_token = replace(prepared, advantages=prepared.advantages.clone().index_put_((torch.tensor(0),
                                                                                    torch.tensor(1)),
                                                                                   torch.tensor(0.3)))
    assert idle_rows(one_token, cfg).tolist() == [False, True, False, False]
    # a term that acts without an advantage, or a loss that is not rowwise, keeps every response in the update
    for changed in (replace(cfg, kl_coef=0.01), replace(cfg, entropy_coef=1e-3), replace(cfg, loss="clip_cov"),
                    replace(cfg, loss="kl_cov")):
        assert not idle_rows(prepared, changed).any(), changed


def test_kl_on_line_starts_acts_on_those_tokens_only():
    # the same constant log-ratio d as above: k3 = e^d - d - 1 per token. Under kl_tokens=line_starts the term is
    # beta * k3 summed over the 4 line-start tokens and aggregated over the 9 loss tokens (token-mean): beta * k3 *
    # 4 / 9 more than no KL; its gradient 1 - e^d (times beta / 9) at the line starts and 0 on the 5 other tokens
    g, d = 0.3, 0.5
    lp = torch.log(torch.full((4, 3), 0.25))
    new = (lp + g).requires_grad_(True)
    starts = torch.tensor([[1.0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1]])
    batch = _batch(logprobs=lp, ref_logprobs=new.detach() + d, line_starts=starts)
    cfg = replace(AlgoConfig(), kl_coef=0.1, kl_tokens="line_starts")
    k3 = math.exp(d) - d - 1
    out = {}
    for name, c in (("none", replace(cfg, kl_coef=0.0, kl_tokens="all")), ("lines", cfg)):
        new.grad = None
        loss, _ = policy_objective(new, None, compute_advantages(batch, c, step=1), c)
        loss.backward()
        out[name] = (loss.item(), new.grad.clone())
    assert out["lines"][0] - out["none"][0] == pytest.approx(0.1 * k3 * 4 / 9, rel=1e-6)
    kl_grad = (out["lines"][1] - out["none"][1]) * 9 / 0.1
    assert torch.allclose(kl_grad, starts * (1 - math.exp(d)), atol=1e-5)
    # the update's statistic: the mean k3 over the line starts, k3 itself here
    stats = policy_objective(new, None, compute_advantages(batch, cfg, step=1), cfg)[1]
    assert stats["kl/line_start_mean"] == pytest.approx(k3, rel=1e-6)
    missing = r"algo.kl_tokens=line_starts needs RolloutBatch fields \['line_starts'\]"
    with pytest.raises(MissingInputError, match=missing):
        policy_objective(new, None, compute_advantages(batch.replace(line_starts=None), cfg, step=1), cfg)
