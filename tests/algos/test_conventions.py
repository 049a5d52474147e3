"""The engines' conventions and EAD's own TIS as options (docs/methods.md §6 and §9): sequence-level truncated
importance weights (`tis_weights(level="sequence")`), verl's dual-clip PPO (`policy_loss(dual_clip_c=...)`) and
verl's clamped k3 KL (`kl_k3(clamp=...)`).

Each is checked against a reference written here independently, as plain Python loops over responses and tokens in
float64 with the derivation in a comment, plus at least one hand-derived number; and every option at its default
must reproduce the functions exactly as they were (`torch.equal` against calls without the new argument)."""

from __future__ import annotations

import math

import pytest
import torch

from explorl.algos import losses as L
from explorl.algos.registry import lookup

NAN = float("nan")


def _rand(shape, seed, scale=1.0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale).to(dtype)


def _rand_mask(n, t, seed):
    gen = torch.Generator().manual_seed(seed)
    mask = (torch.rand(n, t, generator=gen) > 0.3).float()
    mask[0] = 0.0  # one response without any valid token
    mask[1] = 1.0  # one full response
    return mask


# --------------------------------------------------------------------------------------------------------------
# Sequence-level truncated importance weights (EAD App. B.2; docs/methods.md §6)


def ref_seq_tis(logprobs, behavior, mask, cap):
    """Reference, float64. EAD App. B.2 truncates the ratio of whole sequences, min(pi_old(y|x) / mu(y|x), C);
    with pi(y|x) = prod_t pi(y_t | x, y_<t) over the response's tokens, log of the ratio is
    S = sum_t (log pi_old(y_t) - log mu(y_t)) over the valid tokens, so w = min(exp(S), C) = exp(min(S, log C))
    (the second form never overflows). Every valid token of the response carries w; padding carries 0."""
    out = []
    for i in range(len(mask)):
        s = sum(float(logprobs[i][t]) - float(behavior[i][t]) for t in range(len(mask[i])) if mask[i][t])
        w = math.exp(min(s, math.log(cap)))
        out.append([w if mask[i][t] else 0.0 for t in range(len(mask[i]))])
    return out


