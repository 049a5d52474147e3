"""One GRPO training step: explorl's `trainer.train` against TRL's `GRPOTrainer`, in one process, on the CPU.

Both sides start from the same weights (the embedded default, `explorl.models.embedded_dir()`, loaded afresh
for every run), use explorl's character tokenizer (`explorl.models.load_tokenizer`; TRL gets the object as
`processing_class`), and see the same prompts in the same order: the arithmetic training problems of
`explorl.tasks.arith.arith_task([1, 2, 3, 4, 5], 4096, 256, 1234)`, in the order explorl's `PromptStream`
draws them for the run seed (TRL: a `datasets.Dataset` of {"prompt", "answer"} in that order,
`shuffle_dataset=False`). The reward is `explorl.rewards.int_reward(completion, answer)` on both sides.

One step = B prompts x G samples, `max_new_tokens` new tokens, temperature 1.0 (no top-k/top-p), rewards,
group-normalised advantages, and ONE optimizer update on the whole batch:
  explorl: algo.epochs=1, algo.mini_batches=1, micro_batch_size=0, loss_agg=token-mean, kl_coef=0 (no
           reference model), advantage=grpo, eps 0.2/0.2, AdamW, grad_clip 1.0, constant lr (warmup 0,
           min_lr_ratio 1), run.eval_every=0, save_every=0, log_samples=0;
  TRL:     per_device_train_batch_size=B*G (completions), num_generations=G, gradient_accumulation_steps=1,
           steps_per_generation=1, num_iterations=1, beta=0.0 (no reference model), loss_type="dapo" (token
           sum over the whole generation batch / its number of tokens = explorl's token-mean),
           scale_rewards="group", epsilon 0.2, optim adamw_torch, max_grad_norm 1.0, constant lr,
           gradient_checkpointing=False (TRL 1.x defaults to True), bf16=False, use_cpu=True, logging_steps=1,
           no saving, no evaluation.

Timing: explorl's per-step `perf/step_s` (metrics.jsonl; sample + reward + old log-probs + advantages + update;
the final evaluation and checkpoint that `train` runs after the last step are outside it). TRL: wall time from
`on_step_begin` to `on_step_end` of a `TrainerCallback` (generation, reward, advantages, loss, backward, clip,
optimizer step). `rollout s` splits off the sampling phase: explorl `perf/step_s - perf/update_s` (sampling,
decoding, rewards, the no-grad old-log-prob pass, advantages, metrics), TRL the time in
`_generate_and_score_completions` (generation, decoding, rewards, advantages; with num_iterations=1 TRL takes
the old log-probs from the training forward instead of a separate pass); `update s` is the rest of the step.
A further column, `loop`, is the interval between consecutive step ends on each side (adds the
per-step logging: explorl's metrics.jsonl append, TRL's `log`/callbacks and data loading). The first
`--warmup` steps of every run are dropped. Runs alternate (explorl, TRL, then TRL, explorl, ...) for
`--rounds` rounds; medians pool the timed steps of all rounds, and `per round` is the median of the ratios
of the per-round medians.

    python bench/train_step.py                 # B=16, G=8, 64 new tokens, 2 warm-up + 16 timed steps, 4 rounds
    python bench/train_step.py --quick         # a smoke run
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

LR = 1e-5
SEED = 0


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _model_dir() -> Path:
    from explorl.models import resolve_model_path

    return resolve_model_path("embedded")


def _task_cfg():
    from explorl.config import TaskConfig

    return TaskConfig(name="arith", difficulties=[1, 2, 3, 4, 5], train_size=4096, eval_size=256, data_seed=1234)


# ----------------------------------------------------------------------------------------------------------------
# explorl


def run_explorl(args, out_dir: Path) -> dict:
    import explorl.train.loop as trainer
    from explorl.config import load_config
    from explorl.runs.log import RunLog

    overrides = [
        "model.path=embedded", "model.device=cpu", "model.dtype=float32",
        "task.name=arith", "task.difficulties=[1,2,3,4,5]", "task.train_size=4096", "task.eval_size=256",
        "task.data_seed=1234",
        f"sampling.group_size={args.group}", "sampling.temperature=1.0", "sampling.top_p=1.0",
        f"sampling.max_new_tokens={args.max_new_tokens}",
        "algo.advantage=grpo", "algo.loss_agg=token-mean", "algo.kl_coef=0", "algo.entropy_coef=0",
        "algo.epochs=1", "algo.mini_batches=1", "algo.micro_batch_size=0", "algo.eps_low=0.2", "algo.eps_high=0.2",
        f"optim.lr={LR}", "optim.warmup_steps=0", "optim.min_lr_ratio=1.0", "optim.grad_clip=1.0",
        "optim.weight_decay=0.0",
        f"run.steps={args.warmup + args.steps}", f"run.batch_size={args.batch}", f"run.seed={SEED}",
        f"run.out_dir={out_dir}", "run.save_every=0", "run.eval_every=0", "run.eval_n=1", "run.eval_k=[1]",
        "run.log_samples=0", f"run.threads={args.threads}",
    ]
    cfg = load_config(None, overrides)
    ends: list[float] = []
    original = RunLog.append_metrics

    def stamped(self, record):  # time each step's record as it is written (the step's end, for `loop`)
        original(self, record)
        if "perf/step_s" in record:
            ends.append(time.perf_counter())

    RunLog.append_metrics = stamped
    try:
        from rich.console import Console

        trainer.train(cfg, console=Console(file=open(os.devnull, "w")), progress=False)
    finally:
        RunLog.append_metrics = original
    recs = [json.loads(x) for x in (out_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    recs = [r for r in recs if "perf/step_s" in r]
    w = args.warmup
    step_s = [r["perf/step_s"] for r in recs][w:]
    tokens = [r["perf/tokens_per_s"] * r["perf/sample_s"] for r in recs][w:]
    loop_s = [b - a for a, b in zip(ends, ends[1:])][max(w - 1, 0):]
    return {"step_s": step_s, "loop_s": loop_s, "tokens": tokens,
            "rollout_s": [r["perf/step_s"] - r["perf/update_s"] for r in recs][w:],
            "sample_s": [r["perf/sample_s"] for r in recs][w:],
            "reward": [r.get("reward/mean") for r in recs][w:]}


# ----------------------------------------------------------------------------------------------------------------
# TRL


def _trl_dataset(args):
    """The prompts explorl's PromptStream draws for seed SEED, in its order, as a `datasets.Dataset`."""
    from datasets import Dataset

    from explorl.tasks import load_task
    from explorl.rollout.controllers import PromptStream

    task = load_task(_task_cfg())
    stream = PromptStream(len(task.train), SEED)
    rows = []
    for _ in range(args.warmup + args.steps):
        for i in stream.next(args.batch):
            rows.append({"prompt": task.train[i].prompt, "answer": task.train[i].answer})
    return Dataset.from_list(rows)


