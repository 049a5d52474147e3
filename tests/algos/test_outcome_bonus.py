"""Outcome-based exploration (Song et al. 2025, arXiv:2509.06941; docs/methods.md §5ac): the UCB bonus by final
answer with its baselines, the batch penalty, the gate on solved groups, the counts across steps and across a resume,
and a run of the recipe on the embedded model; refused by TRL's and verl's integrations."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from explorl.algos import RolloutBatch, compute_advantages
from explorl.algos.batch import MissingInputError
from explorl.algos.methods.outcome_bonus import (NO_OUTCOME, OutcomeBonusOptions, OutcomeCounts, batch_penalty,
                                                exploration_advantage, outcome_term, ucb_bonus)
from explorl.algos.step import requirements, shaper_states
from explorl.config import ConfigError, load_config
from explorl.train.loop import train

from run_helpers import train_killed_at

RECIPE = Path(__file__).resolve().parents[2] / "configs" / "recipes" / "outcome_bonus.yaml"
R2 = 2 ** -0.5  # 1 / sqrt(2)

# two questions (groups 0 and 1) of three responses each, over two steps; keys stand for (question, answer) hashes
GROUP = torch.tensor([0, 0, 0, 1, 1, 1])
STEP1 = {"outcomes": torch.tensor([10, 10, 11, 20, NO_OUTCOME, 21]),
         "correct": torch.tensor([True, True, False, False, False, False])}
STEP2 = {"outcomes": torch.tensor([10, 11, 12, 20, 20, 22]),
         "correct": torch.tensor([True, False, False, False, False, False])}


def _batch(step: dict) -> RolloutBatch:
    rewards = step["correct"].float()
    return RolloutBatch(mask=torch.ones(6, 4), rewards=rewards, group=GROUP, correct=step["correct"],
                        outcomes=step["outcomes"])


def _algo(*overrides: str):
    return load_config(None, ["algo.shapers=[outcome_bonus]", *overrides]).algo


def test_ucb_bonus_by_hand():
    # min(1, sqrt(1 / N)): N = 0 -> 1 (never seen), 1 -> 1, 2 -> 0.7071, 4 -> 0.5
    assert ucb_bonus(torch.tensor([0, 1, 2, 4])).tolist() == pytest.approx([1.0, 1.0, R2, 0.5])


def test_two_steps_by_hand_ucb_con():
    """UCB-Con (the default: weight 1, b_0 = 0.5), counts excluding the current batch.

    Step 1, nothing seen yet: every answered response has N = 0, b = 1, term b - 0.5 = 0.5; the unanswered one
    (NO_OUTCOME) gets 0. Neither group is all correct. Then N(10) = 2, N(11) = N(20) = N(21) = 1.
    Step 2: group 0 answers 10, 11, 12 with N = 2, 1, 0: b = 0.7071, 1, 1, terms 0.2071, 0.5, 0.5; group 1 answers
    20, 20, 22 with N = 1, 1, 0 (the repeat in this batch does not count): b = 1, 1, 1, terms 0.5 each.
    The term is added on every token of the response (advantages - base_advantages)."""
    algo = _algo()
    states = shaper_states(algo)
    first = compute_advantages(_batch(STEP1), algo, 1, states=states)
    torch.testing.assert_close((first.advantages - first.base_advantages)[:, 0],
                               torch.tensor([0.5, 0.5, 0.5, 0.5, 0.0, 0.5]))
    assert torch.equal(first.advantages - first.base_advantages,
                       (first.advantages - first.base_advantages)[:, :1].expand(6, 4))
    assert states["outcome_bonus"].counts == {10: 2, 11: 1, 20: 1, 21: 1}
    assert first.stats["outcome/bonus_mean"] == pytest.approx(2.5 / 6)
    assert first.stats["outcome/new_frac"] == 1.0 and first.stats["outcome/answered_frac"] == pytest.approx(5 / 6)
    second = compute_advantages(_batch(STEP2), algo, 2, states=states)
    torch.testing.assert_close((second.advantages - second.base_advantages)[:, 0],
                               torch.tensor([R2 - 0.5, 0.5, 0.5, 0.5, 0.5, 0.5]))
    assert states["outcome_bonus"].counts == {10: 3, 11: 2, 12: 1, 20: 3, 21: 1, 22: 1}
    assert second.stats["outcome/new_frac"] == pytest.approx(2 / 6)  # 12 and 22


def test_baselines_and_batch_penalty_by_hand():
    """Step 2's counts (N = 2, 1, 0 | 1, 1, 0), b = 0.7071, 1, 1 | 1, 1, 1.
    UCB: b itself. UCB-Mean: b_i less the mean of the other two of its group: 0.7071 - 1 = -0.2929,
    1 - (0.7071 + 1) / 2 = 0.1464 (twice); group 1: 1 - 1 = 0. Batch: group 1 answers 20, 20, 22 of G = 3: the two
    20s each have one repeat, -1/3; 22 and group 0's distinct answers 0."""
    counts, valid = torch.tensor([2, 1, 0, 1, 1, 0]), torch.ones(6, dtype=torch.bool)
    b = ucb_bonus(counts)
    torch.testing.assert_close(exploration_advantage(b, GROUP, valid, baseline="none"), b)
    mean = exploration_advantage(b, GROUP, valid, baseline="mean")
    half = 1 - (R2 + 1) / 2
    torch.testing.assert_close(mean, torch.tensor([R2 - 1, half, half, 0.0, 0.0, 0.0]))
    torch.testing.assert_close(batch_penalty(STEP2["outcomes"], GROUP), torch.tensor([0, 0, 0, -1 / 3, -1 / 3, 0]))
    # an unanswered response is no one's repeat and gets none: group 1 of step 1 (20, -1, 21) has no penalty
    assert batch_penalty(torch.tensor([5, NO_OUTCOME, NO_OUTCOME]), torch.tensor([0, 0, 0])).tolist() == [0, 0, 0]
    # historical 0.5 (UCB-Con) + batch 2: row 3 is 0.5 (1 - 0.5) + 2 (-1/3) = -0.1667
    both = outcome_term(STEP2["outcomes"], GROUP, counts, STEP2["correct"],
                        options=OutcomeBonusOptions(historical=0.5, batch=2.0))
    torch.testing.assert_close(both, torch.tensor([0.5 * (R2 - 0.5), 0.25, 0.25, 0.25 - 2 / 3, 0.25 - 2 / 3, 0.25]))


