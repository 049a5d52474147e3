"""Loss variants of METHODS.md sections 5 and 6: TIS weights, forking tokens, Clip-Cov, KL-Cov, DAPO overlong
penalty, token weights in `policy_loss`, and the policy-loss registry. Hand-derived values on small examples."""

import math

import pytest
import torch

from explorl.algos import losses as L
from explorl.algos.batch import RolloutBatch
from explorl.algos.registry import lookup, names
from explorl.config import AlgoConfig

NAN = float("nan")
LN2 = math.log(2.0)


# --------------------------------------------------------------------------------------------------------------
# Truncated importance sampling (EAD, METHODS 6)


def test_tis_weights_hand_values_cap_and_padding():
    logprobs = torch.zeros(1, 4, requires_grad=True)
    # behaviour log-probs chosen so that exp(logprobs - behaviour) = 0.5, 1.5, 3.0; the last token is padding (nan)
    behavior = -torch.tensor([[math.log(0.5), math.log(1.5), math.log(3.0), NAN]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    w = L.tis_weights(logprobs, behavior, mask, cap=2.0)
    # min(0.5, 2) = 0.5; min(1.5, 2) = 1.5; min(3, 2) = 2 (truncated); padding 0
    assert torch.allclose(w, torch.tensor([[0.5, 1.5, 2.0, 0.0]]), atol=1e-6)
    assert w[0, 3].item() == 0.0
    assert not w.requires_grad  # detached
    stats = L.tis_stats(logprobs, behavior, mask, cap=2.0)
    assert stats["is/weight_mean"] == pytest.approx((0.5 + 1.5 + 2.0) / 3, abs=1e-6)  # 4/3
    assert stats["is/weight_max"] == pytest.approx(2.0)
    assert stats["is/truncated_frac"] == pytest.approx(1 / 3)  # only the ratio 3.0 exceeds the cap


def test_tis_weights_properties_random():
    gen = torch.Generator().manual_seed(0)
    logprobs = torch.randn(6, 9, generator=gen) * 3
    behavior = torch.randn(6, 9, generator=gen) * 3
    mask = (torch.rand(6, 9, generator=gen) > 0.3).float()
    cap = 1.7
    w = L.tis_weights(logprobs, behavior, mask, cap=cap)
    raw = torch.exp(logprobs - behavior)
    valid = mask.bool()
    assert (w <= cap).all()
    below = valid & (raw < cap)
    assert torch.allclose(w[below], raw[below], rtol=1e-6)  # equal to exp(diff) below the cap
    assert (w[valid & (raw > cap)] == cap).all()
    assert (w[~valid] == 0).all()
    assert L.tis_stats(logprobs, behavior, mask, cap=cap)["is/truncated_frac"] == pytest.approx(
        float((valid & (raw > cap)).sum()) / float(valid.sum()))


def test_tis_weights_empty_mask_and_bad_cap():
    lp = torch.zeros(2, 3)
    assert torch.equal(L.tis_weights(lp, lp, torch.zeros(2, 3)), torch.zeros(2, 3))
    stats = L.tis_stats(lp, lp, torch.zeros(2, 3))
    assert all(math.isfinite(v) for v in stats.values())
    with pytest.raises(ValueError, match="cap"):
        L.tis_weights(lp, lp, torch.ones(2, 3), cap=0.0)


# --------------------------------------------------------------------------------------------------------------
# Forking tokens (Wang et al. 2025, "80/20"; METHODS 5)

ENTROPY = torch.tensor([[0.9, 0.1, 0.5, 7.0], [0.3, 0.9, 0.8, 0.2]])
EMASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])  # 7 valid tokens; 7.0 sits in the padding


def test_forking_mask_count_order_ties_and_padding():
    # top_frac 0.5: k = max(1, int(7 * 0.5)) = int(3.5) = 3 -> entropies 0.9, 0.9, 0.8 at (0,0), (1,1), (1,2)
    m = L.forking_mask(ENTROPY, EMASK, top_frac=0.5)
    assert torch.equal(m, torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 1.0, 0.0]]))
    # top_frac 0.2: k = max(1, int(1.4)) = 1; the two 0.9 tie -> the first in row-major order, (0,0)
    m = L.forking_mask(ENTROPY, EMASK, top_frac=0.2)
    assert torch.equal(m, torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]))
    # top_frac 0.1: int(0.7) = 0 -> max(1, 0) = 1 token still selected
    assert L.forking_mask(ENTROPY, EMASK, top_frac=0.1).sum().item() == 1.0
    # top_frac 1: every valid token, never the padding
    assert torch.equal(L.forking_mask(ENTROPY, EMASK, top_frac=1.0), EMASK)


