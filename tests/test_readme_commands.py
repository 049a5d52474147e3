"""Every `explorl` subcommand the README and the docs pages name exists (issue 41: the README named an `explorl report`
that does not). tests/test_docs_site.py parses every full command line they show."""

from __future__ import annotations

import re
from pathlib import Path

from explorl.commands import COMMANDS, build_parser

ROOT = Path(__file__).resolve().parents[1]
# the front page and the site's pages (docs/methods.md, another's, cites no command lines)
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "methods.md")]


def _subcommands() -> set[str]:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    return set(sub.choices)


def test_every_explorl_command_the_docs_name_exists():
    text = "\n".join(p.read_text() for p in PAGES)
    known = _subcommands()
    assert len(known) == len(COMMANDS)
    # commands: an inline span that starts `explorl <word>`, a line of a code block that starts `explorl <word>`
    shown = set(re.findall(r"`explorl ([a-z][a-z-]*)\b[^`\n]*`", text))
    for block in re.findall(r"```(?:bash|sh|console)\n(.*?)```", text, flags=re.S):
        shown |= set(re.findall(r"^\s*(?:\$ )?explorl ([a-z][a-z-]*)\b", block, flags=re.M))
    assert {"train", "eval", "compare"} <= shown, shown
    assert shown <= known, sorted(shown - known)
    # a list of commands in prose: `explorl analyze` / `compare` / ... each a subcommand
    listings = re.findall(r"`explorl analyze` / ([^:\n]+)", text)
    assert listings
    for listing in listings:
        words = set(re.findall(r"`([a-z]+)", listing))
        assert words <= known, sorted(words - known)