def test_a_solved_group_gets_no_term():
    # group 0 all correct: its term is 0 with skip_solved (the default), 0.5 each without
    correct = torch.tensor([True, True, True, False, False, False])
    out = torch.tensor([10, 10, 10, 20, 21, 22])
    counts = torch.zeros(6, dtype=torch.long)
    assert outcome_term(out, GROUP, counts, correct).tolist() == [0, 0, 0, 0.5, 0.5, 0.5]
    assert outcome_term(out, GROUP, counts, correct, options=OutcomeBonusOptions(skip_solved=False)).tolist() == \
        [0.5] * 6


def test_counting_the_current_batch():
    # include_batch: step 1's 10 appears twice in the batch, N = 2, b = 0.7071; 11, 20, 21 once, b = 1
    state = OutcomeCounts(OutcomeBonusOptions(include_batch=True))
    assert state.observe(STEP1["outcomes"]).tolist() == [2, 2, 1, 1, 0, 1]


def test_memory_is_bounded():
    state = OutcomeCounts(OutcomeBonusOptions(max_outcomes=4))
    state.observe(torch.tensor([1, 1, 1, 2, 2, 3]))
    state.observe(torch.tensor([4, 5]))  # 5 keys > 4: the three most seen are kept (1: 3, 2: 2, then the oldest 3)
    assert state.counts == {1: 3, 2: 2, 3: 1}


def test_counts_restored_after_a_resume_give_the_same_bonus(tmp_path):
    """Step 1, a checkpoint of the counts (saved and read back as a checkpoint is, `weights_only`), step 2 from it:
    the same terms and counts as step 2 of the uninterrupted run."""
    algo = _algo()
    straight = shaper_states(algo)
    compute_advantages(_batch(STEP1), algo, 1, states=straight)
    expected = compute_advantages(_batch(STEP2), algo, 2, states=straight)

    before = shaper_states(algo)
    compute_advantages(_batch(STEP1), algo, 1, states=before)
    torch.save({name: s.state_dict() for name, s in before.items()}, tmp_path / "state.pt")
    resumed = shaper_states(algo)
    for name, s in resumed.items():
        s.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True)[name])
    again = compute_advantages(_batch(STEP2), algo, 2, states=resumed)
    torch.testing.assert_close(again.advantages, expected.advantages)
    assert resumed["outcome_bonus"].counts == straight["outcome_bonus"].counts


def test_without_the_loops_state_or_outcomes_it_says_what_is_missing():
    algo = _algo()
    with pytest.raises(MissingInputError, match="explorl train"):
        compute_advantages(_batch(STEP1), algo, 1)  # an engine that keeps no state
    plain = RolloutBatch(mask=torch.ones(6, 4), rewards=torch.zeros(6), group=GROUP)
    with pytest.raises(MissingInputError, match=r"\['outcomes', 'correct'\]"):
        compute_advantages(plain, algo, 1, states=shaper_states(algo))


