"""The schedule driver (`explorl.rollout.schedule.ScheduleDriver`), which explorl's loop, TRL, verl and the vLLM engine
all drive the temperature schedule and budget policy through: step numbering, passes over the data, deferred entropy,
the per-prompt plan in both forms, and its JSON state."""

from __future__ import annotations

import json

import pytest
import torch

from explorl.config import load_config
from explorl.rollout.controllers import PromptStream
from explorl.rollout.sampler import per_response_table
from explorl.rollout.schedule import ScheduleDriver

E3 = ["sampling.schedule=e3", "budget.policy=e3", "sampling.group_size=8", "run.steps=8"]


def _driver(*extra: str, prompts: int = 10) -> ScheduleDriver:
    return ScheduleDriver(load_config(None, [*E3, *extra]), vocab_size=98, num_prompts=prompts)


def test_end_hands_the_schedule_the_one_based_step():
    driver, own = _driver(), _driver()
    for step, entropy in enumerate([0.5, 0.25, 0.4]):
        temps = driver.begin(step)
        assert temps.step == step and temps.sampler == temps.train == own.schedule.at(step)[0]
        driver.end(entropy)
        own.schedule.observe(step + 1, entropy)  # E3's t is 1-based
    assert driver.schedule.state_dict() == own.schedule.state_dict() and driver.schedule.controller.tau != 1.0
    with pytest.raises(RuntimeError, match="begin"):
        _driver().plan([0])


def test_passes_counted_from_the_prompts_planned_match_the_prompt_stream():
    # 10 prompts, 4 per step: the stream's third batch crosses into the second pass, where E3's curriculum widens
    counted, streamed, stream = _driver(), _driver(), PromptStream(10, seed=0)
    for step in range(6):
        counted.begin(step)
        streamed.begin(step)
        epoch = stream.epoch
        ids = stream.next(4)
        a, b = counted.plan(ids), streamed.plan(ids, new_pass=stream.epoch != epoch)
        assert a == b
        assert counted.budget.curriculum.bounds() == streamed.budget.curriculum.bounds()
        rewards = [[float((i + j) % 3 == 0) for j in range(n)] for i, n in enumerate(a.rollouts)]
        for d in (counted, streamed):
            d.observe_rewards(ids, rewards)
    assert counted.budget.curriculum.passes == 2 and counted.planned == 24


def test_a_deferred_entropy_is_the_mean_of_its_pieces():
    direct, deferred = _driver(), _driver()
    for driver in (direct, deferred):
        driver.begin(0)
    direct.end((0.3 * 5 + 0.9 * 3) / 8)
    deferred.defer_entropy()
    deferred.add_entropy(0.3 * 5, 5)
    assert deferred.entropy_pending
    state = json.loads(json.dumps(deferred.state_dict()))
    deferred.add_entropy(0.9 * 3, 3)
    halves = []  # several processes: `reduce` sums the pieces of every one
    deferred.end(reduce=lambda t: halves.append(t.clone()) or t)
    assert not deferred.entropy_pending and halves[0].tolist() == pytest.approx([0.3 * 5 + 0.9 * 3, 8])
    assert deferred.schedule.state_dict() == direct.schedule.state_dict()
    resumed = _driver()  # the pending sum and the step travel in the state
    resumed.load_state_dict(state)
    resumed.add_entropy(0.9 * 3, 3)
    resumed.end()
    assert resumed.schedule.state_dict() == direct.schedule.state_dict()


def test_the_plan_describes_one_sampling_for_every_engine():
    driver = _driver("sampling.schedule=ead", "budget.policy=uniform", "sampling.max_new_tokens=6",
                     "sampling.temperature=0.8")
    temps = driver.begin(2)
    assert temps.per_token and temps.train == 0.8
    engine = driver.plan([3, 4])
    assert engine.rollout_n == [8, 8] and engine.temperature == [0.8, 0.8] and engine.anneal[0]["step"] == 2
    table = temps.table(6)
    # explorl's sampler: each response's row of the plan's table is the schedule's
    rows = per_response_table(engine.requests, engine.rollouts, 6)
    assert rows.shape == (16, 6) and all(torch.equal(r, table) for r in rows)
    from explorl.integrations.vllm import token_factors

    torch.testing.assert_close(0.8 * token_factors([engine.anneal[0]] * 6, list(range(6))), table)


def test_the_state_is_json_and_resumes_exactly():
    first = _driver()
    for step in range(3):
        first.begin(step)
        ids = [2 * step % 10, (2 * step + 1) % 10]
        first.plan(ids)
        first.observe_rewards(ids, [[1.0, 0.0] * 4, [0.0] * 8])
        first.end(0.6 - 0.1 * step)
    resumed = _driver()
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert resumed.state_dict() == first.state_dict()
    for d in (first, resumed):
        d.begin(3)
    assert resumed.plan([6, 7, 8, 9, 0, 1]) == first.plan([6, 7, 8, 9, 0, 1])
    # one state: the schedule's and the budget policy's beside the driver's own
    state = first.state_dict()
    assert state["schedule"] == first.schedule.state_dict() and state["budget"] == first.budget.state_dict()
    assert set(state) == {"schedule", "budget", "planned", "step", "entropy_sum"}
