"""How long a chain each model writes out of distribution (issue 43). A right chain has one work line ("a+b=c") per
operation, so a model that stops after fewer lines than the problem has operations cannot be right, whatever it
samples. This samples the out-of-distribution split of `bench/testbed_ood_long.py` (difficulties 8-9, the same 128
problems) at T = 1 with `explorl eval --save-completions`, and counts each completion's work lines against its
problem's operations.

    python bench/testbed_ood_lengths.py                  # the base model and each run's final checkpoint, seed 0
    python bench/testbed_ood_lengths.py --seeds 3        # and seeds 1 and 2 (what RESULTS reports)
    python bench/testbed_ood_lengths.py --temperature 0.7 --name testbed_ood_answer --methods grpo,sft

Records: `bench/results/<name>/lengths/<label>.json`, `<label>.T<t>.json` at another temperature than 1 (per
operation count: how many samples wrote each number of work lines, and how many were right chains); a label
recorded with the same --n and --problems is skipped, so the script continues where it stopped. Prints a Markdown
table of every record.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from testbed_long import SPLITS  # noqa: E402
from testbed_long_table import operations_of  # noqa: E402


def work_lines(completion: str) -> int:
    """The number of work lines ("a+b=c") a completion writes before its answer (`\\boxed{}`)."""
    return sum(1 for line in completion.split("\\boxed", 1)[0].splitlines() if "=" in line)


def tally(rows: list[dict]) -> dict[str, dict]:
    """{operations: {"samples": N, "right": right chains, "lines": {work lines: samples}}} of `explorl eval
    --save-completions` rows (problem, completion, correct), keyed by str so the record is JSON as written."""
    out: dict[str, dict] = {}
    for row in rows:
        ops = operations_of(row["problem"])
        if ops is None:
            raise ValueError(f"not an arithmetic problem: {row['problem']!r}")
        level = out.setdefault(str(ops), {"samples": 0, "right": 0, "lines": {}})
        level["samples"] += 1
        level["right"] += bool(row["correct"])
        lines = str(work_lines(row["completion"]))
        level["lines"][lines] = level["lines"].get(lines, 0) + 1
    return out


def sample(model: str, problems: int, n: int, temperature: float = 1.0) -> list[dict]:
    """`explorl eval` of `model` on the out-of-distribution split by right chains at `temperature`, its
    completions."""
    from explorl import commands

    with tempfile.TemporaryDirectory() as tmp:
        completions = Path(tmp) / "completions.jsonl"
        argv = ["eval", "--model", model, "--task", "arith", "--task-opt", f"difficulties={SPLITS['ood']}",
                "--task-opt", "train_size=4096", "--task-opt", f"eval_size={problems}", "--task-opt", "reward=chain",
                "--n", str(n), "--k", "1", "--max-new-tokens", "128", "--temperature", repr(temperature),
                "--device", "cpu",
                "--out", str(Path(tmp) / "eval.json"), "--save-completions", str(completions)]
        if commands.main(argv) != 0:
            raise SystemExit(f"explorl {' '.join(argv)} failed")
        return [json.loads(line) for line in completions.read_text().splitlines()]


def table(records: dict[str, dict]) -> list[str]:
    """One row per model and operation count: the share of samples writing fewer work lines than the problem has
    operations, exactly as many, and more, and the share of right chains."""
    lines = ["| model | T | operations | samples | fewer lines | as many | more | right chains |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for label, record in records.items():
        for ops, level in sorted(record["operations"].items(), key=lambda item: int(item[0])):
            counts = {int(k): v for k, v in level["lines"].items()}
            total = level["samples"]
            fewer = sum(v for k, v in counts.items() if k < int(ops)) / total
            more = sum(v for k, v in counts.items() if k > int(ops)) / total
            same = counts.get(int(ops), 0) / total
            lines.append(f"| {label} | {record['temperature']:g} | {ops} | {total} | {fewer:.3f} | {same:.3f} | "
                         f"{more:.3f} | {level['right'] / total:.4f} |")
    return lines


def main() -> None:
    import testbed_long_frontier as frontier
    from learning import with_baselines
    from testbed_ood_long import DEFAULTS

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--name", default="testbed_ood", help="runs/NAME and bench/results/NAME")
    ap.add_argument("--model", default="embedded:testbed", help="the runs' base model")
    ap.add_argument("--steps", type=int, default=1500, help="the runs' final checkpoint")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--problems", type=int, default=128)
    ap.add_argument("--n", type=int, default=8, help="samples per problem")
    ap.add_argument("--temperature", type=float, default=1.0, help="the sampling temperature")
    ap.add_argument("--methods", default=None, help="comma-separated runs (default: bench/testbed_ood_long.py's "
                    "methods and their baselines)")
    args = ap.parse_args()
    methods = (args.methods.split(",") if args.methods
               else with_baselines(DEFAULTS[DEFAULTS.index("--methods") + 1].split(",")))
    models = {"base": args.model}
    for seed in range(args.seeds):
        done = frontier.final_checkpoints(args.name, seed, args.steps)
        models.update({f"{m}/seed{seed}": done[m] for m in methods if m in done})
    out_dir = ROOT / "bench" / "results" / args.name / "lengths"
    records = {}
    for label, model in models.items():
        at = "" if args.temperature == 1.0 else f".T{args.temperature:g}"
        path = out_dir / f"{label.replace('/', '.')}{at}.json"
        if not path.exists():
            print(f"{label}: sampling {args.problems} problems x {args.n} at T = {args.temperature:g} ({model})",
                  flush=True)
            record = {"model": model, "n": args.n, "problems": args.problems, "temperature": args.temperature,
                      "operations": tally(sample(model, args.problems, args.n, args.temperature))}
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(record, indent=1) + "\n")
        records[label] = json.loads(path.read_text())
        if (records[label]["n"], records[label]["problems"]) != (args.n, args.problems):
            raise SystemExit(f"{path} was sampled with --n {records[label]['n']} --problems "
                             f"{records[label]['problems']}: give those, or move the lengths records aside to "
                             "sample again")
    print("\n".join(table(records)))


if __name__ == "__main__":
    main()
