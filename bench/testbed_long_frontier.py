"""The long runs' coverage-entropy frontiers (issue "Coverage at equal entropy", item 4): every method's final
checkpoint (1500 steps) against its GRPO baseline's and the base model's, at equal sampling entropy, paired over
seeds. Judged by right chains in distribution (`task.reward: chain`): there most right answers are guessed
(bench/RESULTS.md), so pass@k by answers measures how widely guesses spread.

    python bench/testbed_long_frontier.py            # evaluate what is missing, then print the tables
    python bench/testbed_long_frontier.py --table    # only the tables, from the frontiers recorded
    python bench/testbed_long_frontier.py --table --plot bench/results/testbed_long/frontier/differences.png
    python bench/testbed_long_frontier.py --name testbed_ood --model embedded:testbed --split ood   # issue 43
    python bench/testbed_long_frontier.py --name testbed_ood --split ood --table \
        --plot bench/results/testbed_ood/frontier/differences.png \
        --plot-base bench/results/testbed_ood/frontier/base.png

Per seed, one `explorl frontier` of the base model and every run whose final checkpoint exists, into
`bench/results/<name>/frontier/seed<k>/<split>_chain/` (frontier.json, frontier.png). A model's points are kept in the
frontier's partial file as they finish, so a killed or extended sweep evaluates only what is missing (runs that
finish later are added by running it again). Seed 0's base, `grpo` and `grpo_verified` are taken from the first
frontier (`frontier/id_chain/`, the same split, settings and weights). Out of distribution the base model is also
evaluated at lower temperatures, once for all seeds (`BASE_LOW_TEMPERATURES`, into `frontier/base_low/ood_chain/`),
so that it shares entropies with the runs. Cost on this machine: about 2 min of one core per model in
distribution (5 temperatures x 128 problems x 64 samples); out of distribution (longer chains) about 3 min a
model with three processes on the two cores.

The tables: for each method, pass@k minus its baseline's (same seed), minus one-update `grpo`'s where that is not
its baseline, and minus the base model's, at 5 entropies evenly spaced over the range every model of the comparison
reaches, with a 95% interval over problems and seeds
(`explorl.evaluation.frontier.paired_frontier_difference_seeds`) and each seed's difference.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from learning import baseline, with_baselines  # noqa: E402
from testbed_long import METHODS, SPLITS, current_judge  # noqa: E402
from testbed_long_table import fmt, operations_of  # noqa: E402

TEMPERATURES = "0.7,0.85,1.0,1.15,1.3"
KS = [1, 8, 64]
N = 64
BASE_LOW_TEMPERATURES = {"ood": "0.1,0.2,0.3,0.4,0.5,0.6"}
"""Extra temperatures of the base model alone, by split. Out of distribution the runs sample at 0.016-0.13 nats
over `TEMPERATURES` while the base model samples at 0.12-0.33, so without lower temperatures the base model shares
no entropy with any run but one-update GRPO's top end (seed 0 of `testbed_ood`); at 0.1-0.6 it samples at
0.018-0.10. In distribution the ranges overlap (0.097-0.155 on `testbed_long`). The base model is the same for
every seed, so these points are evaluated once (`base_low_dir`) and added to each seed's base frontier."""


def frontier_dir(name: str, seed: int, split: str = "id") -> Path:
    return ROOT / "bench" / "results" / name / "frontier" / f"seed{seed}" / f"{split}_chain"


def base_low_dir(name: str, split: str) -> Path:
    """The base model's frontier at `BASE_LOW_TEMPERATURES[split]`, shared by every seed."""
    return ROOT / "bench" / "results" / name / "frontier" / "base_low" / f"{split}_chain"


def final_checkpoints(name: str, seed: int, steps: int) -> dict[str, str]:
    """{method: its final checkpoint, relative to the repository} of every run of `seed` under `runs/<name>/` that
    reached `steps` (any method: the long sweeps', the supervised control, the newer methods')."""
    found = sorted((ROOT / "runs" / name).glob(f"*/seed{seed}/checkpoints/step_{steps:07d}"))
    return {path.parents[2].name: str(path.relative_to(ROOT)) for path in found}


