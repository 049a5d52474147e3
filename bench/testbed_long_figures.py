"""The figures of the long testbed runs' answer, from the records `bench/testbed_long_table.py` reads:

- `forest`: each method's pass@K difference from the base model at its last checkpoint, with the 95% bootstrap
  interval over problems and seeds (`testbed_long_records.paired`), in and out of distribution, at T = 1 and at the
  base model's entropy: the question "does RL lose coverage the base model had" at a glance;
- `curves`: pass@k against k (1 to n, log scale) of the base model and of each method at its last checkpoint (mean
  over seeds): where RL's gain at small k turns into a loss at large k, if it does;
- `problems`: per problem, the base model's correct samples against each method's at its last checkpoint (out of
  distribution, right chains, at the base entropy): whether coverage shrinks or moves, problem by problem.

    python bench/testbed_long_table.py --name testbed_ood --forest F.png --curves C.png --problems P.png
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from testbed_long_records import MODES, base_mode, fate, is_baseline, ordered_methods, paired, records_at  # noqa: E402

PANELS = [("id", "matched-chain"), ("ood", "matched-chain"), ("id", "t1-chain"), ("ood", "t1-chain")]
"""Right-chain panels first (the judge that is not fooled by guessed answers), at the base entropy, then T = 1."""


def _panels(records: dict) -> list[tuple[str, str]]:
    recorded = {key[3:] for key in records}
    chain = [p for p in PANELS if p in recorded]
    return chain or [p for p in (("id", "matched"), ("ood", "matched"), ("id", "t1"), ("ood", "t1")) if p in recorded]


def last_step(records: dict, method: str, split: str, mode: str) -> int | None:
    """The latest checkpoint of `method` recorded for (split, mode) by every seed that has any, or None."""
    by_seed: dict[int, set[int]] = {}
    for m, seed, step, sp, md in records:
        if (m, sp, md) == (method, split, mode):
            by_seed.setdefault(seed, set()).add(step)
    common = set.intersection(*by_seed.values()) if by_seed else set()
    return max(common) if common else None


def _axes(n: int, width: float, height: float, most_cols: int = 2):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = max(1, min(n, most_cols))
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return plt, fig, list(axes.flat)


def forest_rows(records: dict, k: int, split: str, mode: str) -> list[tuple[str, int, int, tuple]]:
    """(method, its last checkpoint, seeds, `paired` difference from the base model with its interval) for each
    method recorded at (split, mode), in `ordered_methods`' order."""
    base = records.get(("base", 0, 0, split, base_mode(mode)))
    out = []
    for method in ordered_methods(records):
        step = last_step(records, method, split, mode)
        if base is None or step is None:
            continue
        runs = records_at(records, method, step, split, mode)
        ci = paired([(base, r) for r in runs], k)
        if ci is not None:
            out.append((method, step, len(runs), ci))
    return out