def test_forking_mask_random_selects_highest():
    gen = torch.Generator().manual_seed(1)
    ent = torch.rand(8, 16, generator=gen)
    mask = (torch.rand(8, 16, generator=gen) > 0.25).float()
    ent_padded = torch.where(mask.bool(), ent, torch.full_like(ent, 100.0))  # huge padding values must be ignored
    m = L.forking_mask(ent_padded, mask, top_frac=0.2)
    n_valid = int(mask.sum())
    k = max(1, int(n_valid * 0.2))
    assert int(m.sum()) == k
    assert (m[~mask.bool()] == 0).all()
    chosen, rest = ent[m.bool()], ent[mask.bool() & ~m.bool()]
    assert chosen.min() >= rest.max()


def test_forking_mask_empty():
    assert torch.equal(L.forking_mask(ENTROPY, torch.zeros(2, 4)), torch.zeros(2, 4))


# --------------------------------------------------------------------------------------------------------------
# token_weights in policy_loss. Reading (module docstring): tokens with weight 0 still count in the normaliser,
# as the forking-token objective keeps DAPO's 1 / sum_i |o_i| with the indicator inside the sum.

# The 2x3 example of test_losses.py: logp_old = 0, rho = RATIOS, eps 0.2. Token losses (derived there):
#   row 0 (A=+1): -1.2, -0.5, -1.0     row 1 (A=-1): 1.1, 0.8, padding
RATIOS = torch.tensor([[1.5, 0.5, 1.0], [1.1, 0.7, 2.0]])
ADV = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
TW = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]])  # keeps (0,0), (0,2), (1,1); (1,2) is padding


def test_policy_loss_token_weights_keep_the_denominator():
    lp = RATIOS.log().requires_grad_(True)
    loss, stats = L.policy_loss(lp, torch.zeros(2, 3), ADV, MASK, reduction=L.Reduction(token_weights=TW))
    # kept sum = -1.2 - 1.0 + 0.8 = -1.4, over all 5 valid tokens: -0.28
    assert loss.item() == pytest.approx(-1.4 / 5, abs=1e-6)
    assert stats["loss/masked_frac"] == pytest.approx(2 / 5)  # (0,1) and (1,0); padding not counted
    # The same tokens removed from the mask instead: -1.4 / 3; so loss_weights = loss_masked * 3 / 5.
    lp2 = RATIOS.log().requires_grad_(True)
    loss_masked, _ = L.policy_loss(lp2, torch.zeros(2, 3), ADV, MASK * TW)
    assert loss_masked.item() == pytest.approx(-1.4 / 3, abs=1e-6)
    assert loss.item() == pytest.approx(loss_masked.item() * 3 / 5, abs=1e-6)
    # Gradient: policy_loss's (-A*rho/5 where unclipped, test_losses.py) times the weight
    loss.backward()
    full = torch.tensor([[0.0, -0.5 / 5, -1.0 / 5], [1.1 / 5, 0.0, 0.0]])
    assert torch.allclose(lp.grad, full * TW, atol=1e-6)


def test_policy_loss_with_forking_mask_seq_mean():
    # seq-mean-token-mean keeps each response's own token count: row 0 (-1.2 - 1.0) / 3, row 1 0.8 / 2
    loss, _ = L.policy_loss(RATIOS.log(), torch.zeros(2, 3), ADV, MASK,
                            reduction=L.Reduction("seq-mean-token-mean", token_weights=TW))
    assert loss.item() == pytest.approx(((-2.2 / 3) + 0.4) / 2, abs=1e-6)


def test_policy_loss_weights_none_unchanged_and_all_ones():
    base, st0 = L.policy_loss(RATIOS.log(), torch.zeros(2, 3), ADV, MASK)
    ones, st1 = L.policy_loss(RATIOS.log(), torch.zeros(2, 3), ADV, MASK,
                              reduction=L.Reduction(token_weights=torch.ones(2, 3)))
    assert base.item() == pytest.approx(-0.16, abs=1e-6) and ones.item() == pytest.approx(-0.16, abs=1e-6)
    assert "loss/masked_frac" not in st0 and st1["loss/masked_frac"] == 0.0


