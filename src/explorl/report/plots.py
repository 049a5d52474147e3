"""Training curves of one run, or several overlaid, as PNG files (matplotlib's Agg renderer, no pyplot state).

Every plot: a training-step axis has integer ticks; no axis writes an offset or a scale factor beside it (tick
labels are the values themselves); the legend sits to the right of the axes, never over the curves.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator, NullFormatter, ScalarFormatter

from explorl.report.runs import Run

LINESTYLES = ("-", "--", ":", "-.")
POSITION_TAIL = 0.2  # entropy by position: average over the last 20% of the steps
MANY = 6  # with more runs than this, multi-series plots draw only their first series (and the figure widens)
STEP_LABEL = "training step"


@dataclass
class PlotFile:
    """One plot of a report: written to `path`, or skipped (path None) for the reason in `note`."""

    key: str
    title: str
    path: Path | None = None
    note: str | None = None
    figure: Figure | None = field(default=None, repr=False, compare=False)
    """The matplotlib Figure written to `path` (None when skipped)."""


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


def ema(values: list[float], smooth: float) -> list[float]:
    """Exponential moving average `m_t = smooth * m_{t-1} + (1 - smooth) * x_t`, started at the first value and
    debiased as TensorBoard's smoothing is not (a plain running average over the first points); `smooth` 0 = off."""
    if not 0 <= smooth < 1:
        raise ValueError(f"smoothing must be in [0, 1), got {smooth}")
    out, m = [], None
    for x in values:
        m = x if m is None else smooth * m + (1 - smooth) * x
        out.append(m)
    return out


def model_colours(n: int) -> list:
    """`n` colours that stay apart, one per run or model: tab10 up to 10, tab20 up to 20 (tab10 repeats after 10),
    beyond that evenly spaced along a perceptually ordered map."""
    if n <= 10:
        return [f"C{i}" for i in range(n)]
    if n <= 20:
        return [colormaps["tab20"](i) for i in range(n)]
    return [colormaps["turbo"](0.05 + 0.9 * i / (n - 1)) for i in range(n)]


def style_axes(ax: Axes, *, step_axis: bool = False) -> None:
    """explorl's look of an axes: integer ticks on a training-step x axis (`step_axis`), and tick labels that are
    the values themselves on every linear axis (no offset such as "+5.686", no "1e-7" factor: matplotlib would
    write one for values that differ only far behind the decimal point)."""
    if step_axis:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for axis in (ax.xaxis, ax.yaxis):
        if type(axis.get_major_formatter()) is ScalarFormatter:  # log axes keep their own formatters
            plain = ScalarFormatter(useOffset=False)
            plain.set_scientific(False)
            axis.set_major_formatter(plain)


