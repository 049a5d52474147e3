"""explorl's reward functions as verl's custom reward function: the task's own `RewardRunner`, scored in verl.

verl 0.9 calls `compute_score(data_source, solution_str, ground_truth, extra_info, **reward_kwargs)` once per
response (`verl/experimental/reward_loop/reward_manager/naive.py`, `run_single`, in a thread of a reward-loop
worker); a dict result is `{"score": reward, ...}` and its other keys are kept per response as the reward extra
info (verl's validation metrics, `algorithm.filter_groups.metric`, explorl's run directory). Selected with

    reward.custom_reward_function.path=pkg://explorl.integrations.verl.reward
    reward.custom_reward_function.name=compute_score
    +reward.custom_reward_function.reward_kwargs.explorl_config=RUN/verl/explorl.yaml

(`examples/verl/launch.py` writes the config and sets these). The config's `task` section decides everything as in
`explorl train`: the reward list and weights (`task.reward`, `task.reward_weights`), batched functions, the time
limit and worker pool (`task.reward_timeout_s`, `task.reward_workers`), and correctness (`task.correct_by`,
`task.correct_threshold`, `Task.correct`). A function that raises, times out or returns a non-number scores 0 and is
counted. The task is loaded once per process.

What comes back, per response: `score` (the weighted reward), each function's own score under its metric name
(`reward/<name>` in explorl's logs; only with several functions), `correct` (1.0 or 0.0 by the task's rule),
`reward_failed` (1.0 when any function failed on it), `reward_errors`, `reward_timeouts`.

verl's v1 reward loop has no batch manager: each response is scored alone, so a batched function (`@batched`)
is called with batches of one response.
"""

from __future__ import annotations

import functools
import json
import threading
from typing import Any

from explorl.config import load_config
from explorl.tasks import load_task

CONFIG_KWARG = "explorl_config"
"""The `reward_kwargs` key naming the explorl config file."""
META_KEY = "meta"
"""`extra_info` key holding the problem's meta (JSON text), the reward functions' keyword arguments."""
RESERVED = ("score", "correct", "reward_failed", "reward_errors", "reward_timeouts")

_LOCK = threading.Lock()


@functools.lru_cache(maxsize=4)
def _scorer(config_path: str):
    """(task, runner) of the explorl config at `config_path`, built once per process (verl scores from threads)."""
    cfg = load_config(config_path)  # puts run.python_path first on sys.path, imports run.plugins
    task = load_task(cfg.task)
    return task, task.reward_runner(cfg.task.reward_timeout_s, cfg.task.reward_workers)


def scorer(config_path: str):
    with _LOCK:
        return _scorer(str(config_path))


def problem_meta(extra_info: Any) -> dict:
    """The problem's meta (the reward functions' keyword arguments) from a row's `extra_info`."""
    raw = (extra_info or {}).get(META_KEY) if isinstance(extra_info, dict) else None
    if raw is None or raw == "":
        return {}
    meta = json.loads(raw) if isinstance(raw, str) else raw
    return dict(meta) if isinstance(meta, dict) else {}


def metric_key(name: str) -> str:
    """The key of a function's score in the returned dict (its metric name; a reserved name gets a `reward_` prefix)."""
    return f"reward_{name}" if name in RESERVED else name


def score_result(result, task) -> list[dict[str, float]]:
    """verl's dict form of each sample of a `rewards.RewardResult` scored by `task`'s runner."""
    correct = task.correct(result)
    failed = {f.index for f in result.failures}
    out = []
    for i, reward in enumerate(result.rewards):
        row = {"score": float(reward), "correct": float(correct[i]), "reward_failed": float(i in failed),
               "reward_errors": float(sum(f.index == i and f.kind != "timeout" for f in result.failures)),
               "reward_timeouts": float(sum(f.index == i and f.kind == "timeout" for f in result.failures))}
        for name, scores in result.by_function.items():
            row[metric_key(name)] = float(scores[i])
        out.append(row)
    return out


def compute_score(data_source: str = "", solution_str: str = "", ground_truth: str = "", extra_info: Any = None,
                  explorl_config: str | None = None, **_: Any) -> dict[str, float]:
    """verl's custom reward function: one response scored by the explorl task's `RewardRunner`."""
    if not explorl_config:
        raise ValueError(f"explorl's verl reward needs the explorl config: set "
                         f"+reward.custom_reward_function.reward_kwargs.{CONFIG_KWARG}=PATH (examples/verl/launch.py "
                         f"does)")
    task, runner = scorer(explorl_config)
    result = runner([solution_str], [str(ground_truth)], [problem_meta(extra_info)])
    return score_result(result, task)[0]
