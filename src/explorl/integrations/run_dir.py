"""An explorl run directory written by another engine's trainer (TRL's `GRPOTrainer`, verl), so that `explorl
analyze`, `compare`, `eval RUN`, `curves` and `report` read an engine's run as they read `explorl train`'s.

The files and keys are explorl's own (docs/run-directory.md): `config.yaml` (the explorl config the engine ran,
with `model.fingerprint`), `metrics.jsonl` (one record per step with `rollout_metrics`' keys, `reward/<name>` per
reward function, `reward/errors|timeouts` and the method's statistics; `eval/*` after the last step), `samples.jsonl`,
`final/` (a Hugging Face model directory) and, written last, `eval.json`. `engine.json` says which engine wrote the
run and how it was launched (world size, engine version, the launch command's overrides).

Only the main process writes (`main` below). The functions take plain tensors, so each engine's integration
gathers what it has and calls them; nothing here imports TRL or verl.
"""

from __future__ import annotations

import json
from importlib.metadata import PackageNotFoundError, version

import torch
from rich.console import Console

from explorl.algos.batch import RolloutBatch
from explorl.config import Config
from explorl.evaluation.evaluate import held_out_evaluator
from explorl.runs import nofollow
from explorl.runs.final import model_card
from explorl.runs.log import RunLog
from explorl.runs.metrics import rollout_metrics
from explorl.tasks import load_task
from explorl.tasks.chat import prompt_encoder
from explorl.train.setup import open_run_dir

__all__ = ["open_engine_run", "step_record", "finish_engine_run"]

ENGINE_FILE = "engine.json"


def open_engine_run(cfg: Config, engine: str, *, resume: bool = False, **launch) -> RunLog:
    """The run directory `cfg.run.out_dir` for a run of `engine` ("trl", "verl"): config.yaml written (the weights'
    fingerprint filled in, as `explorl train` does), `engine.json` with `launch` (world size, overrides, ...).

    `resume=True` continues the directory (config.yaml rewritten, its change history kept, as `--resume`); otherwise
    a directory that already holds a run is refused, naming the fix.
    """
    log = open_run_dir(cfg, cfg.run.out_dir if resume else None)
    record = {"engine": engine, "version": _version(engine), **launch}
    nofollow.write_atomic(log.dir / ENGINE_FILE, json.dumps(record, indent=1, default=str))  # never through a link
    return log


def _version(engine: str) -> str | None:
    try:
        return version(engine)
    except PackageNotFoundError:
        return None


def step_record(step: int, batch: RolloutBatch, correct: torch.Tensor, *, reward_result=None,
                extra: dict | None = None) -> dict:
    """One step's metrics record with `explorl train`'s keys (`runs.metrics.rollout_metrics`) of an engine's batch.

    `batch`: the step's `RolloutBatch` through `compute_advantages` (its `shaped_rewards`, `advantages`, `mask`,
    `group`, `truncated`), as the engine has it: `entropy` None where the engine computed no entropies of the
    policy's token distributions (the entropy keys are NaN), `temperatures` None for 1. `correct [N]` bool, by the
    task's rule (`Task.correct`). `reward_result` (`rewards.RewardResult`) adds `reward/<name>` per function and the
    failure counts; `extra` (the method's statistics, the engine's own) is merged last.
    """
    entropy = batch.entropy
    n, t = batch.mask.shape
    ent = entropy.float() if entropy is not None else torch.full((n, t), float("nan"))
    # rollout_metrics reads the sampler's entropies and temperatures too; an engine's are rebuilt from what it has
    batch = batch.replace(mask=batch.mask.float(), entropy=ent,
                          behavior_entropy=torch.nan_to_num(ent) if entropy is not None else ent,
                          temperatures=(batch.temperatures.float() if batch.temperatures is not None
                                        else torch.ones(n, t)))
    record = {"step": int(step), **rollout_metrics(batch, correct.bool())}
    if entropy is None:
        record["entropy/by_position"] = None
    if reward_result is not None:
        record["reward/errors"] = reward_result.errors
        record["reward/timeouts"] = reward_result.timeouts
        for name, scores in reward_result.by_function.items():
            record[f"reward/{name}"] = float(sum(scores) / max(len(scores), 1))
    record.update(extra or {})
    return record


def finish_engine_run(log: RunLog, cfg: Config, model, tok, step: int) -> dict:
    """After the engine's last step: explorl's held-out evaluation of `model` (the task's split and `run.eval_sets`,
    `run.eval_n` samples per problem, as `explorl train` ends), `final/` with a model card, the `eval/*` record and,
    last, `eval.json` (which marks the run complete). Returns the evaluation summary."""
    task = load_task(cfg.task)
    was_training = model.training
    # reward failures said on the console, as `explorl train`'s own evaluation says them
    final = held_out_evaluator(model, tok, cfg, task, prompt_encoder(tok, cfg.task), Console())(step)
    model.train(was_training)
    log.save_final_model(model, tok, model_card(cfg, final, step, log.dir))
    log.append_metrics({"step": step, **{f"eval/{k}": v for k, v in final.items()}})
    log.write_eval(step, final, cfg.model.fingerprint)
    return final
