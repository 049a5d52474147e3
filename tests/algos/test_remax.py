"""ReMax (`algo.advantage: remax`, docs/methods.md §5n): hand-derived values, the registry's greedy-baseline need, and
explorl's loop sampling and scoring each prompt's greedy response as the baseline."""

from __future__ import annotations

import pytest
import torch

from explorl.algos.batch import MissingInputError, RolloutBatch
from explorl.algos.methods.remax import remax
from explorl.algos.registry import lookup
from explorl.algos.step import compute_advantages, requirements
from explorl.config import load_config


def test_hand_derived_values_with_padding():
    # rewards 1, 0, 1 against their prompts' greedy rewards 0, 0, 1: 1 - 0 = 1, 0 - 0 = 0, 1 - 1 = 0; with a
    # continuous baseline 0.25: 0.75, -0.25; no normalisation, no group statistic
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=torch.float32)
    got = remax(torch.tensor([1.0, 0.0, 1.0]), torch.tensor([0.0, 0.0, 1.0]), mask)
    assert torch.equal(got, torch.tensor([1.0, 0.0, 0.0])[:, None] * mask)
    got = remax(torch.tensor([1.0, 0.0]), torch.tensor([0.25, 0.25]), torch.ones(2, 2))
    assert torch.equal(got, torch.tensor([[0.75, 0.75], [-0.25, -0.25]]))
    with pytest.raises(ValueError, match="baseline_rewards"):
        remax(torch.zeros(2), torch.zeros(3), torch.ones(2, 2))


def test_the_registry_asks_for_the_greedy_baseline_and_the_step_refuses_a_batch_without_it():
    cfg = load_config(None, ["algo.advantage=remax"]).algo
    assert lookup("estimator", "remax").needs_greedy_baseline and requirements(cfg).greedy_baseline
    assert not requirements(load_config(None, []).algo).greedy_baseline
    batch = RolloutBatch(mask=torch.ones(2, 2), rewards=torch.tensor([1.0, 0.0]), group=torch.tensor([0, 0]))
    with pytest.raises(MissingInputError, match="baseline_rewards"):
        compute_advantages(batch, cfg, step=1)
    got = compute_advantages(batch.replace(baseline_rewards=torch.tensor([0.5, 0.5])), cfg, step=1).advantages
    assert torch.equal(got, torch.tensor([[0.5, 0.5], [-0.5, -0.5]]))


def test_the_loop_scores_each_prompts_greedy_response_as_its_baseline(tiny_model, char_tokenizer):
    """`collect_rollouts` with `greedy_baseline`: each row's baseline is the reward of its prompt's greedy response
    (temperature 0, so any generator draws it), scored by the run's reward functions; the rollouts themselves are
    the ones sampled without it (the greedy responses are sampled after them), and the counts include both."""
    from explorl.rollout.collect import BoundTask, collect_rollouts
    from explorl.rollout.controllers import PromptStream
    from explorl.rollout.engines.native import decode_responses
    from explorl.rollout.sampler import Sampler
    from explorl.rollout.schedule import ScheduleDriver
    from explorl.tasks import load_task

    cfg = load_config(None, ["algo.advantage=remax", "sampling.group_size=3", "task.train_size=8",
                             "task.eval_size=2", "sampling.max_new_tokens=6"])
    task = load_task(cfg.task)
    runner = task.reward_runner(5.0)
    sampler = Sampler(tiny_model, char_tokenizer.eos_token_id, char_tokenizer.pad_token_id, 6)
    bound = BoundTask(char_tokenizer, task, runner)

    def collect(greedy: bool):
        driver = ScheduleDriver(cfg, tiny_model.config.vocab_size, len(task.train))
        return collect_rollouts(sampler, bound, PromptStream(len(task.train), 0), driver, batch_size=2, step=0,
                                generator=torch.Generator().manual_seed(3), greedy_baseline=greedy)

    got, plain = collect(True), collect(False)
    assert plain.batch.baseline_rewards is None and "reward/greedy_baseline" not in plain.stats
    assert torch.equal(got.batch.response_ids, plain.batch.response_ids) and got.rewards == plain.rewards
    assert got.scored == plain.scored + 2  # one greedy response per prompt
    prompts = [bound.prompt_ids(p) for p in got.problems]
    greedy = sampler.sample_fixed(prompts, 1, 0.0, torch.Generator().manual_seed(99))
    texts = decode_responses(char_tokenizer, greedy)
    want = runner(texts, [p.answer for p in got.problems], [p.meta for p in got.problems]).rewards
    assert got.batch.baseline_rewards.tolist() == [want[g] for g in got.batch.group.tolist()]
    assert got.stats["reward/greedy_baseline"] == pytest.approx(sum(want) / len(want))
