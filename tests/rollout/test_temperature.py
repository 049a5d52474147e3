"""EAD / RevEAD schedules and the E3 temperature scheduler: hand-derived values and properties."""

import copy
import json
import math

import pytest
import torch

from explorl.rollout import temperature as Tm

# ---------------------------------------------------------------------------------------------- EAD


def test_ead_hand_values():
    # step 0: d_0 = min(25 + 5*0, 40000) = 25
    #   t = 10 (= c, first annealed token): 1 + 1.2 - exp(10/25) = 2.2 - 1.4918247 = 0.7081753
    #   t = 15: 2.2 - exp(0.6) = 2.2 - 1.8221188 = 0.3778812
    #   t = 30: 2.2 - exp(1.2) = 2.2 - 3.3201169 < 0.1  -> tau_min = 0.1
    t = torch.tensor([0, 9, 10, 15, 30])
    assert torch.allclose(Tm.ead(t, 0), torch.tensor([1.0, 1.0, 0.7081753, 0.3778812, 0.1]), atol=1e-6)
    # step 5: d_5 = 25 + 25 = 50; t = 10: 2.2 - exp(0.2) = 2.2 - 1.2214028 = 0.9785972
    assert abs(float(Tm.ead(10, 5)) - 0.9785972) < 1e-6
    # step 10^6: d = min(25 + 5e6, 40000) = 40000; t = 4000: 2.2 - exp(0.1) = 2.2 - 1.1051709 = 1.0948291
    assert abs(float(Tm.ead(4000, 10**6)) - 1.0948291) < 1e-6
    # public-code scale 20 at step 0: d = 500; t = 10: 2.2 - exp(0.02) = 2.2 - 1.0202013 = 1.1797987
    assert abs(float(Tm.ead(10, 0, Tm.EADOptions(scale=20.0))) - 1.1797987) < 1e-6
    # c = 0: t = 0 starts at tau_max: 1 + 1.2 - exp(0) = 1.2
    assert abs(float(Tm.ead(0, 0, Tm.EADOptions(c=0))) - 1.2) < 1e-6


def test_ead_types_and_shapes():
    out = Tm.ead(3, 0)
    assert out.dim() == 0 and out.dtype == torch.float32
    t = torch.arange(12).reshape(3, 4)
    out = Tm.ead(t, 7)
    assert out.shape == (3, 4) and out.dtype == torch.float32
    assert torch.equal(out.flatten(), Tm.ead_schedule(7, 12))
    # huge positions overflow exp to inf: the schedule stays at tau_min, never nan
    far = Tm.ead(torch.tensor([10**6]), 0)
    assert torch.equal(far, torch.tensor([0.1]))


@pytest.mark.parametrize("step", [0, 1, 10, 100, 2000, 10**5])
def test_ead_properties(step):
    t = torch.arange(0, 5000)
    tau = Tm.ead(t, step)
    c = 10
    assert torch.all(tau[:c] == 1.0)  # the template prefix is sampled at 1.0
    assert torch.all(tau >= 0.1 - 1e-7)  # never below tau_min
    assert torch.all(tau <= 1.2 + 1e-6)  # never above tau_max
    after = tau[c:]
    assert torch.all(after[1:] <= after[:-1])  # non-increasing after c


def test_ead_decays_more_slowly_with_the_training_step():
    # d_s grows with s, so exp(t / d_s) shrinks and tau at a fixed t can only rise (until d_max caps it)
    t = torch.arange(0, 3000)
    prev = Tm.ead(t, 0)
    for step in [1, 2, 5, 20, 100, 1000, 7995, 8000, 10**5]:
        cur = Tm.ead(t, step)
        assert torch.all(cur >= prev), step
        prev = cur
    # strictly warmer somewhere once d_s grows: step 0 vs step 100 at t = 10 (0.708 vs 2.2 - exp(10/525) = 1.181)
    assert float(Tm.ead(10, 100)) > float(Tm.ead(10, 0)) + 0.4
    # the cap: steps past (40000 - 25) / 5 = 7995 all give d = 40000
    assert torch.equal(Tm.ead(t, 7995), Tm.ead(t, 10**6))