def legend_outside(ax: Axes, fontsize: str = "small") -> None:
    """The legend of `ax` (if it has labelled artists) to the right of the axes, top-aligned, so that it never
    covers data; a constrained-layout figure makes room for it."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=fontsize, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)


class _Drawer:
    """Colours and labels for `series` of every run: by series for one run, by run (line style by series) else.
    `smooth`: EMA weight applied to the per-step training curves; `band`: the spread shown for several seeds
    (`minmax`, or `ci95`: the 95% t-interval of the mean over seeds at each step)."""

    def __init__(self, ax: Axes, labels: list[str], smooth: float = 0.0, band: str = "minmax"):
        self.smooth, self.band = smooth, band
        self.ax, self.labels, self.single = ax, labels, len(labels) == 1
        self.many = len(labels) > MANY
        self.colors = model_colours(len(labels))

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


def _draw_keys(d: _Drawer, i: int, run: Run, keys: list[tuple[str, str | None]], marker: str | None = None,
               named: bool = False) -> bool:
    """Draw run `i`'s scalar training metrics `keys` [(metric, legend name)] (only the first with many runs, then
    unnamed unless `named`); False when it has none of them."""
    drawn = False
    for j, (key, series) in enumerate(keys[:1] if d.many else keys):
        xs, ys = run.series(key)
        if xs:
            d.line(i, j, series if named or not d.many else None, xs, ema(ys, d.smooth), marker=marker,
                   markersize=3)
            if len(run.members) > 1 and j == 0:  # seeds of one config: their min-max band
                _seed_band(d, i, run, key, xs)
            drawn = True
    return drawn


def _metric_lines(keys: list[tuple[str, str | None]], marker: str | None = None):
    """A plot of scalar training metrics `keys` [(metric, legend name)]; returns the runs lacking all of them."""

    def draw(d: _Drawer, runs: list[Run]) -> list[int]:
        return [i for i, run in enumerate(runs) if not _draw_keys(d, i, run, keys, marker)]

    return draw


def _draw_reward_functions(d: _Drawer, runs: list[Run]) -> list[int]:
    """A line per reward function of each run whose `task.reward` names several (`reward/<name>`, each function's
    unweighted mean), named by the function; runs with one function, or without the metrics, are lacking."""
    lacking = []
    for i, run in enumerate(runs):
        keys = [(f"reward/{name}", name) for name in run.reward_functions()]
        if not _draw_keys(d, i, run, keys, named=True):
            lacking.append(i)
    return lacking


def _seed_band(d: _Drawer, run_i: int, run: Run, key: str, xs: list[int]) -> None:
    from explorl.report.runs import seed_stat

    per_seed = []
    for m in run.members:
        sx, sy = m.series(key)
        per_seed.append(dict(zip(sx, ema(sy, d.smooth))))  # each seed smoothed as its mean curve is
    band = [x for x in xs if all(x in p for p in per_seed)]
    if not band:
        return
    if d.band == "ci95":
        stats = [seed_stat([p[x] for p in per_seed]) for x in band]
        lo, hi = [st.low for st in stats], [st.high for st in stats]
    else:
        lo, hi = [min(p[x] for p in per_seed) for x in band], [max(p[x] for p in per_seed) for x in band]
    d.ax.fill_between(band, lo, hi, color=d.style(run_i, 0)["color"], alpha=0.15, linewidth=0)


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
    xlabel: str = STEP_LABEL
    title_many: str | None = None
    """The title when more than MANY runs are drawn and only the first series is (multi-series plots)."""


PLOTS: list[PlotSpec] = [
    PlotSpec("reward", "Mean reward per step", "mean reward", _metric_lines([("reward/mean", None)]), "reward/mean"),
    PlotSpec("reward_functions", "Mean reward per reward function (unweighted)", "mean reward",
             _draw_reward_functions, "reward/<name> (logged when task.reward names several functions)",
             title_many="Mean reward of the first reward function (unweighted)"),
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
    PlotSpec("grad_norm", "Gradient norm before clipping", "global L2 norm",
             _metric_lines([("optim/grad_norm", None)]), "optim/grad_norm"),
    PlotSpec("kl", "KL to the reference and between pi_old and pi_new", "KL (nats per token)",
             _metric_lines([("kl/mean", "k3 to the reference"), ("loss/ppo_kl", "pi_old vs pi_new")]), "kl/mean",
             title_many="KL to the reference"),
    PlotSpec("clip", "Tokens clipped by the PPO ratio", "fraction of tokens",
             _metric_lines([("loss/clip_frac_low", "at 1 - eps_low (A < 0)"),
                            ("loss/clip_frac_high", "at 1 + eps_high (A > 0)")]), "loss/clip_frac_low",
             title_many="Tokens clipped at 1 - eps_low"),
    PlotSpec("entropy_by_position", f"Entropy by relative position (last {POSITION_TAIL:.0%} of steps)",
             "mean token entropy (nats)", _draw_position, "entropy/by_position",
             xlabel="relative position in the response (%)"),
]


def make_plots(runs: list[Run], out_dir: str | Path, labels: list[str] | None = None, *, smooth: float = 0.0,
               band: str = "minmax") -> list[PlotFile]:
    """Write one PNG per plot of PLOTS into `out_dir` (overlaying `runs`); plots with no data are skipped.
    `smooth`: EMA weight for the per-step curves (`ema`); `band`: the seeds' spread, `minmax` or `ci95`."""
    if band not in ("minmax", "ci95"):
        raise ValueError(f"band: {band!r} is not one of minmax, ci95")
    if not runs:
        raise ValueError("make_plots: no runs given")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    labels = labels or run_labels(runs)
    results = []
    for spec in PLOTS:
        fig = Figure(figsize=(11.0, 4.8) if len(runs) > MANY else (9.0, 4.2), dpi=100, layout="constrained")
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        drawer = _Drawer(ax, labels, smooth, band)
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
        style_axes(ax, step_axis=spec.xlabel == STEP_LABEL)
        legend_outside(ax, "x-small" if len(runs) > MANY else "small")
        fig.savefig(target, format="png", metadata={"Software": None})
        note = None
        if lacking:
            note = f"no {spec.metric} in: {', '.join(labels[i] for i in lacking)}"
        results.append(PlotFile(spec.key, title, target, note, fig))
    return results


