"""Where the runs stop: the choice between another work line and the answer, read from each model's next-token
distribution (issue 53, section 5: "the runs stop writing a 9th line").

A right chain has one work line ("a+b=c") per operation, then `\\boxed{...}`. Give a model the prompt and the first
j lines of the problem's own right chain (each ending in a newline); its next token either starts another work line
(a digit: the running value) or the answer (`\\`, the first character of `\\boxed`). This reads P(answer now | j
right lines) for every j from 1 to the problem's operations, teacher-forced: no sampling, so the only noise is which
problems are drawn. A model that keeps the base model's chains answers at j = operations and rarely before; one that
has learned to stop early answers at j = operations - 1.

    python bench/testbed_ood_decision.py                        # base, and every run's final checkpoint of seed 0
    python bench/testbed_ood_decision.py --seeds 3 --name testbed_ood_answer

Models: the base model (`--model`) and each run's final weights under `runs/<name>/<method>/seed<s>/final/`.
Records: `bench/results/<name>/decision/<label>.json` (per operation count and j: the problems and the mean
P(answer now)); a label already recorded with the same problems is skipped. Prints the table bench/RESULTS.md quotes,
then one row per method with its seeds together (`method_table`), and draws `decision.png` beside the records
(P(answer now) against the lines written, at 7, 8 and 9 operations).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from testbed_long import SPLITS  # noqa: E402

ANSWER_START = "\\"
"""The first character of `\\boxed{`: the token that ends the chain."""


def problems_of(split: str, count: int) -> list:
    """The evaluation problems `explorl eval` draws for `split` (the same task settings as `bench/testbed_long.py`)."""
    from explorl.config import load_config
    from explorl.tasks import load_task

    cfg = load_config(None, ["task.name=arith", f"task.difficulties={SPLITS[split]}", "task.train_size=4096",
                             f"task.eval_size={count}"])
    return list(load_task(cfg.task).eval)


@torch.no_grad()
def answer_probabilities(model, tok, problem) -> list[float]:
    """P(the next token starts the answer | the prompt and the first j lines of the right chain), j = 1..ops: one
    forward of the whole right chain, read after each work line (a causal model's prediction there depends on that
    prefix alone; each prefix's tokens are checked to be the chain's first ones)."""
    lines = problem.solution.split("\n")[:-1]  # the work lines, without the boxed answer
    answer_id = tok.convert_tokens_to_ids(ANSWER_START)
    full = tok.encode(problem.prompt + problem.solution, add_special_tokens=False)
    ends = []
    for j in range(1, len(lines) + 1):
        prefix = tok.encode(problem.prompt + "\n".join(lines[:j]) + "\n", add_special_tokens=False)
        if full[:len(prefix)] != prefix:
            raise SystemExit(f"the tokenizer does not split {problem.prompt!r}'s chain line by line: this probe needs "
                             f"the testbed's char tokenizer")
        ends.append(len(prefix) - 1)
    logits = model(input_ids=torch.tensor([full])).logits[0, ends].float()
    return torch.softmax(logits, -1)[:, answer_id].tolist()


def record_of(model_path: str, problems: list, tokenizer: str) -> dict:
    """{operations: {j: mean P(answer now)}, problems: count} of one model (`tokenizer`: the base model's)."""
    from transformers import AutoModelForCausalLM

    from explorl.models import resolve_model_path
    from explorl.models.loading import load_tokenizer

    tok = load_tokenizer(resolve_model_path(tokenizer))  # a run's final/ holds the weights only
    model = AutoModelForCausalLM.from_pretrained(str(resolve_model_path(model_path)), dtype=torch.float32).eval()
    if tok.convert_tokens_to_ids(ANSWER_START) in (None, tok.unk_token_id):
        raise SystemExit(f"the tokenizer has no token {ANSWER_START!r}: this probe needs the testbed's char tokenizer")
    by_ops: dict[str, dict[str, list[float]]] = {}
    for p in problems:
        ops = p.meta["difficulty"]
        for j, prob in enumerate(answer_probabilities(model, tok, p), start=1):
            by_ops.setdefault(str(ops), {}).setdefault(str(j), []).append(prob)
    return {"model": model_path, "problems": len(problems),
            "operations": {ops: {j: sum(v) / len(v) for j, v in js.items()} for ops, js in by_ops.items()},
            "counts": {ops: len(js["1"]) for ops, js in by_ops.items()}}


def table(records: dict[str, dict]) -> list[str]:
    """Per model and operation count: P(answer now) one line early (j = ops - 1), on time (j = ops), and the
    largest before that (j <= ops - 2)."""
    lines = ["| model | operations | problems | P(answer) after ops-1 lines | after ops lines | "
             "largest before ops-1 |", "|---|---:|---:|---:|---:|---:|"]
    for label, record in records.items():
        for ops, by_j in sorted(record["operations"].items(), key=lambda item: int(item[0])):
            k = int(ops)
            early = max((by_j[str(j)] for j in range(1, k - 1)), default=float("nan"))
            lines.append(f"| {label} | {k} | {record['counts'][ops]} | {by_j[str(k - 1)]:.3f} | {by_j[str(k)]:.3f} "
                         f"| {early:.3f} |")
    return lines


def method_table(records: dict[str, dict], operations: int = 9) -> list[str]:
    """Per method, its seeds together (labels "<method>/seed<s> (<split>)", `main`'s): out of distribution at
    `operations`, P(answer) after `operations` - 1 right lines and after `operations` - 2, the mean over the seeds and
    each seed's in brackets; in distribution P(answer) on time, the mean over the split's operation counts and seeds."""
    seeds: dict[str, dict[str, list[dict]]] = {}
    for label, record in records.items():
        name, _, split = label.partition(" (")
        seeds.setdefault(name.split("/")[0], {}).setdefault(split.rstrip(")"), []).append(record)

    def cell(values: list[float]) -> str:
        each = f" ({', '.join(f'{v:.3f}' for v in values)})" if len(values) > 1 else ""
        return f"{sum(values) / len(values):.3f}{each}"

    lines = [f"| model | seeds | P(answer) after {operations - 1} of {operations} right lines | after "
             f"{operations - 2} of {operations} | in distribution, on time |", "|---|---:|---|---|---:|"]
    for method, by_split in seeds.items():
        out = [r["operations"][str(operations)] for r in by_split.get("ood", []) if str(operations) in r["operations"]]
        inside = [by_j[ops] for r in by_split.get("id", []) for ops, by_j in r["operations"].items()]
        if not out:
            continue
        on_time = f"{sum(inside) / len(inside):.3f}" if inside else "-"
        lines.append(f"| {method} | {len(out)} | {cell([b[str(operations - 1)] for b in out])} | "
                     f"{cell([b[str(operations - 2)] for b in out])} | {on_time} |")
    return lines


def figure(records: dict[str, dict], out: Path, operations: tuple[int, ...] = (7, 8, 9)) -> None:
    """One panel per operation count: P(answer now) against the right lines written, the base model's and each
    method's (the mean over its seeds, each seed's curve faint), the line where the chain ends marked."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.2 * len(operations), 3.6))
    FigureCanvasAgg(fig)
    methods: dict[str, list[dict]] = {}
    for label, record in records.items():  # "grpo/seed0 (ood)" -> "grpo"
        methods.setdefault(label.split(" ")[0].split("/")[0], []).append(record)
    colours = dict(zip(sorted(m for m in methods if m != "base"), [f"C{i}" for i in range(1, 10)] * 3))
    for i, ops in enumerate(operations):
        ax = fig.add_subplot(1, len(operations), i + 1)
        for method, recs in sorted(methods.items()):
            curves = [[r["operations"][str(ops)][str(j)] for j in range(1, ops + 1)]
                      for r in recs if str(ops) in r["operations"]]
            if not curves:
                continue
            colour = "black" if method == "base" else colours[method]
            for c in curves if len(curves) > 1 else []:
                ax.plot(range(1, ops + 1), c, color=colour, alpha=0.25, lw=0.8)
            mean = [sum(c[j] for c in curves) / len(curves) for j in range(ops)]
            ax.plot(range(1, ops + 1), mean, color=colour, lw=2 if method == "base" else 1.4, marker=".",
                    label=f"{method} ({len(curves)} seed{'s' if len(curves) > 1 else ''})" if method != "base"
                    else "base model")
        ax.axvline(ops, color="grey", ls=":", lw=1)
        ax.set_title(f"{ops} operations ({'in' if ops <= max(SPLITS['id']) else 'out of'} distribution)", fontsize=9)
        ax.set_xlabel("right work lines written", fontsize=8)
        ax.set_ylim(-0.02, 1.02)
        if i == 0:
            ax.set_ylabel("P(next token starts the answer)", fontsize=8)
    fig.axes[-1].legend(fontsize=6, loc="upper left")
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--name", default="testbed_ood_answer", help="runs/NAME and bench/results/NAME")
    ap.add_argument("--model", default="embedded:testbed", help="the runs' base model")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--problems", type=int, default=128, help="problems of each split")
    ap.add_argument("--runs-root", default=str(ROOT / "runs"), help="where runs/NAME lives")
    args = ap.parse_args()
    models = {"base": args.model}
    for seed in range(args.seeds):
        for final in sorted(Path(args.runs_root, args.name).glob(f"*/seed{seed}/final")):
            models[f"{final.parents[1].name}/seed{seed}"] = str(final)
    out_dir = ROOT / "bench" / "results" / args.name / "decision"
    records = {}
    for split in ("id", "ood"):
        problems = problems_of(split, args.problems)
        for label, model in models.items():
            path = out_dir / f"{label.replace('/', '.')}.{split}.json"
            if not path.exists():
                print(f"{label}: {split}, {len(problems)} problems ({model})", flush=True)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps({"split": split, **record_of(model, problems, args.model)}, indent=1) + "\n")
            record = json.loads(path.read_text())
            if record["problems"] != len(problems):
                raise SystemExit(f"{path} holds {record['problems']} problems: give --problems {record['problems']} "
                                 f"or move it aside")
            records[f"{label} ({split})"] = record
    print("\n".join(table(records)))
    print("\n".join(["", "Per method, seeds together:", ""] + method_table(records)))
    figure(records, out_dir / "decision.png")
    print(f"figure: {(out_dir / 'decision.png').relative_to(ROOT)}")


if __name__ == "__main__":
    main()
