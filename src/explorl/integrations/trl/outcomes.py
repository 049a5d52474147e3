"""The outcome-based exploration bonus's inputs in TRL's trainer (`algo.shapers: [outcome_bonus]`, docs/methods.md
§5ac): each response's outcome (its question and final answer, the task's `extract_answer`, equivalent answers
pooled as explorl's loop pools them: `rollout.collect.outcome_keys_of`) and its correctness by the task's rule, from
the `TaskReward` among the trainer's reward functions, gathered from every process. The counts of outcomes seen
across steps are the shaper's state, kept in TRL's checkpoints (`round_state`)."""

from __future__ import annotations

import torch
from torch import Tensor

from explorl.config import ConfigError
from explorl.integrations.trl.batch import gather_rows
from explorl.integrations.trl.run import TaskReward
from explorl.rollout.collect import outcome_keys_of

__all__ = ["check_outcomes", "outcome_parts", "reads_verdicts"]


def _task_reward(reward_funcs) -> TaskReward | None:
    funcs = reward_funcs if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    return next((fn for fn in funcs if isinstance(fn, TaskReward)), None)


def reads_verdicts(needs) -> bool:
    """Whether the method reads each response's final answer (`needs.outcomes`: the outcome bonus) or correctness by
    the task's rule (`needs.topk`: SimKO), which a `TaskReward` gives."""
    return bool(needs.outcomes or needs.topk)


def check_outcomes(needs, algo, reward_funcs) -> None:
    """ConfigError, before the trainer is built, for a shaper that reads each response's outcome (`needs.outcomes`)
    or a loss that reads its correctness (`needs.topk`: SimKO) without a `TaskReward` among `reward_funcs` (a user's
    own functions give scores, not final answers or the task's correctness)."""
    if needs.outcomes and _task_reward(reward_funcs) is None:
        raise ConfigError(f"algo.shapers={list(algo.shapers)}: a shaper reads each response's final answer and "
                          f"correctness by an explorl task's rule; give the trainer a TaskReward among its reward "
                          f"functions (run_config does), or remove the shaper")
    if needs.topk and _task_reward(reward_funcs) is None:
        raise ConfigError(f"algo.loss={algo.loss}: the loss reads each response's correctness by an explorl task's "
                          f"rule; give the trainer a TaskReward among its reward functions (run_config does)")


def outcome_parts(trainer) -> dict[str, Tensor]:
    """`RolloutBatch.correct` `[N]` bool and, where a shaper reads them, `outcomes` `[N]` int64 of the generation
    batch of every process (collective), from this process's prompts and completions (`trainer._samples`) and its
    TaskReward's verdicts."""
    fn = _task_reward(trainer.reward_funcs)
    prompts, completions, _ = trainer._samples
    correct = fn.correct()
    acc = trainer.accelerator
    parts = {"correct": gather_rows(acc, torch.tensor(correct, dtype=torch.bool, device=acc.device))}
    if trainer.explorl_needs.outcomes:
        keys = outcome_keys_of(prompts, completions, correct, fn.task.extract_answer)
        parts["outcomes"] = gather_rows(acc, torch.tensor(keys, dtype=torch.long, device=acc.device))
    return parts
