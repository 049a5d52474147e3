"""Issue 53, item 1: the supervised control of the out-of-distribution testbed. Every RL run there loses the base
model's right 9-operation chains by training on 3-7-operation problems (bench/RESULTS.md, "Three seeds: the
answer"); would any fine-tuning on short chains lose them just the same? This fine-tunes `embedded:testbed` with
`explorl sft` (`explorl.finetune.sft.run_sft`, as `bench/testbed_long.py` trains through `train`) on the worked
solutions, the canonical right chains, of the very training prompts the RL runs use, matched to the `grpo` runs in
optimizer steps and in trained tokens per step, and evaluates its checkpoints exactly as the RL runs are evaluated.

What it trains on: the testbed's task settings (`learning.testbed_overrides()`: `arith`, difficulties 3-7, 4,096
training problems at data seed 1234, eval_size 256), so `task.train` is the RL runs' prompt set, each prompt followed
by its canonical chain and EOS (`sft.max_length` 0: the longest, 86 tokens with EOS, fits RL's 96 new tokens).

How it is matched to `grpo` (`configs/recipes/grpo.yaml` under `configs/testbed/testbed.yaml`, 1,500 steps):
- One RL step samples `run.batch_size` 16 prompts x `sampling.group_size` 16 = 256 responses and makes one policy
  update (`algo.epochs` 1, `algo.mini_batches` 1). The `grpo` runs' responses are 55.2 tokens long on average
  (`length` of their nine in-distribution T = 1 records at 500-1,500 steps, 55.1-55.4; the base model's 57.6), so a
  step's loss covers about 256 x 55.2 = 14,131 response tokens.
- A worked solution with its EOS is 53.38 tokens on average (measured over the 4,096 training problems with the
  model's tokenizer; 35.9 at 3 operations to 70.8 at 7). Matching 14,131 tokens a step takes 264.7 sequences a step.
- `explorl sft` takes `sft.epochs` x ceil(4,096 / `sft.batch_size`) optimizer steps. `matched_schedule` picks the
  batch size whose epochs hold a whole number of steps summing to 1,500 exactly, with the mean sequences per step
  nearest 264.7: `sft.batch_size` 274, 15 steps an epoch (14 of 274 sequences and one of 260), `sft.epochs` 100.
  So 1,500 optimizer steps (the same as `grpo`'s 1,500 updates) of 273.1 sequences, about 14,576 labelled tokens
  each (`sft/tokens` of one epoch: 14,263-14,969, and 13,674 in the step of 260), 3% more than `grpo`'s 14,131
  (1.2% fewer than at its start, when its responses are the base model's 57.6).
- The optimizer is the RL runs' own, unchanged: AdamW, lr 1e-4 (`configs/testbed/testbed.yaml`, the RL recipe's
  learning rate), 5 warm-up steps, cosine decay to 0.1 x over the 1,500 steps, gradient norm clipped at 1.0, no
  weight decay (the same `optim` section, and `explorl sft` schedules over its own steps as `train` does over its
  updates). Kept so the control differs from `grpo` in the objective and the data only, not in the step size or
  schedule; the model was bootstrapped at lr 5e-3 (`embedded_testbed/bootstrap.json`), so 1e-4 is a gentle
  fine-tuning, not a second bootstrap.

What differs, by design or unavoidably:
- RL trains on its own samples, scored by the answer (`task.reward` auto: the last `\\boxed{}`), each response
  weighted by its group-normalised advantage (groups that all score alike give no gradient); SFT trains on the
  canonical chains, every labelled token by cross-entropy.
- Per step, RL sees 16 prompts 16 times each; SFT sees 273 different prompts once. Over the run RL draws 24,000
  prompts (5.9 passes over the 4,096), SFT 409,600 sequences (100 passes over the same 4,096 chains).
- Weighting: `grpo`'s loss is the mean over responses of each response's token mean (`seq-mean-token-mean`); the
  SFT loss is the mean over all labelled tokens of the step, so a longer chain weighs more.
- The matching is by tokens in the loss; `grpo`'s response lengths are the evaluations' (128-token budget, T = 1,
  held-out problems of the same difficulties), not its training logs (those runs' directories are gone).

Evaluated exactly as the RL runs (`testbed_long.evaluate`; 128 problems per split, n = 256, curves to k = 256): each
checkpoint at 500, 1,000 and 1,500 steps, in distribution (`id`, 3-7 operations) and out of it (`ood`, 8-9), by right
chains at T = 1 (`t1-chain`) and at the base model's entropy (`matched-chain`), and, for this control only, the
answer-level verifier at T = 1 out of distribution (`ood` `t1`: the same seeded samples as `t1-chain`, judged by the
answer, beside the base model's `base/step0.ood.t1.json`). Records: `bench/results/testbed_ood/sft/seed<k>/step<N>.
<split>.<mode>.json`, read by `python bench/testbed_long_table.py --name testbed_ood` as one more run, compared with
`grpo` (`testbed_long_records.CONTROLS`) and the base model. Run directories: `runs/testbed_ood/sft/seed<k>/`.

Resumable as `bench/testbed_ood_long.py` is: `explorl sft` checkpoints every `--every` steps (`run.save_every`, all
kept) and a killed run continues from its last checkpoint with the batches an uninterrupted run draws (`run_sft(...,
resume=RUN)`); a complete run is not trained again, a seed whose evaluations are all recorded is not trained at all,
and a recorded evaluation is skipped (a right-chain one judged by an older chain judge is evaluated again). Each seed
is claimed, so two processes share the seeds (`python bench/testbed_ood_sft.py & python bench/testbed_ood_sft.py`).
With `--commit` each record is committed as it lands (`testbed_ood_long.commit`: that file only).

    OMP_NUM_THREADS=1 nohup python bench/testbed_ood_sft.py --commit > /tmp/testbed_ood_sft.log 2>&1 &
    python bench/testbed_long_table.py --name testbed_ood --k 256      # sft beside grpo and the base model

Smoke run (results under bench/results/smoke_sft/ and runs/smoke_sft/: delete both afterwards):

    python bench/testbed_ood_sft.py --steps 6 --every 3 --problems 4 --n 4 --seeds 1 --name smoke_sft

Costs measured (2026-11-27, one core, load average about 3 on this 2-core machine from other sessions): the smoke
run above 30 s (the base model's 3 records, 6 steps of 683 sequences in 18 s, 10 evaluations of 4 problems x 4
samples); a killed smoke run resumed after its step-3 checkpoint to the same weights and records, bit for bit. A
full step (274 sequences) takes 1.0-1.3 s, so 1,500 steps about 30 min a seed. The 15 evaluations of a seed at n =
256 should take about what `grpo`'s 12 took (18 min) and a quarter more: about 25 min. 3 seeds: about 3 h of one
core.

Not drawn here: the out-of-distribution frontier at equal entropy (`bench/testbed_long_frontier.py` knows the RL
runs only); `matched-chain` is the control's point at the base model's entropy.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import testbed_long  # noqa: E402
from learning import testbed_overrides  # noqa: E402
from testbed_ood_long import commit  # noqa: E402

METHOD = "sft"
"""The control's name among the runs of bench/results/<name>/ (`testbed_long_records.CONTROLS`: compared with
`grpo`)."""
SFT_CONFIG = testbed_long.ROOT / "configs" / "sft.yaml"
MODEL = "embedded:testbed"
TRAIN_PROBLEMS = 4096
"""`task.train_size` of the testbed: the RL runs' training prompts, every one with a worked solution."""
GRPO_RESPONSE_TOKENS = 55.2
"""Mean response tokens of the `grpo` runs (`length` of bench/results/testbed_ood/grpo/seed*/step*.id.t1-chain.json,
55.1-55.4)."""
SOLUTION_TOKENS = 53.38
"""Mean labelled tokens (worked solution and EOS) of the 4,096 training problems with the model's tokenizer."""
SPLIT_MODES = [("id", "t1-chain"), ("id", "matched-chain"), ("ood", "t1-chain"), ("ood", "matched-chain"),
               ("ood", "t1")]