# --------------------------------------------------------------------------------------------------------------
# Clip-Cov (Cui et al. 2025; METHODS 5)
#
# Example: 2 x 4, all valid (n_valid = 8). A = +2 on row 0, -2 on row 1 -> mean A = 0, A - mean = +-2.
# logp_new = [0, -1, -2, -5] on both rows -> mean = -16 / 8 = -2, centred [2, 1, 0, -3].
# cov row 0 = 2 * [2, 1, 0, -3] = [4, 2, 0, -6]; row 1 = -2 * [2, 1, 0, -3] = [-4, -2, 0, 6].
# With (lb, ub) = (1, 5) the candidates are (0,0) cov 4 and (0,1) cov 2; (1,3) cov 6 is above ub.
# clip_ratio 2e-4: int(2e-4 * 8) = 0 -> max(0, 1) = 1 token selected.
# logp_old = logp_new -> rho = 1, nothing clipped; token loss -A*rho = -2 (row 0), +2 (row 1);
# policy_loss gradient d/dlogp (-A*rho / 8) = -A/8 = -0.25 (row 0), +0.25 (row 1).

CC_LOGP = torch.tensor([[0.0, -1.0, -2.0, -5.0], [0.0, -1.0, -2.0, -5.0]])
CC_ADV = torch.tensor([[2.0] * 4, [-2.0] * 4])
CC_MASK = torch.ones(2, 4)
CANDIDATES = {(0, 0), (0, 1)}


def _clip_cov(seed=0, logp_old=None, **options):
    lp = CC_LOGP.clone().requires_grad_(True)
    old = CC_LOGP if logp_old is None else logp_old
    loss, stats = L.clip_cov_loss(lp, old, CC_ADV, CC_MASK, options=L.ClipCovOptions(**options),
                                  generator=torch.Generator().manual_seed(seed))
    loss.backward()
    return loss, stats, lp.grad


def test_clip_cov_selected_token_has_zero_gradient_others_match_policy_loss():
    lp = CC_LOGP.clone().requires_grad_(True)
    ref_loss, _ = L.policy_loss(lp, CC_LOGP, CC_ADV, CC_MASK)
    ref_loss.backward()
    assert torch.allclose(lp.grad, torch.tensor([[-0.25] * 4, [0.25] * 4]))
    seen = set()
    for seed in range(20):
        loss, stats, grad = _clip_cov(seed)
        zero = {tuple(ix) for ix in torch.nonzero(grad == 0).tolist()}
        assert len(zero) == 1 and zero <= CANDIDATES  # exactly one token, always a candidate
        seen |= zero
        keep = grad != 0
        assert torch.allclose(grad[keep], lp.grad[keep])  # same denominator: identical gradient elsewhere
        assert stats["loss/clip_cov_frac"] == pytest.approx(1 / 8)
        assert stats["loss/clip_cov_candidate_frac"] == pytest.approx(2 / 8)
        # value: the selected row-0 token's -2 leaves the sum: (-2*3 + 2*4) / 8 = 0.25
        assert loss.item() == pytest.approx(0.25)
    assert seen == CANDIDATES  # the random choice reaches both candidates
    # the same seed gives the same choice
    assert torch.equal(_clip_cov(3)[2], _clip_cov(3)[2])


def test_clip_cov_never_selects_outside_bounds():
    # clip_ratio 1: n = 8 > 2 candidates -> all candidates, nothing else (cov 6 > ub, cov 0/-4/-6 < lb)
    loss, stats, grad = _clip_cov(ratio=1.0)
    assert {tuple(ix) for ix in torch.nonzero(grad == 0).tolist()} == CANDIDATES
    assert stats["loss/clip_cov_frac"] == pytest.approx(2 / 8)
    # value: (-2 - 2 + 2*4) / 8 = 0.5
    assert loss.item() == pytest.approx(0.5)
    # open interval: lb = 2 excludes cov == 2 at (0,1); ub = 4 excludes cov == 4 at (0,0)
    _, _, grad = _clip_cov(ratio=1.0, lb=2.0)
    assert {tuple(ix) for ix in torch.nonzero(grad == 0).tolist()} == {(0, 0)}
    _, _, grad = _clip_cov(ratio=1.0, ub=4.0)
    assert {tuple(ix) for ix in torch.nonzero(grad == 0).tolist()} == {(0, 1)}
    # no candidate at all: nothing selected, the loss equals policy_loss
    loss, stats, _ = _clip_cov(ratio=1.0, lb=10.0, ub=20.0)
    assert stats["loss/clip_cov_frac"] == 0.0 and loss.item() == pytest.approx(0.0)  # (-2*4 + 2*4) / 8


