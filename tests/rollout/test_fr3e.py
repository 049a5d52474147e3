"""FR3E's branching rollouts (`explorl.rollout.fr3e`, docs/methods.md §5ad): anchors, base picks and the advantage
modulation against hand-derived values; the round it draws on a tiny model (prefixes are the base response up to the
anchor, continuations start there, one group per state); a short run of the recipe; the engines' refusals."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from explorl.algos.batch import RolloutBatch
from explorl.algos.step import compute_advantages
from explorl.config import ConfigError, load_config
from explorl.rollout.fr3e import modulation, pick_bases, select_anchors, state_values
from explorl.rollout.sampler import Sampler
from explorl.rollout.schedule import ScheduleDriver
from explorl.train.loop import train

RECIPE = Path(__file__).resolve().parents[2] / "configs" / "recipes" / "fr3e.yaml"


def test_anchors_are_the_top_k_entropies_in_position_order():
    # entropies by position 0..6; K = 3: the largest are 0.9 (positions 1 and 3, a tie kept in position order)
    # and 0.5 (position 5); returned ascending
    assert select_anchors([0.1, 0.9, 0.3, 0.9, 0.2, 0.5, 0.05], 3) == [1, 3, 5]
    # a tie at the cut-off goes to the earlier position: 0.7 at 0 and 2, K = 2 -> 4 (0.8) and 0
    assert select_anchors([0.7, 0.1, 0.7, 0.2, 0.8], 2) == [0, 4]
    # a response of at most K tokens gets one anchor (the authors' rule), its top position
    assert select_anchors([0.2, 0.7], 4) == [1] and select_anchors([0.2, 0.7, 0.1, 0.3], 4) == [1]
    assert select_anchors([], 4) == [] and select_anchors([0.3, 0.1], 0) == []


def test_bases_are_the_first_correct_and_wrong_responses():
    # correct by position: F T F T T; one of each -> the first wrong (0) and the first correct (1)
    assert pick_bases([False, True, False, True, True], 1, 1) == [0, 1]
    assert pick_bases([True, True, False, True], 2, 1) == [0, 1, 2]
    assert pick_bases([True, True, True, True], 1, 1) == [0]  # all correct: one base


def test_state_values_are_each_states_correct_share():
    # state 0: 1 of 2 correct, state 1: 2 of 2, state 2: 0 of 1
    assert state_values([True, False, True, True, False], [0, 0, 1, 1, 2], 3) == [0.5, 1.0, 0.0]


def test_modulation_hand_values():
    # V = (0.5, 0.75, 0.25): delta_0 = 1 - 0.5 = 0.5, delta_1 = 0.75 - 0.5 = 0.25, delta_2 = 0.25 - 0.75 = -0.5;
    # alpha = exp(-delta) = (0.606531, 0.778801, 1.648721): the state that raised V is damped, the one that
    # lowered it amplified
    got = modulation([0.5, 0.75, 0.25])
    assert got == pytest.approx([0.6065307, 0.7788008, 1.6487213], abs=1e-6)
    # sharpened with a = 1.5: |delta|^1.5 = (0.353553, 0.125, 0.353553), sum 0.832107, so the deltas become
    # (0.424889, 0.150221, -0.424889) and alpha = (0.653842, 0.860518, 1.529421)
    assert modulation([0.5, 0.75, 0.25], sharpen=1.5) == pytest.approx([0.653842, 0.860518, 1.529421], abs=1e-6)
    # a single state that is always solved: delta_0 = 0, alpha 1; all deltas 0 stay 0 when sharpened
    assert modulation([1.0]) == [1.0] and modulation([1.0, 1.0], sharpen=1.5) == [1.0, 1.0]
    assert modulation([]) == []


def test_the_modulation_multiplies_the_estimators_advantages():
    # two states of two responses, rewards (1, 0) and (1, 1); dr_grpo: (0.5, -0.5) and (0, 0); alpha (2, 2, 0.5, 0.5)
    batch = RolloutBatch(mask=torch.ones(4, 3), rewards=torch.tensor([1.0, 0.0, 1.0, 1.0]),
                         group=torch.tensor([0, 0, 1, 1]), advantage_scale=torch.tensor([2.0, 2.0, 0.5, 0.5]))
    out = compute_advantages(batch, load_config(None, ["algo.advantage=dr_grpo"]).algo, 1)
    assert out.base_advantages[:, 0].tolist() == [0.5, -0.5, 0.0, 0.0]
    assert out.advantages[:, 0].tolist() == [1.0, -1.0, 0.0, 0.0]
    assert out.select(torch.tensor([1, 2])).advantage_scale.tolist() == [2.0, 0.5]


def _round(tiny_model, tok, overrides, seed=0):
    cfg = load_config(None, ["budget.policy=fr3e", "sampling.max_new_tokens=6", "sampling.group_size=3", *overrides])
    driver = ScheduleDriver(cfg, vocab_size=98, num_prompts=2)
    driver.begin(0)
    plan = driver.plan([0, 1])
    sampler = Sampler(tiny_model, tok.eos_token_id, tok.pad_token_id, 6)
    prompts = [tok.encode("12+7=", add_special_tokens=False), tok.encode("3+4=", add_special_tokens=False)]
    problems = [SimpleNamespace(name="p0"), SimpleNamespace(name="p1")]
    scored = []

    def score(texts, row_problems):  # correct: the text holds a digit
        rewards = [1.0 if any(ch.isdigit() for ch in t) else 0.0 for t in texts]
        scored.append((texts, [p.name for p in row_problems]))
        return SimpleNamespace(rewards=rewards), [r > 0.5 for r in rewards]

    drawn = driver.budget.draw(sampler, tok, problems, prompts, plan, torch.Generator().manual_seed(seed), score)
    base = sampler.sample(prompts, plan, torch.Generator().manual_seed(seed))  # the same first draw
    return driver.budget, drawn, base, prompts, scored


def test_a_round_continues_the_base_response_from_each_anchor(tiny_model, char_tokenizer):
    tok = char_tokenizer
    policy, drawn, base, prompts, scored = _round(tiny_model, tok, ["budget.fr3e.base_rollouts=2",
                                                                    "budget.fr3e.anchors=2"])
    base_texts, _ = scored[0]
    correct = [any(ch.isdigit() for ch in t) for t in base_texts]
    # the states, rebuilt by hand from the same base draw: per prompt the first correct and first wrong response;
    # on each, S_0 (the prompt alone) and the prompt plus the response up to (not including) each anchor
    expected, anchors = [], 0  # (prompt, base number, prefix) per state
    for j in range(2):
        rows = [i for i in range(len(correct)) if int(base.group[i]) == j]
        for i in [rows[k] for k in pick_bases([correct[i] for i in rows], 1, 1)]:
            n = int(base.lengths[i])
            response = base.response_ids[i, :n].tolist()
            cuts = select_anchors(base.behavior_entropy[i, :n].tolist(), 2)
            anchors += len(cuts)
            b = len({(e[0], e[1]) for e in expected})
            expected += [(j, b, response[:a]) for a in [0] + cuts]
    batch = drawn.batch
    assert batch.group.max().item() + 1 == len(expected) == len(drawn.problems) == len(drawn.prompt_ids)
    assert batch.group.bincount().tolist() == [3] * len(expected)  # M = sampling.group_size continuations a state
    for r in range(batch.mask.shape[0]):
        j, _, prefix = expected[int(batch.group[r])]
        prompt_row = batch.prompt_ids[r][batch.prompt_mask[r].bool()].tolist()
        assert prompt_row == prompts[j] + prefix  # the prefix tokens are the base response's, in the prompt
        n = int(batch.lengths[r])
        assert batch.mask[r].tolist() == [1.0] * n + [0.0] * (batch.mask.shape[1] - n)  # loss on the suffix only
        continuation = batch.response_ids[r, :n].tolist()
        ids = prefix + (continuation[:-1] if continuation[-1] == tok.eos_token_id else continuation)
        assert drawn.texts[r] == tok.decode(ids, skip_special_tokens=True)  # scored as prefix + continuation
    assert [p.name for p in drawn.problems] == [f"p{j}" for j, _, _ in expected]
    # alpha_j per state: `modulation` of the states' correct shares, base by base, states in order
    values = state_values(drawn.correct, batch.group.tolist(), len(expected))
    alpha = []
    for b in sorted({e[1] for e in expected}):
        alpha += modulation([v for v, e in zip(values, expected) if e[1] == b])
    assert batch.advantage_scale.tolist() == pytest.approx([alpha[g] for g in batch.group.tolist()])
    assert policy.last["fr3e/states"] == len(expected)
    assert policy.last["fr3e/anchors_per_prompt"] == anchors / 2
    # the anchors' states: every state but the first of its base (S_0)
    anchor_values = [v for v, e, prev in zip(values, expected, [None] + expected) if prev and prev[1] == e[1]]
    assert policy.last["fr3e/anchor_value_mean"] == pytest.approx(sum(anchor_values) / len(anchor_values))


def test_without_restart_the_states_are_the_anchors_only(tiny_model, char_tokenizer):
    policy, drawn, base, prompts, _ = _round(tiny_model, char_tokenizer, [
        "budget.fr3e.base_rollouts=1", "budget.fr3e.anchors=1", "budget.fr3e.restart=false",
        "budget.fr3e.continuations=2"])
    # one base per prompt, one anchor each: two states of two continuations
    assert drawn.batch.group.tolist() == [0, 0, 1, 1]
    for j in range(2):
        n = int(base.lengths[j])
        (a,) = select_anchors(base.behavior_entropy[j, :n].tolist(), 1)
        row = 2 * j
        got = drawn.batch.prompt_ids[row][drawn.batch.prompt_mask[row].bool()].tolist()
        assert got == prompts[j] + base.response_ids[j, :a].tolist()
    assert policy.last["fr3e/anchors_per_prompt"] == 1.0 and policy.last["fr3e/bases_per_prompt"] == 1.0


def test_the_recipe_trains_and_logs_fr3es_statistics(tiny_model_dir, tmp_path):
    cfg = load_config(RECIPE, [
        f"model.path={tiny_model_dir}", f"run.out_dir={tmp_path / 'run'}", "run.steps=3", "run.batch_size=2",
        "sampling.max_new_tokens=8", "sampling.group_size=3", "budget.fr3e.anchors=2", "task.train_size=4",
        "task.eval_size=2", "task.difficulties=[1]", "run.eval_n=1", "run.eval_k=[1]", "run.eval_every=0",
        "run.save_every=0", "task.reward=rewards_for_tests:contains_digit"])
    run = train(cfg, progress=False)
    steps = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if "reward/mean" in x]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:
        assert {"fr3e/anchors_per_prompt", "fr3e/value_mean", "fr3e/alpha_mean", "fr3e/kept_states_frac",
                "fr3e/bases_per_prompt"} <= set(r)
        assert 0 < r["fr3e/anchors_per_prompt"] <= 2 * 2 and 0.0 <= r["fr3e/value_mean"] <= 1.0
        assert math.isfinite(r["fr3e/alpha_mean"]) and r["loss/nonfinite"] == 0


@pytest.mark.parametrize("overrides, field", [
    (["budget.fr3e.anchors=0", "budget.fr3e.restart=false"], "budget.fr3e.anchors"),
    (["budget.fr3e.max_wrong_bases=0"], "budget.fr3e"),
    (["budget.fr3e.sharpen=0"], "budget.fr3e.sharpen"),
    (["algo.advantage=remax"], "greedy"),
    (["sampling.engine=vllm"], "sampling.engine=vllm: budget.policy=fr3e.*sampling.engine=explorl"),
])
def test_settings_fr3e_cannot_run_are_refused(overrides, field):
    with pytest.raises(ConfigError, match=field):
        load_config(RECIPE, overrides)


def test_trl_refuses_fr3e_by_its_registry_flag():
    pytest.importorskip("trl")
    from trl import GRPOConfig

    from explorl.integrations.trl.config import explorl_config

    args = GRPOConfig(output_dir="unused", use_cpu=True, num_generations=8, per_device_train_batch_size=8,
                      max_completion_length=64, report_to=[])
    with pytest.raises(ConfigError, match=r"budget.policy=fr3e: .*explorl train"):
        explorl_config(args, {}, {"max_new_tokens": 64, "group_size": 8}, {"policy": "fr3e"})


def test_verl_refuses_fr3e_by_its_registry_flag(tmp_path):
    pytest.importorskip("verl", reason="verl is installed in .venv-verl only: run `make test-verl`")
    from explorl.integrations.verl.launch import prepare
    from explorl.integrations.verl.rollout import rollout_config

    with pytest.raises(ConfigError, match=r"budget.policy=fr3e: .*explorl train"):
        prepare(RECIPE, [f"run.out_dir={tmp_path / 'run'}"], write=False, run_dir=False)
    with pytest.raises(ConfigError, match=r"algorithm.explorl.budget.policy=fr3e"):
        rollout_config({"budget": {"policy": "fr3e"}}, temperature=1.0, group_size=8, max_new_tokens=32, top_p=1.0,
                       total_steps=2)
