"""`explorl venn FILE FILE [FILE]`: Venn diagram of the k-rollout unsolvable sets of 2-3 models, from the
per-problem files of `explorl eval --analyze`."""

from __future__ import annotations

import json
from pathlib import Path

import explorl.commands.common as common
from explorl.analysis.measures import set_overlaps, unsolvable_set
from explorl.commands.common import add_overwrite_flag, refuse_to_replace


def add_parser(sub) -> None:
    v = sub.add_parser("venn", help="Venn diagram of the k-rollout unsolvable sets of 2-3 models")
    v.add_argument("files", nargs="+", help="per-problem files of `explorl eval --analyze` (MODEL-TASK.problems.jsonl)")
    v.add_argument("--k", type=int, default=8, help="samples per problem that define unsolvable (first k)")
    v.add_argument("--out", help="PNG path (default runs/venn.png, replaced each time)")
    add_overwrite_flag(v)
    v.set_defaults(fn=cmd_venn)


def cmd_venn(args) -> int:
    from explorl.report.eval_plots import plot_venn  # matplotlib: ~0.3 s, paid only to plot

    if not 2 <= len(args.files) <= 3:
        raise SystemExit("explorl venn: give 2 or 3 per-problem files written by `explorl eval --analyze`")
    refuse_to_replace(args.out, "--out", args.overwrite)
    sets = {}
    for f in args.files:
        path = Path(f)
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such file (write one with `explorl eval --analyze`)")
        results = {}
        for i, line in enumerate(path.read_text().splitlines(), 1):
            try:
                row = json.loads(line)
                results[row["id"]] = row["correct"]
            except (json.JSONDecodeError, KeyError, TypeError, RecursionError) as e:
                raise ValueError(f"{path}:{i}: not a per-problem line of `explorl eval --analyze` ({e})") from None
        name = path.name.removesuffix(".problems.jsonl")
        sets[name] = unsolvable_set(results, args.k)
    out = plot_venn(sets, args.out or "runs/venn.png", title=f"{args.k}-rollout unsolvable problems")
    for region, count in set_overlaps(sets).items():
        common.console.print(f"{region}: {count}")
    common.console.print(f"wrote {out}")
    return 0
