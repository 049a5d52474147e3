"""Paired differences at equal entropy between any two models of a saved frontier (`explorl frontier --out DIR`
writes DIR/frontier.json with every model's points; the command itself pairs each model with the first one).

    python bench/frontier_pairs.py bench/results/testbed_long/frontier/id_chain/frontier.json --reference grpo
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from explorl.evaluation.frontier import FrontierPoint, entropy_grid, paired_frontier_difference, shared_entropy_range


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("frontier", type=Path, help="a frontier.json of `explorl frontier`")
    ap.add_argument("--reference", required=True, help="the model the others are paired with (its label)")
    ap.add_argument("--points", type=int, default=7, help="entropies on an even grid over the shared range")
    args = ap.parse_args(argv)
    data = json.loads(args.frontier.read_text())
    models = {label: [FrontierPoint(p["temperature"], p["entropy"], data["n"], p["correct"]) for p in m["points"]]
              for label, m in data["models"].items()}
    if args.reference not in models:
        raise SystemExit(f"--reference {args.reference!r}: the frontier's models are {sorted(models)}")
    low, high = shared_entropy_range(models)
    if low > high:
        raise SystemExit(f"the models' entropy ranges do not overlap ({low:.4f} > {high:.4f}): nothing to pair")
    grid = entropy_grid(low, high, args.points)
    print(f"pass@k minus {args.reference}'s at equal entropy (95% paired bootstrap over {data['problems']} problems)\n")
    print("| model | entropy | " + " | ".join(f"pass@{k}" for k in data["k"]) + " |")
    print("|---|---:|" + "---|" * len(data["k"]))
    for label, points in models.items():
        if label == args.reference:
            continue
        diffs = {k: paired_frontier_difference(models[args.reference], points, k, grid) for k in data["k"]}
        for i, h in enumerate(grid):
            cells = [f"{m:+.3f} [{a:+.3f}, {b:+.3f}]" for _, m, a, b in (diffs[k][i] for k in data["k"])]
            print(f"| {label} | {h:.3f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
