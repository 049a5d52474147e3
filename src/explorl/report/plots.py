"""Training curves of one run, or several overlaid, as PNG files (matplotlib's Agg renderer, no pyplot state)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from explorl.report.runs import Run

LINESTYLES = ("-", "--", ":", "-.")
POSITION_TAIL = 0.2  # entropy by position: average over the last 20% of the steps
MANY = 6  # with more runs than this, multi-series plots draw only their first series and legends move outside


@dataclass
class PlotFile:
    """One plot of a report: written to `path`, or skipped (path None) for the reason in `note`."""

    key: str
    title: str
    path: Path | None = None
    note: str | None = None


def run_labels(runs: list[Run]) -> list[str]:
    """Distinct legend labels: the directory names, with parent directories added where names repeat."""
    labels = [r.name for r in runs]
    depth = 1
    while len(set(labels)) < len(labels) and depth < 6:
        depth += 1
        labels = ["/".join(r.path.resolve().parts[-depth:]) for r in runs]
    if len(set(labels)) < len(labels):
        labels = [f"{lab} [{i + 1}]" for i, lab in enumerate(labels)]
    return labels


class _Drawer:
    """Colours and labels for `series` of every run: by series for one run, by run (line style by series) else."""

    def __init__(self, ax: Axes, labels: list[str]):
        self.ax, self.labels, self.single = ax, labels, len(labels) == 1
        self.many = len(labels) > MANY
        # tab10 repeats after 10 runs; tab20 keeps up to 20 apart
        self.colors = [f"C{i % 10}" for i in range(len(labels))] if len(labels) <= 10 else \
            [colormaps["tab20"](i % 20) for i in range(len(labels))]

    def style(self, run_i: int, series_i: int) -> dict:
        if self.single:
            return {"color": f"C{series_i % 10}", "linestyle": "-"}
        return {"color": self.colors[run_i], "linestyle": LINESTYLES[series_i % len(LINESTYLES)]}

    def label(self, run_i: int, series: str | None) -> str:
        if self.single:
            return series or self.labels[0]
        return f"{self.labels[run_i]}: {series}" if series else self.labels[run_i]

    def line(self, run_i: int, series_i: int, series: str | None, xs, ys, **kw) -> None:
        self.ax.plot(xs, ys, label=self.label(run_i, series), **self.style(run_i, series_i), **kw)


def _metric_lines(keys: list[tuple[str, str | None]], marker: str | None = None):
    """A plot of scalar training metrics `keys` [(metric, legend name)]; returns the runs lacking all of them."""

    def draw(d: _Drawer, runs: list[Run]) -> list[int]:
        lacking = []
        for i, run in enumerate(runs):
            drawn = False
            for j, (key, series) in enumerate(keys[:1] if d.many else keys):
                xs, ys = run.series(key)
                if xs:
                    d.line(i, j, None if d.many else series, xs, ys, marker=marker, markersize=3)
                    if len(run.members) > 1 and j == 0:  # seeds of one config: their min-max band
                        _seed_band(d, i, run, key, xs)
                    drawn = True
            if not drawn:
                lacking.append(i)
        return lacking

    return draw


def _seed_band(d: _Drawer, run_i: int, run: Run, key: str, xs: list[int]) -> None:
    per_seed = [dict(zip(*m.series(key))) for m in run.members]
    band = [x for x in xs if all(x in p for p in per_seed)]
    if band:
        d.ax.fill_between(band, [min(p[x] for p in per_seed) for x in band],
                          [max(p[x] for p in per_seed) for x in band], color=d.style(run_i, 0)["color"],
                          alpha=0.15, linewidth=0)


def _draw_pass_at_k(d: _Drawer, runs: list[Run]) -> list[int]:
    lacking = []
    for i, run in enumerate(runs):
        drawn = False
        for j, k in enumerate(run.pass_ks()):
            xs, ys = run.eval_series(f"pass@{k}")
            if xs:
                d.line(i, j, f"pass@{k}", xs, ys, marker="o", markersize=4)
                drawn = True
        if not drawn:
            lacking.append(i)
    return lacking


def _draw_rollouts(d: _Drawer, runs: list[Run]) -> list[int]:
    lacking = []
    for i, run in enumerate(runs):
        xs, mean = run.series("rollouts/per_prompt_mean")
        lo = dict(zip(*run.series("rollouts/per_prompt_min")))
        hi = dict(zip(*run.series("rollouts/per_prompt_max")))
        if not xs:
            lacking.append(i)
            continue
        style = d.style(i, 0)
        d.line(i, 0, "mean", xs, mean)
        band = [x for x in xs if x in lo and x in hi]
        if band:
            d.ax.fill_between(band, [lo[x] for x in band], [hi[x] for x in band], color=style["color"], alpha=0.2,
                              linewidth=0, label=d.label(i, "min-max"))
    return lacking


def _draw_position(d: _Drawer, runs: list[Run]) -> list[int]:
    lacking = []
    for i, run in enumerate(runs):
        profile = run.position_profile(POSITION_TAIL)
        if profile is None:
            lacking.append(i)
            continue
        width = 100.0 / len(profile)
        pts = [((b + 0.5) * width, v) for b, v in enumerate(profile) if v is not None]
        d.line(i, 0, None, [p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=4)
    if not lacking or len(lacking) < len(runs):
        d.ax.set_xlim(0, 100)
    return lacking


@dataclass
class PlotSpec:
    key: str
    title: str
    ylabel: str
    draw: Callable[[_Drawer, list[Run]], list[int]]
    metric: str
    xlabel: str = "training step"
    title_many: str | None = None
    """The title when more than MANY runs are drawn and only the first series is (multi-series plots)."""


PLOTS: list[PlotSpec] = [
    PlotSpec("reward", "Mean reward per step", "mean reward", _metric_lines([("reward/mean", None)]), "reward/mean"),
    PlotSpec("pass_at_k", "Held-out pass@k during training", "pass@k", _draw_pass_at_k, "eval/pass@k"),
    PlotSpec("entropy", "Token entropy (all / correct / incorrect responses)", "entropy (nats)",
             _metric_lines([("entropy/mean", "all"), ("entropy/pos", "correct (pos)"),
                            ("entropy/neg", "incorrect (neg)")]), "entropy/mean",
             title_many="Token entropy (all responses)"),
    PlotSpec("temperature", "Sampling temperature", "temperature",
             _metric_lines([("temperature/mean", "sampled (mean over tokens)"),
                            ("temperature/train", "optimised policy")]), "temperature/mean",
             title_many="Sampling temperature (mean over sampled tokens)"),
    PlotSpec("temperature_floor", "Tokens sampled at the EAD floor tau_min", "fraction of generated tokens",
             _metric_lines([("temperature/at_min_frac", None)]), "temperature/at_min_frac"),
    PlotSpec("rollouts", "Rollouts per prompt (mean, min-max band)", "responses per prompt", _draw_rollouts,
             "rollouts/per_prompt_*"),
    PlotSpec("all_wrong", "Prompts with every response wrong", "fraction of prompts",
             _metric_lines([("reward/all_wrong_frac", None)]), "reward/all_wrong_frac"),
    PlotSpec("length", "Mean response length", "tokens", _metric_lines([("length/mean", None)]), "length/mean"),
    PlotSpec("entropy_by_position", f"Entropy by relative position (last {POSITION_TAIL:.0%} of steps)",
             "mean token entropy (nats)", _draw_position, "entropy/by_position",
             xlabel="relative position in the response (%)"),
]


def make_plots(runs: list[Run], out_dir: str | Path, labels: list[str] | None = None) -> list[PlotFile]:
    """Write one PNG per plot of PLOTS into `out_dir` (overlaying `runs`); plots with no data are skipped."""
    if not runs:
        raise ValueError("make_plots: no runs given")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    labels = labels or run_labels(runs)
    results = []
    for spec in PLOTS:
        fig = Figure(figsize=(10.0, 4.8) if len(runs) > MANY else (7.5, 4.2), dpi=100, layout="constrained")
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        drawer = _Drawer(ax, labels)
        lacking = spec.draw(drawer, runs)
        target = out_dir / f"{spec.key}.png"
        if len(lacking) == len(runs):
            target.unlink(missing_ok=True)  # no stale picture from an earlier report
            results.append(PlotFile(spec.key, spec.title, None, f"skipped: no {spec.metric} in metrics.jsonl"))
            continue
        title = spec.title_many if drawer.many and spec.title_many else spec.title
        ax.set_title(title)
        ax.set_xlabel(spec.xlabel)
        ax.set_ylabel(spec.ylabel)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            if len(runs) > MANY:
                ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
            else:
                ax.legend(fontsize="small", loc="best")
        fig.savefig(target, format="png", metadata={"Software": None})
        note = None
        if lacking:
            note = f"no {spec.metric} in: {', '.join(labels[i] for i in lacking)}"
        results.append(PlotFile(spec.key, title, target, note))
    return results


def plot_venn(sets: dict[str, set], path: str | Path, title: str = "unsolvable problems") -> Path:
    """A Venn diagram of 2-3 sets (e.g. k-rollout unsolvable sets of several models, paper 004 section 2.1).

    Circles of equal size with the count of every region written in it (`analysis.measures.set_overlaps`).
    """
    from matplotlib.patches import Circle

    from explorl.analysis.measures import set_overlaps

    names = list(sets)
    if not 2 <= len(names) <= 3:
        raise ValueError(f"plot_venn: give 2 or 3 sets, got {len(names)}")
    regions = set_overlaps(sets)
    centres = [(-0.6, 0.0), (0.6, 0.0)] if len(names) == 2 else [(-0.6, 0.35), (0.6, 0.35), (0.0, -0.65)]
    colours = ["tab:blue", "tab:orange", "tab:green"]
    fig = Figure(figsize=(6, 5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for (x, y), colour, name in zip(centres, colours, names):
        ax.add_patch(Circle((x, y), 1.0, alpha=0.25, color=colour))
        ax.text(x * 1.3, y + (1.1 if y >= 0 else -1.2), f"{name} ({len(sets[name])})", ha="center",
                fontsize=10, color=colour, weight="bold")
    for key, count in regions.items():
        inside = [n for n in names if n in key.split("-")[0].split("&")]
        xs = [centres[names.index(n)][0] for n in inside]
        ys = [centres[names.index(n)][1] for n in inside]
        x, y = sum(xs) / len(xs), sum(ys) / len(ys)
        if len(inside) < len(names):  # push single and pairwise regions away from the other circles' centres
            outside = [centres[names.index(n)] for n in names if n not in inside]
            ox, oy = sum(c[0] for c in outside) / len(outside), sum(c[1] for c in outside) / len(outside)
            x, y = x + 0.45 * (x - ox), y + 0.45 * (y - oy)
        ax.text(x, y, str(count), ha="center", va="center", fontsize=12)
    ax.set_xlim(-2.2, 2.2)
    ax.set_ylim(-2.0, 1.9)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(title)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path
