"""Figures of evaluations (`explorl curves`, `explorl frontier`, `explorl venn`): pass@k or maj@k against k with the
difference to a base model, the coverage-entropy frontier, and the Venn diagram of unsolvable sets."""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Circle
from matplotlib.ticker import FuncFormatter, NullFormatter

from explorl.analysis.measures import set_overlaps
from explorl.report.style import legend_outside, model_colours, save_png, style_axes
from explorl.runs import nofollow


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


def plot_venn(sets: dict[str, set], path: str | Path, title: str = "unsolvable problems") -> Path:
    """A Venn diagram of 2-3 sets (e.g. k-rollout unsolvable sets of several models, STILL section 2.1).

    Circles of equal size with the count of every region written in it (`analysis.measures.set_overlaps`).
    """
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
    with nofollow.open_new(path, mode="wb") as f:  # never through a symbolic link at `path`
        fig.savefig(f, format="png", dpi=110, bbox_inches="tight")
    return path
