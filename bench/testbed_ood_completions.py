"""Issue 53, item 1: completions of the key out-of-distribution records, committed as text. The tables say that RL on
3-7 operations loses the base model's right 9-operation chains; these files show what the models write instead.

For each model (the base model, and each finished run's last checkpoint under `runs/<name>/<method>/seed<k>/`), the
out-of-distribution evaluation at T = 1 is sampled again exactly as its `t1-chain` record was (`testbed_long.evaluate`:
the same problems, sampler seed, n and judge, so the same samples), with every completion saved; kept as text are
the 9-operation problems' first `--samples` completions each, in sampling order (no selection by outcome), with
both verdicts (`chain`: every worked line the solution's, the judge of the `t1-chain` records; `answer`: the final
boxed answer right, judged as the `t1` records are, by the arith task's `int_reward`) and the number of lines
written. Each file also counts, over every 9-operation sample, the completions by line count and by verdict.

    OMP_NUM_THREADS=1 python bench/testbed_ood_completions.py --name testbed_ood_answer --methods grpo --seeds 3
    python bench/testbed_ood_completions.py --base-only --name testbed_ood_answer       # the base model alone

Files: `bench/results/<name>/completions/<label>.ood.t1.jsonl` (first line: the summary; then one line per kept
completion), skipped when present; `--commit` commits each as it lands.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import testbed_long  # noqa: E402
from testbed_long_table import operations_of  # noqa: E402
from testbed_ood_lengths import work_lines  # noqa: E402

ROOT = testbed_long.ROOT


def digest(rows: list[dict], samples: int, label: str) -> list[dict]:
    """The summary line and the kept completions of a completions file's rows (`explorl eval --save-completions`):
    9-operation problems only (`testbed_long_table.operations_of`), work lines counted as
    `testbed_ood_lengths.work_lines` counts them."""
    from explorl.rewards import int_reward

    nine = [r for r in rows if operations_of(r["prompt"]) == 9]
    # the `t1` records' judge (an integer, so "07" is 7), not the text: the counts then equal the records'
    answer_right = lambda r: int_reward(r["completion"], r["answer"]) == 1.0  # noqa: E731
    summary = {"label": label, "problems": len({r["problem"] for r in nine}), "samples": len(nine),
               "chain_right": sum(bool(r["correct"]) for r in nine),
               "answer_right": sum(answer_right(r) for r in nine),
               "lines": dict(sorted(Counter(work_lines(r["completion"]) for r in nine).items())),
               "kept_per_problem": samples}
    kept = [{"prompt": r["prompt"], "sample": r["sample"], "answer": r["answer"],
             "completion": r["completion"], "extracted": r["extracted"], "chain_right": bool(r["correct"]),
             "answer_right": answer_right(r), "lines": work_lines(r["completion"])}
            for r in nine if r["sample"] < samples]
    return [summary, *kept]


def write_digest(model: str, label: str, out: Path, args) -> None:
    """Sample `model`'s out-of-distribution `t1-chain` evaluation again with its completions and write the digest."""
    with tempfile.TemporaryDirectory() as tmp:
        completions = Path(tmp) / "completions.jsonl"
        testbed_long.evaluate(model, "ood", "t1-chain", Path(tmp) / "record.json", args, 1.0,
                              completions=completions)
        rows = [json.loads(line) for line in completions.read_text().splitlines()]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = out.with_name(out.name + ".tmp")
    tmp_out.write_text("".join(json.dumps(r) + "\n" for r in digest(rows, args.samples, label)))
    tmp_out.replace(out)
    if args.commit:
        subprocess.run(["git", "add", "--", str(out.relative_to(ROOT))], cwd=ROOT, check=True)
        subprocess.run(["git", "commit", "-q", "-m", f"{args.name}: completions {label}", "--",
                        str(out.relative_to(ROOT))], cwd=ROOT, check=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--name", default="testbed_ood_answer", help="runs/NAME and bench/results/NAME")
    ap.add_argument("--methods", default="grpo", help="comma-separated")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--step", type=int, default=1500, help="the checkpoint of each run")
    ap.add_argument("--model", default="embedded:testbed", help="the base model")
    ap.add_argument("--problems", type=int, default=128, help="held-out problems (as the records)")
    ap.add_argument("--n", type=int, default=256, help="samples per problem (as the records)")
    ap.add_argument("--samples", type=int, default=8, help="completions kept per 9-operation problem")
    ap.add_argument("--base-only", action="store_true")
    ap.add_argument("--commit", action="store_true")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    outdir = ROOT / "bench" / "results" / args.name / "completions"
    jobs = [(args.model, "base")]
    if not args.base_only:
        for method in [m for m in args.methods.split(",") if m]:
            for seed in range(args.seeds):
                ckpt = ROOT / "runs" / args.name / method / f"seed{seed}" / "checkpoints" / f"step_{args.step:07d}"
                jobs.append((str(ckpt), f"{method}_seed{seed}_step{args.step}"))
    for model, label in jobs:
        out = outdir / f"{label}.ood.t1.jsonl"
        if out.exists():
            continue
        if label != "base" and not Path(model).exists():
            print(f"{label}: {model} not there (not trained yet?), skipped", flush=True)
            continue
        print(f"{label}: sampling -> {out.relative_to(ROOT)}", flush=True)
        write_digest(model, label, out, args)


if __name__ == "__main__":
    main()