def test_sequence_tis_hand_values():
    logprobs = torch.zeros(3, 3)
    # response 0: token ratios 0.5, 3, 1 -> sequence ratio 1.5, below the cap 2: 1.5 on its three tokens
    #   (token level would give 0.5, 2 (truncated), 1)
    # response 1: ratios 2, 2 and padding (nan) -> sequence ratio 4 -> truncated to 2 on its two tokens, 0 on padding
    # response 2: no valid token -> all 0
    behavior = -torch.tensor([[math.log(0.5), math.log(3.0), 0.0],
                              [math.log(2.0), math.log(2.0), NAN],
                              [NAN, NAN, NAN]])
    mask = torch.tensor([[1.0, 1, 1], [1, 1, 0], [0, 0, 0]])
    w = L.tis_weights(logprobs, behavior, mask, cap=2.0, level="sequence")
    want = torch.tensor([[1.5, 1.5, 1.5], [2.0, 2.0, 0.0], [0.0, 0.0, 0.0]])
    assert torch.allclose(w, want, atol=1e-6)
    assert w[1, 0].item() == 2.0 and w[1, 2].item() == 0.0 and (w[2] == 0).all()  # exactly the cap, exactly 0
    ref = ref_seq_tis(logprobs.tolist(), behavior.tolist(), mask.tolist(), 2.0)
    assert torch.allclose(w.double(), torch.tensor(ref, dtype=torch.float64), rtol=1e-6, atol=0)
    token = L.tis_weights(logprobs, behavior, mask, cap=2.0)
    assert torch.allclose(token[0], torch.tensor([0.5, 2.0, 1.0]), atol=1e-6)  # the token level differs
    stats = L.tis_stats(logprobs, behavior, mask, cap=2.0, level="sequence")
    # token-weighted over the 5 valid tokens: (3 * 1.5 + 2 * 2) / 5 = 1.7; max 2; response 1's 2 tokens truncated
    assert stats["is/weight_mean"] == pytest.approx(1.7)
    assert stats["is/weight_max"] == pytest.approx(2.0)
    assert stats["is/truncated_frac"] == pytest.approx(2 / 5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("cap", [1.0, 1.7, 2.0, 50.0])
def test_sequence_tis_matches_reference_random(dtype, cap):
    n, t = 7, 11
    logprobs = _rand((n, t), 1, 0.3, dtype)
    behavior = _rand((n, t), 2, 0.3, dtype)
    mask = _rand_mask(n, t, 3)
    behavior[mask == 0] = NAN  # padding may hold anything
    w = L.tis_weights(logprobs, behavior, mask, cap=cap, level="sequence")
    want = torch.tensor(ref_seq_tis(logprobs.tolist(), behavior.tolist(), mask.tolist(), cap), dtype=torch.float64)
    assert w.dtype == dtype and not w.requires_grad
    assert torch.allclose(w.double(), want, rtol=1e-5 if dtype == torch.float32 else 1e-12, atol=0)
    # stats describe these weights, token-weighted; truncated: the response's own ratio exceeds the cap
    valid = mask.bool()
    stats = L.tis_stats(logprobs, behavior, mask, cap, level="sequence")
    assert stats["is/weight_mean"] == pytest.approx(float(want[valid].mean()), rel=1e-5)
    assert stats["is/weight_max"] == pytest.approx(float(want[valid].max()), rel=1e-5)
    seq_log = [sum(float(logprobs[i, j]) - float(behavior[i, j]) for j in range(t) if mask[i, j]) for i in range(n)]
    truncated = sum(int(mask[i].sum()) for i in range(n) if seq_log[i] > math.log(cap))
    assert stats["is/truncated_frac"] == pytest.approx(truncated / int(mask.sum()))


def test_sequence_tis_long_sequence_cannot_overflow():
    # 4096 tokens with log-ratio +5 each: S = 20480, exp(S) overflows even float64 (max ~ e^709). In log space the
    # weight is exp(min(20480, log 2)) = 2, exactly the cap. A response with log-ratio -5 per token has
    # exp(-20480) = 0 (an underflow to 0 is the right value to float precision).
    t = 4096
    logprobs = torch.zeros(2, t)
    behavior = torch.stack([torch.full((t,), -5.0), torch.full((t,), 5.0)])
    mask = torch.ones(2, t)
    w = L.tis_weights(logprobs, behavior, mask, cap=2.0, level="sequence")
    assert torch.isfinite(w).all()
    assert (w[0] == 2.0).all() and (w[1] == 0.0).all()
    stats = L.tis_stats(logprobs, behavior, mask, cap=2.0, level="sequence")
    assert all(math.isfinite(v) for v in stats.values())
    assert stats["is/truncated_frac"] == pytest.approx(0.5) and stats["is/weight_max"] == 2.0
    # without a cap the +20 guard of the module keeps the weight finite: exp(20)
    w_inf = L.tis_weights(logprobs, behavior, mask, cap=math.inf, level="sequence")
    assert torch.isfinite(w_inf).all() and w_inf[0, 0].item() == pytest.approx(math.exp(20.0), rel=1e-6)


def test_sequence_tis_single_token_responses_equal_token_level():
    # with one valid token per response the sequence ratio is the token ratio
    logprobs = _rand((5, 4), 4)
    behavior = _rand((5, 4), 5)
    mask = torch.zeros(5, 4)
    mask[torch.arange(5), torch.tensor([0, 3, 1, 2, 0])] = 1.0
    assert torch.allclose(L.tis_weights(logprobs, behavior, mask, level="sequence"),
                          L.tis_weights(logprobs, behavior, mask), rtol=1e-6, atol=0)


def test_tis_level_default_is_exactly_the_old_token_level_and_bad_level_raises():
    logprobs = _rand((6, 9), 6, 3.0)
    behavior = _rand((6, 9), 7, 3.0)
    mask = _rand_mask(6, 9, 8)
    assert torch.equal(L.tis_weights(logprobs, behavior, mask, cap=1.7),
                       L.tis_weights(logprobs, behavior, mask, cap=1.7, level="token"))
    assert L.tis_stats(logprobs, behavior, mask, 1.7) == L.tis_stats(logprobs, behavior, mask, 1.7, level="token")
    # the old formula, min(exp(min(d, 20)), cap), 0 on padding
    d = torch.where(mask.bool(), logprobs - behavior, torch.zeros(()))
    old = torch.where(mask.bool(), torch.exp(d.clamp(max=20.0)).clamp(max=1.7), torch.zeros(()))
    assert torch.equal(L.tis_weights(logprobs, behavior, mask, cap=1.7), old)
    with pytest.raises(ValueError, match="level"):
        L.tis_weights(logprobs, behavior, mask, level="response")
    with pytest.raises(ValueError, match="level"):
        L.tis_stats(logprobs, behavior, mask, level="seq")


# --------------------------------------------------------------------------------------------------------------
# Dual-clip PPO (verl's clip_ratio_c; docs/methods.md §9)


def ref_dual_clip_loss(new, old, adv, mask, eps_low, eps_high, c):
    """Reference, float64, token-mean. PPO-clip (Schulman et al. 2017 eq. 7) token loss with rho = exp(new - old):
    l = max(-A * rho, -A * clip(rho, 1 - eps_low, 1 + eps_high)); verl's dual clip (compute_policy_loss_vanilla)
    bounds it for A < 0 by the constant -A * c: l' = min(-A * c, l); A >= 0 keeps l. The loss is the mean of l' over
    the valid tokens. Returns (loss, fraction of valid tokens where -A * c < l, i.e. the bound is the value)."""
    total, n, active = 0.0, 0, 0
    for i in range(len(mask)):
        for t in range(len(mask[i])):
            if not mask[i][t]:
                continue
            a = float(adv[i][t])
            rho = math.exp(float(new[i][t]) - float(old[i][t]))
            clipped = min(max(rho, 1.0 - eps_low), 1.0 + eps_high)
            loss = max(-a * rho, -a * clipped)
            if a < 0 and -a * c < loss:
                loss = -a * c
                active += 1
            total += loss
            n += 1
    return total / max(n, 1), active / max(n, 1)


def test_dual_clip_hand_values_and_gradients():
    # one response, 5 tokens, eps 0.2, c = 3:
    #   0: A = -1, rho = 10  : PPO max(10, 1.2) = 10 -> dual min(3, 10) = 3 = -A * c (constant, gradient 0)
    #   1: A = +1, rho = 10  : PPO max(-10, -1.2) = -1.2 (clipped, gradient 0); A > 0 untouched by the dual clip
    #   2: A = -1, rho = 2   : PPO max(2, 1.2) = 2 < 3 -> 2; gradient d(rho)/d(logp) = rho = 2
    #   3: A = -1, rho = 0.5 : PPO max(0.5, 0.8) = 0.8 (clipped, gradient 0)
    #   4: A = +1, rho = 1   : -1; gradient -rho = -1
    # token-mean: (3 - 1.2 + 2 + 0.8 - 1) / 5 = 0.72; gradients divided by 5: [0, 0, 0.4, 0, -0.2]
    old = torch.zeros(1, 5)
    new = torch.log(torch.tensor([[10.0, 10.0, 2.0, 0.5, 1.0]])).requires_grad_(True)
    adv = torch.tensor([[-1.0, 1.0, -1.0, -1.0, 1.0]])
    mask = torch.ones(1, 5)
    loss, stats = L.policy_loss(new, old, adv, mask, dual_clip_c=3.0)
    assert loss.item() == pytest.approx(0.72, abs=1e-6)
    assert stats["loss/dual_clip_frac"] == pytest.approx(1 / 5)
    loss.backward()
    assert torch.allclose(new.grad, torch.tensor([[0.0, 0.0, 0.4, 0.0, -0.2]]), atol=1e-6)
    assert new.grad[0, 0].item() == 0.0  # exactly: the bound is a constant
    # without the dual clip the first token's loss is 10: (10 - 1.2 + 2 + 0.8 - 1) / 5 = 2.12
    plain, plain_stats = L.policy_loss(new.detach(), old, adv, mask)
    assert plain.item() == pytest.approx(2.12, abs=1e-6)
    assert "loss/dual_clip_frac" not in plain_stats


def test_dual_clip_huge_ratio_gives_minus_a_times_c():
    # A = -0.5 and a log-ratio of 50 (rho clamped to e^20 by the module's guard, still huge): the loss is -A * c
    # = 0.5 * 3 = 1.5 instead of ~2.4e8
    new = torch.tensor([[50.0]], requires_grad=True)
    loss, stats = L.policy_loss(new, torch.zeros(1, 1), torch.tensor([[-0.5]]), torch.ones(1, 1), dual_clip_c=3.0)
    assert loss.item() == pytest.approx(1.5)
    assert stats["loss/dual_clip_frac"] == 1.0
    loss.backward()
    assert new.grad.item() == 0.0


@pytest.mark.parametrize("c", [1.5, 3.0, 10.0])
@pytest.mark.parametrize("eps_low, eps_high", [(0.2, 0.2), (0.2, 0.28)])
def test_dual_clip_matches_reference_random(c, eps_low, eps_high):
    n, t = 6, 10
    old = _rand((n, t), 11, 1.0, torch.float64)
    new = (old + _rand((n, t), 12, 1.5, torch.float64)).requires_grad_(True)  # ratios from ~0.01 to ~100
    adv = _rand((n, t), 13, 1.0, torch.float64)
    mask = _rand_mask(n, t, 14)
    loss, stats = L.policy_loss(new, old, adv, mask, eps_low=eps_low, eps_high=eps_high, dual_clip_c=c)
    want, frac = ref_dual_clip_loss(new.tolist(), old.tolist(), adv.tolist(), mask.tolist(), eps_low, eps_high, c)
    assert loss.item() == pytest.approx(want, rel=1e-12, abs=1e-12)
    assert stats["loss/dual_clip_frac"] == pytest.approx(frac)
    assert frac > 0  # the random batch exercises the bound
    loss.backward()
    # the gradient is zero exactly where the constant bound is active, and where A >= 0 it is the plain PPO one
    rho = torch.exp(new.detach() - old)
    active = (adv < 0) & (-adv * c < torch.maximum(-adv * rho, -adv * rho.clamp(1 - eps_low, 1 + eps_high)))
    active &= mask.bool()
    assert (new.grad[active] == 0).all()
    new2 = new.detach().clone().requires_grad_(True)
    L.policy_loss(new2, old, adv, mask, eps_low=eps_low, eps_high=eps_high)[0].backward()
    assert torch.equal(new.grad[~active], new2.grad[~active])


def test_dual_clip_default_is_exactly_the_old_loss():
    n, t = 5, 8
    old = _rand((n, t), 21)
    adv = _rand((n, t), 22)
    mask = _rand_mask(n, t, 23)
    isw = _rand((n, t), 24).abs()
    for agg in L.LOSS_AGG_MODES:
        a = (old + _rand((n, t), 25, 2.0)).requires_grad_(True)
        b = a.detach().clone().requires_grad_(True)
        la, sa = L.policy_loss(a, old, adv, mask, reduction=L.Reduction(agg, max_response_len=t, is_weights=isw))
        lb, sb = L.policy_loss(b, old, adv, mask, dual_clip_c=None,
                               reduction=L.Reduction(agg, max_response_len=t, is_weights=isw))
        la.backward()
        lb.backward()
        assert torch.equal(la, lb) and torch.equal(a.grad, b.grad) and sa == sb
        assert "loss/dual_clip_frac" not in sb


def test_dual_clip_bad_value_raises_and_registry_wiring():
    x = torch.zeros(1, 2)
    for c in (1.0, 0.5, -3.0):
        with pytest.raises(ValueError, match="dual_clip_c"):
            L.policy_loss(x, x, x, torch.ones(1, 2), dual_clip_c=c)
    assert "dual_clip_c" in lookup("policy_loss", "ppo").options.__dataclass_fields__
    # Clip-Cov keeps its own PPO term without the dual clip (verl's Clip-Cov has none)
    assert "dual_clip_c" not in lookup("policy_loss", "clip_cov").options.__dataclass_fields__
    assert "dual_clip_c" not in lookup("policy_loss", "kl_cov").options.__dataclass_fields__


# --------------------------------------------------------------------------------------------------------------
# Clamped k3 KL (verl's low_var_kl; docs/methods.md §1, §9)


def ref_kl_clamped(logprobs, ref_logprobs, mask, clamp):
    """Reference, float64: verl's low_var_kl (kl_penalty_forward in verl/trainer/ppo/core_algos.py):
    d = clip(ref - logp, -20, 20); k3 = exp(d) - d - 1 (Schulman 2020); clip(k3, -clamp, clamp). 0 on padding."""
    out = []
    for i in range(len(mask)):
        row = []
        for t in range(len(mask[i])):
            if not mask[i][t]:
                row.append(0.0)
                continue
            d = min(max(float(ref_logprobs[i][t]) - float(logprobs[i][t]), -20.0), 20.0)
            row.append(min(max(math.exp(d) - d - 1.0, -clamp), clamp))
        out.append(row)
    return out


def test_kl_clamp_hand_values_and_gradient():
    # d = ref - logp per token:
    #   ln 2 : k3 = 2 - ln 2 - 1 = 0.306853; d/dlogp k3 = -(e^d - 1) = -1
    #   -5   : k3 = e^-5 + 4 = 4.006738 (below 10); gradient 1 - e^-5 = 0.993262
    #   3    : k3 = e^3 - 4 = 16.0855 -> 10 (clamped, gradient 0)
    #   -30  : d clamped to -20 first: e^-20 + 19 = 19.000000002 -> 10 (clamped, gradient 0)
    logp = torch.zeros(1, 4, dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[math.log(2.0), -5.0, 3.0, -30.0]], dtype=torch.float64)
    kl = L.kl_k3(logp, ref, clamp=10.0)
    want = [2 - math.log(2) - 1, math.exp(-5) + 4, 10.0, 10.0]
    assert kl[0].tolist() == pytest.approx(want, rel=1e-12)
    kl.sum().backward()
    assert logp.grad[0].tolist() == pytest.approx([-1.0, 1 - math.exp(-5), 0.0, 0.0], rel=1e-12)
    # with a clamp above 19 the +-20 log-ratio clamp shows: d = -30 gives 19 + e^-20, not the bare 29
    wide = L.kl_k3(logp.detach(), ref, clamp=100.0)
    assert wide[0, 2].item() == pytest.approx(math.exp(3) - 4)
    assert wide[0, 3].item() == pytest.approx(19 + math.exp(-20), rel=1e-12)
    assert L.kl_k3(logp.detach(), ref)[0, 3].item() == pytest.approx(29.0)  # unclamped (default)


