"""The out-of-distribution answer in one table (issue 53, item 4): for every method at one checkpoint, what it keeps
of the base model's coverage at 8 and 9 operations, by right chain and by answer, beside what it learnt in
distribution and the entropy it learnt at.

Reads the records `bench/testbed_ood_long.py` writes (`bench/results/<name>/<method>/seed<k>/step<N>.<split>.
<t1|t1-chain>.json` and the base model's `base/step0.*.json`) and prints one Markdown row per method:
- out of distribution, sampled at T = 1, pass@k minus the base model's on the 8-operation and on the 9-operation
  problems alone, by right chain (`t1-chain`: every work line the problem's own) and by answer (`t1`), each with its
  95% bootstrap interval over problems and seeds (`testbed_long_records.paired`) and, with two seeds or more, each
  seed's own difference in brackets;
- of the base model's 9-operation problems it solves by a right chain at least 4 times (of its n samples), how many
  the method never solves in any seed, beside how many a run sampling as the base model does would lose by chance
  (`testbed_long_table.chance_lost_gained`): whether a loss is the problems' or the draws';
- in distribution, right-chain pass@1 and the mean token entropy sampled at T = 1, means over the seeds.

    python bench/testbed_ood_summary.py                       # testbed_ood_answer, pass@256, 1,500 steps
    python bench/testbed_ood_summary.py --step 500 --k 64
    python bench/testbed_ood_summary.py --also testbed_ood   # with the supervised control and the papers' methods
    python bench/testbed_ood_summary.py --figure bench/results/testbed_ood_answer/summary.png
    python bench/testbed_ood_summary.py --also testbed_ood --minus sft   # and each method minus the supervised control

`--minus METHOD` adds a table of each method minus METHOD, paired seed with seed and problem with problem: whether
RL loses more than supervised training does, rather than whether each loses against the base model.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from testbed_long_records import fate, ordered_methods, paired, per_problem, records_at  # noqa: E402
from testbed_long_table import (chance_lost_gained, fmt, load_records, one_judge, operation_levels,  # noqa: E402
                                restricted)

OUT_OF_DISTRIBUTION = (8, 9)  # the operation counts of the testbed's OOD split (training saw 3-7)
VERDICTS = (("t1-chain", "right chains"), ("t1", "by answer"))  # (mode, heading)
AT = "@"  # "<method>@<name>": a method of another sweep (`--also`), shown as "`method` (name)"
MIN_HITS = 4  # a problem the base model solves this often is not one it solved by luck (`solved_sets_table`)


def reliable(base: dict) -> int:
    """How many problems of `base` (a right-chain record) the base model solves at least MIN_HITS times."""
    return sum(1 for c in base["curve"]["problems"]["correct"] if c >= MIN_HITS)


def lost_chains(base: dict, runs: list[dict], chance: dict[tuple[int, int], float]) -> tuple[int, float]:
    """(how many of the problems of `base` the base model solves at least MIN_HITS times no record of `runs` (one per
    seed) solves, how many a run sampling as the base model does would lose in every seed by chance). `base` and
    `runs` are right-chain records restricted to the same problems; `chance` caches the latter by (n, seeds)."""
    counts = dict(zip(base["curve"]["problems"]["id"], base["curve"]["problems"]["correct"]))
    seen: dict[str, list[int]] = {}
    for run in runs:
        for pid, c in zip(run["curve"]["problems"]["id"], run["curve"]["problems"]["correct"]):
            seen.setdefault(pid, []).append(c)
    lost = sum(1 for pid, c in seen.items() if fate(counts.get(pid), c, MIN_HITS) == "lost")
    key = (runs[0]["n"], len(runs))
    if key not in chance:
        chance[key] = chance_lost_gained(list(counts.values()), *key, MIN_HITS)[0]
    return lost, chance[key]


class Row(NamedTuple):
    """One method's row: its label, seeds, each cell's `paired` difference from the base model (None where its
    records lack the cell), the 9-operation chains it loses (lost, by chance; None without right-chain records) and
    in distribution its right-chain pass@1 and entropy (None without records)."""

    label: str
    seeds: int
    cells: list[tuple | None]
    lost: tuple[int, float] | None
    pass1: float | None
    entropy: float | None


class Summary(NamedTuple):
    """What the table and the figure show (`summary_rows`)."""

    heads: list[tuple[str, float]]
    """Each cell's heading and the base model's pass@k there."""
    reliable: int | None
    """How many 9-operation problems the base model solves by a right chain at least MIN_HITS times (None without
    those records)."""
    rows: list[Row]
    """One per method with records at the step, this sweep's first."""


def table_cells(records: dict) -> list[tuple[str, int, dict]]:
    """The table's cells in order, each (mode, operation count, the base model's record restricted to the problems
    of that count), for 8 and 9 operations by right chain and by answer; SystemExit where a base record is missing."""
    cells = []
    for mode, _ in VERDICTS:
        if (base := records.get(("base", 0, 0, "ood", mode))) is None:
            raise SystemExit(f"no base record ood/{mode}: evaluate the base model first (bench/testbed_ood_long.py)")
        levels = operation_levels(base)
        cells += [(mode, ops, restricted(base, levels[ops])) for ops in OUT_OF_DISTRIBUTION if ops in levels]
    return cells


