"""`explorl sft`: supervised fine-tuning on a task's worked solutions.

The SFT baseline of ERPO (section 5.2, Tables 1-2: the MATH training set's solutions, 3 epochs) and the SFT
models of STILL (section 2.4, Figure 1: SFT-Math / SFT-All, lr 1e-5, batch 96) are this command on their data
(docs/methods.md §8d). Each training problem's prompt (as the sampler would see it: template, chat template,
system prompt) is followed by its worked solution and EOS; the loss is the next-token cross-entropy over the
solution and EOS tokens only, averaged over all such tokens of an optimizer step (gradient accumulation over
micro-batches gives the same mean). The output is a run directory like `explorl train`'s: config.yaml,
metrics.jsonl (one record per optimizer step), checkpoints/, final/ (a Hugging Face model directory) and
eval.json (held-out pass@k after training), so `explorl eval --model RUN/final` evaluates it as the run did.

The supervised step (`explorl.finetune.supervised`) is the one `explorl rft` fine-tunes with and `explorl bootstrap`
trains the embedded model with.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from explorl import __version__
from explorl.config import to_dict
from explorl.evaluation.evaluate import held_out_evaluator
from explorl.finetune.supervised import labelled_tokens, sft_batch, sft_example, supervised_step
from explorl.runs.checkpoints import load_checkpoint
from explorl.runs.progress import format_duration
from explorl.tasks import load_task
from explorl.tasks.chat import prompt_text
from explorl.train.setup import load_run_model, open_run_dir
from explorl.train.update import lr_lambda

if TYPE_CHECKING:
    from explorl.config import Config
    from explorl.tasks import Problem, Task


def worked_solutions(task: Task, task_name: str, solution_field: str) -> tuple[list[Problem], int]:
    """The training problems that carry a worked solution, and how many lack one. Raises ValueError naming the field
    when none does."""
    with_solution = [p for p in task.train if p.solution]
    missing = len(task.train) - len(with_solution)
    if with_solution:
        return with_solution, missing
    if task_name == "file":
        first = task.train[0].meta.get("id", "?") if task.train else "?"
        raise ValueError(f"task.solution_field: no training row has a worked solution in the field "
                         f"{solution_field!r} (first row: {first}); `explorl sft` trains on worked solutions. Name "
                         f"the field that holds them with task.solution_field=FIELD")
    raise ValueError(f"task.name: the task {task_name!r} gives no worked solutions, which `explorl sft` trains on; use "
                     f"`arith`, or a `file` task whose rows hold one (task.solution_field, default 'solution')")


def sft_model_card(cfg: Config, summary: dict, steps: int, examples: int) -> str:
    """A short Hugging Face model card for `final/`."""
    rows = "\n".join(f"| {k} | {v:.4f} |" for k, v in summary.items()
                     if k.split("@")[0] in ("pass", "maj", "avg", "worst") and isinstance(v, (int, float)))
    return "\n".join([
        "---", "library_name: transformers", "tags: [explorl, sft]", "---", "",
        f"# Supervised fine-tuning of `{cfg.model.path}`", "",
        f"Fine-tuned with [explorl](https://pypi.org/project/explorl/) {__version__} (`explorl sft`) on {examples} "
        f"worked solutions of the `{cfg.task.name}` task: {cfg.sft.epochs} epochs, {steps} optimizer steps of "
        f"{cfg.sft.batch_size} sequences, lr {cfg.optim.lr:g}, seed {cfg.run.seed}. The full configuration is the "
        f"run's `config.yaml`.", "",
        f"Held-out evaluation ({summary.get('problems', '?')} problems, n = {summary.get('n', '?')} samples each, "
        f"temperature {cfg.run.eval_temperature:g}):", "", "| metric | value |", "|---|---|", rows, ""])


def run_sft(cfg: Config, *, console=None, resume: str | Path | None = None) -> Path:
    """Fine-tune `cfg.model` on the worked solutions of `cfg.task`'s training split as `cfg.sft` and `cfg.optim`
    say; returns the run directory (`cfg.run.out_dir`, which must not hold a run yet, or `resume`: a run of this
    command continued from its last checkpoint, with the same batches as an uninterrupted run)."""
    console = console or Console()
    r, f = cfg.run, cfg.sft
    task = load_task(cfg.task)
    problems, missing = worked_solutions(task, cfg.task.name, cfg.task.solution_field)  # before anything is written
    log = open_run_dir(cfg, resume, "sft")  # the same set-up as `explorl train` (explorl.train.setup)
    model, tok, device, encode = load_run_model(cfg, log)
    pairs = [sft_example(tok, prompt_text(p, tok, chat=encode.chat, system_prompt=cfg.task.system_prompt),
                         p.solution, f.max_length) for p in problems]
    seqs, starts = [q for q, _ in pairs], [st for _, st in pairs]
    total = f.epochs * math.ceil(len(seqs) / f.batch_size)
    optimizer, scheduler = _optimizer(model, cfg, device, total)
    skipped = f" ({missing} training problems without one skipped)" if missing else ""
    console.print(f"[bold]sft[/]: {len(seqs)} worked solutions{skipped}, {f.epochs} epoch(s), {total} optimizer steps "
                  f"of {f.batch_size} sequences", highlight=False)

    # as `explorl train` evaluates: eval sets included, reward failures said
    held_out = held_out_evaluator(model, tok, cfg, task, encode, console)

    def checkpoint(step: int) -> None:
        log.save_checkpoint(step, model, optimizer, scheduler, {"step": step}, r.keep_checkpoints, r.save_every)

    start = 0
    if resume is not None:
        start = _resumed_step(log, total, model, optimizer, scheduler, console)
        if start is None:
            return log.dir
    log.start_trackers(r, to_dict(cfg), resume_step=start if resume is not None else None)  # as `explorl train`
    _train_steps(cfg, _Trainee(model, tok, device, optimizer, scheduler, log, console), seqs, starts, start=start,
                 total=total, held_out=held_out, checkpoint=checkpoint)
    checkpoint(total)
    final = held_out(total)
    log.save_final_model(model, tok, sft_model_card(cfg, final, total, len(seqs)))
    log.append_metrics({"step": total, **{f"eval/{k}": v for k, v in final.items()}})
    log.write_eval(total, final, cfg.model.fingerprint)
    log.close()
    return log.dir


def _optimizer(model, cfg: Config, device: torch.device, total: int):
    """AdamW over the trainable parameters and its learning-rate schedule over `total` steps (`cfg.optim`)."""
    o = cfg.optim
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=o.lr, betas=(o.beta1, o.beta2), weight_decay=o.weight_decay,
                                  foreach=device.type == "cuda")
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(o.warmup_steps, total, o.min_lr_ratio))
    return optimizer, scheduler


def _resumed_step(log, total: int, model, optimizer, scheduler, console) -> int | None:
    """A resumed run: the step its last checkpoint was written after (restored into `model`, `optimizer` and
    `scheduler`; 0 without one), with the metrics records after it dropped; None when the run is complete."""
    if log.is_complete(total):
        console.print(f"{log.dir} is a complete SFT run ({total}/{total} steps): nothing to do", highlight=False)
        return None
    start = 0
    if log.checkpoints():
        start = int(load_checkpoint(log.checkpoints()[-1], model, optimizer, scheduler)["step"])  # data only
        console.print(f"resuming {log.dir} after step {start} of {total}", highlight=False)
    log.truncate_metrics(start, step_key="sft/loss")  # the records after the checkpoint (all, without one)
    return start


@dataclass
class _Trainee:
    """What the SFT steps update and report to (`_train_steps`): the model on `device` with its tokenizer,
    optimizer and LR scheduler, the run directory's log and the console."""

    model: Any
    """The model fine-tuned."""
    tok: Any
    """Its tokenizer (the pad id of the batches)."""
    device: torch.device
    """Where the batches go."""
    optimizer: torch.optim.Optimizer
    """The model's optimizer (`_optimizer`)."""
    scheduler: Any
    """Its LR scheduler, stepped after every optimizer step."""
    log: Any
    """The run directory's log (`runs.log.RunLog`): one metrics record per step."""
    console: Any
    """Where the progress bar, or one line per tenth of the steps, goes."""


