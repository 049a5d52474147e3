"""`explorl config [--markdown]`: every config field with its type, default and meaning, and the registered names;
`explorl config FILE [key=value ...] [--explain | --resolved]`: where each value of that config came from (the
layer that set it, `explorl.config.explain`) and what its methods cost, or the whole resolved config as YAML."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

import explorl.commands.common as common
from explorl.algos.registry import KINDS, names
from explorl.config import dump_yaml, load_config, reference
from explorl.config.explain import explain, format_explanation
from explorl.config.layers import method_names
from explorl.config.trust import refuse_recorded_code


def add_parser(sub) -> None:
    c = sub.add_parser("config", help="list every config field, or explain where a config's values come from",
                       description="Without FILE: every config field with its type, default and meaning. With FILE: "
                                   "every key that differs from its default, with the layer that set it (the "
                                   "command line > the file > its methods: > its base: > the defaults), and what "
                                   "the chosen methods cost per step.")
    c.add_argument("config", nargs="?", default=None, help="a YAML config to explain (e.g. configs/quickstart.yaml)")
    c.add_argument("overrides", nargs="*", help="key.sub=value overrides, as for `explorl train`")
    c.add_argument("--explain", action="store_true",
                   help="with FILE (the default with FILE): each non-default key with its source, and the costs")
    c.add_argument("--resolved", action="store_true", help="with FILE: print the whole resolved config as YAML")
    c.add_argument("--markdown", action="store_true",
                   help="print a Markdown table (docs/configuration.md inserts it when the site is built)")
    c.set_defaults(fn=cmd_config)


def cmd_config(args) -> int:
    if args.config is not None:
        return _explain(args)
    if args.explain or args.resolved or args.overrides:
        raise SystemExit("explorl config: --explain, --resolved and key=value overrides need a CONFIG file "
                         "(e.g. explorl config configs/quickstart.yaml --explain)")
    console = common.console
    table = Table(title="explorl configuration", show_lines=False)
    for col in ("field", "type", "default", "meaning"):
        table.add_column(col, overflow="fold")
    for row in reference():
        table.add_row(*row)
    if args.markdown:
        print("| field | type | default | meaning |\n|---|---|---|---|")
        for name, tp, default, doc in reference():
            tp = tp.replace("|", "\\|")  # Literal choices are written `'a' | 'b'`; a bare | splits the cell
            print(f"| `{name}` | {tp} | `{default}` | {doc.replace('|', '/')} |")
    else:
        console.print(table)
        load_config()  # its validation imports every module that registers
        for kind in KINDS:
            console.print(f"[bold]{kind}[/]: {', '.join(names(kind))}")
        console.print(f"[bold]methods[/] (layers for `methods: [...]`, src/explorl/methods/): "
                      f"{', '.join(method_names())}")
    return 0


def _explain(args) -> int:
    if "=" in args.config and not args.config.endswith((".yaml", ".yml")):
        raise SystemExit(f"explorl config: {args.config!r} looks like an override; give the CONFIG file first")
    refuse_recorded_code(args.config, args.overrides, f"explorl config {args.config}")  # a run's: its code named
    if args.resolved:
        print(dump_yaml(load_config(args.config, args.overrides)), end="")
        return 0
    explained = explain(args.config, args.overrides)
    title = f"{args.config}: the keys that differ from their defaults, and where each came from"
    for line in format_explanation(explained, title=title):
        common.console.print(escape(line), highlight=False, soft_wrap=True)
    return 0
