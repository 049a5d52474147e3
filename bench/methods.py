"""Per-step overhead of each exploration method over plain GRPO, on the embedded default (CPU).

Each method is its recipe in `configs/recipes/` run through `explorl.train.loop.train` for `--steps` steps
(`model.path=embedded`, no checkpoints, no evaluation during training, a tiny final evaluation that lies outside
the step timings). From `metrics.jsonl`, after dropping `--warmup` steps, per run:

  step      median `perf/step_s` (sampling + rewards + scoring + advantages + update + metrics)
  upd       median `perf/step_s - perf/sample_s`: the update side (old log-probs, reference forward when there is
            one, advantages, shapers, token filters, importance weights, the clipped update, step metrics)
  upd/tok   median of (step - sample) / (length/mean x rollouts/total), in microseconds per generated token:
            the update side with the confound of methods that change what is sampled (EAD lengths, E3
            temperature and budgets, DAPO resampling) divided out

Methods run in rounds (grpo, m1, m2, ... then the reverse order in the next round, and so on); each method's
ratio is taken against the grpo run of the same round, and the table shows the median of those per-round
ratios. Every round also times one extra no-grad `response_logprobs` forward (no entropy, as ERPO's reference
forward) over a batch sampled from the embedded model at the recipe's size: the floor that an extra forward pass
sets is 1 + t_fwd / grpo(upd) on the update side (1 + t_fwd / grpo(step) on the whole step).

    python bench/methods.py            # about 10 minutes on 2 cores: 8 steps, 3 rounds, all methods
    python bench/methods.py --quick    # a sub-minute smoke run: 3 steps, 1 round, 3 methods
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "configs" / "recipes"

# (label, recipe, extra overrides); grpo is the baseline and always first
METHODS = [
    ("grpo", "grpo", []),
    ("e3", "e3", []),
    ("erpo", "erpo", []),
    ("cw_grpo", "cw_grpo", []),
    ("ead_tis", "ead_tis", []),
    ("still_ppl", "still_ppl", []),
    ("still_position", "still_position", ["algo.position.start=1"]),  # shaping active from the first step
    ("clip_cov", "clip_cov", []),
    ("kl_cov", "kl_cov", []),
    ("dapo", "dapo", []),
    ("forking_tokens", "forking_tokens", []),
]


def extra_forwards(recipe: str, extra: list[str]) -> tuple[int, str]:
    """No-grad forward passes a recipe needs per step beyond GRPO's, and why.

    With one update per batch GRPO takes pi_old from the training forward (`trainer.on_policy_single_update`);
    a method that needs pi_old's log-probs before the update (CW, PPL, ERPO, TIS, annealed sampling) pays one
    forward for them, and a reference model (ERPO, KL) one more.
    """
    from explorl.config import load_config
    from explorl.train.loop import on_policy_single_update

    cfg = load_config(RECIPES / f"{recipe}.yaml", extra)
    reasons = []
    if not on_policy_single_update(cfg):
        reasons.append("pi_old log-probs before the update")
    if cfg.algo.kl_coef > 0 or cfg.algo.advantage == "erpo":
        reasons.append("reference-model forward")
    return len(reasons), " + ".join(reasons)


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")


def run_method(recipe: str, extra: list[str], steps: int, threads: int, out_dir: Path) -> list[dict]:
    from rich.console import Console

    from explorl.config import load_config
    from explorl.train.loop import train

    overrides = ["model.path=embedded", f"run.steps={steps}", "run.eval_every=0", "run.save_every=0",
                 "task.eval_size=4", "run.eval_n=1", "run.eval_k=[1]", "run.log_samples=0",
                 f"run.threads={threads}", f"run.out_dir={out_dir}", *extra]
    cfg = load_config(RECIPES / f"{recipe}.yaml", overrides)
    shutil.rmtree(out_dir, ignore_errors=True)
    quiet = Console(file=io.StringIO())
    with contextlib.redirect_stderr(io.StringIO()):
        run_dir = train(cfg, console=quiet, progress=False)
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in recs if r.get("perf/step_s") is not None]


def summarise(recs: list[dict], warmup: int) -> dict:
    timed = recs[warmup:] or recs
    upd = [r["perf/step_s"] - r["perf/sample_s"] for r in timed]
    tokens = [r["length/mean"] * r["rollouts/total"] for r in timed]
    return {
        "step": _median([r["perf/step_s"] for r in timed]),
        "sample": _median([r["perf/sample_s"] for r in timed]),
        "upd": _median(upd),
        "pre": _median([r["perf/step_s"] - r["perf/sample_s"] - r["perf/update_s"] for r in timed]),
        "upd_tok_us": _median([u / t * 1e6 for u, t in zip(upd, tokens)]),
        "tokens": _median(tokens),
        "len": _median([r["length/mean"] for r in timed]),
        "n": _median([r["rollouts/total"] for r in timed]),
        "steps_timed": len(timed),
    }


class ForwardProbe:
    """Times one no-grad `response_logprobs` forward over a batch shaped like the recipes' (the extra pass)."""

    def __init__(self, threads: int):
        from explorl.config import load_config
        from explorl.models import load_policy
        from explorl.rollout.engines.native import sample
        from explorl.rollout.sampler import Sampler
        from explorl.tasks import load_task

        cfg = load_config(RECIPES / "grpo.yaml", ["model.path=embedded", "task.eval_size=4"])
        if threads > 0:
            torch.set_num_threads(threads)
        self.model, tok, _ = load_policy(cfg.model)
        self.model.train()  # as in the trainer, which scores old and reference log-probs in train mode
        task = load_task(cfg.task)
        prompts = [tok.encode(p.prompt, add_special_tokens=False) for p in task.train[:cfg.run.batch_size]]
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            self.ro = sample(Sampler(self.model, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                                     max_new_tokens=cfg.sampling.max_new_tokens),
                             prompts, cfg.sampling.group_size, temperature=cfg.sampling.temperature, generator=gen)
        self.temperature = cfg.sampling.temperature
        self.tokens = float(self.ro.mask.sum())

    def time(self, repeats: int) -> float:
        from explorl.rollout.logprobs import LogprobOptions, response_logprobs

        ro, times = self.ro, []
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            with torch.no_grad():
                response_logprobs(self.model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.mask,
                                  self.temperature, options=LogprobOptions(with_entropy=False))
            times.append(time.perf_counter() - t0)
        return statistics.median(times[1:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=8, help="training steps per run (default 8)")
    ap.add_argument("--warmup", type=int, default=2, help="leading steps dropped from the timings (default 2)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds over all methods (default 3)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (default 1: steadier when other jobs share the 2 cores)")
    ap.add_argument("--methods", default="", help="comma-separated labels (grpo is always added)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 3 steps, 1 warm-up, 1 round, 3 methods")
    ap.add_argument("--json", default="", help="also write all per-round numbers to this JSON file")
    args = ap.parse_args()
    methods = METHODS
    if args.quick:
        args.steps, args.warmup, args.rounds = 3, 1, 1
        methods = [m for m in METHODS if m[0] in ("grpo", "erpo", "cw_grpo")]
    if args.methods:
        want = {"grpo", *args.methods.split(",")}
        methods = [m for m in METHODS if m[0] in want]
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    started = time.time()
    tmp = Path(tempfile.mkdtemp(prefix="explorl_bench_methods_"))
    probe = ForwardProbe(args.threads)
    per_round: list[dict] = []
    for rnd in range(args.rounds):
        order = methods[1:] if rnd % 2 == 0 else methods[:0:-1]
        res = {}
        for label, recipe, extra in [methods[0], *order]:
            t0 = time.time()
            res[label] = summarise(run_method(recipe, extra, args.steps, args.threads, tmp / label), args.warmup)
            print(f"round {rnd + 1}/{args.rounds} {label:15s} step {res[label]['step']:.2f}s  "
                  f"upd {res[label]['upd']:.2f}s  ({time.time() - t0:.0f}s wall)", flush=True)
        res["_fwd_s"] = probe.time(repeats=5)
        print(f"round {rnd + 1}/{args.rounds} extra forward {res['_fwd_s']:.3f}s "
              f"({probe.tokens:.0f} tokens)", flush=True)
        per_round.append(res)
    shutil.rmtree(tmp, ignore_errors=True)

    base = "grpo"
    floor_upd = _median([r["_fwd_s"] / r[base]["upd"] for r in per_round])
    floor_step = _median([r["_fwd_s"] / r[base]["step"] for r in per_round])
    rows = []
    for label, _, _ in methods:
        def ratio(key):
            return _median([r[label][key] / r[base][key] for r in per_round])

        rows.append({
            "method": label,
            "step_s": _median([r[label]["step"] for r in per_round]),
            "upd_s": _median([r[label]["upd"] for r in per_round]),
            "upd_tok_us": _median([r[label]["upd_tok_us"] for r in per_round]),
            "tokens": _median([r[label]["tokens"] for r in per_round]),
            "step_x": ratio("step"), "upd_x": ratio("upd"), "upd_tok_x": ratio("upd_tok_us"),
            "per_round_upd_tok_x": [round(r[label]["upd_tok_us"] / r[base]["upd_tok_us"], 3) for r in per_round],
            "extra_forward": extra_forwards(*next((r, e) for lab, r, e in methods if lab == label)),
        })

    print()
    print(f"Extra no-grad forward (response_logprobs, {probe.tokens:.0f} tokens): median "
          f"{_median([r['_fwd_s'] for r in per_round]):.3f}s = {floor_upd:.1%} of grpo's update side, "
          f"{floor_step:.1%} of grpo's step -> floor {1 + floor_upd:.2f}x (update side), "
          f"{1 + floor_step:.2f}x (step)")
    print()
    print("| method | step s | update-side s | update-side us/token | tokens/step | step vs grpo | "
          "update-side vs grpo | update-side/token vs grpo | per round | goal |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|---|")
    for row in rows:
        goal = 1.15
        note = ""
        n_extra, why = row["extra_forward"]
        if n_extra:
            goal = max(1.15, (1 + n_extra * floor_upd) * 1.15)
            note = f" (floor {1 + n_extra * floor_upd:.2f}x: {why})"
        verdict = "baseline" if row["method"] == base else (
            ("meets" if row["upd_tok_x"] <= goal else "MISSES") + f" <= {goal:.2f}x{note}")
        print(f"| {row['method']} | {row['step_s']:.2f} | {row['upd_s']:.2f} | {row['upd_tok_us']:.1f} | "
              f"{row['tokens']:.0f} | {row['step_x']:.2f}x | {row['upd_x']:.2f}x | {row['upd_tok_x']:.2f}x | "
              f"{', '.join(f'{x:.2f}' for x in row['per_round_upd_tok_x'])} | {verdict} |")
    print()
    print(f"{args.steps} steps/run ({args.warmup} warm-up dropped), {args.rounds} round(s), "
          f"{args.threads} thread(s); {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"torch {torch.__version__}, Python {platform.python_version()}; "
          f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; total {time.time() - started:.0f}s")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "per_round": per_round, "floor_upd": floor_upd,
                                               "floor_step": floor_step, "args": vars(args)}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
