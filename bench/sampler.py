"""Sampling throughput: explorl's sampler against Hugging Face `model.generate`, on the CPU (or a GPU if present).

Three models:
  (a) the embedded default (`explorl.models.embedded_dir()`) when it has been bootstrapped, else a randomly
      initialised model of the same architecture (Qwen2, vocab 98, hidden 64, 3 layers, 4 heads, 2 KV heads,
      MLP 256), prompted with real arithmetic prompts from `explorl.tasks.arith.arith_task`;
  (anchor) a random Qwen2 with hidden 128, 4 layers, 4 heads / 2 KV heads, MLP 512, vocabulary 64 (1.0M
      parameters), random prompts of 16 tokens;
  (b) a ~10M-parameter Qwen2 with a 32k vocabulary (hidden 256, 3 layers, MLP 512; random weights), prompted
      with random token prompts of length 32.
explorl runs its default, the fused decoder compiled by torch.compile (`sampling.compile: true`; its first call,
which compiles, is timed and printed apart), and the same decoder eager for comparison.
Both sides get the same prompts, B prompts x G samples (HF: `num_return_sequences=G`), the same
`max_new_tokens`, temperature 1.0, no top-k/top-p, and stop rows at EOS. Throughput counts valid response
tokens: explorl's `mask`, and for HF the tokens up to and including each row's first EOS. Methods run
interleaved, in alternating order, after one warm-up round; the table shows medians over the repeats, the
ratio of the medians (`vs HF`) and the median of the per-round ratios (`vs HF, per round`; steadier when
the machine is shared).

explorl also returns behaviour log-probs and entropies for every token; `generate` returns tokens only.

    python bench/sampler.py                 # defaults: B=8, G=8, 64 new tokens, 5 repeats, 2 threads
    python bench/sampler.py --quick         # a smoke run
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
import warnings

import torch


def _embedded_or_random():
    """(model, tokenizer, description) for model (a)."""
    from explorl.models import TinyQwen2Sizes, build_char_tokenizer, embedded_dir, load_tokenizer, tiny_qwen2

    path = embedded_dir()
    if (path / "config.json").exists():
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
        return model, load_tokenizer(path), f"embedded default (bootstrapped, {path})"
    tok = build_char_tokenizer()
    model = tiny_qwen2(len(tok), TinyQwen2Sizes(hidden=64, layers=3, heads=4, kv_heads=2, intermediate=256),
                       pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, seed=0)
    return model, tok, f"embedded-default architecture, RANDOM weights (not bootstrapped: no {path})"


def _model_32k():
    from explorl.models import TinyQwen2Sizes, tiny_qwen2

    return tiny_qwen2(32000,
                      TinyQwen2Sizes(hidden=256, layers=3, heads=4, kv_heads=2, intermediate=512, max_positions=1024),
                      pad_token_id=0, eos_token_id=1, seed=0)


def _hf_valid_tokens(generated: torch.Tensor, eos: int) -> int:
    """Tokens up to and including the first EOS of each row (all of them where a row has none)."""
    if generated.shape[1] == 0:
        return 0
    is_eos = generated == eos
    first = torch.where(is_eos.any(-1), is_eos.int().argmax(-1) + 1, generated.shape[1])
    return int(first.sum())


def _run_explorl(model, prompts, group, max_new, eos, pad, temperature, seed, device, compile=True, cuda_graph=False):
    from explorl.rollout.engines.native import sample
    from explorl.rollout.sampler import Sampler

    gen = torch.Generator(device=device).manual_seed(seed)
    _sync(device)
    t0 = time.perf_counter()
    ro = sample(Sampler(model, eos_token_id=eos, pad_token_id=pad, max_new_tokens=max_new, compile=compile,
                        cuda_graph=cuda_graph),
                prompts, group, temperature=temperature, generator=gen)
    _sync(device)
    return int(ro.mask.sum()), time.perf_counter() - t0


def _run_hf(model, prompts, group, max_new, eos, pad, seed, device):
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for i, p in enumerate(prompts):  # left padding, as for any decoder-only batch
        ids[i, width - len(p):] = torch.tensor(p)
        attn[i, width - len(p):] = 1
    ids, attn = ids.to(device), attn.to(device)
    torch.manual_seed(seed)
    _sync(device)
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=attn, do_sample=True, temperature=1.0, top_k=0,
                             top_p=1.0, max_new_tokens=max_new, num_return_sequences=group, eos_token_id=eos,
                             pad_token_id=pad)
    _sync(device)
    return _hf_valid_tokens(out[:, width:], eos), time.perf_counter() - t0


def _vllm_engine(model, max_model_len: int = 512):
    """explorl's colocated vLLM engine (`sampling.engine: vllm`) holding `model`'s weights, or None where vLLM's
    CPU attention cannot run it (head sizes below 32)."""
    import tempfile

    from explorl.rollout.engines.vllm import VllmRollouts

    head = model.config.hidden_size // model.config.num_attention_heads
    if head < 32 and not torch.cuda.is_available():
        print(f"  vLLM skipped for this model: head size {head} (vLLM's CPU attention needs 32 or more)")
        return None
    path = tempfile.mkdtemp(prefix="bench-vllm-")
    model.save_pretrained(path)
    engine = VllmRollouts(path, dtype=next(model.parameters()).dtype, max_model_len=max_model_len, seed=0)
    engine.sync(model)
    return engine


def _run_vllm(sampler, prompts, group, seed):
    from explorl.rollout.controllers import PromptTemperature

    t0 = time.perf_counter()
    ro = sampler.engine.sample(sampler, prompts, [group] * len(prompts), [PromptTemperature(1.0)] * len(prompts),
                               seed=seed)
    return int(ro.mask.sum()), time.perf_counter() - t0


def _cpu_name() -> str:
    name = platform.processor()
    try:  # platform.processor() is often empty on Linux
        with open("/proc/cpuinfo") as f:
            name = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), name)
    except OSError:
        pass
    return f"{name or 'unknown CPU'} ({platform.machine()})"


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def bench_model(model, prompts, args, device, eos, pad):
    """Median tokens/s of each method over args.repeats interleaved rounds (after one warm-up round)."""
    model.to(device).eval()
    n = len(prompts) * args.group
    steps = torch.arange(args.max_new_tokens, dtype=torch.float32)
    anneal = 1.2 - 0.6 * steps / max(args.max_new_tokens - 1, 1)  # 1.2 -> 0.6 over the response
    per_token = anneal[None].expand(n, -1).contiguous().to(device)

    def explorl(temperature, compile=True):
        return lambda s: _run_explorl(model, prompts, args.group, args.max_new_tokens, eos, pad, temperature, s,
                                      device, compile)

    methods = {
        "explorl, T=1.0": explorl(1.0),
        "HF generate, T=1.0": lambda s: _run_hf(model, prompts, args.group, args.max_new_tokens, eos, pad, s,
                                                device),
        "explorl, per-token T [N,T] 1.2->0.6": explorl(per_token),
        "explorl eager (sampling.compile: false), T=1.0": explorl(1.0, compile=False),
    }
    engine = _vllm_engine(model) if args.vllm else None
    if engine is not None:
        from explorl.rollout.sampler import Sampler

        vllm_sampler = Sampler(model, eos, pad, args.max_new_tokens, engine=engine)
        methods["vLLM (in process), T=1.0"] = lambda s: _run_vllm(vllm_sampler, prompts, args.group, s)
    names = list(methods)
    rates = {k: [] for k in names}
    tokens = {k: [] for k in names}
    t0 = time.perf_counter()
    methods[names[0]](999)  # the compiled sampler's first call compiles (seconds to a minute): timed on its own
    print(f"  first call of the compiled sampler (compiles; cached on disk for later processes): "
          f"{time.perf_counter() - t0:.1f} s")
    for r in range(args.repeats + 1):  # round 0 warms up
        order = names if r % 2 == 0 else names[::-1]  # alternate, so no method always runs first
        for k in order:
            count, secs = methods[k](1000 + r)
            if r > 0:
                rates[k].append(count / secs)
                tokens[k].append(count)
    hf = rates["HF generate, T=1.0"]
    # the ratio within each round (both sides saw about the same load), then its median: steadier than a ratio
    # of medians when the machine is shared
    return {k: dict(tok_s=statistics.median(v), spread=(min(v), max(v)), tokens=statistics.median(tokens[k]),
                    paired=statistics.median(a / b for a, b in zip(v, hf)))
            for k, v in rates.items()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5, help="timed rounds per method (after one warm-up round)")
    p.add_argument("--batch", type=int, default=8, help="B distinct prompts")
    p.add_argument("--group", type=int, default=8, help="G samples per prompt (HF: num_return_sequences)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    p.add_argument("--device", default="cpu")
    p.add_argument("--quick", action="store_true", help="smoke run: 2 repeats, B=4, G=4, 16 new tokens")
    p.add_argument("--vllm", action="store_true",
                   help="add explorl's in-process vLLM engine (sampling.engine=vllm; needs vLLM, e.g. .venv-vllm)")
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.batch, args.group, args.max_new_tokens = 2, 4, 4, 16
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    import transformers

    device = torch.device(args.device)
    print(f"date {datetime.datetime.now().isoformat(timespec='seconds')}")
    print(f"machine: {_cpu_name()}, {os.cpu_count()} cores, "
          f"torch {torch.__version__} ({args.threads} threads), transformers {transformers.__version__}, "
          f"python {platform.python_version()}, device {device}")
    print(f"command: {' '.join([os.path.basename(sys.executable), *sys.argv])}")
    print(f"B={args.batch} prompts x G={args.group} samples, max_new_tokens={args.max_new_tokens}, "
          f"median of {args.repeats} repeats after 1 warm-up, methods interleaved")

    from explorl.tasks.arith import arith_task

    results = []
    model, tok, desc = _embedded_or_random()
    problems, _ = arith_task([1, 2, 3, 4, 5], args.batch, 0, seed=0)
    prompts = [tok.encode(pr.prompt, add_special_tokens=False) for pr in problems]
    print(f"(a) {desc}: {sum(x.numel() for x in model.parameters()) / 1e6:.2f}M params, "
          f"arith prompts of {min(map(len, prompts))}-{max(map(len, prompts))} tokens")
    results.append(("(a) char", bench_model(model, prompts, args, device, tok.eos_token_id, tok.pad_token_id)))

    # the anchor of issue 'Twice the experiments per hour' (a head size vLLM's CPU attention takes)
    from explorl.models import TinyQwen2Sizes, tiny_qwen2

    model = tiny_qwen2(64, TinyQwen2Sizes(hidden=128, layers=4, heads=4, kv_heads=2, intermediate=512), pad_token_id=0,
                       eos_token_id=1, seed=0)
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(2, 64, (args.batch, 16), generator=g).tolist()
    print(f"(anchor) random Qwen2 h128 L4, vocab 64: {sum(x.numel() for x in model.parameters()) / 1e6:.2f}M "
          f"params, random prompts of 16 tokens")
    results.append(("(anchor) h128", bench_model(model, prompts, args, device, 1, 0)))

    model = _model_32k()
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(2, 32000, (args.batch, 32), generator=g).tolist()
    print(f"(b) random Qwen2, vocab 32000: {sum(x.numel() for x in model.parameters()) / 1e6:.2f}M params, "
          f"random prompts of 32 tokens")
    results.append(("(b) 32k", bench_model(model, prompts, args, device, 1, 0)))
    _print_table(results)


def _print_table(results):
    rows = []
    for model_name, res in results:
        hf = res["HF generate, T=1.0"]["tok_s"]
        for method, r in res.items():
            rows.append((model_name, method, f"{r['tok_s']:,.0f}", f"{r['spread'][0]:,.0f}-{r['spread'][1]:,.0f}",
                         f"{r['tokens']:.0f}", f"{r['tok_s'] / hf:.2f}x", f"{r['paired']:.2f}x"))
    header = ("model", "method", "tok/s (median)", "min-max", "tokens/run", "vs HF", "vs HF, per round")
    try:
        from rich.console import Console
        from rich.table import Table

        table = Table(*header, title="sampling throughput (valid response tokens per second)")
        for row in rows:
            table.add_row(*row)
        Console(width=140).print(table)
    except ImportError:
        widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
        for row in (header, *rows):
            print("  ".join(str(x).ljust(w) for x, w in zip(row, widths)))


if __name__ == "__main__":
    main()