def run_trl(args, out_dir: Path, explorl_trainer: bool = False) -> dict:
    """TRL's GRPO step; with `explorl_trainer`, the same step through `ExplorlGRPOTrainer` (explorl's GRPO
    advantages and PPO loss, token-mean, eps 0.2: no extra forward), to measure the adapter's overhead."""
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from explorl.models import load_tokenizer
    from explorl.rewards import int_reward

    torch.set_num_threads(args.threads)
    path = _model_dir()
    tok = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, attn_implementation="sdpa")
    tokens_per_step: list[int] = []

    def reward(prompts, completions, completion_ids, answer, **kw):
        tokens_per_step.append(sum(len(c) for c in completion_ids))
        return [int_reward(c, a) for c, a in zip(completions, answer)]

    class Timer(TrainerCallback):
        def __init__(self):
            self.begin: list[float] = []
            self.end: list[float] = []

        def on_step_begin(self, a, state, control, **kw):
            self.begin.append(time.perf_counter())

        def on_step_end(self, a, state, control, **kw):
            self.end.append(time.perf_counter())

    timer = Timer()
    n = args.batch * args.group
    config = GRPOConfig(
        output_dir=str(out_dir), use_cpu=True, bf16=False, fp16=False, seed=SEED,
        per_device_train_batch_size=n, num_generations=args.group, gradient_accumulation_steps=1,
        steps_per_generation=1, num_iterations=1, max_steps=args.warmup + args.steps,
        max_completion_length=args.max_new_tokens, temperature=1.0, top_p=1.0, top_k=0,
        beta=0.0, loss_type="dapo", scale_rewards="group", epsilon=0.2,
        learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
        adam_beta1=0.9, adam_beta2=0.999, optim="adamw_torch",
        gradient_checkpointing=False, shuffle_dataset=False, logging_steps=1, save_strategy="no",
        eval_strategy="no", report_to=[], dataloader_num_workers=0, disable_tqdm=True, log_completions=False,
    )
    if explorl_trainer:
        from explorl.integrations.trl import ExplorlGRPOTrainer

        trainer = ExplorlGRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=_trl_dataset(args),
                                     processing_class=tok, callbacks=[timer],
                                     algo={"advantage": "grpo", "loss_agg": "token-mean", "eps_low": 0.2,
                                           "eps_high": 0.2})
    else:
        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=_trl_dataset(args),
                              processing_class=tok, callbacks=[timer])
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # no per-step dict on stdout (the logs are still computed and kept)
    rollout_s: list[float] = []
    inner = trainer._generate_and_score_completions

    def timed(*a, **kw):  # the rollout phase: generation, rewards, advantages
        t = time.perf_counter()
        out = inner(*a, **kw)
        rollout_s.append(time.perf_counter() - t)
        return out

    trainer._generate_and_score_completions = timed
    trainer.train()
    w = args.warmup
    step_s = [e - b for b, e in zip(timer.begin, timer.end)][w:]
    loop_s = [b - a for a, b in zip(timer.end, timer.end[1:])][max(w - 1, 0):]
    hist = [h for h in trainer.state.log_history if "reward" in h]
    return {"step_s": step_s, "loop_s": loop_s, "tokens": tokens_per_step[w:], "rollout_s": rollout_s[w:],
            "reward": [h.get("reward") for h in hist][w:]}