@pytest.mark.parametrize("clamp", [0.05, 1.0, 10.0, 25.0])
def test_kl_clamp_matches_reference_random(clamp):
    n, t = 6, 9
    logp = _rand((n, t), 31, 1.0, torch.float64)
    ref = logp + _rand((n, t), 32, 12.0, torch.float64)  # log-ratios of tens of nats, some beyond +-20
    mask = _rand_mask(n, t, 33)
    ref[mask == 0] = NAN  # padding may hold anything
    got = L.kl_k3(logp, ref, mask, clamp=clamp)
    want = torch.tensor(ref_kl_clamped(logp.tolist(), ref.tolist(), mask.tolist(), clamp), dtype=torch.float64)
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)
    assert (got <= clamp).all() and (got[mask == 0] == 0).all()


def test_kl_clamp_default_is_exactly_the_old_estimate_and_bad_clamp_raises():
    logp = _rand((5, 7), 41, 3.0)
    ref = _rand((5, 7), 42, 3.0)
    mask = _rand_mask(5, 7, 43)
    assert torch.equal(L.kl_k3(logp, ref, mask), L.kl_k3(logp, ref, mask, clamp=None))
    assert torch.equal(L.kl_k3(logp, ref), L.kl_k3(logp, ref, clamp=None))
    d = torch.where(mask.bool(), ref - logp, torch.zeros(()))  # the old formula
    assert torch.equal(L.kl_k3(logp, ref, mask), torch.where(mask.bool(), torch.expm1(d) - d, torch.zeros(())))
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match="clamp"):
            L.kl_k3(logp, ref, mask, clamp=bad)