def test_the_registry_asks_for_outcomes():
    assert requirements(_algo()).outcomes and not requirements(load_config(None, []).algo).outcomes
    assert shaper_states(load_config(None, []).algo) == {}


@pytest.mark.parametrize("override, field", [
    ("algo.outcome_bonus.baseline=median", "algo.outcome_bonus.baseline"),
    ("algo.outcome_bonus.historical=-1", "algo.outcome_bonus"),
    ("algo.outcome_bonus.max_outcomes=0", "algo.outcome_bonus.max_outcomes"),
])
def test_bad_options_are_refused_by_field(override, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        _algo(override)


def _steps(run_dir):
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in records if "reward/mean" in r]


def test_the_recipe_trains_on_the_embedded_model_and_logs_the_bonus(tmp_path):
    cfg = load_config(RECIPE, [f"run.out_dir={tmp_path / 'run'}", "run.steps=2", "run.batch_size=4",
                               "sampling.group_size=4", "sampling.max_new_tokens=48", "task.eval_size=4",
                               "run.eval_n=2", "run.eval_k=[1,2]", "run.eval_every=0", "run.save_every=0"])
    assert cfg.model.path == "embedded" and cfg.algo.shapers == ["outcome_bonus"]
    steps = _steps(train(cfg, progress=False))
    assert [r["step"] for r in steps] == [1, 2]
    assert all({"outcome/bonus_mean", "outcome/new_frac", "outcome/pairs"} <= set(r) for r in steps)
    assert steps[0]["outcome/new_frac"] == 1.0  # nothing seen before the first step
    assert steps[1]["outcome/pairs"] > 0


def _cfg(model_dir, out_dir):
    # the last character is the answer, so a random tiny model's responses have outcomes that differ and repeat
    return load_config(None, [
        f"model.path={model_dir}", f"run.out_dir={out_dir}", "run.steps=4", "run.batch_size=3",
        "sampling.group_size=4", "sampling.max_new_tokens=12", "task.eval_size=4", "task.train_size=6",
        "task.difficulties=[1]", "run.eval_n=2", "run.eval_k=[1,2]", "optim.lr=1e-3", "run.save_every=2",
        "run.log_samples=1", "task.reward=rewards_for_tests:contains_digit", "task.answer_pattern=(.)",
        "algo.shapers=[outcome_bonus]", "algo.outcome_bonus.batch=1.0"])


def test_resume_reaches_the_same_run(tiny_model_dir, tmp_path, monkeypatch):
    full = _steps(train(_cfg(tiny_model_dir, tmp_path / "full"), progress=False))
    assert full[-1]["outcome/pairs"] > 0 and any(r["outcome/new_frac"] < 1 for r in full[1:])  # repeats were seen
    train_killed_at(monkeypatch, _cfg(tiny_model_dir, tmp_path / "killed"), 3)  # after step 2's checkpoint
    state = torch.load(tmp_path / "killed" / "checkpoints" / "step_0000002" / "trainer_state.pt", weights_only=True)
    assert int(state["shaper_states"]["outcome_bonus"]["counts"].sum()) > 0
    resumed = train(load_config(tmp_path / "killed" / "config.yaml"), resume=tmp_path / "killed", progress=False)
    assert full == _steps(resumed)


def test_trls_config_takes_it():
    """TRL's trainer runs it with an explorl task's reward (tests/integrations/test_trl.py: equal to explorl's step;
    refused by name without a TaskReward), so its config check lets it through."""
    trl = pytest.importorskip("trl")
    from explorl.integrations.trl.config import explorl_config

    args = trl.GRPOConfig(output_dir="unused", num_generations=4, per_device_train_batch_size=4, use_cpu=True,
                          bf16=False, report_to=[])
    assert explorl_config(args, algo={"shapers": ["outcome_bonus"]}).algo.shapers == ["outcome_bonus"]


def test_verl_refuses_it_naming_the_field():
    pytest.importorskip("verl", reason="verl is installed in .venv-verl only: run `make test-verl`")
    from explorl.integrations.verl.adapters import algo_config
    from explorl.integrations.verl.launch import refuse_loop_only

    with pytest.raises(ConfigError, match=r"algorithm\.explorl\.shapers: shaper 'outcome_bonus' .*explorl train"):
        algo_config({"shapers": ["outcome_bonus"]})
    with pytest.raises(ConfigError, match=r"algo\.shapers: shaper 'outcome_bonus' .*explorl train"):
        refuse_loop_only(load_config(RECIPE))


def test_the_public_functions_defaults_are_the_options():
    import inspect

    o, params = OutcomeBonusOptions(), inspect.signature(exploration_advantage).parameters
    assert (params["baseline"].default, params["constant"].default) == (o.baseline, o.constant)
    assert inspect.signature(outcome_term).parameters["options"].default == o
