"""An explorl run directory written by `ExplorlGRPOTrainer(..., run_config=cfg)`, so `explorl analyze`, `compare`,
`eval RUN` and `curves` read a TRL run as they read `explorl train`'s (the files and the writer:
`explorl.integrations.run_dir`).

- `TaskReward`: an explorl task's reward as a TRL reward function, scored by the task's own `RewardRunner` (reward
  lists, weights, batched functions, time limits, failures scored 0 and counted, as in explorl's loop); the trainer
  reads its last `RewardResult` to decide correctness by the task's rule (`Task.correct`) and to log
  `reward/<name>`, `reward/errors` and `reward/timeouts`.
- `RoundRecord`: one generation round's metrics record, collected while TRL runs it (the advantage step, then the
  update's micro-batches and optimizer steps) and written once the round's last optimizer step is done.
- `refuse_existing_run`: a new run never writes into a directory that holds one.
- The trainer's side (`ExplorlGRPOTrainer` calls these with itself): `open_run` (config.yaml and engine.json, main
  process), `round_record` at the advantage step (correctness and reward counts gathered from every process,
  `batch_outcome`, and explorl's reward guard, `guard_rewards`), `write_round` after the round's last optimizer step,
  `finish_run` after training (explorl's held-out evaluation, final/, eval.json).
- A resumed run runs what its config.yaml says: `configured_hyperparameters` / `keep_configured_optimizer` put the
  config's AdamW settings and learning-rate schedule back after TRL loaded the checkpoint's, and `record_resume_step`
  writes the step a resume continues from into config_history.jsonl (TRL's checkpoints are `checkpoint-N`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from accelerate.utils import broadcast_object_list
from rich.console import Console
from torch import Tensor
from transformers.trainer_utils import get_last_checkpoint

from explorl.algos import RolloutBatch
from explorl.config import AlgoConfig, ConfigError
from explorl.integrations.run_dir import ENGINE_FILE, finish_engine_run, open_engine_run, step_record
from explorl.integrations.trl.batch import gather_rows
from explorl.rewards import RewardResult
from explorl.runs import nofollow
from explorl.runs.failures import RewardFailureLog
from explorl.train.guards import RunStopped, stop_if_rewards_failed, too_many_reward_failures
from explorl.train.update import (configured_hyperparameters, keep_configured_optimizer,  # shared with explorl's loop
                                  lr_lambda)

__all__ = ["TaskReward", "RoundRecord", "RunOptions", "batch_outcome", "configured_hyperparameters", "finish_run",
           "guard_rewards", "judge_column", "keep_configured_optimizer", "open_run", "record_resume_step",
           "refuse_existing_run", "resumed_round", "round_algo", "round_record", "without_tied_keys", "write_round"]


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


def explorl_scheduler(optimizer, optim, total: int):
    """explorl's learning-rate schedule (`lr_lambda`) for a TRL run of an explorl config, over `total` optimizer
    steps: its warm-up gives the first update lr / warmup_steps, where transformers' gives it 0 (an update that
    changes nothing) and stays one step behind explorl's loop through the warm-up (issue 56)."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(optim.warmup_steps, total, optim.min_lr_ratio))


def refuse_existing_run(out_dir: str | Path) -> None:
    """FileExistsError when `out_dir` already holds a run (its metrics.jsonl, or TRL checkpoints), naming the fix."""
    out = Path(out_dir)
    if (out / "metrics.jsonl").exists() or any(out.glob("checkpoint-*")):
        raise FileExistsError(f"run.out_dir={out} already holds a run; continue it from its last checkpoint "
                              f"(examples/trl/train.py ... --resume, or trainer.train(resume_from_checkpoint=True)) "
                              f"or choose another run.out_dir")