def forest(records: dict, k: int, path: Path) -> None:
    """pass@k minus the base model's, per method at its last checkpoint, with 95% intervals over problems and seeds;
    one panel per (split, mode)."""
    panels = _panels(records)
    plt, fig, axes = _axes(len(panels), 6.8, 0.45 * len(ordered_methods(records)) + 1.6)
    for ax, (split, mode) in zip(axes, panels):
        rows = forest_rows(records, k, split, mode)
        y = list(range(len(rows)))[::-1]
        for yi, (method, _, _, (mean, lo, hi, _)) in zip(y, rows):
            ax.errorbar(mean, yi, xerr=[[mean - lo], [hi - mean]], fmt="o", capsize=3,
                        color="tab:gray" if is_baseline(method) else "tab:blue")
        ax.axvline(0.0, color="k", linestyle=":")
        ax.set_yticks(y, [f"{m} @{s} ({n} seed{'s' if n > 1 else ''})" for m, s, n, _ in rows], fontsize=8)
        ax.set_xlabel(f"pass@{k} minus the base model's")
        ax.set_title(f"{split.upper()}, sampled at {MODES[mode]}", fontsize=10)
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle("Coverage against the base model (95% intervals over problems and seeds; grey: GRPO baselines)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def curves(records: dict, path: Path) -> None:
    """pass@k against k of the base model and each method's last checkpoint (mean over seeds), per (split, mode)."""
    panels = _panels(records)
    methods = ordered_methods(records)
    plt, fig, axes = _axes(len(panels), 6.0, 4.2)
    colours = plt.get_cmap("tab20")
    for ax, (split, mode) in zip(axes, panels):
        base = records.get(("base", 0, 0, split, base_mode(mode)))
        if base is not None:
            ax.plot(base["curve"]["k"], [v[0] for v in base["curve"]["pass@k"]], color="k", linestyle=":",
                    label="base")
        for i, method in enumerate(methods):
            step = last_step(records, method, split, mode)
            runs = records_at(records, method, step, split, mode)
            if not runs:
                continue
            ks = runs[0]["curve"]["k"]
            mean = [statistics.fmean(r["curve"]["pass@k"][j][0] for r in runs) for j in range(len(ks))]
            ax.plot(ks, mean, color=colours(i % 20), linestyle="--" if is_baseline(method) else "-",
                    label=f"{method} @{step}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("k")
        ax.set_ylabel("pass@k")
        ax.set_title(f"{split.upper()}, sampled at {MODES[mode]}", fontsize=10)
        ax.grid(alpha=0.3)
    handles = {}
    for ax in axes:
        handles.update(zip(*reversed(ax.get_legend_handles_labels())))
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=3, fontsize=8)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def problem_points(records: dict, method: str, split: str, mode: str) -> list[tuple[str, int, list[int]]]:
    """(problem, the base model's correct samples, the method's in each seed at its last checkpoint) for every
    problem both evaluated, the base model's at its own entropy (`base_mode`)."""
    base = records.get(("base", 0, 0, split, base_mode(mode)))
    step = last_step(records, method, split, mode)
    if base is None or step is None:
        return []
    runs = [dict(zip(r["curve"]["problems"]["id"], r["curve"]["problems"]["correct"]))
            for r in records_at(records, method, step, split, mode)]
    return [(pid, c, [run[pid] for run in runs])
            for pid, c in zip(base["curve"]["problems"]["id"], base["curve"]["problems"]["correct"])
            if all(pid in run for run in runs)]


def problems(records: dict, path: Path, split: str = "ood", mode: str = "matched-chain", min_hits: int = 4) -> None:
    """Per problem, the base model's correct samples (x) against each method's at its last checkpoint (y, mean over
    seeds), one panel per method, both axes symmetric-log. Red: a problem the base model solves at least
    `min_hits` times that the method never solves in any seed (lost, as `solved_sets_table` counts); green: one
    the base never solves that the method solves at least `min_hits` times in every seed (gained)."""
    panels = [(m, points) for m in ordered_methods(records) if (points := problem_points(records, m, split, mode))]
    plt, fig, axes = _axes(len(panels), 3.6, 3.4, most_cols=3)  # three a row: nine runs fit a page
    for ax, (method, points) in zip(axes, panels):
        step = last_step(records, method, split, mode)
        n = records_at(records, method, step, split, mode)[0]["n"]
        colour = [{"lost": "tab:red", "gained": "tab:green"}.get(fate(c, seen, min_hits), "tab:gray")
                  for _, c, seen in points]
        ax.scatter([c for _, c, _ in points], [statistics.fmean(seen) for _, _, seen in points], s=12, c=colour,
                   alpha=0.7)
        ax.plot([0, n], [0, n], color="k", linestyle=":", linewidth=0.8)
        for axis in (ax.set_xscale, ax.set_yscale):
            axis("symlog", linthresh=1)
        ax.set_xlim(-0.3, n)
        ax.set_ylim(-0.3, n)
        lost, gained = colour.count("tab:red"), colour.count("tab:green")
        ax.set_title(f"{method} @{step}: {lost} lost, {gained} gained", fontsize=8)
        ax.set_xlabel(f"base model, correct of {n}", fontsize=8)
        ax.set_ylabel("run, correct (mean over seeds)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{split.upper()} problems, sampled at {MODES[mode]}: the base model against each run "
                 f"(red: lost, green: gained, at least {min_hits} of {n})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")