def test_ead_invalid_arguments():
    with pytest.raises(ValueError):
        Tm.ead(0, -1)
    with pytest.raises(ValueError):
        Tm.ead(0, 0, Tm.EADOptions(scale=0.0))
    with pytest.raises(ValueError):
        Tm.ead(0, 0, Tm.EADOptions(d0=0.0))


# ---------------------------------------------------------------------------------------------- RevEAD


def test_revead_hand_values_and_bounds():
    # c = 0 (the formula as printed), d = 25: t = 0: 0.1 + exp(0) = 1.1; t = 1: 0.1 + exp(0.04) = 1.1408108;
    # t = 3: 0.1 + exp(0.12) = 1.2274969 > 1.2 -> tau_max
    printed = Tm.EADOptions(c=0)  # the paper's formula, without the prefix
    assert torch.allclose(Tm.revead(torch.tensor([0, 1, 3]), 0, printed), torch.tensor([1.1, 1.1408108, 1.2]),
                          atol=1e-6)
    for step in [0, 3, 50, 10**4]:
        tau = Tm.revead(torch.arange(0, 3000), step)
        assert torch.all(tau[:10] == 1.0)  # same template prefix as EAD by default
        after = tau[10:]
        # bounds: exp(.) >= 1, so tau in [min(tau_min + 1, tau_max), tau_max] = [1.1, 1.2]
        assert torch.all(after >= 1.1 - 1e-6) and torch.all(after <= 1.2 + 1e-6)
        assert torch.all(after[1:] >= after[:-1])  # non-decreasing: the reverse of EAD
    # the schedule helper matches
    assert torch.equal(Tm.revead_schedule(4, 20, printed), Tm.revead(torch.arange(20), 4, printed))


# ---------------------------------------------------------------------------------------------- E3 eq. 4 / 5


def test_e3_update_hand_values():
    # V = 100: ln 100 = 4.6051702, ln ln 100 = ln 4.6051702 = 1.5271796, sum D = 6.1323498; ln 2 = 0.6931472
    # ratio r = 0.6931472 / 6.1323498 = 0.1130313
    # tau = 1: 1 * (1 + 1 * r) = 1.1130313
    assert abs(Tm.e3_update(1.0, 2.0, 1.0, 100) - 1.1130313) < 1e-6
    # tau = 2: 2 * (1 + 2 * r) = 2 * 1.2260625 = 2.4521250
    assert abs(Tm.e3_update(2.0, 2.0, 1.0, 100) - 2.4521250) < 1e-6
    # alpha = 1/2 is symmetric: 1 * (1 - r) = 0.8869687
    assert abs(Tm.e3_update(1.0, 1.0, 2.0, 100) - 0.8869687) < 1e-6
    # alpha = 1 leaves tau unchanged
    assert Tm.e3_update(0.7, 1.3, 1.3, 151936) == 0.7
    # no clamp in the pure function: tau = 4, alpha = 1/20 (ln = -2.9957323) -> 4 * (1 + 4 * -0.4885) < 0
    assert Tm.e3_update(4.0, 0.1, 2.0, 100) < 0
    with pytest.raises(ValueError):
        Tm.e3_update(1.0, 1.0, 0.0, 100)


def _entropy(logits: torch.Tensor, tau: float) -> float:
    lp = torch.log_softmax(logits / tau, dim=-1)
    return float(-(lp.exp() * lp).sum(-1).mean())