def test_clip_cov_skips_tokens_already_clipped():
    # rho(0,0) = 1.5 > 1.2 with A > 0: the clipped term is active, so (0,0) is no candidate (its gradient is
    # already 0 by the clip); the cov uses logp_new, unchanged, so (0,1) is the only candidate for every seed.
    old = CC_LOGP.clone()
    old[0, 0] = -math.log(1.5)
    for seed in range(5):
        _, stats, grad = _clip_cov(seed, logp_old=old)
        assert grad[0, 0] == 0 and grad[0, 1] == 0  # clipped by PPO, removed by Clip-Cov
        assert stats["loss/clip_cov_candidate_frac"] == pytest.approx(1 / 8)
        assert stats["loss/clip_cov_frac"] == pytest.approx(1 / 8)
        assert stats["loss/clip_frac"] == pytest.approx(1 / 8)


# --------------------------------------------------------------------------------------------------------------
# KL-Cov (Cui et al. 2025; METHODS 5)
#
# mask [[1,1,1],[1,1,0]] -> n_valid = 5. A = +1 (row 0), -1 (row 1): mean A = (3 - 2) / 5 = 0.2;
#   A - mean: row 0 0.8, row 1 -1.2.
# logp_new row 0 [-0.5, -1, -2], row 1 [-1.5, -3, pad]: mean = -8 / 5 = -1.6;
#   centred row 0 [1.1, 0.6, -0.4], row 1 [0.1, -1.4].
# cov row 0 [0.88, 0.48, -0.32], row 1 [-0.12, 1.68] -> order: (1,1) 1.68 > (0,0) 0.88 > (0,1) 0.48 > ...
# logp_old = logp_new - log(rho) with rho row 0 [1.5, 0.5, 1.0], row 1 [1.1, 2.0].
# unclipped -A*rho: row 0 [-1.5, -0.5, -1.0], row 1 [1.1, 2.0]  (PPO-clip would give -1.2 for rho 1.5).

KC_MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
KC_ADV = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
KC_LOGP = torch.tensor([[-0.5, -1.0, -2.0], [-1.5, -3.0, NAN]])
KC_RHO = torch.tensor([[1.5, 0.5, 1.0], [1.1, 2.0, 1.0]])


def _kl_cov(**kw):
    lp = KC_LOGP.clone().requires_grad_(True)
    loss, stats = L.kl_cov_loss(lp, KC_LOGP - KC_RHO.log(), KC_ADV, KC_MASK, **kw)
    loss.backward()
    return loss, stats, lp.grad


def test_kl_cov_hand_example_top1():
    # default k_percent 0.2 (%): int(5 * 0.2 / 100) = 0 -> max(1, 0) = 1 token: (1,1), cov 1.68.
    # its loss: 2.0 + 1 * |ln 2| = 2.693147; sum = -1.5 - 0.5 - 1.0 + 1.1 + 2.693147 = 0.793147; / 5
    loss, stats, grad = _kl_cov()
    assert loss.item() == pytest.approx((0.1 + 2.0 + LN2 - 2.0) / 5, abs=1e-6)  # 0.1586294
    assert stats["loss/kl_cov_frac"] == pytest.approx(1 / 5)
    assert stats["loss/kl_cov_abs_kl"] == pytest.approx(LN2, abs=1e-6)
    # gradient / 5 of: -A*rho everywhere, + kl_coef * sign(log rho) = +1 at (1,1); padding 0
    expected = torch.tensor([[-1.5, -0.5, -1.0], [1.1, 2.0 + 1.0, 0.0]]) / 5
    assert torch.allclose(grad, expected, atol=1e-6)
    assert grad[1, 2].item() == 0.0