class RoundRecord:
    """One generation round (explorl's step) of a TRL run, collected for its metrics record.

    Made at the advantage step from the batch gathered from every process: `batch` as `compute_advantages` made it
    (`[N, T]`, N = run.batch_size x sampling.group_size) with the sampling temperature of each token
    (`temperatures`), `correct [N]` (bool, by the task's rule), `result` (the batch's reward counts and
    per-function scores), `extra` (the method's and the schedule's statistics).
    The update adds, micro-batch by micro-batch, `policy_objective`'s statistics (averaged, as explorl's
    `update_policy` does) and, when the advantage step had no pi_old entropies (one update per batch: pi_old is
    the update's own forward, as in explorl's loop), this process's rows' token entropies, `[n, t]` at local row
    indices; TRL adds each optimizer step's gradient norm.
    """

    def __init__(self, step: int, started: float, sample_s: float, batch: RolloutBatch, correct: Tensor,
                 result: RewardResult, extra: dict, local_shape: tuple[int, int]):
        self.step, self.started, self.sample_s = step, started, sample_s
        self.batch, self.correct, self.result = batch, correct, result
        self.extra = extra
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
        """The round's metrics record (`run_dir.step_record`'s keys, with `loss/*`, `optim/*` and `perf/*`), or
        None off the main process. Every process calls it: `gather` (`[n, t]` rows of every process, in rank
        order) is a collective when the entropies came from the update."""
        entropy = self.batch.entropy if self.entropy is None else gather(self.entropy)
        if not main:
            return None
        now = time.perf_counter()
        b = self.batch
        extra = {**self.extra, **{k: sum(v) / len(v) for k, v in self.losses.items()}}
        if self.grad_norms:
            extra["optim/grad_norm"] = sum(self.grad_norms) / len(self.grad_norms)
        extra.update({"optim/lr": lr, "perf/step_s": now - self.started, "perf/sample_s": self.sample_s,
                      "perf/update_s": now - self.update_started,
                      "perf/tokens_per_s": float(b.mask.sum()) / max(self.sample_s, 1e-9)})
        return step_record(self.step, b.replace(entropy=entropy).to("cpu"), self.correct.cpu(),
                           reward_result=self.result, extra=extra)


# ----------------------------------------------------------------------------------------------------------------
# the trainer's side: `trainer` is the `ExplorlGRPOTrainer` writing the run directory (`trainer.run_config`)


@dataclass(frozen=True)
class RunOptions:
    """What the trainer's run directory (`run_config`) needs besides the config: explorl's additions to TRL's
    signature, grouped so that the trainer's own arguments stay TRL's."""

    correct_by: str | None = None
    """With no `TaskReward` among `reward_funcs`: the name of the TRL reward function whose unweighted score
    decides correctness (above `run_config.task.correct_threshold`); None: the first, as explorl's own rule
    (`task.correct_by`) defaults to the first reward entry."""
    launch: Mapping | None = None
    """How the run was launched, for engine.json (e.g. the config file, overrides)."""


def judge_column(reward_func_names: list[str], correct_by: str | None) -> int:
    """The column of `correct_by` among TRL's reward functions (the first when None), whose score decides
    correctness when no `TaskReward` scores."""
    if correct_by is None:
        return 0
    if correct_by not in reward_func_names:
        raise ConfigError(f"correct_by={correct_by!r} is not one of the reward functions {reward_func_names}; name "
                          f"the one whose score decides correctness")
    return reward_func_names.index(correct_by)


def round_record(trainer, batch: RolloutBatch, sample_s: float, local_shape: tuple[int, int]) -> RoundRecord:
    """The round's record as far as the advantage step knows it (`batch`: through `compute_advantages`; every
    process: it gathers). The batch gains the sampling temperature of each token, `temperatures`."""
    correct, result = batch_outcome(trainer, trainer._explorl_rewards_per_func)
    n, t = batch.mask.shape
    if trainer._ead_table is not None:  # the per-token behaviour temperature, T x tau(t)
        table = trainer._ead_table
        row = F.pad(table, (0, max(t - table.numel(), 0)), value=float(table[-1]))[:t]
    else:
        row = torch.full((t,), float(trainer.temperature))
    batch = batch.replace(temperatures=row[None, :].expand(n, t).to(batch.mask.device))
    extra = {**trainer.explorl_driver.rollout_stats(batch), **trainer._round_stats, **batch.stats}
    return RoundRecord(trainer._round, trainer._round_started, sample_s, batch, correct, result, extra,
                       local_shape)


