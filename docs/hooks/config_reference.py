"""MkDocs hook: the configuration reference page's table is generated from the schema at build time.

`docs/configuration.md` holds the marker below where the table goes; the table is the output of
`explorl config --markdown` (the field docstrings of `explorl.config.schema` and of every registered method's
options), so the page cannot go stale when a field is added."""

from __future__ import annotations

import contextlib
import io

MARKER = "<!-- explorl config --markdown -->"


def config_table() -> str:
    """The Markdown table `explorl config --markdown` prints, as a string."""
    from explorl.commands import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["config", "--markdown"])
    if code != 0:
        raise RuntimeError(f"`explorl config --markdown` exited with {code}")
    return out.getvalue().strip()


def render(markdown: str) -> str:
    """`markdown` with the marker replaced by the generated table (unchanged when it has no marker)."""
    return markdown.replace(MARKER, config_table()) if MARKER in markdown else markdown


def on_page_markdown(markdown, page, config, files):  # noqa: ARG001  (MkDocs' hook signature)
    return render(markdown)
