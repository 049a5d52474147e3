"""One step's batch of rollouts: prompts from the stream, each round planned by the schedule driver (budgets and
temperatures), sampled, scored, and the budget policy's choice of which groups train (DAPO's dynamic sampling draws
more rounds). Stages 1 and 2 of the step's `RolloutBatch`: the sampler's fields and the rewards."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from explorl.algos.batch import RolloutBatch
from explorl.metrics import vote_keys
from explorl.rollout.budget_policies import Drawn
from explorl.rollout.controllers import PromptStream
from explorl.rollout.engines.native import decode_responses
from explorl.rollout.sampler import Sampler
from explorl.rollout.schedule import ScheduleDriver


@dataclass
class Collected:
    """A step's scored batch and what scoring it found. `problems[g]` is the problem of group g of `batch`."""

    problems: list
    batch: RolloutBatch
    """The sampled and scored responses (`RolloutBatch` stages 1 and 2: `rewards` float32)."""
    texts: list[str]
    """Per response: its decoded text."""
    rewards: list[float]
    """Per response: the reward as the reward functions returned it (the samples log writes these exactly)."""
    train_temperature: float
    """Temperature of the optimised policy for this batch (the schedule's training temperature)."""
    errors: int
    """Reward-function failures (scored 0)."""
    timeouts: int
    """Reward-function timeouts (scored 0)."""
    stats: dict = field(default_factory=dict)
    """The schedule's and budget policy's metrics, and with several reward functions each one's mean over the
    batch, `reward/<name>`."""
    failures: list = field(default_factory=list)
    """The reward failures and timeouts of every round (`rewards.RewardFailure`; `index` counts the samples
    scored this step, all rounds in order)."""
    scored: int = 0
    """Samples scored this step, over all rounds (DAPO's dropped groups included): what `errors` and `timeouts`
    are counted out of."""
    correct: list[bool] = field(default_factory=list)
    """Per response of `rollouts`: correct by the task's rule (`Task.correct`: one reward entry and a threshold)."""


@dataclass(frozen=True)
class BoundTask:
    """A task bound to a run: its problems (`task`, an `explorl.tasks.Task`), the tokenizer that decodes the
    responses, the reward workers that score them (`runner`, `Task.reward_runner`) and `encode(problem)`, the
    prompt's token ids (`tasks.chat.prompt_encoder`; None: the prompt text as it is)."""

    tok: Any
    task: Any
    runner: Any
    encode: Callable | None = None

    def prompt_ids(self, problem) -> list[int]:
        if self.encode is not None:
            return self.encode(problem)
        return self.tok.encode(problem.prompt, add_special_tokens=False)


def _greedy_rewards(sampler: Sampler, bound: BoundTask, problems: list, prompt_ids: list, generator):
    """Each prompt's greedy response (temperature 0), scored by the run's reward functions: (its reward per prompt,
    the `RewardResult`). ReMax's baseline (`RolloutBatch.baseline_rewards`); not trained on."""
    ro = sampler.sample_fixed(prompt_ids, 1, 0.0, generator)
    group = ro.group.tolist()
    rr = bound.runner(decode_responses(bound.tok, ro), [problems[g].answer for g in group],
                      [problems[g].meta for g in group])
    by_prompt = [0.0] * len(problems)
    for i, g in enumerate(group):
        by_prompt[g] = rr.rewards[i]
    return by_prompt, rr


def _draw_round(sampler: Sampler, tok, problems: list, prompt_ids: list, plan, generator: torch.Generator,
                score: Callable) -> Drawn:
    """The round as planned: `plan.rollouts[j]` responses to prompt j, one group per prompt, scored (`score(texts,
    problems per row) -> (RewardResult, correct per row)`). A budget policy with `draw` (FR3E) replaces it."""
    ro = sampler.sample(prompt_ids, plan, generator)
    texts = decode_responses(tok, ro)
    rr, correct = score(texts, [problems[g] for g in ro.group.tolist()])
    return Drawn(ro, texts, rr, correct, list(problems), [int(i) for i in plan.prompt_ids])


