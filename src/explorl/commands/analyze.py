"""`explorl analyze RUN`: plots and an HTML report of a run directory (`explorl.report`); `explorl analyze FILE`: the
quality issues, token categories and case studies of a completions file of `explorl eval --save-completions`."""

from __future__ import annotations

import json
from pathlib import Path

from rich.table import Table
from rich.text import Text

import explorl.commands.common as common
from explorl.analysis.completions import completions_report, read_completions
from explorl.commands.common import _show_report, add_overwrite_flag, refuse_to_replace
from explorl.runs import nofollow


def add_parser(sub) -> None:
    a = sub.add_parser("analyze", help="plots and an HTML report of a run directory (written to RUN/report/), or "
                                       "the quality issues, token categories and case studies of a completions "
                                       "file of `explorl eval --save-completions`")
    a.add_argument("run", help="run directory made by `explorl train`, or a completions JSONL file")
    a.add_argument("--out", help="output directory (default RUN/report), or for a completions file the report "
                                 "JSON (default FILE.report.json)")
    a.add_argument("--smooth", type=float, default=0.0, help="EMA weight of the per-step curves, in [0, 1) "
                                                                "(0 = raw; 0.9 smooths strongly)")
    add_overwrite_flag(a)
    a.set_defaults(fn=cmd_analyze)


def cmd_analyze(args) -> int:
    from explorl.report import analyze  # matplotlib: ~0.3 s, paid only to plot

    refuse_to_replace(args.out, "--out", args.overwrite)
    if Path(args.run).is_file():
        return analyze_completions(Path(args.run), Path(args.out) if args.out else None)

    return _show_report(analyze(args.run, out=args.out, smooth=args.smooth))


def analyze_completions(path: Path, out: Path | None) -> int:
    console = common.console
    report = completions_report(read_completions(path))
    table = Table(title=f"{path.name}: {report['n']} completions, accuracy {report['accuracy']:.3f}, "
                        f"format rate {report['format_rate']:.3f}")
    table.add_column("responses")
    for col in ("n", "format issue", "repetition", "language mixing", "any issue"):
        table.add_column(col, justify="right")
    for name, q in report["quality"].items():
        if q is not None:
            table.add_row(name, str(q["n"]), *[f"{q[k]:.3f}" for k in ("format", "repetition", "language_mixing",
                                                                        "any")])
    console.print(table)
    cats = Table(title="word categories (share of words)")
    cats.add_column("responses")
    for c in report["categories"]["correct"]:
        cats.add_column(c, justify="right")
    for name, counts in report["categories"].items():
        cats.add_row(name, *[f"{v['share']:.3f}" for v in counts.values()])
    console.print(cats)
    for issue, examples in report["cases"].items():
        for ex in examples[:1]:
            console.print(Text(f"case ({issue}): problem {ex['problem']}, sample {ex['sample']}, reward "
                               f"{ex['reward']}: {ex['excerpt'][:200]!r}"))
    out = out or path.with_name(path.name.removesuffix(".jsonl") + ".report.json")
    nofollow.write_file(out, json.dumps(report, indent=2))  # a symbolic link there is refused, never followed
    console.print(Text(f"wrote {out}"))
    return 0
