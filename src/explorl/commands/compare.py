"""`explorl compare RUN RUN ...`: several runs overlaid, final pass@k with 95% CIs across seeds (`explorl.report`)."""

from __future__ import annotations

from explorl.commands.common import _show_report, add_overwrite_flag, refuse_to_replace


def add_parser(sub) -> None:
    cm = sub.add_parser("compare", help="overlay several runs; final pass@k with 95%% CIs across seeds")
    cm.add_argument("runs", nargs="+", metavar="RUN", help="run directories (seeds of one config are pooled)")
    cm.add_argument("--out", help="output directory (default runs/compare, replaced each time)")
    cm.add_argument("--smooth", type=float, default=0.0, help="EMA weight of the per-step curves, in [0, 1)")
    cm.add_argument("--band", choices=["minmax", "ci95"], default="minmax",
                    help="spread of several seeds of a config: min-max, or the 95%% t-interval of the mean")
    cm.add_argument("--diff", action="append", default=[], metavar="METRIC",
                    help="also plot METRIC of each config minus the first's, e.g. reward/all_wrong_frac "
                         "(E3 Fig. 8; repeatable)")
    add_overwrite_flag(cm)
    cm.set_defaults(fn=cmd_compare)


def cmd_compare(args) -> int:
    from explorl.report import compare  # matplotlib: ~0.3 s, paid only to plot

    refuse_to_replace(args.out, "--out", args.overwrite)
    return _show_report(compare(args.runs, out=args.out or "runs/compare", smooth=args.smooth, band=args.band,
                                diff=args.diff))
