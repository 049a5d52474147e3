"""MkDocs hook: one page per paper, each the paper's section of docs/methods.md, inserted at build time.

docs/methods.md stays the single source (code and docstrings cite it as `docs/methods.md §N`); a page such as
`docs/methods-e3.md` holds the marker `<!-- docs/methods.md §2 -->`, replaced here by that section, from its
`## 2.` heading to the next `## ` heading, so a reader finds one paper on one page and nothing is written twice."""

from __future__ import annotations

import re
from pathlib import Path

METHODS = Path(__file__).resolve().parents[1] / "methods.md"
MARKER = re.compile(r"<!-- docs/methods\.md §([0-9]+) -->")


def section(number: str, text: str | None = None) -> str:
    """The text of `## <number>.` of docs/methods.md, its heading included; KeyError when there is none."""
    text = METHODS.read_text() if text is None else text
    match = re.search(rf"^## {re.escape(number)}\. .*?(?=^## |\Z)", text, flags=re.M | re.S)
    if match is None:
        raise KeyError(f"docs/methods.md has no section `## {number}.`")
    return match.group(0).strip()


def render(markdown: str) -> str:
    """`markdown` with every marker replaced by its section (unchanged when it has none)."""
    return MARKER.sub(lambda m: section(m.group(1)), markdown)


def on_page_markdown(markdown, page, config, files):  # noqa: ARG001  (MkDocs' hook signature)
    return render(markdown)
