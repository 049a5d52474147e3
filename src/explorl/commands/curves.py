"""`explorl curves EVAL_JSON ...`: pass@k (or maj@k) against k of several `explorl eval --curve` summaries, each
minus the first paired over the shared problems, and where they cross."""

from __future__ import annotations

import json
from pathlib import Path

from rich.table import Table
from rich.text import Text

import explorl.commands.common as common
from explorl.commands.common import add_overwrite_flag, refuse_to_replace
from explorl.evaluation.evaluate import check_same_base, paired_pass_difference


def add_parser(sub) -> None:
    cv = sub.add_parser("curves", help="plot pass@k (or maj@k) against k of several `explorl eval --curve` "
                                       "summaries, and each minus the first (where they cross)")
    cv.add_argument("files", nargs="+", metavar="EVAL_JSON", help="summaries of `explorl eval --curve`; the first "
                                                                   "is the reference (e.g. the base model)")
    cv.add_argument("--labels", help="comma-separated names (default: each summary's label)")
    cv.add_argument("--metric", choices=["pass@k", "maj@k"], default="pass@k")
    cv.add_argument("--out", help="PNG path (default runs/curves.png, replaced each time)")
    add_overwrite_flag(cv)
    cv.set_defaults(fn=cmd_curves)


def cmd_curves(args) -> int:
    from explorl.report.eval_plots import crossings, plot_k_curves  # matplotlib: ~0.3 s, paid only to plot

    console = common.console
    refuse_to_replace(args.out, "--out", args.overwrite)
    curves, summaries = {}, {}
    labels = args.labels.split(",") if args.labels else []
    if labels and len(labels) != len(args.files):
        raise SystemExit(f"--labels: {len(labels)} names for {len(args.files)} files")
    for i, f in enumerate(args.files):
        path = Path(f)
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such file (write one with `explorl eval --curve`)")
        try:
            summary = json.loads(path.read_text())
        except (ValueError, RecursionError) as e:  # RecursionError: brackets nested past Python's stack
            raise ValueError(f"{path}: not an `explorl eval` record ({e or 'nested too deeply'})") from None
        if not isinstance(summary, dict) or "curve" not in summary:
            raise ValueError(f"{path}: has no `curve`; evaluate with `explorl eval --curve` (n >= 2k for the "
                             f"largest k you want)")
        name = labels[i] if labels else summary.get("label") or path.stem
        name = name if name not in curves else f"{name}-{i}"
        curves[name], summaries[name] = summary["curve"], summary
    names = list(curves)
    table = Table(title=f"{args.metric} against k")
    table.add_column("k", justify="right")
    for name in names:
        table.add_column(name, justify="right")
    ks = curves[names[0]]["k"]
    for k in ks:
        cells = []
        for name in names:
            c = curves[name]
            if k in c["k"]:
                mean, lo, hi = c[args.metric][c["k"].index(k)]
                cells.append(f"{mean:.3f} [{lo:.3f}, {hi:.3f}]")
            else:
                cells.append("-")
        table.add_row(str(k), *cells)
    console.print(table)
    paired = {}
    if args.metric == "pass@k" and all("problems" in curves[n] for n in names):
        for warning in check_same_base(summaries):
            console.print(Text(f"warning: {warning}"), style="yellow")

        base = curves[names[0]]
        paired = {name: paired_pass_difference(base, curves[name]) for name in names[1:]}
        diff = Table(title=f"pass@k minus {names[0]}, paired over the shared problems (95% bootstrap interval)")
        diff.add_column("k", justify="right")
        for name in names[1:]:
            diff.add_column(name, justify="right")
        for k in base["k"]:
            cells = [f"{paired[n][k][0]:+.3f} [{paired[n][k][1]:+.3f}, {paired[n][k][2]:+.3f}]" if k in paired[n]
                     else "-" for n in names[1:]]
            diff.add_row(str(k), *cells)
        console.print(diff)
    for name in names[1:]:
        cross = crossings(curves[names[0]], curves[name], args.metric)
        console.print(f"{name} crosses {names[0]} at k = {', '.join(map(str, cross))}" if cross
                      else f"{name} does not cross {names[0]} at the k evaluated")
    out = plot_k_curves(curves, args.out or "runs/curves.png", args.metric, paired=paired)
    console.print(f"wrote {out}")
    return 0