def plot_venn(sets: dict[str, set], path: str | Path, title: str = "unsolvable problems") -> Path:
    """A Venn diagram of 2-3 sets (e.g. k-rollout unsolvable sets of several models, STILL section 2.1).

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


def save_png(fig: Figure, path: str | Path) -> Path:
    """Write `fig` as a PNG at `path` (parents created; no software tag, so equal figures give equal bytes)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", metadata={"Software": None})
    return path


def curve_difference(base: dict, other: dict, metric: str = "pass@k") -> tuple[list[int], list[float]]:
    """(k, `other`'s mean minus `base`'s) at the k both curves have (`evaluate.k_curves` results)."""
    ks = [k for k in other["k"] if k in base["k"]]
    return ks, [other[metric][other["k"].index(k)][0] - base[metric][base["k"].index(k)][0] for k in ks]


def crossings(base: dict, other: dict, metric: str = "pass@k") -> list[int]:
    """The k (of both curves) at which `other`'s mean moves from above `base`'s to at or below it, or back:
    where a trained model's curve crosses the base model's (E3, EAD, STILL)."""
    ks, diff = curve_difference(base, other, metric)
    return [k for k, before, now in zip(ks[1:], diff, diff[1:]) if (before > 0) != (now > 0)]


def plot_k_curves(curves: dict[str, dict], path: str | Path, metric: str = "pass@k",
                  paired: dict[str, dict] | None = None) -> Path:
    """`metric` (pass@k or maj@k) against k on a log-2 axis, one line per evaluation with its 95% interval over
    problems shaded (`evaluate.k_curves`); with two or more, a second panel shows each curve minus the first
    (the base model's), so a crossing is where the difference meets 0 (E3 Fig. 8, STILL Fig. 1a),
    shaded with its paired interval where `paired[name]` gives one (`evaluate.paired_pass_difference`).
    Written as a PNG at `path` (`k_curves_figure` draws it)."""
    return save_png(k_curves_figure(curves, metric, paired), path)


def k_curves_figure(curves: dict[str, dict], metric: str = "pass@k", paired: dict[str, dict] | None = None) -> Figure:
    """The figure of `plot_k_curves`."""
    if not curves:
        raise ValueError("plot_k_curves: no curves")
    names = list(curves)
    panels = 2 if len(names) > 1 else 1
    fig = Figure(figsize=(9.0, 4.2 * panels), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(panels, 1, i + 1) for i in range(panels)]
    colours = model_colours(len(names))
    for i, name in enumerate(names):
        c = curves[name]
        mean, lo, hi = zip(*c[metric])
        axes[0].plot(c["k"], mean, marker="o", ms=3, color=colours[i], label=name)
        axes[0].fill_between(c["k"], lo, hi, color=colours[i], alpha=0.15, linewidth=0)
    axes[0].set_ylabel(metric)
    axes[0].set_title(f"{metric} against k (95% intervals over problems)")
    if panels == 2:
        base = curves[names[0]]
        axes[1].axhline(0.0, color="black", linewidth=0.8)
        for i, name in enumerate(names[1:], 1):
            ks, diff = curve_difference(base, curves[name], metric)
            axes[1].plot(ks, diff, marker="o", ms=3, color=colours[i], label=f"{name} - {names[0]}")
            band = (paired or {}).get(name)
            if band:
                shown = [k for k in ks if k in band]
                axes[1].fill_between(shown, [band[k][1] for k in shown], [band[k][2] for k in shown],
                                     color=colours[i], alpha=0.15, linewidth=0)
        axes[1].set_ylabel(f"{metric} minus {names[0]}")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))  # 1, 2, 4, ... rather than 2^0, 2^1
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("k")
        ax.grid(True, alpha=0.3)
        style_axes(ax)
        legend_outside(ax)
    return fig


