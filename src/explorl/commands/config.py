"""`explorl config [--markdown]`: every config field with its type, default and meaning, and the registered names."""

from __future__ import annotations

from rich.table import Table

import explorl.commands.common as common
from explorl.config import load_config, reference


def add_parser(sub) -> None:
    c = sub.add_parser("config", help="list every config field with its type, default and meaning")
    c.add_argument("--markdown", action="store_true", help="print a Markdown table (for the README)")
    c.set_defaults(fn=cmd_config)


def cmd_config(args) -> int:
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
        from explorl.algos.registry import KINDS, names

        load_config()  # its validation imports every module that registers
        for kind in KINDS:
            console.print(f"[bold]{kind}[/]: {', '.join(names(kind))}")
        from explorl.config.loading import method_names

        console.print(f"[bold]methods[/] (layers for `methods: [...]`, src/explorl/methods/): "
                      f"{', '.join(method_names())}")
    return 0