def test_kl_cov_hand_example_top2_and_seq_mean():
    # k_percent 40: int(5 * 40 / 100) = 2 -> (1,1) and (0,0). kl_coef 0.5:
    #   (1,1): 2.0 + 0.5 ln 2 = 2.346574;  (0,0): -1.5 + 0.5 ln 1.5 = -1.297267
    #   sum = -1.297267 - 0.5 - 1.0 + 1.1 + 2.346574 = 0.649307; / 5 = 0.129861
    loss, stats, _ = _kl_cov(k_percent=40.0, kl_coef=0.5)
    expected = (-1.5 + 0.5 * math.log(1.5) - 0.5 - 1.0 + 1.1 + 2.0 + 0.5 * LN2) / 5
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert stats["loss/kl_cov_frac"] == pytest.approx(2 / 5)
    # seq-mean-token-mean, top 1: row 0 (-1.5 - 0.5 - 1.0) / 3 = -1; row 1 (1.1 + 2.693147) / 2 = 1.896574;
    # mean of the two = 0.448287
    loss, _, _ = _kl_cov(reduction=L.Reduction("seq-mean-token-mean"))
    assert loss.item() == pytest.approx((-1.0 + (1.1 + 2.0 + LN2) / 2) / 2, abs=1e-6)


def test_kl_cov_weights_multiply_whole_token_loss():
    # is_weights 2 on every token doubles the top-1 value; token_weights zeroing (1,1) removes it, penalty too:
    # (-1.5 - 0.5 - 1.0 + 1.1) / 5 = -0.38
    lp = KC_LOGP.clone()
    old = KC_LOGP - KC_RHO.log()
    loss, st = L.kl_cov_loss(lp, old, KC_ADV, KC_MASK, reduction=L.Reduction(is_weights=torch.full((2, 3), 2.0)))
    assert loss.item() == pytest.approx(2 * (0.1 + LN2) / 5, abs=1e-6)
    assert st["loss/is_weight_mean"] == pytest.approx(2.0)
    tw = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 1.0]])
    loss, st = L.kl_cov_loss(lp, old, KC_ADV, KC_MASK, reduction=L.Reduction(token_weights=tw))
    assert loss.item() == pytest.approx(-1.9 / 5, abs=1e-6)
    assert st["loss/masked_frac"] == pytest.approx(1 / 5)


# --------------------------------------------------------------------------------------------------------------
# DAPO overlong penalty (Yu et al. 2025, eq. 13)


def test_overlong_penalty_hand_values():
    # max_len 20, buffer 5 -> soft zone (15, 20]: (15 - L) / 5 * penalty
    lengths = torch.tensor([10, 15, 16, 18, 20, 20, 25, 12])
    truncated = torch.tensor([False, False, False, False, False, True, False, True])
    out = L.overlong_penalty(lengths, truncated, 20, buffer=5)
    # 10 -> 0; 15 -> 0 (L <= 15); 16 -> -1/5; 18 -> -3/5; 20 -> -5/5 = -1; 20 truncated -> -1; 25 -> -1;
    # 12 truncated -> -1 (a truncated response counts as exceeding)
    assert torch.allclose(out, torch.tensor([0.0, 0.0, -0.2, -0.6, -1.0, -1.0, -1.0, -1.0]), atol=1e-6)
    assert out.dtype == torch.float32
    half = L.overlong_penalty(lengths, truncated, 20, buffer=5, penalty=0.5)
    assert torch.allclose(half, out * 0.5, atol=1e-6)
    # no flags; buffer 0 is a hard step at max_len
    step = L.overlong_penalty(torch.tensor([19, 20, 21]), None, 20, buffer=0)
    assert torch.equal(step, torch.tensor([0.0, 0.0, -1.0]))
    with pytest.raises(ValueError, match="buffer"):
        L.overlong_penalty(lengths, truncated, 20, buffer=21)


# --------------------------------------------------------------------------------------------------------------
# All variants: registry, common call, empty masks


def test_registry_names_and_unknown():
    # the registered loss adapts the config and its options to the loss function, whose maths it names
    for name, fn in (("ppo", L.policy_loss), ("clip_cov", L.clip_cov_loss), ("kl_cov", L.kl_cov_loss)):
        entry = lookup("policy_loss", name)
        assert L.get_policy_loss(name) is entry.fn and entry.formula == (fn,)
    with pytest.raises(KeyError, match="cispo, clip_cov, dppo_kl, dppo_tv, dro, geo_mean, gpg, gspo, kl_cov, luspo, "
                                       "ppo, sapo, simko, vespo"):
        L.get_policy_loss("grpo_loss")


