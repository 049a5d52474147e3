"""A self-contained HTML report: PNGs embedded as base64 data URIs, inline CSS, no scripts, no external resources."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from html import escape
from pathlib import Path

from explorl.report.plots import PlotFile
from explorl.report.examples import Example
from explorl.runs import nofollow

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1200px;
       padding: 0 1em; color: #222; }
h1 { font-size: 1.6em; } h2 { font-size: 1.25em; margin-top: 1.8em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.92em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.7em; text-align: right; }
th { background: #f3f3f3; } td:first-child, th:first-child { text-align: left; }
caption { caption-side: top; text-align: left; font-weight: 600; padding-bottom: 0.3em; }
.plots { display: flex; flex-wrap: wrap; gap: 1em; }
figure { margin: 0; flex: 1 1 540px; max-width: 100%; }
figure img { width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: 0.85em; color: #555; }
pre { background: #f7f7f7; padding: 0.8em; overflow-x: auto; font-size: 0.85em; }
.note { color: #8a5a00; font-size: 0.9em; } .muted { color: #666; font-size: 0.9em; }
.example { border: 1px solid #ddd; border-radius: 4px; padding: 0.2em 0.9em 0.6em; margin: 0.8em 0; }
.example h3 { font-size: 1em; margin: 0.5em 0 0.3em; }
.example .label { font-size: 0.85em; color: #555; margin: 0.4em 0 0.1em; }
.example pre { white-space: pre-wrap; overflow-wrap: anywhere; margin: 0; max-height: 24em; overflow-y: auto; }
.best { border-left: 4px solid #2a7d2a; } .worst { border-left: 4px solid #b03030; }
.only { border-left: 4px solid #888; }
"""
EXAMPLE_CHARS = 3000  # a longer prompt or completion is cut there (its length said)


@dataclass
class HtmlTable:
    caption: str
    headers: list[str]
    rows: list[list[str]]
    note: str | None = None


@dataclass
class Page:
    title: str
    subtitle: str = ""
    tables: list[HtmlTable] = field(default_factory=list)
    plots: list[PlotFile] = field(default_factory=list)
    configs: list[tuple[str, str]] = field(default_factory=list)
    """(label, YAML text) of each config shown."""
    notes: list[str] = field(default_factory=list)
    examples: list[Example] | None = None
    """Example completions (`examples.example_completions`); None: no such section (`compare`)."""
    examples_note: str = ""
    """Said above the examples: where they come from, or why there are none."""


def png_data_uri(path: str | Path) -> str:
    data = Path(path).read_bytes()
    if not data.startswith(PNG_SIGNATURE):
        raise ValueError(f"{path}: not a PNG file")
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def _table(t: HtmlTable) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in t.headers)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in t.rows)
    note = f'<p class="muted">{escape(t.note)}</p>' if t.note else ""
    return (f"<table><caption>{escape(t.caption)}</caption><thead><tr>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table>{note}")


def _cut(text: str, limit: int = EXAMPLE_CHARS) -> str:
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text) - limit} more characters)"


def _examples(page: Page) -> list[str]:
    parts = ['<h2 id="examples">Example completions</h2>']
    if page.examples_note:
        parts.append(f'<p class="muted">{escape(page.examples_note)}</p>')
    for ex in page.examples or []:
        which = "the only scored completion" if ex.which == "only" else f"{ex.which} of {ex.of}"
        parts.append(f'<div class="example {escape(ex.which)}"><h3>step {ex.step}: {escape(which)}, reward '
                     f'{ex.reward:.3f}</h3>'
                     f'<p class="label">prompt (reference answer: <code>{escape(_cut(ex.answer, 200))}</code>)</p>'
                     f'<pre class="prompt">{escape(_cut(ex.prompt))}</pre>'
                     f'<p class="label">completion</p><pre class="completion">{escape(_cut(ex.completion))}</pre>'
                     f"</div>")
    return parts


def render(page: Page) -> str:
    """The page as one HTML document."""
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             f"<title>{escape(page.title)}</title><style>{_CSS}</style></head><body>",
             f"<h1>{escape(page.title)}</h1>"]
    if page.subtitle:
        parts.append(f'<p class="muted">{escape(page.subtitle)}</p>')
    if page.tables:
        parts.append('<h2 id="final">Final held-out evaluation</h2>')
        parts.extend(_table(t) for t in page.tables)
    parts.append('<h2 id="plots">Training curves</h2><div class="plots">')
    for plot in page.plots:
        if plot.path is None:
            continue
        caption = escape(plot.title) + (f' <span class="note">({escape(plot.note)})</span>' if plot.note else "")
        parts.append(f'<figure id="plot-{escape(plot.key)}"><img src="{png_data_uri(plot.path)}" '
                     f'alt="{escape(plot.title)}"><figcaption>{caption}</figcaption></figure>')
    parts.append("</div>")
    skipped = [p for p in page.plots if p.path is None]
    if skipped or page.notes:
        parts.append('<ul class="note">')
        parts.extend(f"<li>{escape(p.title)}: {escape(p.note or 'skipped')}</li>" for p in skipped)
        parts.extend(f"<li>{escape(n)}</li>" for n in page.notes)
        parts.append("</ul>")
    if page.examples is not None:
        parts.extend(_examples(page))
    parts.append('<h2 id="config">Config</h2>')
    for label, text in page.configs:
        if len(page.configs) > 1:
            parts.append(f"<h3>{escape(label)}</h3>")
        parts.append(f'<pre class="config">{escape(text)}</pre>')
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def write_page(page: Page, path: str | Path) -> Path:
    """`page` as `path` (a new file; a symbolic link at `path` is refused, never followed: `runs.nofollow`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)  # the caller's folder, checked by it (`report.analyze`)
    return nofollow.write_file(path, render(page))