def collect_rollouts(sampler: Sampler, bound: BoundTask, stream: PromptStream, driver: ScheduleDriver, *,
                     batch_size: int, step: int, generator: torch.Generator,
                     greedy_baseline: bool = False) -> Collected:
    """Sample and score `batch_size` prompts' groups of `bound`'s training problems at 0-based training step
    `step`, which this begins on the schedule `driver` (the caller ends it once the batch's entropy is known).
    `sampler`: the run's, built once (explorl's decoder or the vLLM engine), given each round's plan. With
    `greedy_baseline` each round's prompts get their greedy response scored too (`_greedy_rewards`: ReMax)."""
    tok, task, runner = bound.tok, bound.task, bound.runner
    temps = driver.begin(step)
    stats = dict(temps.stats)
    budget = driver.budget
    problems: list = []
    parts, texts, rewards, correct, baselines = [], [], [], [], []
    errors = timeouts = rounds = sampled_groups = scored = 0
    failures: list = []
    by_function: dict[str, list[float]] = {}  # several reward functions: each one's scores of the kept rows

    def account(rr) -> None:  # a scoring's failures and counts, indexed over everything scored this step
        nonlocal errors, timeouts, scored, failures
        errors, timeouts = errors + rr.errors, timeouts + rr.timeouts
        for f in rr.failures:
            f.index += scored
        failures += rr.failures
        scored += len(rr.rewards)

    def score(texts: list[str], row_problems: list):  # the run's reward functions: (result, correct per row)
        rr = runner(texts, [p.answer for p in row_problems], [p.meta for p in row_problems])
        account(rr)
        return rr, task.correct(rr)

    draw = getattr(budget, "draw", None) or _draw_round  # a policy that branches (FR3E) draws its rounds itself
    while True:
        epoch = stream.epoch
        ids = stream.next(batch_size - len(problems))
        plan = driver.plan(ids, new_pass=stream.epoch != epoch)
        round_problems = [task.train[i] for i in ids]
        prompt_ids = [bound.prompt_ids(p) for p in round_problems]
        drawn = draw(sampler, tok, round_problems, prompt_ids, plan, generator, score)
        ro, round_texts, rr, round_correct = drawn.batch, drawn.texts, drawn.scored, drawn.correct
        group = ro.group.tolist()
        if greedy_baseline:
            greedy, greedy_rr = _greedy_rewards(sampler, bound, round_problems, prompt_ids, generator)
            account(greedy_rr)
        per_prompt = [[rr.rewards[i] for i, g in enumerate(group) if g == j]  # per group (a prompt, an FR3E state)
                      for j in range(len(drawn.problems))]
        driver.observe_rewards(drawn.prompt_ids, per_prompt)
        sampled_groups += len(drawn.problems)
        keep = budget.keep(per_prompt, batch_size - len(problems))
        last_round = rounds >= budget.extra_rounds
        if not keep and last_round and not problems:
            keep = [j for j in range(len(drawn.problems)) if per_prompt[j]]  # nothing informative: train on it all
        new_id = {j: len(problems) + i for i, j in enumerate(keep)}
        rows = [i for i, g in enumerate(group) if g in new_id]
        part = ro.select(torch.tensor(rows, dtype=torch.long, device=ro.group.device))
        parts.append(part.replace(group=torch.tensor([new_id[g] for g in part.group.tolist()], dtype=torch.long,
                                                     device=ro.group.device)))
        problems += [drawn.problems[j] for j in keep]
        texts += [round_texts[i] for i in rows]
        rewards += [rr.rewards[i] for i in rows]
        baselines += [greedy[group[i]] for i in rows] if greedy_baseline else []
        correct += [round_correct[i] for i in rows]
        for name, scores in rr.by_function.items():
            by_function.setdefault(name, []).extend(scores[i] for i in rows)
        if len(problems) >= batch_size or last_round:
            break
        rounds += 1
    batch = parts[0] if len(parts) == 1 else RolloutBatch.cat(parts, tok.pad_token_id)
    batch = batch.replace(rewards=torch.tensor(rewards, dtype=torch.float32, device=batch.mask.device))
    if by_function:  # several reward functions: each one's scores, for estimators that take them apart (GDPO)
        weights = {part.name: part.weight for part in bound.runner.fn.parts}
        batch = batch.replace(reward_components=torch.tensor(list(by_function.values()), dtype=torch.float32,
                                                             device=batch.mask.device).T,
                              reward_weights=tuple(float(weights[name]) for name in by_function))
    if greedy_baseline:
        batch = batch.replace(baseline_rewards=torch.tensor(baselines, dtype=torch.float32, device=batch.mask.device))
        stats["reward/greedy_baseline"] = sum(baselines) / max(len(baselines), 1)
    stats.update(driver.rollout_stats(batch))
    stats.update(budget.stats(rounds, len(problems) / max(sampled_groups, 1)))
    stats.update({f"reward/{name}": sum(v) / max(len(v), 1) for name, v in by_function.items()})
    return Collected(problems, batch, texts, rewards, temps.train, errors, timeouts, stats, failures, scored, correct)


def outcome_keys_of(prompts: Sequence[str], texts: Sequence[str], correct: Sequence[bool],
                    extract_answer: Callable[[str], str | None]) -> list[int]:
    """Per response (its question's `prompt`, its `text`, whether it is `correct`), a 63-bit hash of the prompt and
    its final answer (`extract_answer`, the task's), equivalent answers pooled as maj@k pools them
    (`metrics.vote_keys`: every correct answer one outcome); -1 where no answer was extracted."""
    def key(prompt: str, vote: str | None) -> int:
        if vote is None:
            return -1
        return int.from_bytes(hashlib.blake2b(f"{prompt}\x00{vote}".encode(), digest_size=8).digest(), "big") >> 1

    votes = vote_keys([extract_answer(t) for t in texts], list(correct))
    return [key(p, v) for p, v in zip(prompts, votes)]


def outcome_keys(got: Collected, extract_answer: Callable[[str], str | None]) -> torch.Tensor:
    """`RolloutBatch.outcomes` of a scored batch (`outcome_keys_of` of each response's problem prompt): `[N]` int64
    on the batch's device."""
    prompts = [got.problems[g].prompt for g in got.batch.group.tolist()]
    keys = outcome_keys_of(prompts, got.texts, got.correct, extract_answer)
    return torch.tensor(keys, dtype=torch.long, device=got.batch.mask.device)