"""The RL runs' evaluations (`bench/testbed_ood_long.py`: right chains in and out of distribution, at T = 1 and at
the base model's entropy), then the answer-level verifier out of distribution at T = 1."""


def rl_step() -> tuple[int, int, int]:
    """(prompts, responses per prompt, policy updates) of one RL step of the `grpo` runs: the testbed's
    `run.batch_size` and `sampling.group_size`, and the GRPO recipe's updates per batch."""
    from learning import objective

    settings = dict(o.split("=", 1) for o in testbed_overrides())
    return int(settings["run.batch_size"]), int(settings["sampling.group_size"]), objective("grpo")[3]


def matched_sequences(response_tokens: float = GRPO_RESPONSE_TOKENS, solution_tokens: float = SOLUTION_TOKENS
                      ) -> float:
    """SFT sequences per step whose labelled tokens match the tokens one RL step trains on (its responses)."""
    prompts, group, updates = rl_step()
    return prompts * group * response_tokens / (updates * solution_tokens)


def matched_schedule(problems: int, steps: int, sequences: float) -> tuple[int, int]:
    """(`sft.batch_size`, `sft.epochs`) giving exactly `steps` optimizer steps over `problems` worked solutions
    (`explorl sft` takes epochs x ceil(problems / batch) steps, the last batch of an epoch the remainder), with the mean
    sequences per step (problems / steps per epoch) nearest `sequences`: for each divisor of `steps` as the steps of
    one epoch, the smallest batch size that gives it. ValueError when no batch size divides `steps` so."""
    best = None
    for per_epoch in range(1, min(steps, problems) + 1):
        if steps % per_epoch:
            continue
        batch = math.ceil(problems / per_epoch)
        if math.ceil(problems / batch) != per_epoch:  # no batch size cuts the problems into that many steps
            continue
        gap = abs(problems / per_epoch - sequences)
        if best is None or gap < best[0]:
            best = (gap, batch, steps // per_epoch)
    if best is None:
        raise ValueError(f"no batch size gives {steps} steps over {problems} problems in whole epochs")
    return best[1], best[2]


def sft_overrides(seed: int, run_dir: Path, args) -> list[str]:
    """The run's config: `configs/sft.yaml` under the testbed's settings (as every RL run's recipe is), from the
    testbed model, `sft.batch_size` and `sft.epochs` matched to `args.steps` (`matched_schedule`), checkpoints every
    `args.every` steps, all kept."""
    batch, epochs = matched_schedule(TRAIN_PROBLEMS, args.steps, matched_sequences())
    return [*testbed_overrides(), f"model.path={args.model}", f"run.seed={seed}", f"run.out_dir={run_dir}",
            f"run.steps={args.steps}", f"run.save_every={args.every}",
            f"run.keep_checkpoints={args.steps // args.every + 1}", "run.eval_every=0",
            f"run.eval_n={args.n_final}", f"run.eval_k={[1, args.n_final]}", f"run.threads={args.threads}",
            f"sft.batch_size={batch}", f"sft.epochs={epochs}"]


def train_run(seed: int, run_dir: Path, args) -> None:
    """Fine-tune to `args.steps`, resuming a killed run from its last checkpoint; a complete run is left."""
    from explorl.config import load_config
    from explorl.finetune.sft import run_sft
    from explorl.runs.log import RunLog

    cfg = load_config(SFT_CONFIG, sft_overrides(seed, run_dir, args))
    steps = cfg.sft.epochs * math.ceil(TRAIN_PROBLEMS / cfg.sft.batch_size)
    if steps != args.steps:
        raise SystemExit(f"sft: {cfg.sft.epochs} epochs of batch {cfg.sft.batch_size} give {steps} steps, "
                         f"not {args.steps}")
    resume = run_dir if (run_dir / "config.yaml").exists() else None
    if resume is not None and RunLog(run_dir).is_complete(args.steps):
        return
    run_sft(cfg, resume=resume)


def wanted_records(record_dir: Path, steps: list[int]) -> dict[tuple[int, str, str], Path]:
    """{(step, split, mode): record path} of every evaluation of the run's checkpoints (`SPLIT_MODES`)."""
    return {(s, split, mode): record_dir / f"step{s}.{split}.{mode}.json" for s in steps for split, mode in SPLIT_MODES}


def evaluate(model: str, split: str, mode: str, out: Path, args, temperature: float | None = 1.0) -> None:
    """`testbed_long.evaluate`, then with `--commit` the record committed alone."""
    testbed_long.evaluate(model, split, mode, out, args, temperature)
    if args.commit:
        commit(out)


def run_job(seed: int, run_dir: Path, steps: list[int], args) -> None:
    """Train one seed as far as its evaluations need and evaluate what is not recorded."""
    record_dir = testbed_long.ROOT / "bench" / "results" / args.name / METHOD / f"seed{seed}"
    missing = {k: p for k, p in wanted_records(record_dir, steps).items() if not testbed_long.recorded(p, k[2])}
    if not missing:
        print(f"{METHOD} seed {seed}: every evaluation recorded", flush=True)
        return
    print(f"{METHOD} seed {seed}: fine-tuning to {args.steps} steps in {run_dir}", flush=True)
    train_run(seed, run_dir, args)
    record_dir.mkdir(parents=True, exist_ok=True)
    for (s, split, mode), out in missing.items():
        model = run_dir / "checkpoints" / f"step_{s:07d}"
        if not model.exists():
            print(f"  {model}: not there, skipped", flush=True)
            continue
        print(f"  step {s} {split} {mode} -> {out.relative_to(testbed_long.ROOT)}", flush=True)
        # right chains at the base model's entropy: its temperature found again, as the RL runs' were
        evaluate(str(model), split, mode, out, args, None if mode == "matched-chain" else 1.0)


def evaluate_base(args) -> None:
    """The base model's records the control's modes compare with (`base/step0.<split>.<t1-chain|t1>.json`, at T = 1),
    where missing (bench/results/testbed_ood/ holds them all)."""
    base_dir = testbed_long.ROOT / "bench" / "results" / args.name / "base"
    with testbed_long.claimed(testbed_long.ROOT / "runs" / args.name / "base.claim") as mine:
        for split, mode in dict.fromkeys((s, m.replace("matched", "t1")) for s, m in SPLIT_MODES) if mine else []:
            out = base_dir / f"step0.{split}.{mode}.json"
            if not testbed_long.recorded(out, mode):
                base_dir.mkdir(parents=True, exist_ok=True)
                print(f"  base model {split} {mode} -> {out.relative_to(testbed_long.ROOT)}", flush=True)
                evaluate(args.model, split, mode, out, args)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=1500, help="optimizer steps (the grpo runs' 1,500)")
    ap.add_argument("--every", type=int, default=500, help="checkpoint (and evaluation) every this many steps")
    ap.add_argument("--problems", type=int, default=128, help="held-out problems per split")
    ap.add_argument("--n", type=int, default=256, help="samples per problem (pass@k curves to k = n)")
    ap.add_argument("--n-final", type=int, default=8, help="the run's own final evaluation (run.eval_n)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--name", default="testbed_ood", help="runs/NAME and bench/results/NAME")
    ap.add_argument("--model", default=MODEL, help="the base model fine-tuned (model.path)")
    ap.add_argument("--commit", action="store_true", help="commit each record as it lands")
    return ap


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.steps % args.every:
        raise SystemExit(f"--steps {args.steps} must be a multiple of --every {args.every}")
    import torch

    torch.set_num_threads(args.threads)
    evaluate_base(args)
    steps = list(range(args.every, args.steps + 1, args.every))
    for seed in range(args.seeds):
        run_dir = testbed_long.ROOT / "runs" / args.name / METHOD / f"seed{seed}"
        with testbed_long.claimed(run_dir.with_name(f"seed{seed}.claim")) as mine:
            if mine:
                run_job(seed, run_dir, steps, args)


if __name__ == "__main__":
    main()