def round_algo(trainer, entropy: float) -> AlgoConfig:
    """The algo config of a training round's updates: with Skywork-OR1's adaptive coefficient
    (`algo.entropy_control`, `train/adaptive_entropy.py`), the coefficient the round's batch entropy gates and
    adapts, logged as explorl's loop logs it (`algo/entropy_coef`); otherwise the trainer's `algo` itself."""
    coef = trainer.explorl_entropy_coef
    if not coef.adaptive:
        return trainer.explorl.algo
    applied = coef.step(entropy)
    trainer._metrics["train"]["algo/entropy_coef"].append(applied)
    if trainer._record is not None:
        trainer._record.extra["algo/entropy_coef"] = applied
    return coef.algo_for(trainer.explorl.algo, applied)


def batch_outcome(trainer, rewards_per_func: Tensor) -> tuple[Tensor, RewardResult]:
    """Which of the batch's `N` responses are correct (`[N]` bool) and the batch's `RewardResult` (failure counts
    and `by_function`, each function's unweighted scores), from every process (collective).

    A `TaskReward` (the first, if several) decides by its task's rule and brings its own per-function scores and
    failure counts; otherwise `correct_by`'s column of TRL's `rewards_per_func [N, F]` above
    `task.correct_threshold` (a function's None, NaN, is not correct). With several TRL reward functions, each
    one's mean over the rows it scored is `reward/<its TRL name>`, as explorl logs each of `task.reward`."""
    acc = trainer.accelerator
    gather = lambda x: gather_rows(acc, x.to(acc.device))  # noqa: E731
    several = len(trainer.reward_funcs) > 1
    # errors, timeouts, failed samples (a sample counts once however many functions failed on it)
    correct, by_function, counts = None, {}, torch.zeros(3, dtype=torch.float64)
    failures: list = []
    for i, (fn, name) in enumerate(zip(trainer.reward_funcs, trainer.reward_func_names)):
        column = rewards_per_func[:, i]
        if isinstance(fn, TaskReward):
            mine = fn.last  # this process's rows
            if correct is None:
                correct = gather(torch.tensor(fn.correct(), dtype=torch.bool))
            names = list(mine.by_function)
            if names:
                table = gather(torch.tensor([mine.by_function[k] for k in names], dtype=torch.float32).T)
                by_function.update({k: table[:, j].tolist() for j, k in enumerate(names)})
            elif several:
                by_function[name] = column.tolist()
            failed = len({f.index for f in mine.failures})
            counts += torch.tensor([mine.errors, mine.timeouts, failed], dtype=torch.float64)
            failures += mine.failures
        elif several:
            by_function[name] = column[~torch.isnan(column)].tolist()
    if acc.num_processes > 1:
        counts = acc.reduce(counts.to(acc.device), reduction="sum").cpu()
    if correct is None:
        correct = rewards_per_func[:, trainer._judge] > trainer.run_config.task.correct_threshold
    guard_rewards(trainer, failures, int(counts[2]), len(correct), int(counts[0]), int(counts[1]))
    return correct.bool(), RewardResult([], errors=int(counts[0]), timeouts=int(counts[1]), by_function=by_function)


def guard_rewards(trainer, failures: list, failed: int, scored: int, errors: int, timeouts: int) -> None:
    """explorl's reward guard, before the round's update: the main process logs its rows' failures
    (RUN/reward_errors.log, the first traceback on the console), and every process stops (`RunStopped`) when
    more than `task.max_reward_failure_frac` of the batch's samples failed (`failed` of `scored`, summed over
    processes, so every process decides alike)."""
    if trainer._failure_log is not None:
        trainer._failure_log.record(trainer._round, failures, scored)
    got = SimpleNamespace(failures=failures, scored=scored, errors=errors, timeouts=timeouts)
    if trainer.run_log is not None:
        stop_if_rewards_failed(trainer._round, got, trainer.run_config, trainer.run_log,
                               last_checkpoint(trainer.args.output_dir), failed=failed,
                               resume="`examples/trl/train.py CONFIG --resume`")
    elif too_many_reward_failures(failed, scored, trainer.run_config):
        raise RunStopped(f"stopping before the update of round {trainer._round}: the reward failed on {failed} of "
                         f"{scored} samples (the main process logs the details)")