def run_frontier(name: str, seed: int, models: dict[str, str], problems: int, base: str = "embedded",
                 split: str = "id") -> None:
    """`explorl frontier` of the base model `base` and `models` ({label: path}) on `split` (`SPLITS`), by right
    chains; points already in the directory's partial file are not evaluated again. Out of distribution the base
    model is also evaluated at `BASE_LOW_TEMPERATURES` (once for every seed)."""
    from explorl.commands.frontier import PARTIAL

    out = frontier_dir(name, seed, split)
    first = ROOT / "bench" / "results" / name / "frontier" / f"{split}_chain" / PARTIAL
    if seed == 0 and first.exists() and not (out / PARTIAL).exists():
        out.mkdir(parents=True, exist_ok=True)
        shutil.copy(first, out / PARTIAL)  # same split, settings and weights: its points are reused
    frontier_command({"base": base, **models}, split, problems, TEMPERATURES, out, f"seed {seed}")
    if split in BASE_LOW_TEMPERATURES:
        frontier_command({"base": base}, split, problems, BASE_LOW_TEMPERATURES[split], base_low_dir(name, split),
                         "the base model at low temperatures")


def frontier_command(models: dict[str, str], split: str, problems: int, temperatures: str, out: Path,
                     what: str) -> None:
    """`explorl frontier` of `models` ({label: path}) on `split` by right chains at `temperatures`, into `out`
    (continued: its recorded points are not evaluated again)."""
    from explorl import commands

    argv = ["frontier", *models.values(), "--labels", ",".join(models), "--task", "arith",
            "--task-opt", f"difficulties={SPLITS[split]}", "--task-opt", "train_size=4096",
            "--task-opt", f"eval_size={problems}", "--task-opt", "reward=chain", "--n", str(N),
            "--k", ",".join(map(str, KS)), "--max-new-tokens", "128", "--temperatures", temperatures,
            "--device", "cpu", "--out", str(out)]
    print(f"{what}: frontier of {len(models)} models -> {out.relative_to(ROOT)}", flush=True)
    if commands.main(argv) != 0:
        raise SystemExit(f"explorl {' '.join(argv)} failed")


def drawn_models(path: Path) -> set[str]:
    """The labels of the frontier.json at `path` where it is there and judged by the chain judge in use
    (`current_judge`), else none: an older judge's points are evaluated again (its partial file is not reused)."""
    if not path.exists():
        return set()
    data = json.loads(path.read_text())
    return set(data.get("models", {})) if current_judge(data) else set()


def read_frontier(path: Path) -> tuple[dict[str, list], dict]:
    """({label: [FrontierPoint]}, the versions of the checkers it was judged by) of one frontier.json; the versions
    are {} where they were not recorded yet (chain judge 1)."""
    from explorl.evaluation.frontier import FrontierPoint

    data = json.loads(path.read_text())
    return ({label: [FrontierPoint(p["temperature"], p["entropy"], data["n"], p["correct"]) for p in m["points"]]
             for label, m in data["models"].items()}, data.get("reward_versions", {}))


def load_frontiers(name: str, seeds: int, split: str = "id") -> dict[int, dict[str, list]]:
    """{seed: {label: [FrontierPoint]}} of every seed's recorded frontier, the base model's low-temperature points
    (`base_low_dir`, where recorded and judged by the same chain judge) added to each seed's base model in
    temperature order."""
    low = base_low_dir(name, split) / "frontier.json"
    base_low, low_judge = read_frontier(low) if low.exists() else ({}, None)
    base_low = base_low.get("base", [])
    out = {}
    for seed in range(seeds):
        path = frontier_dir(name, seed, split) / "frontier.json"
        if path.exists():
            out[seed], seed_judge = read_frontier(path)
            if "base" in out[seed] and base_low and seed_judge == low_judge:
                known = {p.temperature for p in out[seed]["base"]}
                out[seed]["base"] = sorted(out[seed]["base"] + [p for p in base_low if p.temperature not in known],
                                           key=lambda p: p.temperature)
    return out


def of_operations(frontiers: dict[int, dict[str, list]], operations: int) -> dict[int, dict[str, list]]:
    """`frontiers` with every point cut to the problems of `operations` operations (`operations_of`): a split that
    mixes two distances from training, compared at each alone. Each point keeps its entropy, measured over the
    whole split it was sampled on."""
    from dataclasses import replace

    def cut(point):
        return replace(point, correct={pid: c for pid, c in point.correct.items() if operations_of(pid) == operations})

    return {seed: {label: [cut(p) for p in points] for label, points in models.items()}
            for seed, models in frontiers.items()}


def comparison(frontiers: dict[int, dict[str, list]], method: str, reference: str,
               points: int) -> tuple[int, float, float, dict[int, list] | None] | None:
    """`method` minus `reference`, paired over the seeds that have both: (seeds, low, high, {k: [(entropy, mean,
    lo, hi, [each seed's mean])]} at `points` entropies over [low, high], the range every seed's pair reaches);
    the dict is None when the ranges do not overlap (low > high), and the whole None when no seed has both."""
    from explorl.evaluation.frontier import entropy_grid, paired_frontier_difference_seeds, shared_entropy_range

    seeds = [s for s, models in sorted(frontiers.items()) if method in models and reference in models]
    if not seeds:
        return None
    pairs = [(frontiers[s][reference], frontiers[s][method]) for s in seeds]
    low, high = shared_entropy_range({f"{i}{side}": pts for i, pair in enumerate(pairs)
                                      for side, pts in zip("ro", pair)})
    if low > high:
        return len(seeds), low, high, None
    grid = entropy_grid(low, high, points)
    return len(seeds), low, high, {k: paired_frontier_difference_seeds(pairs, k, grid, n_boot=2000) for k in KS}


