"""Verifiable reward functions `fn(completion, answer, **meta) -> float` and the batch scorer.

Completions are untrusted model output: nothing here evaluates them, slow checkers (math-verify, which runs
sympy) run in the sandbox's worker processes under a hard time limit, and every failure scores 0 and is
counted instead of crashing the run.

- `extract_boxed`: the content of the last \\boxed{...} (bounded scan, no regex backtracking; `rewards.boxed`).
- `math_reward`: public API; math-verify equivalence of the last \\boxed{} with the ground truth, in the pool.
- `math_check`: the same check run in the current process (the function the workers call; `rewards.symbolic`).
- `exact_reward`, `int_reward`: cheap in-process checks (`rewards.simple`).
- `false_equations`, `verified_reward`: the stated integer equations of a response (`12+7=19`, `3 \\times 4 = 12`)
  checked by a small parser; `task.reward: verified` is the task's own checker scoring 0 when any of them is false
  (a right answer reached through wrong arithmetic). `chain_reward` (`task.reward: chain`): the response's lines
  are the problem's worked solution (`meta["solution"]`, which the `arith` task carries), an evaluation instrument
  (`rewards.arith`).
- `RewardRunner`: scores a batch, isolated (in parallel across the worker pool) or in-process; every failure
  comes back with its text (`RewardResult.failures`; `rewards.runner`); `resolve_reward`: maps one `task.reward`
  entry to a function, `reward_versions`: the versions of the built-in checkers a spec names, which records carry
  (`REWARD_VERSIONS`; `rewards.resolve`); `check_rewards`: the checks before a run (`rewards.checks`).
- Rewards as TRL users write them: `WeightedRewards`, several functions scored as their weighted sum (TRL's
  `reward_funcs` with `reward_weights`; `resolve_rewards` builds it from `task.reward` and `task.reward_weights`),
  each function's scores kept apart for the `reward/<name>` metrics; `batched`, the mark of a reward called once
  per batch as `fn(completions, answers, **meta) -> list[float]` (`rewards.weighted`).

Each name is defined in the module named beside it and exported here: import it from `explorl.rewards`. The worker
processes import a function by the module that defines it (`rewards.sandbox` pickles functions by reference).
"""

from explorl.rewards.arith import chain_reward, false_equations, verified_reward
from explorl.rewards.boxed import MAX_DEPTH, MAX_SCAN, brace_depth, closing_brace, extract_boxed
from explorl.rewards.checks import RewardLimits, check_rewards
from explorl.rewards.resolve import (BUILTIN_REWARDS, REWARD_VERSIONS, resolve_reward, resolve_rewards, reward_entries,
                                     reward_metric_name, reward_versions)
from explorl.rewards.runner import FAILURE_EXCERPT, RewardFailure, RewardResult, RewardRunner
from explorl.rewards.simple import exact_reward, int_reward
from explorl.rewards.symbolic import SOFT_TIMEOUT_S, math_check, math_reward
from explorl.rewards.weighted import RewardPart, WeightedRewards, batched, is_batched

__all__ = [
    "BUILTIN_REWARDS", "FAILURE_EXCERPT", "MAX_DEPTH", "MAX_SCAN", "REWARD_VERSIONS", "SOFT_TIMEOUT_S", "RewardFailure",
    "RewardLimits", "RewardPart", "RewardResult", "RewardRunner", "WeightedRewards", "batched", "brace_depth",
    "chain_reward", "check_rewards", "closing_brace", "exact_reward", "extract_boxed", "false_equations", "int_reward",
    "is_batched", "math_check", "math_reward", "resolve_reward", "resolve_rewards", "reward_entries",
    "reward_metric_name", "reward_versions", "verified_reward",
]
