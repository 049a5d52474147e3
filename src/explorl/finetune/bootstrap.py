"""`explorl bootstrap`: train the embedded default policy, a tiny Qwen2 model with a character tokenizer.

Supervised training on the built-in arithmetic task's worked solutions, stopped on purpose while the model is
still imperfect: every `eval_every` steps the held-out pass@1 (one sample per problem at temperature 1) is
measured, and training stops at the first measurement at or above `target_pass1`. RL then has room to improve.
The result is saved with `save_pretrained`, so it loads through the same path as any Hugging Face model.
Deterministic for a seed and a thread count on one machine, but not across CPU models (kernels round differently),
so the embedded default is not trained on the user's machine: its weights ship with the package
(`explorl/embedded/`, with this command's `bootstrap.json` and the weights' fingerprint), and this command is how
they were made and how to make another (`explorl bootstrap --out DIR`, then `EXPLORL_EMBEDDED=DIR`).

A mixture (`rare_fraction` > 0) replaces that fraction of the worked solutions with problems from another region,
`rare_difficulties` on `rare_operands` (e.g. chains longer than RL trains on), seen seldom: a model with thin support
there, where RL can keep or lose what the base model writes (the `embedded:testbed` model, `explorl/embedded_testbed/`).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from explorl.evaluation.evaluate import EvalPlan, evaluate
from explorl.finetune.supervised import sft_batch, sft_example, supervised_step
from explorl.models import TinyQwen2Sizes, build_char_tokenizer, count_parameters, tiny_qwen2, weights_fingerprint
from explorl.rewards import extract_boxed
from explorl.rollout.sampler import Sampler
from explorl.tasks import Task
from explorl.tasks.arith import MAX_DIFFICULTY, MAX_OPERAND, OPERANDS, arith_task, default_reward


@dataclass
class BootstrapConfig:
    seed: int = 0
    """Seed of initialisation and data order."""
    hidden: int = 64
    """Model width."""
    layers: int = 3
    """Decoder layers."""
    heads: int = 4
    """Attention heads."""
    kv_heads: int = 2
    """Key/value heads (grouped-query attention, as Qwen2)."""
    intermediate: int = 256
    """MLP width."""
    difficulties: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 5])
    """Difficulty levels of the training problems (the default task mix)."""
    train_size: int = 30000
    """Worked solutions to train on (disjoint from the held-out split)."""
    eval_size: int = 256
    """Held-out problems for the stopping rule (the same split the default task evaluates on)."""
    data_seed: int = 1234
    """Seed of the task generator; equal to `task.data_seed`'s default so the held-out split is shared."""
    batch_size: int = 64
    """Sequences per optimizer step."""
    lr: float = 5e-3
    """Peak AdamW learning rate (linear warm-up, then constant)."""
    warmup: int = 100
    """Warm-up steps."""
    max_steps: int = 2500
    """Hard cap on optimizer steps."""
    eval_every: int = 100
    """Steps between checks of the stopping rule."""
    target_pass1: float = 0.25
    """Stop at the first check whose held-out pass@1 reaches this (keeps the model imperfect)."""
    max_new_tokens: int = 64
    """Length limit of sampled solutions during the checks."""
    rare_fraction: float = 0.0
    """Fraction of the `train_size` worked solutions drawn from the rare region (`rare_difficulties` on
    `rare_operands`) instead of `difficulties`; 0 (the embedded default): none. A small value gives the model thin
    support there."""
    rare_difficulties: list[int] = field(default_factory=lambda: [8, 9])
    """Difficulty levels of the rare problems (with `rare_fraction` > 0)."""
    rare_operands: list[int] = field(default_factory=lambda: [1, 20])
    """Inclusive operand range [low, high] of the rare problems. They are the train split of `arith_task` at
    `data_seed` with `eval_size` held out, so an evaluation of that region (`task.difficulties` and `task.operands`
    the same, `task.eval_size` <= `eval_size`, the default `task.data_seed`) never scores a problem trained on."""
    note: str = ""
    """Why this model was made (recorded in bootstrap.json with the mixture)."""


def check_config(cfg: BootstrapConfig) -> None:
    """Raise ValueError naming the field when the mixture settings are out of range (before any training)."""
    if not 0.0 <= cfg.rare_fraction < 1.0:
        raise ValueError(f"bootstrap.rare_fraction: a fraction in [0, 1), got {cfg.rare_fraction}")
    if not cfg.rare_difficulties or not all(1 <= d <= MAX_DIFFICULTY for d in cfg.rare_difficulties):
        raise ValueError(f"bootstrap.rare_difficulties: levels in 1..{MAX_DIFFICULTY}, got {cfg.rare_difficulties}")
    ops = cfg.rare_operands
    if len(ops) != 2 or not 1 <= ops[0] <= ops[1] <= MAX_OPERAND:
        raise ValueError(f"bootstrap.rare_operands: an inclusive range [low, high] with 1 <= low <= high <= "
                         f"{MAX_OPERAND}, got {ops}")


