"""Train an explorl recipe with TRL's GRPOTrainer (`ExplorlGRPOTrainer`), on one process or many.

    python examples/trl/train.py configs/recipes/cw_grpo.yaml run.steps=2 run.out_dir=runs/trl-cw
    torchrun --nproc_per_node 2 examples/trl/train.py configs/recipes/grpo.yaml run.steps=2 run.batch_size=4
    accelerate launch --config_file deepspeed_zero2.yaml examples/trl/train.py RECIPE   # GPUs
    python examples/trl/train.py RECIPE key=value ... --resume   # continue from the last TRL checkpoint

RECIPE is an explorl config and the `key=value` arguments are explorl's overrides (`explorl config` lists every
field). The recipe's task, model and reward come from explorl (`explorl.tasks`, `explorl.models`), its method
from `algo`, `sampling` and `budget`; the TRL settings are derived from it:
- run.batch_size prompts x sampling.group_size completions per step, split evenly over the processes
  (per_device_train_batch_size = batch_size * group_size / processes), one optimizer step per algo.mini_batches
  share of it (steps_per_generation = algo.mini_batches), algo.epochs passes (num_iterations); so TRL's
  max_steps (optimizer steps) is run.steps x algo.epochs x algo.mini_batches, and a checkpoint every
  run.save_every steps lands between two steps;
- the reward is the task's own `RewardRunner` (`TaskReward`: task.reward's functions and weights, batched
  functions, task.reward_timeout_s, failures scored 0 and counted), correctness the task's rule (task.correct_by);
- optim.* -> AdamW, warm-up, cosine decay to optim.min_lr_ratio, gradient clipping;
- algo.kl_importance_weighted -> use_bias_correction_kl (explorl's KL term replaces TRL's, weighted alike);
- model.dtype auto -> bfloat16 on a GPU that has it, float32 on the CPU; model.device cpu -> use_cpu.
Not mapped: LoRA (`model.lora`), evaluation during training and checkpoints of explorl's own format (TRL writes
its own, RUN/checkpoint-N, which --resume continues from).

The run directory is run.out_dir, as `explorl train` writes it (rank 0 alone): config.yaml, engine.json (the world
size the run had, the command's arguments, TRL's log history), metrics.jsonl (one record per step with explorl's
keys), samples.jsonl, and after training explorl's held-out evaluation, final/ and eval.json; read it with
`explorl analyze RUN`, `explorl eval --model RUN`, `explorl compare`. A directory that holds a run is refused
unless --resume is given.

On the CPU, launch several processes with torchrun (`accelerate launch --cpu --num_processes N` starts one
process without mpirun, silently).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch


def grpo_args(cfg, world: int):
    """TRL's GRPOConfig for an explorl config run on `world` processes."""
    from trl import GRPOConfig

    from explorl.config import ConfigError
    from explorl.integrations.trl import checkpointing_field
    from explorl.models import resolve_device, resolve_dtype

    s, a, o, r = cfg.sampling, cfg.algo, cfg.optim, cfg.run
    total = r.batch_size * s.group_size
    if total % (world * a.mini_batches):
        raise ConfigError(f"run.batch_size={r.batch_size} x sampling.group_size={s.group_size} = {total} completions "
                          f"must split evenly over {world} processes x algo.mini_batches={a.mini_batches}; change "
                          f"run.batch_size")
    device = resolve_device(cfg.model.device)
    dtype = resolve_dtype(cfg.model.dtype, device)
    updates = a.epochs * a.mini_batches  # optimizer steps per explorl step
    return GRPOConfig(
        output_dir=r.out_dir, seed=r.seed, max_steps=r.steps * updates, use_cpu=device.type == "cpu",
        bf16=dtype == torch.bfloat16, fp16=False,
        per_device_train_batch_size=total // (world * a.mini_batches), steps_per_generation=a.mini_batches,
        gradient_accumulation_steps=1, num_iterations=a.epochs, num_generations=s.group_size,
        max_completion_length=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p, top_k=0,
        use_bias_correction_kl=a.kl_importance_weighted,  # explorl's KL term replaces TRL's: the same weighting
        learning_rate=o.lr, weight_decay=o.weight_decay, adam_beta1=o.beta1, adam_beta2=o.beta2,
        warmup_steps=o.warmup_steps, lr_scheduler_type="cosine_with_min_lr",
        lr_scheduler_kwargs={"min_lr_rate": o.min_lr_ratio}, max_grad_norm=o.grad_clip,
        **{checkpointing_field(): cfg.model.gradient_checkpointing}, logging_steps=1,
        save_strategy="steps" if r.save_every > 0 else "no", save_steps=max(r.save_every, 1) * updates,
        save_total_limit=r.keep_checkpoints, report_to=list(r.report_to), log_completions=False, disable_tqdm=True,
        dataloader_num_workers=0)


