"""Coverage of a model from `explorl eval --curve` records, with intervals: pass@k at each k (unbiased, from each
problem's n samples and c right ones) and its 95% percentile-bootstrap interval over the problems
(`metrics.bootstrap_ci`, 2,000 resamples), and how many problems have at least one right sample in n. This is how
the `embedded:testbed` model's coverage out of distribution was measured (issue 43: right-chain pass@64 in
[0.05, 0.5] there).

    python bench/testbed_ood_coverage.py bench/results/testbed_ood/base/step0.ood.t1-chain.json --k 1,8,64,256
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def coverage(record: dict, k: int) -> tuple[float, float, float]:
    """(mean pass@k over the record's problems, 95% interval low, high); k at most the record's n."""
    from explorl.metrics import bootstrap_ci, pass_at_k

    problems = record["curve"]["problems"]
    values = [pass_at_k(n, c, k) for n, c in zip(problems["n"], problems["correct"])]
    return bootstrap_ci(values, n_boot=2000, seed=0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("records", nargs="+", help="eval records written with --curve")
    ap.add_argument("--k", default="1,8,64,256", help="comma-separated k (those above a record's n are skipped)")
    args = ap.parse_args()
    ks = [int(k) for k in args.k.split(",")]
    print("| record | problems | n | entropy | solved at least once | " + " | ".join(f"pass@{k}" for k in ks) + " |")
    print("|---|---:|---:|---:|---:|" + "---|" * len(ks))
    for path in args.records:
        record = json.loads(Path(path).read_text())
        problems = record["curve"]["problems"]
        solved = sum(c > 0 for c in problems["correct"])
        cells = []
        for k in ks:
            if k > min(problems["n"]):
                cells.append("-")
                continue
            mean, lo, hi = coverage(record, k)
            cells.append(f"{mean:.3f} [{lo:.3f}, {hi:.3f}]")
        print(f"| {path} | {len(problems['n'])} | {record['n']} | {record['entropy']:.3f} | {solved} | "
              + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
