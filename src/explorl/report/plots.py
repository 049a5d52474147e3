"""Training curves of one run, or several overlaid, as PNG files (matplotlib's Agg renderer, no pyplot state).

Every plot: a training-step axis has integer ticks; no axis writes an offset or a scale factor beside it (tick
labels are the values themselves); the legend sits to the right of the axes, never over the curves
(`report.style`). The figures of evaluations are `report.eval_plots`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from explorl.report.runs import Run
from explorl.report.seeds import seed_stat
from explorl.report.style import ema, legend_outside, model_colours, save_png, style_axes
from explorl.runs import nofollow

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
    PlotSpec("mismatch_kl", "Rollout/trainer mismatch: KL(rollout || trainer)", "KL (nats per token)",
             _metric_lines([("mismatch/k3_kl", "k3"), ("mismatch/kl", "k1 (log p_rollout - log p_trainer)")]),
             "mismatch/k3_kl", title_many="Rollout/trainer mismatch: k3 KL(rollout || trainer)"),
    PlotSpec("mismatch_oob", "Rollout/trainer token ratios p_trainer / p_rollout outside [0.9, 1.1]",
             "fraction of tokens",
             _metric_lines([("mismatch/ratio_oob", "outside [0.9, 1.1]"), ("mismatch/ratio_low", "below 0.9"),
                            ("mismatch/ratio_high", "above 1.1")]), "mismatch/ratio_oob",
             title_many="Rollout/trainer token ratios outside [0.9, 1.1]"),
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
            nofollow.remove(target)  # no stale picture from an earlier report (a link is refused, not followed)
            results.append(PlotFile(spec.key, spec.title, None, f"skipped: no {spec.metric} in metrics.jsonl"))
            continue
        title = spec.title_many if drawer.many and spec.title_many else spec.title
        ax.set_title(title)
        ax.set_xlabel(spec.xlabel)
        ax.set_ylabel(spec.ylabel)
        ax.grid(True, alpha=0.3)
        style_axes(ax, step_axis=spec.xlabel == STEP_LABEL)
        legend_outside(ax, "x-small" if len(runs) > MANY else "small")
        save_png(fig, target)
        note = None
        if lacking:
            note = f"no {spec.metric} in: {', '.join(labels[i] for i in lacking)}"
        results.append(PlotFile(spec.key, title, target, note, fig))
    return results


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