def training_problems(cfg: BootstrapConfig) -> tuple[list, list]:
    """(train, held_out) problems: `train_size` worked solutions, of which round(`rare_fraction` x `train_size`)
    come from the rare region, and the held-out split of `difficulties` that the stopping rule scores. With
    `rare_fraction` 0 exactly the embedded default's data."""
    rare_count = round(cfg.rare_fraction * cfg.train_size)
    train, held_out = arith_task(cfg.difficulties, cfg.train_size - rare_count, cfg.eval_size, cfg.data_seed)
    if rare_count:
        rare, _ = arith_task(cfg.rare_difficulties, rare_count, cfg.eval_size, cfg.data_seed,
                             tuple(cfg.rare_operands))
        train = train + rare  # the data order is a random permutation of all of them (`_batches`)
    return train, held_out


def mixture(cfg: BootstrapConfig) -> dict:
    """What the model was trained on, for bootstrap.json."""
    rare_count = round(cfg.rare_fraction * cfg.train_size)
    out = {"main": {"difficulties": cfg.difficulties, "operands": list(OPERANDS),
                    "problems": cfg.train_size - rare_count}}
    if rare_count:
        out["rare"] = {"difficulties": cfg.rare_difficulties, "operands": cfg.rare_operands, "problems": rare_count,
                       "fraction": rare_count / cfg.train_size}
    return out


def _batches(seqs: list[list[int]], starts: list[int], batch: int, gen: torch.Generator, pad: int):
    """Endless shuffled `sft_batch`es."""
    while True:
        for idx in torch.randperm(len(seqs), generator=gen).split(batch):
            yield sft_batch(seqs, starts, idx.tolist(), pad)


def bootstrap(out_dir: str | Path, cfg: BootstrapConfig | None = None, *, console=None) -> Path:
    """Train and save the embedded default model to `out_dir` (atomically). Returns `out_dir`."""
    cfg = cfg or BootstrapConfig()
    check_config(cfg)
    console = console or Console()
    out_dir = Path(out_dir)
    t_start = time.perf_counter()
    tok = build_char_tokenizer()
    sizes = TinyQwen2Sizes(hidden=cfg.hidden, layers=cfg.layers, heads=cfg.heads, kv_heads=cfg.kv_heads,
                           intermediate=cfg.intermediate)
    model = tiny_qwen2(len(tok), sizes, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, seed=cfg.seed)
    train, held_out = training_problems(cfg)
    reward_fn, isolate = default_reward()
    task = Task(name="arith", train=train, eval=held_out, reward_fn=reward_fn, isolate=isolate,
                extract_answer=extract_boxed)
    seqs, starts = [], []
    for p in train:
        seq, start = sft_example(tok, p.prompt, p.solution)
        seqs.append(seq)
        starts.append(start)
    gen = torch.Generator().manual_seed(cfg.seed)
    batches = _batches(seqs, starts, cfg.batch_size, gen, tok.pad_token_id)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / cfg.warmup))
    console.print(f"[bold]bootstrap[/]: tiny Qwen2 with {count_parameters(model):,} parameters, "
                  f"{len(seqs)} worked solutions, stopping at held-out pass@1 >= {cfg.target_pass1}")
    sampler = Sampler(model, tok.eos_token_id, tok.pad_token_id, cfg.max_new_tokens)  # the held-out pass@1's
    history = []
    pass1 = 0.0
    step = 0
    with Progress(TextColumn("[bold]bootstrap"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[info]}"), console=console, disable=not console.is_terminal) as bar:
        job = bar.add_task("sft", total=cfg.max_steps, info="")
        model.train()
        for step in range(1, cfg.max_steps + 1):
            loss = supervised_step(model, opt, [next(batches)], grad_clip=1.0)  # shared with `explorl sft` and rft
            sched.step()
            if step % cfg.eval_every == 0:
                summary, _ = evaluate(sampler, tok, held_out, task,
                                      EvalPlan(n=1, ks=[1], temperature=1.0, seed=cfg.seed + step))
                model.train()
                pass1 = summary["pass@1"]
                history.append({"step": step, "loss": loss, "pass@1": pass1})
                bar.update(job, completed=step, info=f"loss {loss:.3f}  held-out pass@1 {pass1:.3f}")
                if not console.is_terminal:
                    console.print(f"  step {step}: loss {loss:.3f}, held-out pass@1 {pass1:.3f}")
                if pass1 >= cfg.target_pass1:
                    break
            else:
                bar.update(job, completed=step)
    model.eval()
    tmp = out_dir.with_name(out_dir.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp))
    tok.save_pretrained(str(tmp))
    info = {"mixture": mixture(cfg)} if cfg.rare_fraction else {}  # first: what sets this model apart
    info |= {"note": cfg.note} if cfg.note else {}
    info |= {"config": asdict(cfg), "steps": step, "held_out_pass@1": pass1, "parameters": count_parameters(model),
            "seconds": time.perf_counter() - t_start, "history": history}
    info["fingerprint"] = weights_fingerprint(tmp)
    info["torch"], info["threads"] = torch.__version__, torch.get_num_threads()
    info["machine"] = f"{platform.machine()} {torch.backends.cpu.get_cpu_capability()}, {time.strftime('%Y-%m-%d')}"
    (tmp / "bootstrap.json").write_text(json.dumps(info, indent=2))
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)
    console.print(f"[bold]bootstrap[/]: saved to {out_dir} after {step} steps, held-out pass@1 {pass1:.3f}, "
                  f"{info['seconds']:.0f}s, fingerprint {info['fingerprint']}")
    return out_dir

