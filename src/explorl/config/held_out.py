"""The tasks evaluation runs on: each held-out set of `run.eval_sets` (its settings layered over the run's `task`)
and the task of `explorl eval` / `explorl probe` (a run's own, or one named on the command line with `--task-opt`).
"""

from __future__ import annotations

from typing import Any, Mapping

from explorl.config.building import apply_override, from_dict, to_dict
from explorl.config.schema import Config, TaskConfig

EVAL_KEYS_RESERVED = ("entropy", "length", "errors", "timeouts", "format_rate", "problems", "n")


def held_out_task(base: TaskConfig, fields: Mapping[str, Any], prefix: str) -> TaskConfig:
    """Task settings `fields` over `base`, each checked (errors name `prefix` + the field). A `file` task named by
    `path` alone is held out from that file: `eval_path` = `path` (its first `eval_size` rows)."""
    task = from_dict(TaskConfig, {**to_dict(base), **fields}, prefix)
    if task.name == "file" and "path" in fields and "eval_path" not in fields:
        task.eval_path = task.path
    return task


def eval_set_task(cfg: "Config", name: str) -> "TaskConfig":
    """The task of held-out set `name` of `run.eval_sets`: its settings layered over `cfg.task` (`held_out_task`)."""
    return held_out_task(cfg.task, cfg.run.eval_sets[name], f"run.eval_sets.{name}.")


def command_task(run_cfg: "Config | None", name: str | None, opts: Mapping[str, str]) -> TaskConfig:
    """The task `explorl eval` and `explorl probe` use: an evaluated run's own `task` section when there is a run and
    `name` is None or its task's name, else task `name` (default `arith`) with its defaults; `opts` (`field=value`
    text, as `--task-opt` gives it) on top. A `file` named by `path` alone is evaluated on all of its rows (unless
    `eval_size` is given)."""
    if run_cfg is not None and name in (None, run_cfg.task.name):
        base = run_cfg.task
    else:
        base = from_dict(TaskConfig, {"name": name or "arith"}, "task.")
    data: dict = {"task": {}}
    for k, v in opts.items():
        apply_override(data, f"task.{k}={v}")
    task = held_out_task(base, data["task"], "task.")
    if task.name == "file" and "path" in opts and "eval_path" not in opts and "eval_size" not in opts:
        from explorl.tasks.rows import count_rows  # `import explorl.config` loads no task (~40 ms, not ~90)

        task.eval_size = max(count_rows(task.eval_path, "--task-opt path"), 1)
    return task

