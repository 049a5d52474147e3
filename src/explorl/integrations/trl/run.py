"""An explorl run directory written by `ExplorlGRPOTrainer(..., run_config=cfg)`, so `explorl analyze`, `compare`,
`eval RUN` and `curves` read a TRL run as they read `explorl train`'s (the files and the writer:
`explorl.runs.engine`).

- `TaskReward`: an explorl task's reward as a TRL reward function, scored by the task's own `RewardRunner` (reward
  lists, weights, batched functions, time limits, failures scored 0 and counted, as in explorl's loop); the trainer
  reads its last `RewardResult` to decide correctness by the task's rule (`Task.correct`) and to log
  `reward/<name>`, `reward/errors` and `reward/timeouts`.
- `RoundRecord`: one generation round's metrics record, collected while TRL runs it (the advantage step, then the
  update's micro-batches and optimizer steps) and written once the round's last optimizer step is done.
- `refuse_existing_run`: a new run never writes into a directory that holds one.
- A resumed run runs what its config.yaml says: `configured_hyperparameters` / `keep_configured_optimizer` put the
  config's AdamW settings and learning-rate schedule back after TRL loaded the checkpoint's, and `record_resume_step`
  writes the step a resume continues from into config_history.jsonl (TRL's checkpoints are `checkpoint-N`).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch
from torch import Tensor

from explorl.algos import PreparedBatch, RolloutBatch
from explorl.runs.engine import step_record
from explorl.rewards import RewardResult
from explorl.train.update import configured_hyperparameters, keep_configured_optimizer  # shared with explorl's loop

__all__ = ["TaskReward", "RoundRecord", "configured_hyperparameters", "keep_configured_optimizer",
           "record_resume_step", "refuse_existing_run", "resumed_round"]


class TaskReward:
    """An explorl task's reward (`explorl.tasks.Task`, `load_task(cfg.task)`) as a TRL reward function.

    Reads two dataset columns: `answer` (the ground truth, a string) and `meta` (the problem's meta as a JSON
    string: a datasets column needs one schema for every row, a task's meta need not have one). Returns the
    weighted reward of each completion; `last` keeps the `RewardResult` of this process's rows of the latest call
    (`by_function`, `judged`, failure counts), which `ExplorlGRPOTrainer` gathers for the run's metrics record.

        reward = TaskReward(load_task(cfg.task), cfg.task.reward_timeout_s, cfg.task.reward_workers)
        rows = [{"prompt": ..., "answer": p.answer, "meta": json.dumps(p.meta)} for p in task.train]
    """

    def __init__(self, task, timeout_s: float = 5.0, workers: int | None = None):
        self.task = task
        self.runner = task.reward_runner(timeout_s, workers)
        self.__name__ = f"explorl_{task.name.replace(':', '_')}"  # TRL's name for it (its `rewards/<name>` logs)
        self.last: RewardResult | None = None

    def __call__(self, prompts, completions, answer, meta=None, **kwargs) -> list[float]:
        if completions and not isinstance(completions[0], str):
            raise TypeError(f"{self.__name__}: completions must be text (TRL's standard, non-conversational "
                            f"format): give the dataset's `prompt` column as templated text, not chat messages")
        metas = [json.loads(m) if m else {} for m in meta] if meta is not None else None
        self.last = self.runner(list(completions), [str(a) for a in answer], metas)
        return list(self.last.rewards)

    def correct(self) -> list[bool]:
        """The latest call's samples correct by the task's rule (`task.correct_by`, `task.correct_threshold`)."""
        return self.task.correct(self.last)


def refuse_existing_run(out_dir: str | Path) -> None:
    """FileExistsError when `out_dir` already holds a run (its metrics.jsonl, or TRL checkpoints), naming the fix."""
    out = Path(out_dir)
    if (out / "metrics.jsonl").exists() or any(out.glob("checkpoint-*")):
        raise FileExistsError(f"run.out_dir={out} already holds a run; continue it from its last checkpoint "
                              f"(examples/trl/train.py ... --resume, or trainer.train(resume_from_checkpoint=True)) "
                              f"or choose another run.out_dir")


class RoundRecord:
    """One generation round (explorl's step) of a TRL run, collected for its metrics record.

    Made at the advantage step from the batch gathered from every process: `batch` and `prepared` as
    `compute_advantages` saw and made them (`[N, T]`, N = run.batch_size x sampling.group_size), `correct [N]`
    (bool, by the task's rule), `result` (the batch's reward counts and per-function scores), `temperatures
    [N, T]` (the sampling temperature of each token), `extra` (the method's and the schedule's statistics).
    The update adds, micro-batch by micro-batch, `policy_objective`'s statistics (averaged, as explorl's
    `update_policy` does) and, when the advantage step had no pi_old entropies (one update per batch: pi_old is
    the update's own forward, as in explorl's loop), this process's rows' token entropies, `[n, t]` at local row
    indices; TRL adds each optimizer step's gradient norm.
    """

    def __init__(self, step: int, started: float, sample_s: float, batch: RolloutBatch, prepared: PreparedBatch,
                 correct: Tensor, result: RewardResult, temperatures: Tensor, extra: dict,
                 local_shape: tuple[int, int]):
        self.step, self.started, self.sample_s = step, started, sample_s
        self.batch, self.prepared, self.correct, self.result = batch, prepared, correct, result
        self.temperatures, self.extra = temperatures, extra
        self.update_started = time.perf_counter()
        self.entropy = torch.zeros(local_shape) if batch.entropy is None else None
        self.losses: dict[str, list[float]] = {}
        self.grad_norms: list[float] = []

    def observe_update(self, rows: Tensor, entropy: Tensor, stats: dict) -> None:
        """One micro-batch of the update: its local row indices `[m]`, token entropies `[m, t]`, loss statistics."""
        if self.entropy is not None:
            self.entropy[rows.cpu(), :entropy.shape[1]] = entropy.detach().float().cpu()
        for k, v in stats.items():
            self.losses.setdefault(k, []).append(float(v))

    def record(self, gather, lr: float, main: bool) -> dict | None:
        """The round's metrics record (`rundir.step_record`'s keys, with `loss/*`, `optim/*` and `perf/*`), or
        None off the main process. Every process calls it: `gather` (`[n, t]` rows of every process, in rank
        order) is a collective when the entropies came from the update."""
        entropy = self.batch.entropy if self.entropy is None else gather(self.entropy)
        if not main:
            return None
        now = time.perf_counter()
        b, p = self.batch, self.prepared
        extra = {**self.extra, **{k: sum(v) / len(v) for k, v in self.losses.items()}}
        if self.grad_norms:
            extra["optim/grad_norm"] = sum(self.grad_norms) / len(self.grad_norms)
        extra.update({"optim/lr": lr, "perf/step_s": now - self.started, "perf/sample_s": self.sample_s,
                      "perf/update_s": now - self.update_started,
                      "perf/tokens_per_s": float(b.mask.sum()) / max(self.sample_s, 1e-9)})
        cpu = lambda x: None if x is None else x.detach().cpu()  # noqa: E731
        return step_record(self.step, rewards=cpu(p.rewards), correct=cpu(self.correct), group=cpu(b.group),
                           mask=cpu(b.mask), advantages=cpu(p.advantages), entropy=cpu(entropy),
                           truncated=cpu(b.truncated), temperatures=cpu(self.temperatures),
                           reward_result=self.result, extra=extra)


# ----------------------------------------------------------------------------------------------------------------
# a resumed run runs what its config.yaml says


def resumed_round(checkpoint: str | Path, updates_per_round: int) -> int:
    """The explorl step (generation round) a TRL checkpoint ends: its `explorl_schedule.json`'s round, else its
    optimizer steps (`trainer_state.json`'s global_step) over the updates of one round."""
    path = Path(checkpoint)
    try:
        return int(json.loads((path / "explorl_schedule.json").read_text())["round"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        steps = int(json.loads((path / "trainer_state.json").read_text())["global_step"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0
    return steps // max(updates_per_round, 1)


def record_resume_step(history: Path, records_before: int, step: int) -> None:
    """Set `resumed_after_step` of the config_history.jsonl record that opening the resumed run just appended (the
    records after the first `records_before`): the run directory's writer counts explorl's `checkpoints/step_N`,
    which a TRL run does not have, so it wrote 0."""
    if not history.exists():
        return
    lines = history.read_text().splitlines()
    if len(lines) <= records_before:
        return  # nothing changed: no record
    for i in range(records_before, len(lines)):
        record = json.loads(lines[i])
        record["resumed_after_step"] = step
        lines[i] = json.dumps(record)
    tmp = history.with_name(history.name + ".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, history)