def table_methods(records: dict) -> list[str]:
    """The methods the tables list, in their order: this sweep's (`ordered_methods`), then the other sweeps'."""
    return sorted(ordered_methods(records), key=lambda m: AT in m)


def label_of(method: str) -> str:
    """How the tables name `method`: "`grpo`", or "`sft` (testbed_ood)" for a method of another sweep."""
    return "`{}` ({})".format(*method.split(AT)) if AT in method else f"`{method}`"


def summary_rows(records: dict, k: int, step: int) -> Summary:
    """The table's contents at `step`, pass@`k` (see the module's docstring)."""
    cells = table_cells(records)
    heads = [(f"{dict(VERDICTS)[mode]}, {ops} ops", statistics.fmean(per_problem(b, k).values()))
             for mode, ops, b in cells]
    nine = next((b for mode, ops, b in cells if (mode, ops) == ("t1-chain", 9)), None)
    chance: dict[tuple[int, int], float] = {}
    rows = []
    for method in table_methods(records):
        seeds = {mode: records_at(records, method, step, "ood", mode) for mode, _ in VERDICTS}
        if not any(seeds.values()):
            continue
        diffs = [paired([(base, restricted(r, set(base["curve"]["problems"]["id"]))) for r in seeds[mode]], k)
                 for mode, _, base in cells]
        lost = None
        if nine is not None and seeds["t1-chain"]:
            runs = [restricted(r, set(nine["curve"]["problems"]["id"])) for r in seeds["t1-chain"]]
            lost = lost_chains(nine, runs, chance)
        inside = records_at(records, method, step, "id", "t1-chain")
        rows.append(Row(label_of(method), max(len(v) for v in seeds.values()), diffs, lost,
                        statistics.fmean(r["pass@1"] for r in inside) if inside else None,
                        statistics.fmean(r["entropy"] for r in inside) if inside else None))
    return Summary(heads, None if nine is None else reliable(nine), rows)


def summary_table(summary: Summary, k: int, step: int) -> list[str]:
    """The Markdown table of `summary` (`summary_rows` at `step`, pass@`k`): heading, header and one row per method.
    A method lacking one of the records a cell needs shows "-" there."""
    heads = [f"{head} (base {base:.3f})" for head, base in summary.heads]
    if summary.reliable is not None:
        heads.append(f"9-op chains lost of the base's {summary.reliable} (by chance)")
    lines = [f"#### Out of distribution at T = 1, pass@{k} minus the base model's, at step {step}; in distribution "
             "at T = 1, right-chain pass@1 and entropy", "",
             "| method | seeds | " + " | ".join(heads) + " | ID pass@1 | ID entropy |",
             "|---|---:|" + "---|" * len(heads) + "---:|---:|"]
    for row in summary.rows:
        cells = [fmt(ci) for ci in row.cells]
        if summary.reliable is not None:
            cells.append("-" if row.lost is None else f"{row.lost[0]} ({row.lost[1]:.2f})")
        inside = ["-" if v is None else f"{v:.3f}" for v in (row.pass1, row.entropy)]
        lines.append(f"| {row.label} | {row.seeds} | " + " | ".join(cells + inside) + " |")
    return lines + [""]


def resolve(records: dict, method: str) -> str:
    """`method` as `records` key it: itself, or "<method>@<sweep>" where only another sweep (`--also`) has it;
    SystemExit naming the methods there are otherwise."""
    known = ordered_methods(records)
    found = [m for m in known if m == method] or [m for m in known if m.split(AT)[0] == method]
    if len(found) != 1:
        names = ", ".join(m.replace(AT, " of ") for m in known)
        raise SystemExit(f"--minus {method}: {'no' if not found else 'more than one'} such method; there are {names}")
    return found[0]


def minus_table(records: dict, reference: str, k: int, step: int) -> list[str]:
    """Each method minus `reference` (a key of `records`' methods, `resolve`) at `step`, pass@`k`, in the summary's
    four cells: paired seed with seed (the seeds both have) and problem with problem, 95% interval over problems and
    those seeds (`paired`), each seed's own difference in brackets. Answers, for one, whether RL loses more than the
    supervised control (`--minus sft`) rather than whether each loses against the base model."""
    cells = table_cells(records)
    heads = [f"{dict(VERDICTS)[mode]}, {ops} ops" for mode, ops, _ in cells]
    lines = [f"#### Out of distribution at T = 1, pass@{k} of each method minus {label_of(reference)}'s, same seed, "
             f"at step {step}", "", "| method | seeds | " + " | ".join(heads) + " |",
             "|---|---:|" + "---|" * len(heads)]

    def by_seed(method: str, mode: str) -> dict[int, dict]:
        return {seed: r for (m, seed, s, split, md), r in records.items()
                if (m, s, split, md) == (method, step, "ood", mode)}

    # the reference's records and each cell's problems, once for every method
    theirs = {mode: by_seed(reference, mode) for mode, _ in VERDICTS}
    problems = [set(base["curve"]["problems"]["id"]) for _, _, base in cells]
    for method in table_methods(records):
        if method == reference:
            continue
        row, seeds = [], set()
        for (mode, _, _), pids in zip(cells, problems):
            mine = by_seed(method, mode)
            common = sorted(mine.keys() & theirs[mode].keys())
            row.append(paired([(restricted(theirs[mode][s], pids), restricted(mine[s], pids)) for s in common], k))
            seeds |= set(common)
        if seeds:
            lines.append(f"| {label_of(method)} | {len(seeds)} | " + " | ".join(fmt(ci) for ci in row) + " |")
    return lines + [""]


