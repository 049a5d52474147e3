"""Reports of training runs: `analyze` (one run) and `compare` (several, seeds of one config pooled with 95% CIs).

Each writes PNG plots and a self-contained index.html (images embedded) into an output directory.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from explorl.analysis.measures import entropy_performance_fit
from explorl.report.configs import MISSING, config_differences
from explorl.report.examples import example_completions, load_samples
from explorl.report.html import HtmlTable, Page, write_page
from explorl.report.plots import PLOTS, PlotFile, make_plots, plot_difference, run_labels
from explorl.report.runs import Run, RunError, load_run
from explorl.report.seeds import SeedStat, group_by_config, group_labels, seed_mean, seed_stat
from explorl.runs import nofollow

__all__ = ["PLOTS", "Report", "Run", "RunError", "analyze", "compare", "compare_tables", "final_table",
           "group_by_config", "load_run", "make_plots", "seed_mean", "seed_stat"]


@dataclass
class Report:
    out_dir: Path
    html: Path
    plots: list[PlotFile]
    tables: list[HtmlTable]
    runs: list[Run]


def _fmt(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return "-" if value is None else str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 1000 else f"{value:.1f}"
    return str(value)


def _metric_order(key: str) -> tuple:
    for rank, prefix in enumerate(("pass@", "maj@", "avg@")):
        if key.startswith(prefix) and key[len(prefix):].isdigit():
            return (1, rank, int(key[len(prefix):]), key)
    fixed = ["step", "problems", "n"]
    if key in fixed:
        return (0, fixed.index(key), 0, key)
    for rank, name in enumerate(("entropy", "length")):
        if key == name:
            return (2, rank, 0, key)
    return (3, 0, 0, key)


def final_table(run: Run) -> HtmlTable:
    """The final held-out evaluation of `run` (eval.json) as metric/value rows."""
    if not run.final:
        return HtmlTable("final held-out evaluation", ["metric", "value"], [],
                         note="no eval.json and no evaluation in metrics.jsonl (the run may not have finished)")
    rows = [[k, _fmt(run.final[k])] for k in sorted(run.final, key=_metric_order)]
    return HtmlTable(f"final held-out evaluation: {run.name}", ["metric", "value"], rows)


def fit_table(run: Run) -> HtmlTable:
    """Entropy-performance fit R = -a exp(H) + b over the run's steps (STILL; `entropy_performance_fit`)."""
    pairs = [(r["entropy/mean"], r["reward/mean"]) for r in run.steps
             if isinstance(r.get("entropy/mean"), (int, float)) and isinstance(r.get("reward/mean"), (int, float))]
    title = "entropy-performance fit: reward = -a exp(H) + b over training steps"
    try:
        fit = entropy_performance_fit([h for h, _ in pairs], [r for _, r in pairs])
    except ValueError as e:
        return HtmlTable(title, ["a", "b", "R^2", "steps"], [], note=f"not fitted: {e}")
    return HtmlTable(title, ["a", "b", "R^2", "steps"],
                     [[_fmt(fit["a"]), _fmt(fit["b"]), _fmt(fit["r2"]), str(len(pairs))]])


def _ks(runs: list[Run]) -> list[int]:
    return sorted({int(k[5:]) for r in runs if r.final for k in r.final if k.startswith("pass@") and k[5:].isdigit()})


def _stat_cells(stat: SeedStat | None) -> tuple[str, str]:
    if stat is None:
        return "-", "-"
    if stat.low is None:
        return f"{stat.mean:.3f}", "- (1 seed)"
    return f"{stat.mean:.3f} ± {stat.half_width:.3f}", f"[{stat.low:.3f}, {stat.high:.3f}]"


FOLD = 60  # characters of a config value shown in the "differs in" column