def without_tied_keys(model, load_result):
    """`load_result` (a checkpoint load's missing and unexpected keys) without the missing keys of parameters tied
    to another one: a head tied to the embeddings is saved once, as the embeddings, so its "missing" key is no loss
    (a resumed run of the embedded model warned about lm_head.weight)."""
    params = dict(model.named_parameters(remove_duplicate=False))
    missing = [k for k in load_result.missing_keys
               if not (k in params and any(p is params[k] for n, p in params.items() if n != k))]
    if len(missing) == len(load_result.missing_keys):
        return load_result
    return SimpleNamespace(missing_keys=missing, unexpected_keys=load_result.unexpected_keys)


def last_checkpoint(output_dir: str | Path) -> str:
    """TRL's last checkpoint in `output_dir`, as a resume would name it."""
    ckpts = sorted(Path(output_dir).glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]))
    return str(ckpts[-1]) if ckpts else "none yet, so a resume starts over"


def write_round(trainer) -> None:
    """The collected round's record to metrics.jsonl and its first prompts to samples.jsonl (main process; every
    process calls it)."""
    record, trainer._record = trainer._record, None
    acc = trainer.accelerator
    rec = record.record(lambda x: gather_rows(acc, x.to(acc.device)), trainer.lr_scheduler.get_last_lr()[0],
                        acc.is_main_process)
    if rec is None or trainer.run_log is None:
        return
    trainer.run_log.append_metrics(rec)
    prompts, completions, answers = trainer._samples
    g = trainer.num_generations
    k = min(trainer.run_config.run.log_samples, len(prompts) // g)
    problems = [SimpleNamespace(prompt=prompts[j * g], answer=answers[j * g]) for j in range(k)]
    rewards = record.batch.rewards[:len(prompts)].tolist()  # the main process's rows come first
    trainer.run_log.log_samples(record.step, problems, SimpleNamespace(group=torch.arange(len(prompts)) // g),
                                list(completions), rewards, k)


def open_run(trainer, resume: bool, checkpoint: str | bool | None = None) -> None:
    """config.yaml and engine.json (main process); a resumed run's config_history.jsonl record names the step of the
    checkpoint it continues from. An error there stops every process, not only the main one (the others would wait
    for it in the first gather)."""
    error, acc, cfg = None, trainer.accelerator, trainer.run_config
    if acc.is_main_process:
        try:
            if not resume:
                refuse_existing_run(cfg.run.out_dir)
            history = Path(cfg.run.out_dir) / "config_history.jsonl"
            before = len(history.read_text().splitlines()) if history.exists() else 0
            trainer.run_log = open_engine_run(cfg, "trl", resume=resume, world_size=acc.num_processes,
                                              trl_output_dir=trainer.args.output_dir, **trainer.run_launch)
            if resume:
                path = get_last_checkpoint(trainer.args.output_dir) if checkpoint is True else checkpoint
                step = resumed_round(path, trainer.args.steps_per_generation * trainer.num_iterations) if path else 0
                record_resume_step(history, before, step)
            trainer._failure_log = RewardFailureLog(trainer.run_log.reward_errors_path, Console(stderr=True))
        except (ConfigError, OSError, ValueError) as e:
            error = e
    if acc.num_processes > 1:
        error = broadcast_object_list([error])[0]
    if error is not None:
        raise error


def finish_run(trainer) -> None:
    """After training, on the main process alone (nothing collective: the other processes are done): TRL's
    optimizer steps and log history into engine.json, then explorl's held-out evaluation, final/ and eval.json."""
    engine = trainer.run_log.dir / ENGINE_FILE
    record = json.loads(engine.read_text())
    record.update(optimizer_steps=trainer.state.global_step, log_history=trainer.state.log_history)
    nofollow.write_atomic(engine, json.dumps(record, indent=1, default=str))  # never through a symbolic link
    model = trainer.accelerator.unwrap_model(trainer.model)
    finish_engine_run(trainer.run_log, trainer.run_config, model, trainer.processing_class, trainer._round)


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
    nofollow.write_atomic(history, "\n".join(lines) + "\n")  # through history.tmp, renamed; never through a link