REQUIRED_OPTIONS = {"dro": {"beta": 0.05}}
"""Options a loss has no default for (verl's `dro_beta` is required), set where the tests call every loss."""

NEEDS_TOPK = {n for n in names("policy_loss") if lookup("policy_loss", n).needs_topk is not None}
"""Losses the step calls with its forward's top-K log-probs as well (`needs_topk`: SimKO), which these generic calls do
not give; tests/algos/test_simko.py tests SimKO's call on a real forward."""


def _bound(name: str, agg: str = "token-mean", **options):
    """The registered loss `name` as the step calls it: with a config of `agg` and the loss's `options`."""
    cfg = AlgoConfig(loss=name, loss_agg=agg)
    entry = lookup("policy_loss", name)
    options = {**REQUIRED_OPTIONS.get(name, {}), **options}
    bound = {} if entry.options is None else {"options": entry.options(**options)}  # CISPO has no options

    def call(new, old, adv, mask, *, max_response_len, is_weights, token_weights, **kw):
        batch = RolloutBatch.for_loss(mask, adv, logprobs=old, max_response_len=max_response_len,
                                      is_weights=is_weights, token_weights=token_weights)
        return entry.fn(new, batch, cfg, **bound, **kw)
    return call


def test_the_registered_losses_pass_the_config_and_options_unchanged():
    """Each registered loss reads its keywords from `cfg` (the clip range, the aggregation) and its options, the
    same numbers the loss function gets called directly with them."""
    n, t = 4, 6
    gen = torch.Generator().manual_seed(3)
    old, adv = torch.randn(n, t, generator=gen), torch.randn(n, t, generator=gen)
    new = old + 0.5 * torch.randn(n, t, generator=gen)
    mask = (torch.rand(n, t, generator=gen) > 0.2).float()
    common = {"max_response_len": t, "is_weights": None, "token_weights": None}
    cfg = AlgoConfig()
    cases = [("ppo", {"dual_clip_c": 2.0}, L.policy_loss, {"eps_low": cfg.eps_low, "eps_high": cfg.eps_high,
                                                          "dual_clip_c": 2.0}),
             ("kl_cov", {"k_percent": 50.0, "coef": 0.5}, L.kl_cov_loss, {"k_percent": 50.0, "kl_coef": 0.5}),
             ("clip_cov", {"ratio": 0.5, "lb": -5.0, "ub": 5.0}, L.clip_cov_loss,
              {"clip_range": (cfg.eps_low, cfg.eps_high), "options": L.ClipCovOptions(ratio=0.5, lb=-5.0, ub=5.0)})]
    for name, options, fn, keywords in cases:
        for agg in L.LOSS_AGG_MODES:
            random = {"generator": torch.Generator().manual_seed(0)} if name == "clip_cov" else {}
            got, got_stats = _bound(name, agg, **options)(new, old, adv, mask, **common, **random)
            random = {"generator": torch.Generator().manual_seed(0)} if name == "clip_cov" else {}
            want, want_stats = fn(new, old, adv, mask, reduction=L.Reduction(agg, t), **keywords, **random)
            assert torch.equal(got, want) and got_stats == want_stats, (name, agg)


@pytest.mark.parametrize("name", [n for n in names("policy_loss") if n not in NEEDS_TOPK])
@pytest.mark.parametrize("agg", L.LOSS_AGG_MODES)
def test_empty_mask_gives_zero_not_nan(name, agg):
    logp_new = torch.randn(2, 3).requires_grad_(True)
    old = torch.full((2, 3), NAN)  # padding garbage must not leak
    loss, stats = _bound(name, agg)(logp_new, old, torch.ones(2, 3), torch.zeros(2, 3), max_response_len=3,
                                    is_weights=torch.ones(2, 3), token_weights=torch.ones(2, 3))
    assert loss.item() == 0.0
    loss.backward()
    assert torch.equal(logp_new.grad, torch.zeros(2, 3))
    assert all(math.isfinite(v) for v in stats.values())