@pytest.mark.parametrize("tau", [0.8, 1.0, 1.2])
@pytest.mark.parametrize("ratio", [0.8, 0.9, 1.1, 1.25])
def test_e3_update_moves_entropy_toward_target(tau, ratio):
    # a synthetic LM-like next-token distribution (E3 App. A): Gaussian noise logits plus one outlier
    # token per row, so the entropy is small (~0.02-0.7 nats) as eq. 4's derivation assumes
    g = torch.Generator().manual_seed(0)
    V, N = 1000, 64
    logits = torch.randn(N, V, generator=g, dtype=torch.float64)
    logits[torch.arange(N), torch.randint(V, (N,), generator=g)] += 12.0
    h_now = _entropy(logits, tau)
    target = ratio * h_now
    new_tau = Tm.e3_update(tau, target, h_now, V)
    h_new = _entropy(logits, new_tau)
    if ratio < 1:  # H_now above target: tau goes down and so does the entropy
        assert new_tau < tau and h_new < h_now
    else:  # H_now below target: tau and entropy go up
        assert new_tau > tau and h_new > h_now
    assert abs(h_new - target) < abs(h_now - target)
    # eq. 4 scales the entropy by about alpha (paper's Fig. 2); within 5% here
    assert abs(h_new / h_now - ratio) < 0.05 * ratio


def test_e3_target_hand_values():
    # t_max = 100, t_anneal = floor(0.6 * 100) = 60, H_init = 2.0, eta = 0.9
    kw = dict(t_max=100)
    assert Tm.e3_target(0, 2.0, **kw) == 2.0
    assert Tm.e3_target(59, 2.0, **kw) == 2.0
    # t = 60: cos(0) = 1 -> 2.0 * (0.9 + 0.1 * 0.5 * 2) = 2.0
    assert abs(Tm.e3_target(60, 2.0, **kw) - 2.0) < 1e-12
    # t = 80 (midway): cos(pi/2) = 0 -> 2.0 * (0.9 + 0.1 * 0.5) = 1.9
    assert abs(Tm.e3_target(80, 2.0, **kw) - 1.9) < 1e-12
    # t = 70: cos(pi/4) = 0.7071068 -> 2.0 * (0.9 + 0.05 * 1.7071068) = 1.9707107
    assert abs(Tm.e3_target(70, 2.0, **kw) - 1.9707107) < 1e-6
    # t = t_max: cos(pi) = -1 -> 2.0 * 0.9 = 1.8; held there past t_max
    assert abs(Tm.e3_target(100, 2.0, **kw) - 1.8) < 1e-12
    assert abs(Tm.e3_target(150, 2.0, **kw) - 1.8) < 1e-12
    # paper run: 480 steps -> t_anneal = 288; floor(0.6 * t) is exact despite float rounding (0.6 * 10 = 6)
    assert Tm.anneal_start(480) == 288 and Tm.anneal_start(10) == 6 and Tm.anneal_start(7) == 4
    # eta = 0.85 at t_max
    assert abs(Tm.e3_target(100, 1.0, t_max=100, eta=0.85) - 0.85) < 1e-12


# ---------------------------------------------------------------------------------------------- controller


def test_controller_init_then_updates():
    ctrl = Tm.E3TemperatureController(1.0, 100, t_max=10)
    assert ctrl.tau == 1.0
    assert "temperature/h_init" not in ctrl.stats()
    ctrl.observe(1, 1.5)  # first batch (steps are 1-based for E3): H_init = 1.5, tau unchanged
    assert ctrl.tau == 1.0 and ctrl.h_init == 1.5 and ctrl.updates == 0
    s = ctrl.stats()
    assert s["temperature/h_init"] == 1.5 and s["temperature/h_target"] == 1.5 and s["temperature/tau"] == 1.0
    ctrl.observe(2, 0.75)  # second batch: alpha = 1.5 / 0.75 = 2 -> tau = 1.1130313 (see the hand values above)
    assert abs(ctrl.tau - 1.1130313) < 1e-6 and ctrl.updates == 1
    ctrl.observe(3, 1.5)  # entropy back at the target: alpha = 1, tau stays
    assert abs(ctrl.tau - 1.1130313) < 1e-6
    assert ctrl.stats()["temperature/clamped"] == 0.0