def checked_config(argv: list[str], resume: bool):
    """The explorl config of the command line, validated, and for a new run everything it reads checked (as
    `explorl train` checks it) before anything is loaded; the trainer checks the run directory again before it
    writes."""
    from explorl.config import load_config
    from explorl.config.trust import refuse_recorded_code
    from explorl.integrations.trl import refuse_existing_run
    from explorl.train.preflight import check_run_inputs

    try:
        refuse_recorded_code(argv[0], argv[1:], f"python examples/trl/train.py {argv[0]}")
        cfg = load_config(argv[0], argv[1:])
        if not resume:
            refuse_existing_run(cfg.run.out_dir)
            check_run_inputs(cfg)
    except (FileNotFoundError, FileExistsError, ValueError) as e:
        e.explorl_before_training = True  # printed as one line by `run_from_command_line`
        raise
    return cfg


def main(argv: list[str] | None = None) -> Path:
    """Train as the module docstring says; returns the run directory."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        raise SystemExit(0 if argv else 2)
    resume = "--resume" in argv
    argv = [a for a in argv if a != "--resume"]
    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    from explorl.integrations.trl import ExplorlGRPOTrainer, RunOptions, TaskReward
    from explorl.models import load_tokenizer, resolve_device, resolve_dtype, resolve_model_path
    from explorl.tasks import load_task
    from explorl.tasks.chat import prompt_text, resolve_chat_template

    cfg = checked_config(argv, resume)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if cfg.run.threads > 0:
        torch.set_num_threads(cfg.run.threads)
    path = resolve_model_path(cfg.model.path)
    tok = load_tokenizer(path, cfg.model.trust_remote_code)
    device = resolve_device(cfg.model.device)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=resolve_dtype(cfg.model.dtype, device),
                                                 attn_implementation=cfg.model.attn_implementation,
                                                 trust_remote_code=cfg.model.trust_remote_code)
    task = load_task(cfg.task)
    chat = resolve_chat_template(cfg.task.chat_template, tok)
    cfg.task.chat_template = "on" if chat else "off"  # config.yaml says what `auto` resolved to
    # every column of a row reaches the reward through `meta` (TaskReward passes its keys as keyword arguments)
    rows = [{"prompt": prompt_text(p, tok, chat=chat, system_prompt=cfg.task.system_prompt), "answer": p.answer,
             "meta": json.dumps(p.meta, default=str)} for p in task.train]
    reward = TaskReward(task, cfg.task.reward_timeout_s, cfg.task.reward_workers)
    trainer = ExplorlGRPOTrainer(model, reward, args=grpo_args(cfg, world), train_dataset=Dataset.from_list(rows),
                                 processing_class=tok, run_config=cfg,
                                 run_options=RunOptions(launch={"recipe": argv[0], "overrides": argv[1:],
                                                                "resumed": resume}))
    if trainer.accelerator.num_processes != world:
        raise RuntimeError(f"launched as {world} processes (WORLD_SIZE) but accelerate sees "
                           f"{trainer.accelerator.num_processes}")
    trainer.train(resume_from_checkpoint=True if resume else None)
    return Path(cfg.run.out_dir)


def run_from_command_line(argv: list[str] | None = None) -> int:
    """`main`, with a config or input error printed as one line (`explorl train`'s way) instead of a traceback."""
    from explorl.config import ConfigError

    try:
        main(argv)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    except (FileNotFoundError, FileExistsError, ValueError) as e:
        if not getattr(e, "explorl_before_training", False):
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(run_from_command_line())
