"""`explorl methods [NAME]`: every registered method (estimators, shapers, policy losses, token filters, reward
shapers, importance weights, loss aggregations, temperature schedules, budget policies) and every method explorl's
loop carries out itself (`explorl.train.loop_methods.LOOP_METHODS`, kind `loop`) with the paper and equations
it implements (the entry's `cites`), its options with their defaults and config keys, and the `file:line` of its
code; with NAME, the entries of that name of every kind and those citing the paper of that short name (`e3`, `ead`),
each in full: the `file:line` of its formula (`Entry.formula`) and of where the step acts with it (`Entry.acts_at`),
and the papers' authors, titles and arXiv ids (`explorl.algos.papers.PAPERS`)."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

import explorl.commands.common as common
from explorl.algos.papers import OWN, PAPERS
from explorl.algos.registry import METHOD_KINDS, SECTIONS, SELECTED_BY, entries, lookup
from explorl.config.fields import field_docs
from explorl.config.validation import fill_registry
from explorl.train.loop_methods import LOOP_METHODS, LoopEntry


def add_parser(sub) -> None:
    m = sub.add_parser("methods", help="list the registered methods with their papers, equations, options and code",
                       description="Every registered method (advantage estimators, shapers, policy losses, token "
                                   "filters, reward shapers, importance weights, loss aggregations, temperature "
                                   "schedules, budget policies) and those explorl's loop carries out itself: the "
                                   "paper and equations it implements, the "
                                   "docs/methods.md section that documents it, its options with their defaults, and "
                                   "the file:line of its code. With NAME, every entry of that name, and every entry "
                                   "citing the paper of that short name, in full: the file:line of its formula and "
                                   "of where the step acts with it (e.g. explorl methods erpo, explorl methods e3).")
    m.add_argument("name", nargs="?", default=None,
                   help="one method name or paper short name (e.g. erpo, e3, ead, cw_group)")
    m.set_defaults(fn=cmd_methods)


def method_entries() -> list:
    """Every registered entry of the method kinds (`METHOD_KINDS`; tasks are not methods), explorl's own modules
    imported first, in the order of the kinds then by name; then the methods explorl's loop carries out itself
    (`explorl.train.loop_methods.LOOP_METHODS`: a `LoopEntry` for each, beside their modules)."""
    fill_registry()
    return [entry for kind in METHOD_KINDS for _, entry in sorted(entries(kind).items())] + list(LOOP_METHODS)


def code_location(fn: Any) -> tuple[str, int]:
    """(file, line) of the `def` or `class` statement of a registered function or class (past its decorators); the
    file relative to the working directory when it lies below it."""
    lines, start = inspect.getsourcelines(fn)
    statement = re.compile(rf"\s*(async\s+)?(def|class)\s+{re.escape(fn.__name__)}\b")
    offset = next((i for i, line in enumerate(lines) if statement.match(line)), 0)
    return _shown(fn), start + offset


def _shown(obj: Any) -> str:
    """The source file of `obj`, relative to the working directory when it lies below it."""
    obj = inspect.unwrap(obj)  # a decorated function's own file (`torch.no_grad` wraps `compute_advantages`)
    path = Path(inspect.getsourcefile(obj) or inspect.getfile(obj)).resolve()
    try:
        return path.relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return str(path)


def site_location(site) -> tuple[str, int]:
    """(file, line) of a `Site`: the first line holding its marker in its function's source; ValueError when the
    function or the marker is not found (the step was changed without its registry's `ACTS_AT`)."""
    parts = site.function.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            break
        lines, start = inspect.getsourcelines(obj)
        hit = next((i for i, line in enumerate(lines) if site.marker in line), None)
        if hit is not None:
            return _shown(obj), start + hit
        break
    raise ValueError(f"explorl methods: {site.marker!r} not found in {site.function} (fix the registry's ACTS_AT)")


def option_defaults(entry) -> list[tuple[str, str, Any]]:
    """(config key, field, default) of each option the entry reads (its own, or those of `options_from`; a loop
    method's are its config section's)."""
    owner = lookup(entry.kind, entry.options_from) if entry.options_from else entry
    if owner.options is None:
        return []
    section = entry.config if isinstance(entry, LoopEntry) else f"{SECTIONS[entry.kind]}.{owner.name}"
    rows = []
    for f in dataclasses.fields(owner.options):
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else "(required)")
        rows.append((f"{section}.{f.name}", f.name, default))
    return rows


def _cite_text(cite) -> str:
    where = f" {cite.where}" if cite.locators else ""
    sections = ", ".join(f"§{s}" for s in cite.sections)
    return f"{cite.paper}{where}" + (f" (docs/methods.md {sections})" if sections else "")


def _paper_text(short: str) -> str:
    if short == OWN:
        return "explorl's own (in no paper; docs/methods.md defines it)"
    paper = PAPERS.get(short)
    if paper is None:
        return f"{short} (not in explorl.algos.papers.PAPERS)"
    arxiv = f"arXiv {paper.arxiv}" if paper.arxiv else "no arXiv id given"
    return f"{short}: {paper.authors}, \"{paper.title}\" ({arxiv})"


