"""The configuration reference (`explorl config`, docs/configuration.md's table): every core field, then the options
of every method explorl registers, each with its type, default and the docstring written under it.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect

from explorl.algos.registry import SECTIONS, entries
from explorl.config.building import type_hints, type_name
from explorl.config.schema import Config
from explorl.config.selection import CHOICES, fill_registry


def field_docs(cls: type) -> dict[str, str]:
    """Map each field of dataclass `cls` to the docstring written under it."""
    src = inspect.getsource(cls)
    tree = ast.parse(src)
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for prev, node in zip(body, body[1:]):
        if (isinstance(prev, ast.AnnAssign) and isinstance(prev.target, ast.Name) and isinstance(node, ast.Expr)
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
            docs[prev.target.id] = " ".join(node.value.value.split())
    return docs


def reference(cls: type = Config, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """Rows (dotted name, type, default, doc) for every leaf field of the core config and, after it, the options of
    every method explorl itself registers (`algo.erpo.gamma`, ...), for `explorl config` and docs/configuration.md."""
    rows = _reference(cls, prefix)
    if cls is Config and not prefix:
        fill_registry()
        for kind, section in SECTIONS.items():
            for name, entry in sorted(entries(kind).items()):
                if entry.options is None or not entry.fn.__module__.startswith("explorl."):
                    continue  # explorl's own methods (a plugin's are listed by its own module's docs)
                shared = sorted(n for n, e in entries(kind).items() if e.options_from == name)
                note = f"{kind.replace('_', ' ')} `{name}`" + (f" (and {', '.join(shared)})" if shared else "")
                rows += [(r[0], r[1], r[2], f"{note}: {r[3]}") for r in _reference(entry.options, f"{section}.{name}.")]
    return rows


def _reference(cls: type, prefix: str) -> list[tuple[str, str, str, str]]:
    rows = []
    docs = field_docs(cls)
    hints = type_hints(cls)
    default = cls()
    for f in dataclasses.fields(cls):
        if f.name == "options":
            continue
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            rows.extend(_reference(tp, f"{prefix}{f.name}."))
        else:
            choices = CHOICES.get(f"{prefix}{f.name}")
            shown = " | ".join(map(repr, choices)) if choices else type_name(tp)
            rows.append((f"{prefix}{f.name}", shown, repr(getattr(default, f.name)), docs.get(f.name, "")))
    return rows