def test_controller_clamp_acts_and_is_logged():
    ctrl = Tm.E3TemperatureController(1.0, 100, t_max=10, tau_ceil=1.05, tau_floor=0.95)
    ctrl.observe(1, 1.0)
    ctrl.observe(2, 0.5)  # raw tau = 1.1130313 > 1.05
    assert ctrl.tau == 1.05
    s = ctrl.stats()
    assert s["temperature/clamped"] == 1.0 and s["temperature/clamp_count"] == 1.0 and s["temperature/tau"] == 1.05
    ctrl.observe(3, 1.0)  # alpha = 1: no change, clamp did not act
    assert ctrl.tau == 1.05 and ctrl.stats()["temperature/clamped"] == 0.0
    ctrl.observe(4, 4.0)  # alpha = 1/4: raw = 1.05 * (1 + 1.05 * -1.3862944 / 6.1323498) = 0.8007661 < 0.95
    assert ctrl.tau == 0.95 and ctrl.stats()["temperature/clamped"] == 1.0
    assert ctrl.stats()["temperature/clamp_count"] == 2.0


def test_controller_skips_non_positive_entropy():
    ctrl = Tm.E3TemperatureController(1.0, 100, t_max=10)
    ctrl.observe(1, 0.0)  # not a usable H_init
    assert ctrl.h_init is None and ctrl.stats()["temperature/skipped"] == 1.0
    ctrl.observe(2, 1.0)
    assert ctrl.h_init == 1.0 and ctrl.stats()["temperature/skipped"] == 0.0
    ctrl.observe(3, float("nan"))
    assert ctrl.tau == 1.0 and ctrl.stats()["temperature/skipped"] == 1.0


def test_controller_annealing_uses_eq5_target():
    # t_max = 10 -> t_anneal = 6; at step 8: progress (8 - 6) / 4 = 0.5 -> target = H_init * 0.95;
    # at the last step, 10: target = eta * H_init = 1.8
    ctrl = Tm.E3TemperatureController(1.0, 100, t_max=10, anneal=True)
    ctrl.observe(1, 2.0)
    for step in range(2, 7):
        ctrl.observe(step, 2.0)
        assert ctrl.h_target == 2.0 and ctrl.tau == 1.0  # target H_init up to t_anneal (cos 0 = 1 at t = 6)
    ctrl.observe(7, 2.0)
    assert ctrl.tau < 1.0  # the target dropped below H_init while H stays at 2.0: tau falls
    ctrl.observe(8, 2.0)
    assert abs(ctrl.h_target - 1.9) < 1e-12
    ctrl.observe(9, 2.0)
    ctrl.observe(10, 2.0)
    assert abs(ctrl.h_target - 1.8) < 1e-12
    # without annealing the same entropies leave tau at tau0
    plain = Tm.E3TemperatureController(1.0, 100, t_max=10)
    for step in range(1, 11):
        plain.observe(step, 2.0)
    assert plain.tau == 1.0


def test_controller_state_dict_round_trip_is_exact():
    g = torch.Generator().manual_seed(3)
    entropies = (0.3 + torch.rand(40, generator=g, dtype=torch.float64)).tolist()
    a = Tm.E3TemperatureController(1.0, 151936, t_max=40, anneal=True, tau_ceil=1.3)
    for step in range(1, 16):
        a.observe(step, entropies[step - 1])
    saved = json.loads(json.dumps(a.state_dict()))  # survives JSON (and so torch.save) unchanged
    b = Tm.E3TemperatureController(1.0, 151936, t_max=40, anneal=True, tau_ceil=1.3)
    b.load_state_dict(copy.deepcopy(saved))
    assert b.stats() == a.stats()
    taus_a, taus_b = [], []
    for step in range(16, 41):
        a.observe(step, entropies[step - 1])
        b.observe(step, entropies[step - 1])
        taus_a.append(a.tau)
        taus_b.append(b.tau)
    assert taus_a == taus_b  # bit-identical
    assert len(set(taus_a)) > 1


def test_controller_rejects_bad_settings():
    with pytest.raises(ValueError):
        Tm.E3TemperatureController(5.0, 100, t_max=10)  # tau0 above tau_ceil = 4
    with pytest.raises(ValueError):
        Tm.E3TemperatureController(1.0, 1, t_max=10)
    assert math.isfinite(Tm.E3TemperatureController(1.0, 2, t_max=0).tau)
