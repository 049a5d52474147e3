"""`RolloutBatch` (algos/batch.py): stacking the rounds of a step, moving it, and the fields a loss reads."""

from __future__ import annotations

import pytest
import torch

from explorl.algos.batch import RolloutBatch


def _part(prompt: list[list[int]], response: list[list[int]], group: list[int]) -> RolloutBatch:
    """A sampled batch: prompts left-padded with 0, responses right-padded with 9 (the pad id), mask 1 on tokens."""
    p, t = max(map(len, prompt)), max(map(len, response))
    ids = torch.tensor([[0] * (p - len(x)) + x for x in prompt])
    pmask = torch.tensor([[0] * (p - len(x)) + [1] * len(x) for x in prompt])
    resp = torch.tensor([x + [9] * (t - len(x)) for x in response])
    mask = torch.tensor([[1.0] * len(x) + [0.0] * (t - len(x)) for x in response])
    return RolloutBatch(mask=mask, rewards=None, group=torch.tensor(group), max_response_len=4, prompt_ids=ids,
                        prompt_mask=pmask, response_ids=resp, behavior_logprobs=-mask, temperatures=mask * 0.7)


def test_cat_repads_prompts_left_and_responses_right_and_keeps_what_no_part_has():
    a = _part([[5, 6]], [[1, 2, 3]], [0])
    b = _part([[7, 8, 4], [3]], [[2], [4, 4]], [1, 1])
    got = RolloutBatch.cat([a, b], pad_token_id=9)
    # prompts to width 3 on the left (pad id 9 where a part's own padding was 0, mask 0); responses to length 3
    assert got.prompt_ids.tolist() == [[9, 5, 6], [7, 8, 4], [0, 0, 3]]
    assert got.prompt_mask.tolist() == [[0, 1, 1], [1, 1, 1], [0, 0, 1]]
    assert got.response_ids.tolist() == [[1, 2, 3], [2, 9, 9], [4, 4, 9]]
    assert got.mask.tolist() == [[1, 1, 1], [1, 0, 0], [1, 1, 0]]
    assert torch.equal(got.behavior_logprobs, -got.mask) and torch.equal(got.temperatures, got.mask * 0.7)
    assert got.group.tolist() == [0, 1, 1] and got.lengths.tolist() == [3, 1, 2]
    assert got.rewards is None and got.logprobs is None and got.max_response_len == 4
    with pytest.raises(ValueError, match="rewards is None in some parts"):
        RolloutBatch.cat([a.replace(rewards=torch.ones(1)), b], pad_token_id=9)


def test_select_cuts_rows_and_response_columns_but_not_prompts_or_stats():
    batch = _part([[5, 6], [3]], [[1, 2, 3], [4]], [0, 0]).replace(stats={"tokens/masked_frac": 0.5})
    micro = batch.select(torch.tensor([1]), width=1)
    assert micro.response_ids.tolist() == [[4]] and micro.prompt_ids.tolist() == [[0, 3]]
    assert micro.stats == {"tokens/masked_frac": 0.5} and micro.group.tolist() == [0]


def test_for_loss_fills_what_policy_objective_reads():
    mask, adv, old = torch.ones(2, 3), torch.randn(2, 3), -torch.rand(2, 3)
    batch = RolloutBatch.for_loss(mask, adv, logprobs=old, max_response_len=3)
    assert batch.loss_mask is mask and batch.advantages is adv and batch.logprobs is old
    assert batch.rewards.tolist() == [0.0, 0.0] and batch.is_weights is None and batch.max_response_len == 3
    assert batch.to("cpu").advantages.requires_grad is False


def test_reward_components_follow_their_rows_and_their_weights_stay_whole():
    # rows 0..2 with two reward functions' scores; select keeps rows 2 and 0, cat stacks two parts' rows
    comps = torch.tensor([[1.0, 0.1], [0.0, 0.2], [1.0, 0.3]])
    batch = RolloutBatch(mask=torch.ones(3, 2), rewards=comps @ torch.tensor([1.0, 3.0]), group=torch.tensor([0, 0, 1]),
                         reward_components=comps, reward_weights=(1.0, 3.0))
    picked = batch.select(torch.tensor([2, 0]), width=1)
    assert torch.equal(picked.reward_components, comps[[2, 0]]) and picked.reward_weights == (1.0, 3.0)
    a = _part([[5]], [[7, 1]], [0]).replace(rewards=torch.tensor([1.0]), reward_components=torch.tensor([[1.0, 0.0]]),
                                            reward_weights=(1.0, 3.0))
    b = _part([[6]], [[8, 1]], [1]).replace(rewards=torch.tensor([3.0]), reward_components=torch.tensor([[0.0, 1.0]]),
                                            reward_weights=(1.0, 3.0))
    both = RolloutBatch.cat([a, b], pad_token_id=0)
    assert both.reward_components.tolist() == [[1.0, 0.0], [0.0, 1.0]] and both.reward_weights == (1.0, 3.0)
    with pytest.raises(ValueError, match="different reward_weights"):
        RolloutBatch.cat([a, b.replace(reward_weights=(1.0, 2.0))], pad_token_id=0)
    with pytest.raises(ValueError, match=r"reward_components: expected shape \[N, K\] = \(3, 1\)"):
        RolloutBatch(mask=torch.ones(3, 2), rewards=None, group=torch.tensor([0, 0, 1]), reward_components=comps,
                     reward_weights=(1.0,))
