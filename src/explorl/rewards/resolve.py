"""From `task.reward` to functions: each entry (`auto`, explorl's own checkers by name, or `module:function`)
resolved to (fn, isolate) (`resolve_reward`), and the entries with `task.reward_weights` to one reward
(`resolve_rewards`); the entries' metric names (`reward/<name>`)."""

from __future__ import annotations

import functools
import importlib
import os
import re
import sys
from typing import Callable

from explorl.rewards.arith import chain_reward, verified_reward
from explorl.rewards.simple import exact_reward
from explorl.rewards.symbolic import math_check
from explorl.rewards.weighted import RewardPart, WeightedRewards, is_batched

BUILTIN_REWARDS = ("auto", "math", "exact", "verified", "chain")
"""The `task.reward` entries that name explorl's own checkers (anything else is `module:function`)."""

REWARD_VERSIONS = {"chain": 2}
"""The built-in checkers whose verdicts have changed, with the version in use. `explorl eval` records and
`explorl frontier` records and partial files name the versions they were judged by (`reward_versions`), so a
result of an older version is not taken for a current one. `chain` 2 (2026-11-27): text after the boxed answer on
its line is not judged; version 1 counted a right chain followed by stray braces (`\\boxed{-4}}}`) as wrong."""


def reward_versions(spec: str | list[str]) -> dict[str, int]:
    """{entry: version} of the entries of `task.reward` that have a version (`REWARD_VERSIONS`); {} for none."""
    return {e: REWARD_VERSIONS[e] for e in reward_entries(spec) if e in REWARD_VERSIONS}


def reward_entries(spec: str | list[str]) -> list[str]:
    """The entries of `task.reward`: a list as it is, a string split at commas (`math,my_rewards:fmt`)."""
    if isinstance(spec, str):
        return [x.strip() for x in spec.split(",")] if "," in spec else [spec]
    return list(spec)


def reward_metric_name(entry: str) -> str:
    """The `<name>` of a reward's `reward/<name>` metric: its `task.reward` entry with `:` written `.` and anything
    other than letters, digits, `_`, `.` and `-` written `_` (`my_rewards:fmt` -> `my_rewards.fmt`)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", entry.strip().replace(":", "."))


def resolve_rewards(spec: str | list[str], weights: list[float] | None,
                    task_default: tuple[Callable, bool]) -> tuple[Callable, bool]:
    """Map `task.reward` and `task.reward_weights` to (fn, isolate): a single unweighted per-sample function as
    `resolve_reward` gives it, anything else (several functions, a weight other than 1, a batched function) as a
    `WeightedRewards`. ValueError names the field."""
    entries = reward_entries(spec)
    if not entries:
        raise ValueError(f"task.reward: name at least one reward function ({', '.join(BUILTIN_REWARDS)} or "
                         f"module:function)")
    weights = [1.0] * len(entries) if weights is None else [float(w) for w in weights]
    if len(weights) != len(entries):
        raise ValueError(f"task.reward_weights: {len(weights)} weight(s) for {len(entries)} reward function(s) in "
                         f"task.reward; give one weight per entry, in order (or null for all 1)")
    resolved = [resolve_reward(e, task_default) for e in entries]
    if len(entries) == 1 and weights[0] == 1.0 and not is_batched(resolved[0][0]):
        return resolved[0]
    combined = WeightedRewards([RewardPart(reward_metric_name(e), fn, isolate, w)
                                for e, (fn, isolate), w in zip(entries, resolved, weights)])
    return combined, combined.isolate


def resolve_reward(spec: str, task_default: tuple[Callable, bool]) -> tuple[Callable, bool]:
    """Map `task.reward` to (fn, isolate): `auto` keeps the task's default, `math`, `exact`, or `module:function`."""
    if spec == "auto":
        return task_default
    if spec == "math":
        return math_check, True
    if spec == "exact":
        return exact_reward, False
    if spec == "verified":
        checker, isolate = task_default
        if checker is not None and is_batched(checker):
            raise ValueError("task.reward: verified wraps the task's own per-sample checker, and this task's is "
                             "batched; write your own module:function that zeroes what false_equations flags")
        return functools.partial(verified_reward, checker=checker), isolate
    if spec == "chain":
        return chain_reward, False
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"task.reward: {spec!r} is not {', '.join(BUILTIN_REWARDS)} or module:function")
    if "" not in sys.path and os.getcwd() not in sys.path:
        # The `explorl` console script does not put the working directory on sys.path, but users expect
        # `my_rewards:fn` next to their config to work; workers inherit sys.path, so they find it too.
        sys.path.append(os.getcwd())
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except ImportError as e:
        raise ValueError(f"task.reward: cannot import module {module_name!r} ({e}). A module next to your config "
                         f"file is found there (its directory goes on run.python_path); else put its directory on "
                         f"run.python_path, or give `explorl eval` --python-path DIR") from None
    except AttributeError:
        raise ValueError(f"task.reward: module {module_name!r} has no attribute {attr!r}") from None
    if not callable(fn):
        raise ValueError(f"task.reward: {spec} is not callable")
    return fn, True  # user code may be slow or unsafe: always in the pool