def _plain(value: Any) -> str:
    """A config value as one line: YAML's words for null and booleans, strings unquoted (an empty one as ''),
    mappings as {key=value, ...} and lists as [a, b], nested alike; a key the config lacks as -."""
    if value is MISSING:
        return "-"
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, str):
        return " ".join(value.split()) or "''"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}={_plain(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_plain(v) for v in value) + "]"
    return str(value)


def fold(value: Any, limit: int = FOLD) -> str:
    """`value` as one line of at most `limit` characters (`_plain`), cut with an ellipsis when longer."""
    text = _plain(value)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def compare_tables(runs: list[Run]) -> list[HtmlTable]:
    """Side-by-side final pass@k per config (mean over seeds with a 95% CI) and per run."""
    groups = group_by_config(runs)
    labels = dict(zip(map(id, runs), run_labels(runs)))
    ks = _ks(runs)
    with_ci = any(len(g) > 1 for g in groups)
    diffs = config_differences(groups) if len(groups) > 1 else [{} for _ in groups]
    headers = ["config", "runs", "run.seed"] + (["differs in"] if len(groups) > 1 else [])
    for k in ks:
        headers += [f"pass@{k}"] + ([f"pass@{k} 95% CI"] if with_ci else [])
    rows = []
    for gi, (group, diff) in enumerate(zip(groups, diffs)):
        row = [f"config {gi + 1}", ", ".join(labels[id(r)] for r in group),
               ", ".join(str(r.seed) for r in group)]
        if len(groups) > 1:
            row.append("; ".join(f"{k}={fold(v)}" for k, v in diff.items()) or "-")
        for k in ks:
            value, ci = _stat_cells(seed_stat([(r.final or {}).get(f"pass@{k}") for r in group]))
            row += [value] + ([ci] if with_ci else [])
        rows.append(row)
    note = ("Runs whose configs are equal except run.seed and run.out_dir are one config"
            + ("; \"differs in\": the config keys whose values are not the same in every config compared (- where "
               "a config lacks the key; long values cut at 60 characters)" if len(groups) > 1 else "") + ". "
            + ("With several seeds: mean ± half-width of the 95% t-interval of the mean over seeds "
               "(t with n-1 degrees of freedom, sample std; not clipped to [0, 1]). " if with_ci else "")
            + "With one seed the value is shown alone.")
    by_config = HtmlTable("final held-out pass@k by config", headers, rows, note=note)

    extra = [c for c in ("entropy", "length") if any(r.final and c in r.final for r in runs)]
    run_headers = ["run", "config", "seed"] + [f"pass@{k}" for k in ks] + extra
    group_of = {id(r): gi + 1 for gi, g in enumerate(groups) for r in g}
    run_rows = []
    for r in runs:
        final = r.final or {}
        run_rows.append([labels[id(r)], f"config {group_of[id(r)]}", str(r.seed)]
                        + [_fmt(final.get(f"pass@{k}")) for k in ks] + [_fmt(final.get(c)) for c in extra])
    return [by_config, HtmlTable("final held-out evaluation by run", run_headers, run_rows)]


def analyze(run_path: str | Path, out: str | Path | None = None, *, smooth: float = 0.0) -> Report:
    """Plots and index.html of one run, written to RUN/report/ (or `out`); `smooth`: EMA weight of the curves.
    RUN/report as a symbolic link is refused before anything is written, as is a link among the files written
    (`runs.nofollow`): a run directory is someone else's at times, and the report would land where the link points."""
    run = load_run(run_path)
    out_dir = Path(out) if out is not None else run.path / "report"
    nofollow.make_dirs(out_dir, run.path if out is None else out_dir)
    plots = make_plots([run], out_dir, smooth=smooth)
    tables = [final_table(run), fit_table(run)]
    notes = [f"{run.skipped_lines} unreadable line(s) of metrics.jsonl skipped"] if run.skipped_lines else []
    steps = run.steps[-1]["step"] if run.steps else 0
    examples = example_completions(load_samples(run.path / "samples.jsonl"))
    if examples:
        shown = sorted({ex.step for ex in examples})
        which = "the first, middle and last step logged" if len(shown) == 3 else "every step logged"
        said = (f"The best and the worst completion (by reward) of step{'s' if len(shown) > 1 else ''} "
                f"{', '.join(map(str, shown))} ({which}) among the logged ones: samples.jsonl holds the first "
                f"run.log_samples prompts of each step with all their completions.")
    else:
        said = ("No completions to show: no samples.jsonl in the run directory, or no scored completion in it "
                "(the run logs them with run.log_samples > 0).")
    page = Page(title=f"explorl run report: {run.name}", subtitle=f"{run.path} ({steps} training steps)",
                tables=tables, plots=plots, configs=[("config.yaml", run.config_text)], notes=notes,
                examples=examples, examples_note=said)
    html = write_page(page, out_dir / "index.html")
    return Report(out_dir, html, plots, tables, [run])


def compare(run_paths: list[str | Path], out: str | Path = "runs/compare", *, smooth: float = 0.0,
            band: str = "minmax", diff: list[str] | tuple = ()) -> Report:
    """Overlaid curves and a side-by-side table of several runs, written to `out` (PNGs and index.html).

    `smooth`: EMA weight of the per-step curves; `band`: the spread of several seeds of a config (`minmax` or
    `ci95`); `diff`: metrics drawn as each config's curve minus the first's (E3 Fig. 8).
    """
    if not run_paths:
        raise RunError("compare: give at least one run directory")
    runs = [load_run(p) for p in run_paths]
    out_dir = Path(out)
    labels = run_labels(runs)
    groups = group_by_config(runs)
    label_of = dict(zip(map(id, runs), labels))
    notes = [f"{label_of[id(r)]}: {r.skipped_lines} unreadable line(s) of metrics.jsonl skipped"
             for r in runs if r.skipped_lines]
    if any(len(g) > 1 for g in groups):  # one curve per config: seeds averaged, their spread shaded
        names = group_labels(groups, label_of)
        curves = [seed_mean(g, n) for g, n in zip(groups, names)]
        plots = make_plots(curves, out_dir, names, smooth=smooth, band=band)
        notes.insert(0, "Curves: one per config, the mean over its seeds at the steps all of them logged; shaded: "
                        "the min-max range across seeds (first series of each plot). Legend names: "
                        + "; ".join(f"{n} = {', '.join(label_of[id(r)] for r in g)}" for n, g in zip(names, groups)))
    else:
        curves, names = runs, labels
        plots = make_plots(runs, out_dir, labels, smooth=smooth, band=band)
    for metric in diff:
        if len(curves) < 2:
            raise RunError(f"--diff {metric}: needs two configs (or runs) to subtract")
        plots.append(plot_difference(curves, names, metric, out_dir, smooth))
    tables = compare_tables(runs)
    configs = [(f"config {gi + 1}: {', '.join(label_of[id(r)] for r in g)} (shown: {label_of[id(g[0])]})",
                g[0].config_text) for gi, g in enumerate(groups)]
    page = Page(title=f"explorl comparison: {' vs '.join(labels)}",
                subtitle=", ".join(str(r.path) for r in runs), tables=tables, plots=plots, configs=configs,
                notes=notes)
    html = write_page(page, out_dir / "index.html")
    return Report(out_dir, html, plots, tables, runs)
