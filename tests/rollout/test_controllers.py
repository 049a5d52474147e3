"""Schedules and budget policies from the registry (`explorl.rollout.controllers`, driven by
`explorl.rollout.schedule.ScheduleDriver`): the adaptive per-prompt temperature (docs/methods.md §2c) by hand, its
composition with EAD and E3, and its state."""

from __future__ import annotations

import math

import pytest
import torch

from explorl.config import ConfigError, load_config
from explorl.rollout import temperature as Tm
from explorl.rollout.sampler import per_response_table
from explorl.rollout.schedule import ScheduleDriver


def test_adaptive_factor_by_hand():
    # 1 + 0.5 * (0.5 - p): p = 0 -> 1.25, p = 1 -> 0.75, p = 0.5 -> 1, unseen -> 1; gamma 0 switches it off
    assert Tm.adaptive_factor([0.0, 1.0, 0.5, None]).tolist() == [1.25, 0.75, 1.0, 1.0]
    assert Tm.adaptive_factor([0.2], gamma=1.0, target=0.6).tolist() == pytest.approx([1.4])
    assert Tm.adaptive_factor([0.0, 1.0], gamma=0.0).tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="gamma"):
        Tm.adaptive_factor([0.5], gamma=-1.0)


def _adaptive(base: str, *extra: str) -> ScheduleDriver:
    cfg = load_config(None, ["sampling.schedule=adaptive", f"sampling.adaptive.base={base}",
                             "sampling.max_new_tokens=16", "sampling.temperature=0.8", *extra])
    return ScheduleDriver(cfg, vocab_size=98, num_prompts=10)


def test_fixed_base_gives_one_temperature_per_prompt_from_its_success_rate():
    c = _adaptive("fixed")
    temp, train, _ = c.schedule.at(0)
    assert temp == train == 0.8  # the optimised policy stays at the base temperature
    # prompt 3: 1 of 4 correct (p = 0.25 -> 1.125); prompt 5: 4 of 4 (p = 1 -> 0.75); prompt 7 unseen (1)
    c.schedule.observe_rewards([3, 5], [[1, 0, 0, 0], [1, 1, 1, 1]])
    got = c.schedule.per_prompt(0, temp, [3, 5, 7])
    assert [r.temperature for r in got] == pytest.approx([0.8 * 1.125, 0.8 * 0.75, 0.8])
    assert all(r.anneal is None for r in got)
    stats = c.schedule.rollout_stats(None)
    assert stats == {"temperature/adaptive_factor_min": 0.75, "temperature/adaptive_factor_max": 1.125}
    assert not c.behavior_is_policy  # sampled != optimised: no one-update shortcut, TIS is allowed


def test_ead_base_scales_each_prompts_tau_max():
    c = _adaptive("ead", "sampling.ead.c=2")
    temp, train, _ = c.schedule.at(0)
    c.schedule.observe_rewards([0], [[0, 0]])  # p = 0 -> factor 1.25 -> tau_max 1.5
    per_token = per_response_table(c.schedule.per_prompt(0, temp, [0, 1]), [2, 1], 16)
    assert per_token.shape == (3, 16)  # one row per response: budgets 2 and 1
    for t in (0, 1, 2, 5, 15):  # tau_t = (1 for t < 2, else max(1 + tau_max_i - e^(t/25), 0.1)) * 0.8
        hot = 1.0 if t < 2 else max(1 + 1.5 - math.exp(t / 25), 0.1)
        base = 1.0 if t < 2 else max(1 + 1.2 - math.exp(t / 25), 0.1)
        assert per_token[0, t].item() == pytest.approx(0.8 * hot, rel=1e-6)
        assert per_token[1, t].item() == pytest.approx(0.8 * hot, rel=1e-6)
        assert per_token[2, t].item() == pytest.approx(0.8 * base, rel=1e-6)
    assert train == 0.8  # the optimised policy stays at the base temperature


def test_e3_base_keeps_its_controller_and_the_state_round_trips():
    c = _adaptive("e3")
    c.schedule.observe(1, 0.5)  # H_init
    c.schedule.observe(2, 0.25)  # entropy halved: E3 raises tau
    tau = c.schedule.at(2)[0]
    assert tau > 0.8
    c.schedule.observe_rewards([1, 2], [[1, 1], [0, 1]])
    state = c.state_dict()
    d = _adaptive("e3")
    d.load_state_dict(state)
    assert d.schedule.at(2)[0] == tau
    assert d.schedule.per_prompt(2, tau, [1, 2, 9]) == c.schedule.per_prompt(2, tau, [1, 2, 9])


@pytest.mark.parametrize("extra, message", [
    (["sampling.adaptive.base=adaptive"], "cannot itself be adaptive"),
    (["sampling.adaptive.base=nope"], "sampling.adaptive.base: unknown temperature schedule 'nope'"),
    (["sampling.adaptive.gamma=2.5"], "sampling.adaptive.gamma"),
    (["sampling.adaptive.target=1.5"], "sampling.adaptive.target"),
    (["sampling.adaptive.base=ead", "sampling.ead.tau_min=0"], "sampling.ead.tau_min"),  # the base's check runs too
])
def test_adaptive_settings_are_validated(extra, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, ["sampling.schedule=adaptive", *extra])