# ----------------------------------------------------------------------------------------------------------------


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def _med(xs):
    return statistics.median(xs) if xs else float("nan")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=16, help="timed steps per run (after --warmup steps)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps at the start of every run")
    p.add_argument("--rounds", type=int, default=4, help="runs per method, alternating the order")
    p.add_argument("--batch", type=int, default=16, help="B prompts per step")
    p.add_argument("--group", type=int, default=8, help="G samples per prompt")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (explorl: run.threads)")
    p.add_argument("--quick", action="store_true", help="smoke run: B=4, G=4, 16 new tokens, 1+2 steps, 1 round")
    args = p.parse_args(argv)
    if args.quick:
        args.batch, args.group, args.max_new_tokens, args.warmup, args.steps, args.rounds = 4, 4, 16, 1, 2, 1
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    torch.set_num_threads(args.threads)

    import transformers
    import trl

    print(f"date {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; {_cpu_name()}, "
          f"{os.cpu_count()} cores, {args.threads} torch threads; torch {torch.__version__}, "
          f"transformers {transformers.__version__}, trl {trl.__version__}, Python {platform.python_version()}")
    print(f"model {_model_dir()}; B={args.batch} prompts x G={args.group}, max_new_tokens={args.max_new_tokens}, "
          f"warm-up {args.warmup} + timed {args.steps} steps per run, {args.rounds} round(s)")
    print(f"load average (1/5/15 min) at the start: {_load()}")
    sys.stdout.flush()

    results = {"explorl": [], "TRL": [], "TRL+explorl": []}
    runners = {"explorl": run_explorl, "TRL": run_trl,
               "TRL+explorl": lambda a, o: run_trl(a, o, explorl_trainer=True)}
    with tempfile.TemporaryDirectory(prefix="explorl-bench-") as tmp:
        for rnd in range(args.rounds):
            order = ["explorl", "TRL", "TRL+explorl"] if rnd % 2 == 0 else ["TRL+explorl", "TRL", "explorl"]
            for name in order:
                out = Path(tmp) / f"{name}-{rnd}"
                t = time.perf_counter()
                res = runners[name](args, out)
                results[name].append(res)
                print(f"round {rnd + 1} {name}: median {_med(res['step_s']):.3f} s/step "
                      f"({len(res['step_s'])} steps, run {time.perf_counter() - t:.1f} s)")
                sys.stdout.flush()

    def pooled(name, key):
        return [x for r in results[name] for x in r[key]]

    base = _med(pooled("TRL", "step_s"))
    base_loop = _med(pooled("TRL", "loop_s"))
    rows = []
    for name in ("explorl", "TRL", "TRL+explorl"):
        s, lp, tk = pooled(name, "step_s"), pooled(name, "loop_s"), pooled(name, "tokens")
        per_round = [_med(a["step_s"]) / _med(b["step_s"]) for a, b in zip(results[name], results["TRL"])]
        rows.append((name, _med(s), min(s), max(s), _med(lp), _med(tk), _med(s) / base, _med(lp) / base_loop,
                     _med(per_round), len(s)))
    print()
    print("| method | s/step (median) | min-max | rollout s | update s | loop s/step | tokens/step | vs TRL "
          "| loop vs TRL | vs TRL, per round | steps |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, med, lo, hi, lp, tk, ratio, lratio, prr, n in rows:
        ro = pooled(name, "rollout_s")
        up = [a - b for a, b in zip(pooled(name, "step_s"), ro)]
        print(f"| {name} | {med:.3f} | {lo:.3f}-{hi:.3f} | {_med(ro):.3f} | {_med(up):.3f} | {lp:.3f} | {tk:,.0f} "
              f"| {ratio:.2f}x | {lratio:.2f}x | {prr:.2f}x | {n} |")
    r = {name: [x for x in pooled(name, "reward") if x is not None] for name in results}
    print(f"\nexplorl rollout phase: sampling + decoding + rewards (perf/sample_s) median "
          f"{_med(pooled('explorl', 'sample_s')):.3f} s; the rest of it (old log-probs, advantages, metrics) "
          f"{_med([a - b for a, b in zip(pooled('explorl', 'rollout_s'), pooled('explorl', 'sample_s'))]):.3f} s")
    print(f"load average (1/5/15 min) at the end: {_load()}")
    print(f"mean reward over timed steps: explorl {statistics.fmean(r['explorl']):.3f}, "
          f"TRL {statistics.fmean(r['TRL']):.3f}, TRL+explorl {statistics.fmean(r['TRL+explorl']):.3f}")


if __name__ == "__main__":
    main()
