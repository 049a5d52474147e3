"""Long testbed runs (issue "Coverage at equal entropy", item 3): each method and the GRPO baseline of its objective,
1500 steps on the testbed's settings (`configs/testbed/testbed.yaml`), checkpoints at 500, 1000 and 1500 steps,
and each checkpoint evaluated in distribution (difficulties 3-7) and out of it (8-9) at T = 1 and at the base
model's entropy (`explorl eval --match-entropy base`), with pass@k curves (`--curve`); the base model itself is
evaluated once per split at T = 1 (`base/step0.<split>.t1.json`, and in distribution by right chains,
`base/step0.id.t1-chain.json`). `bench/testbed_long_table.py` makes the tables.

Built to run across sessions: a run killed mid-way resumes from its last checkpoint (`explorl train --resume`),
each finished evaluation is written to `bench/results/<name>/<method>/seed<k>/step<N>.<split>.<mode>.json`
(`MODES`: T = 1, the base model's entropy, and in distribution the same two judged by right chains rather than
right answers) and skipped when present, and a run whose evaluations are all recorded is not trained again.
Commit the records as they land. Costs measured on this 2-core machine (2026-11-25, one core per process): a
1500-step run of one policy update per batch about 15 min, of 8 updates 28-35 min; 12 evaluations at the defaults
(`--problems 128 --n 128`) 8-10 min, and the 6 right-chain ones about 4 min more.

    python bench/testbed_long.py --methods e3_ts,ead_tis --seeds 1          # one seed of two methods (+ baselines)
    python bench/testbed_long.py & python bench/testbed_long.py   # both cores: each takes the runs no other holds
    python bench/testbed_long.py --methods grpo --steps 6 --every 3 --problems 4 --n 4 --name smoke   # smoke run
    python bench/testbed_ood_long.py   # issue 43: --model embedded:testbed --ood-chain --n 256, right chains only
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from learning import RECIPES, spec, testbed_overrides, with_baselines  # noqa: E402

METHODS = ["grpo_verified", "e3_ts", "ead_tis", "clip_cov", "kl_cov", "cw_balanced", "erpo", "adaptive_temperature"]
"""The issue's candidates and explorl's `grpo_verified` (GRPO with `task.reward: verified`, designed from these
runs); each is run with the GRPO baseline of its own objective (`learning.with_baselines`)."""
SPLITS = {"id": [3, 4, 5, 6, 7], "ood": [8, 9]}


def train_run(method: str, seed: int, run_dir: Path, args) -> None:
    """Train `method` to `args.steps`, resuming a killed run from its last checkpoint; a complete run is left."""
    from explorl.config import load_config
    from explorl.runs.log import RunLog
    from explorl.train.loop import train

    recipe, extra = spec(method)
    overrides = [*testbed_overrides(), f"model.path={args.model}", f"run.seed={seed}", f"run.out_dir={run_dir}",
                 f"run.steps={args.steps}", f"run.save_every={args.every}",
                 f"run.keep_checkpoints={args.steps // args.every + 1}", "run.eval_every=0",
                 f"run.eval_n={args.n_final}", f"run.eval_k={[1, args.n_final]}", f"run.threads={args.threads}", *extra]
    cfg = load_config(RECIPES / f"{recipe}.yaml", overrides)
    resume = run_dir if (run_dir / "config.yaml").exists() else None
    if resume is not None and RunLog(run_dir).is_complete(args.steps):
        return
    train(cfg, resume=resume, progress=False)


def evaluate(model: str, split: str, mode: str, out: Path, args, temperature: float | None = 1.0,
             seed: int = 0, completions: Path | None = None) -> None:
    """`explorl eval` of one checkpoint on one split, written to `out` (through a temporary name). `mode`: `t1`
    (T = 1), `matched` (the base model's entropy, `--match-entropy base`) or, with `-chain` (`t1-chain`,
    `matched-chain`), correct only when every worked step is the solution's (`task.reward: chain`) at
    `temperature` (None: at the base model's entropy, found here): the answer alone is often guessed. `seed`: the
    sampler's (`explorl eval --seed`; the same seed and temperature draw the same samples, whatever the judge).
    `completions`: also write every sampled completion there (`explorl eval --save-completions`)."""
    from explorl import commands

    ks = sorted({1, 8, 32, args.n} - {k for k in (8, 32) if k > args.n})
    argv = ["eval", "--model", model, "--task", "arith", "--task-opt", f"difficulties={SPLITS[split]}",
            "--task-opt", "train_size=4096", "--task-opt", f"eval_size={args.problems}", "--n", str(args.n),
            "--k", ",".join(map(str, ks)), "--curve", "--max-new-tokens", "128", "--device", "cpu",
            "--seed", str(seed)]
    if mode.endswith("-chain"):
        argv += ["--task-opt", "reward=chain"]
        if temperature is None:
            argv += ["--match-entropy", "base", "--calibration", str(min(32, args.problems))]
        else:
            argv += ["--temperature", repr(temperature)]
    elif mode == "matched":
        argv += ["--match-entropy", "base", "--calibration", str(min(32, args.problems))]
    else:
        argv += ["--temperature", "1.0"]
    if completions is not None:
        argv += ["--save-completions", str(completions)]
    tmp = out.with_name(out.name + ".tmp")
    if commands.main([*argv, "--out", str(tmp)]) != 0:
        raise SystemExit(f"explorl {' '.join(argv)} failed")
    tmp.replace(out)


MODES = ["t1", "matched", "t1-chain", "matched-chain"]
"""Evaluations of each checkpoint, in this order (a `-chain` one samples at its answer evaluation's temperature);
the `-chain` ones in distribution only: out of it the embedded model writes no right chain (bench/RESULTS.md);
`--ood-chain` for a model that does (`--model embedded:testbed`, bench/testbed_ood_long.py)."""


def split_modes(modes: list[str] = MODES, ood_chain: bool = False) -> list[tuple[str, str]]:
    """The (split, mode) pairs evaluated, among `modes`: right chains in distribution only, unless `ood_chain` (a
    base model that writes right chains out of distribution, `--model embedded:testbed`)."""
    return [(split, mode) for split in SPLITS for mode in modes
            if split == "id" or ood_chain or not mode.endswith("-chain")]


def wanted_records(record_dir: Path, steps: list[int], modes: list[str] = MODES,
                   ood_chain: bool = False) -> dict[tuple[int, str, str], Path]:
    """{(step, split, mode): record path} of every evaluation a run's checkpoints get."""
    return {(s, split, mode): record_dir / f"step{s}.{split}.{mode}.json" for s in steps
            for split, mode in split_modes(modes, ood_chain)}


def current_judge(record: dict) -> bool:
    """Whether a right-chain record (`explorl eval`'s or `explorl frontier`'s) was judged by the chain judge in use
    (`explorl.rewards.REWARD_VERSIONS`); one written before records named their judge was judged by version 1."""
    from explorl.rewards import reward_versions

    return record.get("reward_versions") == reward_versions("chain")


def recorded(path: Path, mode: str) -> bool:
    """Whether `path` holds an evaluation to keep: there, and for a right-chain mode judged by the chain judge in
    use (`current_judge`); one judged by an older judge is evaluated again (the evaluation is seeded, so the samples
    are the same and only the verdicts can change)."""
    if not path.exists():
        return False
    return not mode.endswith("-chain") or current_judge(json.loads(path.read_text()))


def run_job(method: str, seed: int, run_dir: Path, steps: list[int], args) -> None:
    """Train one (method, seed) run as far as its evaluations need and evaluate what is not recorded."""
    record_dir = ROOT / "bench" / "results" / args.name / method / f"seed{seed}"
    wanted = wanted_records(record_dir, steps, args.modes, args.ood_chain)
    missing = {k: p for k, p in wanted.items() if not recorded(p, k[2])}
    if not missing:
        return
    if not args.no_train:
        print(f"{method} seed {seed}: training to {args.steps} steps in {run_dir}", flush=True)
        train_run(method, seed, run_dir, args)
    record_dir.mkdir(parents=True, exist_ok=True)
    for (s, split, mode), out in missing.items():
        model = run_dir / "checkpoints" / f"step_{s:07d}"
        if not model.exists():
            print(f"  {model}: not there (kept checkpoints?), skipped", flush=True)
            continue
        temperature = 1.0
        if mode == "matched-chain":  # the temperature its answer evaluation found, or found again (None)
            matched = wanted.get((s, split, "matched"))
            temperature = json.loads(matched.read_text())["temperature"] if matched else None
        print(f"  step {s} {split} {mode} -> {out.relative_to(ROOT)}", flush=True)
        evaluate(str(model), split, mode, out, args, temperature)


def _alive_sweep(claim: Path) -> bool:
    """Whether the process a claim file names still runs this script (a PID reused by another program is not)."""
    try:
        cmdline = Path(f"/proc/{int(claim.read_text() or 0)}/cmdline").read_bytes()
    except (OSError, ValueError):
        return False
    return any(name in cmdline for name in (b"testbed_long", b"testbed_ood_long", b"testbed_ood_sft"))


@contextmanager
def claimed(path: Path):
    """Yields whether this process holds `path`, a claim file naming the holder's PID (created atomically): several
    processes with the same arguments (one per core) then share a sweep, each taking the jobs no live process
    holds; a claim left by a dead process is taken over. Released on exit."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            if not _alive_sweep(path):
                path.unlink(missing_ok=True)  # a dead holder's claim
                continue
            yield False
            return
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        try:
            yield True
        finally:
            path.unlink(missing_ok=True)
        return
    yield False


def parser() -> argparse.ArgumentParser:
    """The command line (`bench/testbed_ood_long.py` reads it too)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--methods", default=",".join(METHODS), help="comma-separated (their baselines are added)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--every", type=int, default=500, help="checkpoint (and evaluation) every this many steps")
    ap.add_argument("--problems", type=int, default=128, help="held-out problems per split")
    ap.add_argument("--n", type=int, default=128, help="samples per problem (pass@k curves to k = n)")
    ap.add_argument("--n-final", type=int, default=8, help="the run's own final evaluation (run.eval_n)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--name", default="testbed_long", help="runs/NAME and bench/results/NAME")
    ap.add_argument("--model", default="embedded", help="the base model every run starts from (model.path)")
    ap.add_argument("--modes", default=",".join(MODES),
                    help=f"comma-separated evaluation modes of each checkpoint, among {','.join(MODES)}")
    ap.add_argument("--ood-chain", action="store_true",
                    help="judge right chains out of distribution too (a base model that writes some there)")
    ap.add_argument("--no-train", action="store_true", help="only evaluate checkpoints that exist")
    ap.add_argument("--no-baselines", action="store_true",
                    help="run the named methods only, not the GRPO baseline of each one's objective")
    return ap


def main() -> None:
    args = parser().parse_args()
    if args.steps % args.every:
        raise SystemExit(f"--steps {args.steps} must be a multiple of --every {args.every}")
    args.modes = [m for m in args.modes.split(",") if m]
    if not args.modes or set(args.modes) - set(MODES):
        raise SystemExit(f"--modes: {args.modes} must be among {','.join(MODES)}")
    args.modes = [m for m in MODES if m in args.modes]  # `matched` before `matched-chain`, which reads it
    import torch

    torch.set_num_threads(args.threads)
    base_dir = ROOT / "bench" / "results" / args.name / "base"  # the base model at T = 1 (its own entropy)
    with claimed(ROOT / "runs" / args.name / "base.claim") as mine:
        # the base model at T = 1, by each judge a checkpoint's modes use
        base_modes = [m for m in ["t1", "t1-chain"] if any(m == mode.replace("matched", "t1") for mode in args.modes)]
        for split, mode in split_modes(base_modes, args.ood_chain) if mine else []:  # at T = 1: own entropy
            out = base_dir / f"step0.{split}.{mode}.json"
            if not recorded(out, mode):
                base_dir.mkdir(parents=True, exist_ok=True)
                print(f"  base model {split} {mode} -> {out.relative_to(ROOT)}", flush=True)
                evaluate(args.model, split, mode, out, args)
    named = [m for m in args.methods.split(",") if m]
    methods = named if args.no_baselines else with_baselines(named)
    steps = list(range(args.every, args.steps + 1, args.every))
    for seed, method in [(seed, method) for seed in range(args.seeds) for method in methods]:  # every seed 0 first
        run_dir = ROOT / "runs" / args.name / method / f"seed{seed}"
        with claimed(run_dir.with_name(f"seed{seed}.claim")) as mine:
            if mine:
                run_job(method, seed, run_dir, steps, args)


if __name__ == "__main__":
    main()