def comparison_rows(frontiers: dict[int, dict[str, list]], method: str, reference: str,
                    points: int = 5) -> list[str]:
    """Markdown rows: `method` minus `reference` at `points` entropies over the range every seed's pair reaches,
    for each k, paired over the seeds that have both."""
    found = comparison(frontiers, method, reference, points)
    if found is None:
        return []
    seeds, _, _, by_k = found
    if by_k is None:
        return [f"| {method} | {reference} | {seeds} | (entropy ranges do not overlap) |" + " |" * len(KS)]
    return [f"| {method} | {reference} | {seeds} | {row[0]:.4f} | " + " | ".join(fmt(by_k[k][i][1:]) for k in KS)
            + " |" for i, row in enumerate(by_k[KS[0]])]


def summary_row(frontiers: dict[int, dict[str, list]], method: str, reference: str, points: int = 5) -> str | None:
    """One Markdown row: for each k, the smallest and largest difference over the `points` entropies, and at how
    many of them the interval lies above zero (+) and below it (-); None when the pair is not recorded."""
    found = comparison(frontiers, method, reference, points)
    if found is None:
        return None
    seeds, low, high, by_k = found
    if by_k is None:
        return f"| {method} | {reference} | {seeds} | none: the ranges do not overlap |" + " - |" * len(KS)
    cells = []
    for k in KS:
        means = [r[1] for r in by_k[k]]
        above, below = sum(r[2] > 0 for r in by_k[k]), sum(r[3] < 0 for r in by_k[k])
        cells.append(f"{min(means):+.3f} to {max(means):+.3f} ({above}+ {below}-)")
    return f"| {method} | {reference} | {seeds} | {low:.3f}-{high:.3f} | " + " | ".join(cells) + " |"


def recorded_methods(frontiers: dict[int, dict[str, list]]) -> list[str]:
    """The runs some seed's frontier holds: the long runs' methods and baselines in `with_baselines` order, then any
    other run there (the newer methods', the supervised control's, drawn by other sweeps) by name."""
    known = with_baselines(METHODS)
    seen = {m for models in frontiers.values() for m in models} - {"base"}
    return [m for m in known if m in seen] + sorted(seen - set(known))


def baseline_of(method: str) -> str:
    """`learning.baseline`, or one-update `grpo` for a run that is no recipe (the supervised control)."""
    from explorl.config import ConfigError

    try:
        return baseline(method)
    except ConfigError:  # no recipe of that name
        return "grpo"


def summary(frontiers: dict[int, dict[str, list]]) -> list[str]:
    """Each method against its baseline, one-update `grpo` and the base model, one row each (`summary_row`)."""
    methods = recorded_methods(frontiers)
    lines = ["#### Summary: the difference over 5 entropies (smallest to largest), and at how many of them the 95% "
             "interval lies above zero (+) or below it (-)", "",
             "| method | minus | seeds | entropy range | " + " | ".join(f"pass@{k}" for k in KS) + " |",
             "|---|---|---:|---|" + "---|" * len(KS)]
    for method in methods:
        for reference in dict.fromkeys([baseline_of(method), "grpo", "base"]):
            row = None if reference == method else summary_row(frontiers, method, reference)
            lines += [row] if row else []
    return lines + [""]


def tables(frontiers: dict[int, dict[str, list]], split: str = "id") -> list[str]:
    head = ["| method | minus | seeds | entropy | " + " | ".join(f"pass@{k}" for k in KS) + " |",
            "|---|---|---:|---:|" + "---|" * len(KS)]
    methods = recorded_methods(frontiers)
    where = "in distribution" if split == "id" else "out of distribution"
    lines = [f"#### Right chains {where} at equal entropy: each method minus its GRPO baseline (same seed)", "",
             *head]
    for method in methods:
        if method != baseline_of(method):
            lines += comparison_rows(frontiers, method, baseline_of(method))
    lines += ["", "#### ... minus one-update `grpo` (the methods whose own baseline is another GRPO)", "", *head]
    for method in methods:
        if baseline_of(method) != "grpo":
            lines += comparison_rows(frontiers, method, "grpo")
    lines += ["", "#### ... and minus the base model", "", *head]
    for method in methods:
        lines += comparison_rows(frontiers, method, "base")
    return lines + [""]


