"""Out-of-distribution coverage of every testbed run: the final model of each recorded run
(`runs/testbed/<method>/seed<k>/final`) evaluated on arithmetic difficulties 8-9, which no run trained on
(256 problems, n = 32, k = 1, 8, 32, T = 1, 128 new tokens), beside the base model. This is the split where
GRPO's pass@k at large k falls below the base model's (bench/RESULTS.md, "Narrowing").

Writes `bench/results/testbed/<method>/seed<k>.ood.json` (and `base.ood.json`) and skips what is recorded, so it
continues across sessions; prints a table of what is recorded.
Usage: `python bench/testbed_ood.py [--threads 1] [--shard 0/2]` (two processes: `--shard 0/2` and `--shard 1/2`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "testbed"
RUNS = ROOT / "runs" / "testbed"
EVAL = ["--task", "arith", "--task-opt", "difficulties=[8,9]", "--task-opt", "train_size=4096", "--task-opt",
        "eval_size=256", "--n", "32", "--k", "1,8,32", "--max-new-tokens", "128", "--temperature", "1.0"]


def evaluate(model: str, out: Path, threads: int) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    tmp = out.with_suffix(".tmp")
    subprocess.run([sys.executable, "-m", "explorl", "eval", "--model", model, *EVAL, "--out", str(tmp)],
                   check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
    tmp.rename(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--name", default="testbed",
                    help="which testbed: records in bench/results/NAME, runs in runs/NAME (testbed_v2: the rows on "
                         "the shipped embedded model, bench/testbed_round2.sh)")
    ap.add_argument("--shard", default="0/1",
                    help="I/N: evaluate every N-th missing model from the I-th (two processes: 0/2 and 1/2)")
    args = ap.parse_args()
    global RESULTS, RUNS
    RESULTS, RUNS = ROOT / "bench" / "results" / args.name, ROOT / "runs" / args.name
    jobs = [("embedded", RESULTS / "base.ood.json")]
    for record in sorted(RESULTS.glob("*/seed*.json")):
        if record.name.endswith(".ood.json"):
            continue
        final = RUNS / record.parent.name / record.stem / "final"
        if (final / "config.json").exists():
            jobs.append((str(final), record.with_suffix(".ood.json")))
    index, count = (int(x) for x in args.shard.split("/"))
    for model, out in [job for job in jobs if not job[1].exists()][index::count]:
        if not out.exists():
            print(f"evaluating {model}", flush=True)
            evaluate(model, out, args.threads)
    rows = sorted(RESULTS.glob("**/*.ood.json"))
    print(f"{'run':42s} pass@1  pass@8  pass@32 entropy")
    for path in rows:
        d = json.loads(path.read_text())
        print(f"{str(path.relative_to(RESULTS)):42s} {d['pass@1']:.3f}  {d['pass@8']:.3f}  {d['pass@32']:.3f}  "
              f"{d['entropy']:.3f}")


if __name__ == "__main__":
    main()
