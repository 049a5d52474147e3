"""The look every explorl figure shares (matplotlib's Agg renderer, no pyplot state): colours that stay apart, axes
whose tick labels are the values themselves, the legend beside the axes, EMA smoothing, and PNGs written with equal
bytes for equal figures."""

from __future__ import annotations

from pathlib import Path

from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, ScalarFormatter

from explorl.runs import nofollow


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


def save_png(fig: Figure, path: str | Path) -> Path:
    """Write `fig` as a PNG at `path` (parents created; no software tag, so equal figures give equal bytes), as a new
    file: a symbolic link at `path` is refused, never followed (`runs.nofollow`). The folder is the caller's: a
    report checks its own before it writes (`report.analyze`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with nofollow.open_new(path, mode="wb") as f:
        fig.savefig(f, format="png", metadata={"Software": None})
    return path