def difference_figure(frontiers: dict[int, dict[str, list]], points: int = 9, split: str = "id",
                      against_base: bool = False, operations: int | None = None):
    """Each method minus its baseline (and each baseline minus one-update `grpo`), or with `against_base` every run
    minus the base model, against sampling entropy: one panel per k, the mean over seeds as a line and the 95%
    interval over problems and seeds as a band. `operations`: the frontiers were cut to that many (the title
    says so)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from explorl.report.style import legend_outside, model_colours, style_axes

    comparisons = []
    for method in recorded_methods(frontiers):
        reference = "base" if against_base else "grpo" if method == baseline_of(method) else baseline_of(method)
        found = None if method == reference else comparison(frontiers, method, reference, points)
        if found is not None:
            comparisons.append((method, reference, *found))
    fig = Figure(figsize=(10.0, 3.4 * len(KS)), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(len(KS), 1, i + 1) for i in range(len(KS))]
    colours = model_colours(len(comparisons))
    where = "In distribution" if split == "id" else "Out of distribution"
    if operations is not None:
        where += f", problems of {operations} operations only"
    fig.suptitle(f"{where}, final checkpoints; mean over seeds, band: 95% interval over problems and seeds",
                 fontsize="medium")
    for ax, k in zip(axes, KS):
        ax.axhline(0.0, color="black", linewidth=0.8)
        for colour, (method, reference, seeds, _, _, by_k) in zip(colours, comparisons):
            if by_k is None:  # the entropy ranges do not overlap
                continue
            xs, mean, lo, hi, _ = zip(*by_k[k])
            ax.plot(xs, mean, marker="o", ms=2, color=colour, linestyle="--" if method == baseline_of(method) else "-",
                    label=f"{method} - {reference} ({seeds} seed{'s' * (seeds != 1)})")
            ax.fill_between(xs, lo, hi, color=colour, alpha=0.12, linewidth=0)
        ax.set_ylabel(f"pass@{k} difference")
        ax.set_title(f"right-chain pass@{k}, {'run minus the base model' if against_base else 'method minus baseline'}"
                     " at equal entropy")
        ax.set_xlabel("mean token entropy of the samples (nats)")
        ax.grid(True, alpha=0.3)
        style_axes(ax)
        legend_outside(ax, fontsize="x-small")
    return fig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--name", default="testbed_long", help="runs/NAME and bench/results/NAME")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=1500, help="the final checkpoint's step")
    ap.add_argument("--problems", type=int, default=128)
    ap.add_argument("--model", default="embedded", help="the base model the runs started from")
    ap.add_argument("--split", choices=sorted(SPLITS), default="id",
                    help="in distribution or out of it (a base model with right chains there: embedded:testbed)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--table", action="store_true", help="only print the tables of the recorded frontiers")
    ap.add_argument("--plot", default=None, help="PNG path: each method minus its baseline against entropy")
    ap.add_argument("--plot-base", default=None, help="PNG path: every run minus the base model against entropy")
    ap.add_argument("--operations", type=int, default=None,
                    help="compare on the problems of this many operations alone (arithmetic; e.g. 9 of the 8-9 split)")
    args = ap.parse_args()
    if not args.table:
        import torch

        torch.set_num_threads(args.threads)
        for seed in range(args.seeds):
            models = final_checkpoints(args.name, seed, args.steps)
            if models:
                run_frontier(args.name, seed, models, args.problems, args.model, args.split)
    frontiers = load_frontiers(args.name, args.seeds, args.split)
    if not frontiers:
        raise SystemExit(f"no frontier recorded under bench/results/{args.name}/frontier/seed*/{args.split}_chain")
    if args.operations is not None:
        frontiers = of_operations(frontiers, args.operations)
        points = [p for models in frontiers.values() for pts in models.values() for p in pts]
        if not any(p.correct for p in points):
            raise SystemExit(f"--operations {args.operations}: no problem of the {args.split} split has that many "
                             f"operations; give one of {sorted(SPLITS[args.split])}")
        print(f"(problems of {args.operations} operations only; entropies are the whole split's)\n")
    print("\n".join(summary(frontiers)))
    print("\n".join(tables(frontiers, args.split)))
    for path, against_base in ((args.plot, False), (args.plot_base, True)):
        if path:
            from explorl.report.style import save_png

            figure = difference_figure(frontiers, split=args.split, against_base=against_base,
                                       operations=args.operations)
            print(f"wrote {save_png(figure, path)}")


if __name__ == "__main__":
    main()