@pytest.mark.parametrize("name", [n for n in names("policy_loss") if n not in NEEDS_TOPK])
def test_trainer_style_call_on_policy(name):
    # ratio 1 and no weights: every variant gives -token-mean(A). Clip-Cov gets bounds no cov reaches (as options,
    # the way the step passes them), so nothing is a candidate; KL-Cov's penalty is |log 1| = 0. The two whose value
    # is not PPO's (their gradient is, -A grad logp): CISPO's token loss -A * logp, SAPO's -A * (4 / tau) sigmoid(0)
    # = -A * 2 / tau, tau 1 where A > 0 and 1.05 elsewhere.
    gen = torch.Generator().manual_seed(0)
    logp = torch.randn(3, 5, generator=gen)
    adv = torch.tensor([[1.0], [-0.5], [0.25]]).expand(3, 5)
    mask = torch.tensor([[1.0] * 5, [1.0] * 3 + [0.0] * 2, [1.0] * 4 + [0.0]])
    options = {"clip_cov": {"lb": 1e6, "ub": 2e6}}.get(name, {})
    loss, stats = _bound(name, **options)(logp, logp, adv, mask, max_response_len=5, is_weights=None,
                                          token_weights=None)
    on_policy = {"cispo": adv * logp, "sapo": adv * torch.where(adv > 0, 2 / 1.0, 2 / 1.05)}.get(name, adv)
    # verl's DPPO, DRO and GPG losses are -A * logp too (DPPO's ratio weight is 1 and DRO's penalty 0 here)
    on_policy = adv * logp if name in ("dppo_tv", "dppo_kl", "dro", "gpg") else on_policy
    # LUSPO scales each response's term by its length |y_i|; VESPO's token loss is -phi * A * logp with phi(1) = 1
    on_policy = {"luspo": adv * mask.sum(-1, keepdim=True), "vespo": adv * logp}.get(name, on_policy)
    assert loss.item() == pytest.approx(-L.aggregate(on_policy, mask).item(), abs=1e-6)
    assert stats["loss/ratio_mean"] == pytest.approx(1.0)


def test_variants_reject_bad_shapes_and_arguments():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="clip_cov_loss"):
        L.clip_cov_loss(x, x, x, x, reduction=L.Reduction(token_weights=torch.zeros(3, 2)))
    with pytest.raises(ValueError, match="k_percent"):
        L.kl_cov_loss(x, x, x, x, k_percent=0.0)
    with pytest.raises(ValueError, match="top_frac"):
        L.forking_mask(x, x, top_frac=1.5)
    with pytest.raises(ValueError, match="valid"):
        L.kl_cov_loss(x, x, x, x, reduction=L.Reduction("sum"))


def test_kl_cov_penalty_share_and_ratio_min_by_hand():
    """The statistics that show whether the mechanism acts (with one update per batch KL-Cov's penalty is 0).
    One response, two tokens, A = 1 on both; the new policy is 0.5 nats above the old on the first token only, and
    k_percent 100 selects both. Token-mean: penalty (|0.5| + 0) / 2 = 0.25; policy-gradient part
    -(e^0.5 + 1) / 2 = -1.324361; share 0.25 / (1.3243606 + 0.25) = 0.1587946. Ratios: e^0.5 and 1."""
    old = torch.zeros(1, 2)
    new = torch.tensor([[0.5, 0.0]])
    adv, mask = torch.ones(1, 2), torch.ones(1, 2)
    loss, stats = L.kl_cov_loss(new, old, adv, mask, k_percent=100.0, kl_coef=1.0)
    assert float(loss) == pytest.approx(-1.324361 + 0.25, abs=1e-6)
    assert stats["loss/kl_cov_penalty_share"] == pytest.approx(0.1587946, abs=1e-6)
    assert stats["loss/ratio_min"] == pytest.approx(1.0) and stats["loss/ratio_max"] == pytest.approx(math.exp(0.5))
    # the first update of a batch: ratio 1 everywhere, so |log ratio| = 0 and the penalty does not act
    _, first = L.kl_cov_loss(old, old, adv, mask, k_percent=100.0, kl_coef=1.0)
    assert first["loss/kl_cov_penalty_share"] == 0.0 and first["loss/ratio_min"] == 1.0
    _, ppo = L.policy_loss(new, old, adv, mask, eps_high=0.28)  # e^0.5 = 1.65 > 1.28 with A > 0: clipped high
    assert ppo["loss/ratio_min"] == 1.0 and ppo["loss/clip_frac_high"] == pytest.approx(0.5)