def _train_steps(cfg: Config, trainee: _Trainee, seqs: list, starts: list, *, start: int, total: int, held_out,
                 checkpoint) -> None:
    """The optimizer steps after `start` up to `total`: each epoch's shuffled batches (the permutations of an
    uninterrupted run, the batches before `start` skipped), one metrics record per step, the held-out evaluations
    and checkpoints of `run.eval_every` / `run.save_every` on the way."""
    r, o, f = cfg.run, cfg.optim, cfg.sft
    model, tok, device, optimizer, scheduler = (trainee.model, trainee.tok, trainee.device, trainee.optimizer,
                                                trainee.scheduler)
    log, console = trainee.log, trainee.console
    shuffle = torch.Generator().manual_seed(r.seed)
    t0 = time.monotonic()
    step = 0
    model.train()
    with Progress(TextColumn("[bold]sft"), BarColumn(), MofNCompleteColumn(), TextColumn("steps"),
                  TimeElapsedColumn(), TextColumn("{task.fields[info]}"), console=console,
                  disable=not console.is_terminal) as bar:
        job = bar.add_task("sft", total=total, info="")
        for epoch in range(1, f.epochs + 1):
            for idx in torch.randperm(len(seqs), generator=shuffle).split(f.batch_size):
                if step < start:  # done before the resume: the same permutations are drawn, the batches skipped
                    step += 1
                    continue
                rows = idx.tolist()
                size = f.micro_batch_size or len(rows)
                batches = [tuple(x.to(device) for x in sft_batch(seqs, starts, rows[i:i + size], tok.pad_token_id))
                           for i in range(0, len(rows), size)]
                lr = scheduler.get_last_lr()[0]
                loss = supervised_step(model, optimizer, batches, grad_clip=o.grad_clip)
                scheduler.step()
                step += 1
                if not math.isfinite(loss) and any(labelled_tokens(b[2]) for b in batches):
                    raise RuntimeError(f"sft step {step}: the loss is not finite; lower optim.lr")
                record = {"step": step, "epoch": epoch, "sft/loss": loss, "lr": lr,
                          "sft/tokens": sum(labelled_tokens(b[2]) for b in batches)}
                if r.eval_every > 0 and step % r.eval_every == 0 and step < total:
                    record.update({f"eval/{k}": v for k, v in held_out(step).items()})
                log.append_metrics(record)
                if r.save_every > 0 and step % r.save_every == 0 and step < total:
                    checkpoint(step)
                bar.update(job, completed=step, info=f"epoch {epoch}/{f.epochs}  loss {loss:.4f}")
                if not console.is_terminal and (step % max(1, total // 10) == 0 or step == total):
                    console.print(f"step {step}/{total}: epoch {epoch}, loss {loss:.4f}, "
                                  f"{format_duration(time.monotonic() - t0)} elapsed", highlight=False)
