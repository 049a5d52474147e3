"""Pictures of `explorl probe` results (`experiments.probes`; docs/methods.md §8e), one PNG each, drawn with
matplotlib's Agg renderer (no pyplot state), as `report.style`."""

from __future__ import annotations

import math
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from explorl.report.style import save_png

__all__ = ["plot_position", "plot_covariance", "plot_branch", "plot_perturb", "plot_update"]


def _figure(panels: int = 1, width: float = 6.5):
    fig = Figure(figsize=(width * panels, 4.2), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, [fig.add_subplot(1, panels, i + 1) for i in range(panels)]


def _num(x) -> float:
    """0 for a missing value (None in a JSON result, NaN in a fresh one), else the value."""
    return 0.0 if x is None or math.isnan(x) else x


def _finite(xs, ys):
    pts = [(x, y) for x, y in zip(xs, ys) if y is not None and not math.isnan(y)]
    return [p[0] for p in pts], [p[1] for p in pts]


def plot_position(result: dict, path: str | Path) -> Path:
    """Mean token entropy against absolute output position, with the number of tokens behind each point
    (EAD, Figure 1)."""
    fig, (ax,) = _figure()
    xs, ys = _finite(result["start"], result["mean"])
    ax.plot(xs, ys, color="C0", marker="o", ms=2)
    ax.set_xlabel("output position (tokens)")
    ax.set_ylabel("mean token entropy (nats)")
    twin = ax.twinx()
    twin.bar(result["start"], result["count"], width=max(1, result.get("bin_size", 1)), color="C7", alpha=0.2)
    twin.set_ylabel("tokens")
    ax.set_zorder(twin.get_zorder() + 1)
    ax.patch.set_visible(False)
    ax.set_title("entropy by absolute position (EAD Fig. 1)")
    return save_png(fig, path)


def plot_covariance(cumulative: dict, path: str | Path) -> Path:
    """Share of the total |c| carried by the most extreme fraction of tokens, per sign (CW-GRPO, Figure 3)."""
    fig, (ax,) = _figure()
    for sign, colour in (("positive", "C3"), ("negative", "C0")):
        xs, ys = _finite([100 * f for f in cumulative["fractions"]], cumulative[sign])
        ax.plot(xs, ys, color=colour, label=f"{sign} c")
    ax.set_xscale("log")
    ax.set_xlabel("most extreme tokens (% of the sign's tokens)")
    ax.set_ylabel("share of total |c|")
    ax.set_ylim(0, 1.02)
    ax.grid(True, alpha=0.3)
    ax.legend()
    ax.set_title("cumulative contribution of covariance (CW Fig. 3)")
    return save_png(fig, path)


def plot_branch(summary: list[dict], path: str | Path) -> Path:
    """Accuracy and maj@k of continuations against the cut position, with the entropy at the cut
    (EAD, Figure 2)."""
    fig, (ax,) = _figure()
    cuts = [r["cut"] for r in summary]
    ax.plot(*_finite(cuts, [r["accuracy"] for r in summary]), marker="o", color="C0", label="accuracy")
    if any(r["maj"] is not None for r in summary):
        ax.plot(*_finite(cuts, [r["maj"] for r in summary]), marker="s", color="C1", label="maj@k")
    ax.set_xlabel("branch position (tokens of the base response kept)")
    ax.set_ylabel("score of the continuations")
    ax.set_ylim(-0.02, 1.02)
    twin = ax.twinx()
    twin.plot(*_finite(cuts, [r["entropy"] for r in summary]), linestyle=":", color="C2", label="entropy at cut")
    twin.set_ylabel("entropy at the cut (nats)")
    lines = ax.get_legend_handles_labels()
    more = twin.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize="small")
    ax.set_title("forking: success by branch position (EAD Fig. 2)")
    return save_png(fig, path)


def plot_perturb(tests: dict, path: str | Path) -> Path:
    """Accuracy after perturbing high- vs low-entropy tokens, per mode, with the Fisher p-value
    (ERPO, Figure 1(b))."""
    modes = list(tests)
    fig, (ax,) = _figure(width=max(4.5, 2.5 * len(modes)))
    for i, mode in enumerate(modes):
        t = tests[mode]
        for j, (side, colour) in enumerate((("high", "C3"), ("low", "C0"))):
            ax.bar(i + (j - 0.5) * 0.38, _num(t[f"accuracy_{side}"]), width=0.36, color=colour,
                   label=f"{side}-entropy tokens" if i == 0 else None)
        ax.text(i, 1.04, f"p = {t['fisher_p']:.2g}", ha="center", fontsize=9)
    ax.set_xticks(range(len(modes)), modes)
    ax.set_ylim(0, 1.12)
    ax.set_ylabel("accuracy after the perturbation")
    ax.legend(fontsize="small", loc="lower right")
    ax.set_title("perturbing high- vs low-entropy tokens (ERPO Fig. 1b)")
    return save_png(fig, path)


def plot_update(summary: dict, path: str | Path) -> Path:
    """Mean |probability shift| by entropy bin and by token category after one update (STILL, Figure 4)."""
    panels = 2 if "by_category" in summary else 1
    fig, axes = _figure(panels)
    bins = summary["by_entropy"]
    axes[0].bar(range(len(bins)), [_num(b["mean_abs_shift"]) for b in bins], color="C0")
    axes[0].set_xticks(range(len(bins)), [f"{b['low']:.2f}-{b['high']:.2f}" for b in bins], fontsize=8, rotation=30)
    axes[0].set_xlabel("entropy before the update (equal-count bins)")
    axes[0].set_ylabel("mean |p_after - p_before|")
    axes[0].set_title("probability shift by entropy (STILL Fig. 4b)")
    if panels == 2:
        cats = summary["by_category"]
        names = list(cats)
        axes[1].bar(range(len(names)), [_num(cats[c]["share_in_top"]) for c in names], color="C1")
        axes[1].set_xticks(range(len(names)), names)
        axes[1].set_ylabel("share of the category's tokens in the top shifts")
        axes[1].set_title("top shifts by token category (STILL 3.2.2)")
    return save_png(fig, path)