def cmd_methods(args) -> int:
    entries = method_entries()
    if args.name is not None:
        chosen = named(entries, args.name)
        if not chosen:
            valid = sorted({e.name for e in entries})
            papers = sorted({c.paper for e in entries for c in e.cites})
            raise ValueError(f"explorl methods: no method named {args.name!r}; valid: {', '.join(valid)}; or a "
                             f"paper: {', '.join(papers)}")
        for entry in chosen:
            _print_entry(entry)
        return 0
    rows = {kind: [_summary(e) for e in entries if e.kind == kind] for kind in dict.fromkeys(e.kind for e in entries)}
    console = common.console
    tables = [_table(kind, kind_rows) for kind, kind_rows in rows.items()]
    unbounded = console.options.update_width(10**6)  # the tables' natural widths, not capped at the console's
    if all(console.measure(table, options=unbounded).maximum <= console.width for table in tables):
        for table in tables:
            console.print(table)
    else:  # narrower than a table row (an 80-column terminal, or piped): one block of whole lines per method
        for kind, kind_rows in rows.items():
            _print_blocks(kind, kind_rows)
    return 0


def named(entries: list, name: str) -> list:
    """The entries called `name`, then those citing the paper whose short name is `name` (any case: `e3`, `ead`)."""
    citing = [e for e in entries if e.name != name and any(c.paper.lower() == name.lower() for c in e.cites)]
    return [e for e in entries if e.name == name] + citing


COLUMNS = ("name", "paper: equations", "docs §", "options (defaults)", "code")


def _summary(entry) -> tuple[str, str, str, str, str]:
    """One entry's cells under `COLUMNS`, as plain text ("-" where it has none)."""
    file, line = code_location(entry.fn)
    cites = "; ".join(f"{c.paper}: {c.where}" if c.locators else c.paper for c in entry.cites) or "-"
    sections = ", ".join(dict.fromkeys(f"§{s}" for c in entry.cites for s in c.sections)) or "-"
    options = ", ".join(f"{name}={default!r}" for _, name, default in option_defaults(entry))
    if entry.options_from:
        options = f"{entry.options_from}'s: {options}"
    return entry.name, cites, sections, options or "-", f"{file}:{line}"


def _title(kind: str) -> str:
    chosen = SELECTED_BY.get(kind, "carried out by explorl's loop, switched on by its algo section")
    return f"{kind} ({chosen}; explorl methods NAME shows one in full)"


def _table(kind: str, rows: list[tuple[str, ...]]) -> Table:
    """The methods of one kind as a table, one row each (for a console wide enough to hold a row on one line)."""
    table = Table(title=_title(kind))
    for col in COLUMNS[:-1]:
        table.add_column(col, overflow="fold")
    table.add_column(COLUMNS[-1], no_wrap=True)
    for row in rows:
        table.add_row(*(escape(cell) for cell in row))
    return table


def _print_blocks(kind: str, rows: list[tuple[str, ...]]) -> None:
    """The methods of one kind as blocks of whole lines, never cut into columns: the name, then what it implements,
    its options and its code, each on a line of its own (soft-wrapped, so a pipe gets every line whole)."""
    console = common.console
    console.print(escape(_title(kind)), highlight=False, soft_wrap=True)
    for name, cites, sections, options, code in rows:
        docs = "" if sections == "-" else f" (docs/methods.md {sections})"
        console.print(f"  [bold]{escape(name)}[/]", highlight=False, soft_wrap=True)
        for line in (f"implements: {cites}{docs}", f"options: {options}", f"code: {code}"):
            console.print(f"    {escape(line)}", highlight=False, soft_wrap=True)
    console.print()


def _print_entry(entry) -> None:
    console = common.console
    doc = (inspect.getdoc(entry.fn) or "").split("\n\n")[0]
    console.print(f"[bold]{entry.kind} {escape(entry.name)}[/]: {escape(' '.join(doc.split()))}", soft_wrap=True)
    for line in _entry_lines(entry):  # whole lines, piped or at 80 columns: a file:line is never cut
        console.print(escape(line), highlight=False, soft_wrap=True)
    rows = option_defaults(entry)
    if not rows:
        console.print("  options: none")
        console.print()
        return
    owner = entry.options_from or entry.name
    meaning = field_docs(_options_class(entry))
    table = Table(title=f"options of {entry.kind} {owner}" + (f" (read by {entry.name})" if entry.options_from else ""))
    for col in ("key", "default", "meaning"):
        table.add_column(col, overflow="fold")
    for key, name, default in rows:
        table.add_row(escape(key), escape(repr(default)), escape(meaning.get(name, "")))
    console.print(table)
    console.print()


def _entry_lines(entry) -> list[str]:
    """An entry's code, formula and where the step acts with it (each a `file:line`), and what it implements."""
    file, line = code_location(entry.fn)
    lines = [f"  code: {file}:{line}"]
    for fn in entry.formula:
        where = ":".join(map(str, code_location(fn)))
        lines.append(f"  formula: {where} ({fn.__module__}.{fn.__qualname__})")
    for site in entry.acts_at:
        where = ":".join(map(str, site_location(site)))
        what = site.function.rsplit(".", 1)[-1] + (f": {site.what}" if site.what else "")
        lines.append(f"  acts at: {where} ({what})")
    for cite in entry.cites:
        lines += [f"  implements: {_cite_text(cite)}", f"    {_paper_text(cite.paper)}"]
    if not entry.cites:
        lines.append("  implements: (the entry cites nothing)")
    return lines


def _options_class(entry) -> type:
    return (lookup(entry.kind, entry.options_from) if entry.options_from else entry).options