def forest(summary: Summary, k: int, step: int, path: Path) -> None:
    """The table's four differences (`summary_rows` at `step`, pass@`k`) as a figure: one panel per cell (8 and 9
    operations, by right chain and by answer), each method's mean over its seeds with its 95% interval and each
    seed's own difference as a dot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    heads, rows = summary.heads, summary.rows
    fig, axes = plt.subplots(1, len(heads), figsize=(3.6 * len(heads), 0.32 * len(rows) + 1.6), sharey=True)
    y = list(range(len(rows)))[::-1]
    for i, (ax, (head, base)) in enumerate(zip(axes, heads)):
        for yi, row in zip(y, rows):
            if (ci := row.cells[i]) is None:
                continue
            mean, lo, hi, per_seed = ci
            ax.errorbar(mean, yi, xerr=[[mean - lo], [hi - mean]], fmt="o", capsize=3, color="tab:blue")
            ax.plot(per_seed, [yi] * len(per_seed), "x", color="tab:orange", markersize=4)
        ax.axvline(0.0, color="k", linestyle=":")
        ax.axvline(-base, color="tab:red", linestyle="--", alpha=0.6)  # every problem the base solves lost
        ax.set_title(f"{head} (base {base:.3f})", fontsize=9)
        ax.set_xlabel(f"pass@{k} minus the base model's", fontsize=8)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(y, [f"{r.label.replace('`', '')} ({r.seeds})" for r in rows], fontsize=8)
    fig.suptitle(f"Out of distribution at T = 1, step {step}: mean over seeds (seeds in brackets), 95% interval over "
                 "problems and seeds, each seed (x); red: all of the base's lost", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


def with_other_sweeps(records: dict, others: dict[str, dict]) -> dict:
    """`records` with the runs of each other sweep ({name: its records}) of methods `records` lacks, as
    "<method>@<name>", where that sweep's base model records are `records`' (the same model, evaluated alike);
    ValueError naming the sweep and the record otherwise."""
    out = dict(records)
    mine = {m for m, *_ in records}
    for name, theirs in others.items():
        for key, record in theirs.items():
            if key[0] == "base":
                if key in records and record["curve"]["problems"] != records[key]["curve"]["problems"]:
                    raise ValueError(f"--also {name}: its base model record {key[3]}/{key[4]} is not this sweep's; "
                                     "its differences from the base would not compare")
            elif key[0] not in mine:
                out[(f"{key[0]}{AT}{name}", *key[1:])] = record
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--name", default="testbed_ood_answer", help="bench/results/NAME")
    ap.add_argument("--k", type=int, default=256, help="pass@k (at most the samples per problem recorded)")
    ap.add_argument("--step", type=int, default=1500, help="the checkpoint compared (the schedule's last: 1,500)")
    ap.add_argument("--seeds", type=int, default=None, help="only seeds 0 to SEEDS-1; default every seed recorded")
    ap.add_argument("--also", action="append", default=[], metavar="NAME",
                    help="rows of another sweep of the same base model (bench/results/NAME), its methods this one "
                         "lacks (e.g. --also testbed_ood: the supervised control and the papers' methods)")
    ap.add_argument("--figure", default=None, help="PNG path: the table's differences, one panel per cell")
    ap.add_argument("--minus", default=None, metavar="METHOD",
                    help="also a table of each method minus METHOD, seed with seed (e.g. --also testbed_ood "
                         "--minus sft: RL against the supervised control)")
    args = ap.parse_args()
    loaded = {name: one_judge(load_records(ROOT / "bench" / "results" / name, args.seeds))[0]
              for name in [args.name, *args.also]}
    for name, found in loaded.items():
        if not found:
            raise SystemExit(f"no records under bench/results/{name}")
    try:
        records = with_other_sweeps(loaded.pop(args.name), loaded)
    except ValueError as e:
        raise SystemExit(str(e))
    most = min(min(r["curve"]["problems"]["n"]) for r in records.values())
    if args.k > most:
        raise SystemExit(f"--k {args.k}: the records hold {most} samples of some problem; pass --k {most} or less")
    reference = resolve(records, args.minus) if args.minus else None  # before any work
    summary = summary_rows(records, args.k, args.step)  # the bootstraps, once for the table and the figure
    print("\n".join(summary_table(summary, args.k, args.step)))
    if args.figure:
        forest(summary, args.k, args.step, Path(args.figure))
    if reference:
        print("\n".join(minus_table(records, reference, args.k, args.step)))


if __name__ == "__main__":
    main()