def plot_frontier(points: dict[str, list[dict]], ks: list[int], paired: dict[str, dict] | None,
                  path: str | Path) -> Path:
    """The coverage-entropy frontier (`explorl frontier`): pass@1 and pass@k at the largest k against the mean token
    entropy of the samples, one line per model through its temperatures, shaded with the 95% interval over
    problems; with `paired` (`{model: {k: [(entropy, mean, lo, hi)]}}`, `frontier.paired_frontier_difference`) a
    last panel shows each model minus the first at equal entropy, with its paired interval. Written as a PNG."""
    if not points:
        raise ValueError("plot_frontier: no models")
    shown_ks = sorted({min(ks), max(ks)})
    panels = len(shown_ks) + (1 if paired else 0)
    fig = Figure(figsize=(9.0, 3.6 * panels), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(panels, 1, i + 1) for i in range(panels)]
    names = list(points)
    colours = model_colours(len(names))
    few = len(names) <= 4  # with more models the temperature labels and bands would hide the lines
    for ax, k in zip(axes, shown_ks):
        for i, name in enumerate(names):
            pts = sorted(points[name], key=lambda p: p["entropy"])
            xs = [p["entropy"] for p in pts]
            mean, lo, hi = zip(*(p[f"pass@{k}"] for p in pts))
            ax.plot(xs, mean, marker="o", ms=3, color=colours[i], label=name)
            ax.fill_between(xs, lo, hi, color=colours[i], alpha=0.15 if few else 0.05, linewidth=0)
            for p in pts if few else []:  # each point's sampling temperature, small, beside it
                ax.annotate(f"T={p['temperature']:g}", (p["entropy"], p[f"pass@{k}"][0]), fontsize="x-small",
                            textcoords="offset points", xytext=(3, -9), color=colours[i])
        ax.set_ylabel(f"pass@{k}")
        ax.set_title(f"pass@{k} against sampling entropy (95% intervals over problems)")
    if paired:
        ax = axes[-1]
        ax.axhline(0.0, color="black", linewidth=0.8)
        k = max(ks)
        for i, name in enumerate(names[1:], 1):
            rows = paired[name][k]
            if not rows:
                continue
            xs, mean, lo, hi = zip(*rows)
            ax.plot(xs, mean, marker="o", ms=3, color=colours[i], label=f"{name} - {names[0]}")
            ax.fill_between(xs, lo, hi, color=colours[i], alpha=0.15 if few else 0.05, linewidth=0)
        ax.set_ylabel(f"pass@{k} minus {names[0]}")
        ax.set_title(f"pass@{k} at equal entropy, paired over problems (95% interval)")
    for ax in axes:
        ax.set_xlabel("mean token entropy of the samples (nats)")
        ax.grid(True, alpha=0.3)
        style_axes(ax)
        legend_outside(ax)
    return save_png(fig, path)


def plot_difference(runs: list[Run], labels: list[str], metric: str, out_dir: str | Path,
                    smooth: float = 0.0) -> PlotFile:
    """`metric` of each run minus the first run's, over the training steps both logged, EMA-smoothed (E3
    Fig. 8: the all-wrong fraction with dynamic budgets minus without), as `out_dir/diff_<metric>.png`. Skipped
    (path None) when the runs lack it."""
    base = dict(zip(*runs[0].series(metric)))
    fig = Figure(figsize=(9.0, 4.2), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.axhline(0.0, color="black", linewidth=0.8)
    title = f"{metric}: difference to {labels[0]}" + (f" (EMA {smooth:g})" if smooth else "")
    drawn = []
    for i, run in enumerate(runs[1:], 1):
        xs, ys = run.series(metric)
        common = [(x, y - base[x]) for x, y in zip(xs, ys) if x in base]
        if common:
            ax.plot([x for x, _ in common], ema([v for _, v in common], smooth), color=f"C{i % 10}",
                    label=f"{labels[i]} - {labels[0]}")
            drawn.append(labels[i])
    key = "diff_" + re.sub(r"[^A-Za-z0-9_]+", "_", metric).strip("_")
    if not base or not drawn:
        return PlotFile(key, title, None, f"skipped: {metric} not logged by {labels[0] if not base else 'the others'}")
    ax.set_title(title)
    ax.set_xlabel(STEP_LABEL)
    ax.set_ylabel(f"difference in {metric}")
    ax.grid(True, alpha=0.3)
    style_axes(ax, step_axis=True)
    legend_outside(ax)
    return PlotFile(key, title, save_png(fig, Path(out_dir) / f"{key}.png"), figure=fig)
