"""Issue 53, item 1: the out-of-distribution testbed's base model measured again. Its right-chain coverage at 9
operations rests on few hits (6 of its 9 solved 9-operation problems have 3 hits or fewer in 256), and every
earlier base record is one evaluation with the sampler's seed 0. This evaluates the base model (`embedded:testbed`)
on the out-of-distribution split (8-9 operations, 128 problems x 256 samples, T = 1, as `bench/testbed_ood_long.py`
does) with sampler seeds 1 and 2, and with each seed judges the same samples twice: by right chains
(`t1-chain`, what the testbed's answer uses) and by right answers (`t1`, the answer-level verifier).

Records: `bench/results/testbed_ood/base/step0.ood.t1.json` (seed 0's samples judged by answer) and
`bench/results/testbed_ood/base/eval_seed<k>/step0.ood.<t1-chain|t1>.json`. A recorded one is skipped; with
`--commit` each is committed as it lands. About 1-2 min per record on one core.

    OMP_NUM_THREADS=1 nohup python bench/testbed_ood_base_seeds.py --commit > /tmp/base_seeds.log 2>&1 &
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import testbed_long  # noqa: E402
from testbed_ood_long import commit  # noqa: E402

BASE = testbed_long.ROOT / "bench" / "results" / "testbed_ood" / "base"
RECORDS = [(0, "t1", BASE / "step0.ood.t1.json")] + [
    (seed, mode, BASE / f"eval_seed{seed}" / f"step0.ood.{mode}.json") for seed in (1, 2) for mode in ("t1-chain", "t1")]
"""(sampler seed, mode, record): seed 0's chain record is the testbed's own `base/step0.ood.t1-chain.json`."""


def main(argv: list[str] | None = None) -> list[Path]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--commit", action="store_true", help="commit each record as it lands")
    p.add_argument("--problems", type=int, default=128)
    p.add_argument("--n", type=int, default=256)
    args = p.parse_args(argv)
    written = []
    for seed, mode, out in RECORDS:
        if out.exists():
            print(f"{out.relative_to(testbed_long.ROOT)}: recorded, skipped", flush=True)
            continue
        out.parent.mkdir(parents=True, exist_ok=True)
        print(f"{out.relative_to(testbed_long.ROOT)}: evaluating (seed {seed}, {mode})", flush=True)
        testbed_long.evaluate("embedded:testbed", "ood", mode, out, args, 1.0, seed=seed)
        written.append(out)
        if args.commit:
            commit(out)
    return written


if __name__ == "__main__":
    main()
