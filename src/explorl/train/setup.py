"""What `explorl train` and `explorl sft` do once before their first step: refuse a dtype the device cannot train
in, record the starting weights' fingerprint, open the run directory (`open_run_dir`), then seed, load the model
and resolve the prompt template (`load_run_model`), the same for both commands.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch
from rich.markup import escape

from explorl.config import Config, ConfigError, ModelConfig, dump_yaml
from explorl.config.files import read_yaml
from explorl.config.validation import small_training_set
from explorl.models import check_fingerprint, load_policy
from explorl.runs.log import RunLog
from explorl.tasks.chat import prompt_encoder


def check_trainable_dtype(model_cfg: ModelConfig) -> None:
    """Refuse a parameter dtype the device cannot train in, with `auto` resolved for this machine: float16
    anywhere (AdamW keeps its moments in the weights' dtype: squared gradients below ~2e-4 and its eps of 1e-8
    round to 0 in float16, so the first step writes inf and NaN), bfloat16 on a GPU without it."""
    from explorl.models.devices import resolve_device, resolve_dtype  # at call time: a replaced one is used

    device = resolve_device(model_cfg.device)
    dtype = resolve_dtype(model_cfg.dtype, device)
    if dtype == torch.float16:
        raise ConfigError(f"model.dtype: {model_cfg.dtype} resolves to float16 on {device}, which cannot be trained "
                          f"here (AdamW's moments underflow in float16 and the first step writes inf/NaN into the "
                          f"weights); use model.dtype=float32, or bfloat16 on a GPU that supports it (`auto` picks it)")
    if dtype == torch.bfloat16 and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigError(f"model.dtype: bfloat16 is not supported by {torch.cuda.get_device_name(device)}; "
                          f"use model.dtype=float32 (or auto)")


def open_run_dir(cfg: Config, resume: str | Path | None, command: str = "train") -> RunLog:
    """The run directory, new (`cfg.run.out_dir`) or resumed, with the config that runs written to its config.yaml:
    the dtype checked first, `model.fingerprint` filled in (checked against a resumed run's). Nothing is written
    before the directory is locked for this process (`RunLog.open`): a new one must be absent, empty or a run explorl
    made that logged no step (`explorl <command> --resume` continues one that did)."""
    check_trainable_dtype(cfg.model)
    cfg.model.fingerprint = check_fingerprint(cfg.model)  # config.yaml records which weights it started from
    if resume is not None and "auto" in (cfg.task.chat_template, cfg.model.dtype):
        # the resumed run's file holds what `auto` resolved to (the chat template for these weights, the dtype the
        # weights trained in): not a change to record
        path = Path(resume) / "config.yaml"
        previous = read_yaml(path) if path.exists() else {}
        template = (previous.get("task") or {}).get("chat_template")
        if cfg.task.chat_template == "auto" and template in ("on", "off"):
            cfg.task.chat_template = template
        dtype = (previous.get("model") or {}).get("dtype")
        if cfg.model.dtype == "auto" and dtype not in (None, "auto"):
            cfg.model.dtype = dtype
    return RunLog.open(cfg.run.out_dir, dump_yaml(cfg), resume, resume_hint=f"explorl {command} --resume")


def warn_small_training_set(cfg: Config, train_problems: int, console) -> None:
    """Say on `console`, as a run starts, when the training split is smaller than `run.batch_size`
    (`config.validation.small_training_set`; the dry run says it too)."""
    message = small_training_set(cfg, train_problems)
    if message:
        console.print(f"[yellow]warning:[/] {escape(message)}", highlight=False)


def load_run_model(cfg: Config, log: RunLog):
    """Threads and seeds as `cfg.run` says, then `(model, tokenizer, device, encode)`: the policy and the prompt
    encoder of the task; `task.chat_template: auto` and `model.dtype: auto` are written to config.yaml as what they
    resolved to."""
    if cfg.run.threads > 0:
        torch.set_num_threads(cfg.run.threads)
    torch.manual_seed(cfg.run.seed)
    random.seed(cfg.run.seed)
    model, tok, device = load_policy(cfg.model)
    encode = prompt_encoder(tok, cfg.task)
    autos = cfg.task.chat_template == "auto" or cfg.model.dtype == "auto"
    if cfg.task.chat_template == "auto":  # the run's config says what `auto` resolved to
        cfg.task.chat_template = "on" if encode.chat else "off"
    if cfg.model.dtype == "auto":  # and which dtype the weights trained in (bfloat16 on a GPU, float32 on the CPU)
        cfg.model.dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    if autos:
        log.write_config(dump_yaml(cfg))
    return model, tok, device, encode
