"""docs/methods.md is the project's methods reference, and every citation of it (or of any `.md` file) resolves.

Scanned: every text file under src/ (not build outputs), configs/, bench/*.py, bench/*.md, docs/*.md and README.md.
- A cited `.md` path (`README.md`, `bench/RESULTS.md`, `docs/methods.md`, ...) exists, relative to the repository root
  (a Markdown link's target, `[Results](results.md)`, may also be relative to the file that links it).
- `docs/methods.md §N` (also `§N, §M and §K` chains) names a heading of docs/methods.md: `## N.` or `### Na.`.
  The sign `§` is reserved for these sections: a `§` outside such a citation fails, as it could name anything.
- Nothing cites the team notes by their old names (`METHODS`, `METHODS.md`, `DESIGN`), which are not in the
  repository, except the files in `OLD_NAMES_PENDING`.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "methods.md"

OLD_NAMES_PENDING: list[str] = []  # files still allowed to cite the old notes (none)

RECIPES_BEGIN = "<!-- recipes:begin -->"
RECIPES_END = "<!-- recipes:end -->"

_URL = re.compile(r"[a-z][a-z0-9+.-]*://\S+", re.IGNORECASE)
_MD_PATH = re.compile(r"(?<![\w./-])([\w.-]+(?:/[\w.-]+)*\.md)(?![\w-])")
_SEP = r"[\s#*,;]*(?:(?:and|or|to|-|–)[\s#*]*)?"
_CITATION = re.compile(r"docs/methods\.md((?:" + _SEP + r"§\s*[0-9]+[a-z]{0,2})+)")
_SECTION_REF = re.compile(r"§\s*([0-9]+[a-z]{0,2})")
_OLD_NAME = re.compile(r"\b(METHODS|DESIGN)\b")
_HEADING = re.compile(r"^(##|###)\s+([0-9]+[a-z]{0,2})\.\s+\S", re.MULTILINE)


def _scanned_files() -> list[Path]:
    files = [p for p in (ROOT / "src").rglob("*")
             if p.is_file() and not any(part == "__pycache__" or part.endswith(".egg-info") for part in p.parts)]
    files += [p for p in (ROOT / "configs").rglob("*") if p.is_file()]
    files += sorted((ROOT / "bench").glob("*.py")) + sorted((ROOT / "bench").glob("*.md"))
    files += sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
    return sorted(set(files))


def _texts() -> dict[str, str]:
    out = {}
    for p in _scanned_files():
        try:
            out[p.relative_to(ROOT).as_posix()] = p.read_text(encoding="utf-8")
        except UnicodeDecodeError:  # a binary file (e.g. an image) cites nothing
            continue
    return out


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _sections(doc_text: str) -> dict[str, int]:
    """Section id ('3', '2b') -> heading level (2 or 3) of every numbered heading of docs/methods.md."""
    return {m.group(2): len(m.group(1)) for m in _HEADING.finditer(doc_text)}


def _section_refs(text: str) -> list[tuple[int, str, int]]:
    """(line, section id, position of its `§`) of every `docs/methods.md §N` citation in `text`, chains included."""
    refs = []
    for m in _CITATION.finditer(text):
        for r in _SECTION_REF.finditer(m.group(1)):
            pos = m.start(1) + r.start()
            refs.append((_line(text, pos), r.group(1), pos))
    return refs


def _prose(path: str, text: str) -> list[tuple[int, str]]:
    """(first line, text) of the prose of a file: comments and strings of Python files, all of any other file."""
    if not path.endswith(".py"):
        return [(1, text)]
    kinds = {tokenize.STRING, tokenize.COMMENT} | {getattr(tokenize, n) for n in ("FSTRING_MIDDLE",)
                                                    if hasattr(tokenize, n)}
    return [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(text).readline)
            if tok.type in kinds]


def _old_names(path: str, text: str) -> list[tuple[int, str]]:
    """(line, name) of every mention of the old team-notes names in the prose of a file."""
    return [(first + _line(piece, m.start()) - 1, m.group(1))
            for first, piece in _prose(path, text) for m in _OLD_NAME.finditer(piece)]


def _doc_text() -> str:
    assert DOC.is_file(), "docs/methods.md is missing"
    return DOC.read_text(encoding="utf-8")


# ---------------------------------------------------------------------------------------------------------------
# the document itself


def test_methods_doc_has_sections_1_to_10_in_order():
    text = _doc_text()
    top = [m.group(2) for m in _HEADING.finditer(text) if m.group(1) == "##"]
    assert top == [str(n) for n in range(1, 11)], f"docs/methods.md top-level sections are {top}, want 1..10"


def test_methods_doc_subsections_sit_under_their_section():
    current = None
    for m in _HEADING.finditer(_doc_text()):
        level, sid = m.group(1), m.group(2)
        if level == "##":
            assert sid.isdigit(), f"`## {sid}.`: a top-level section is numbered without a letter"
            current = sid
        else:
            assert re.fullmatch(r"[0-9]+[a-z]{1,2}", sid) and sid.rstrip("abcdefghijklmnopqrstuvwxyz") == current, \
                f"`### {sid}.` is not a subsection of the section it sits in (## {current}.)"


def test_methods_doc_has_the_recipe_markers_in_section_10():
    text = _doc_text()
    start = re.search(r"^## 10\. ", text, re.MULTILINE)
    assert start, "docs/methods.md has no `## 10.` section"
    lines = [ln.strip() for ln in text[start.start():].splitlines()]
    assert lines.count(RECIPES_BEGIN) == 1 and lines.count(RECIPES_END) == 1, \
        f"section 10 needs the marker lines {RECIPES_BEGIN} and {RECIPES_END}, once each"
    assert lines.index(RECIPES_BEGIN) < lines.index(RECIPES_END)


# ---------------------------------------------------------------------------------------------------------------
# citations


def test_cited_md_files_exist():
    bad = []
    for path, text in _texts().items():
        for m in _MD_PATH.finditer(_URL.sub(" ", text)):
            cited = m.group(1)
            if cited == "METHODS.md" and path in OLD_NAMES_PENDING:
                continue  # reported by the old-name test once the file leaves the pending list
            # a Markdown link's target (`[Results](results.md)` in docs/index.md) is relative to the linking file
            is_link = text[:m.start()].endswith("](")
            if not (ROOT / cited).is_file() and not (is_link and (ROOT / path).parent.joinpath(cited).is_file()):
                bad.append(f"{path}:{_line(text, m.start())}: cites {cited}, which is not in the repository")
    assert not bad, "\n".join(bad)


def test_methods_doc_section_citations_resolve():
    sections = _sections(_doc_text())
    bad = []
    for path, text in _texts().items():
        cited_at = set()
        for line, sid, pos in _section_refs(text):
            cited_at.add(pos)
            if sid not in sections:
                bad.append(f"{path}:{line}: cites docs/methods.md §{sid}, which has no `## {sid}.` / `### {sid}.` "
                           f"heading")
        if path == "docs/methods.md":  # inside the document a bare `§N` means its own section
            for r in _SECTION_REF.finditer(text):
                if r.group(1) not in sections:
                    bad.append(f"{path}:{_line(text, r.start())}: refers to §{r.group(1)}, which does not exist")
            continue
        for r in _SECTION_REF.finditer(text):
            if r.start() not in cited_at:
                bad.append(f"{path}:{_line(text, r.start())}: `§{r.group(1)}` outside a `docs/methods.md §N` "
                           "citation (§ is reserved for the sections of docs/methods.md)")
    assert not bad, "\n".join(bad)


def test_no_citation_of_the_old_team_notes():
    bad = []
    for path, text in _texts().items():
        if path in OLD_NAMES_PENDING:
            continue
        for line, name in _old_names(path, text):
            bad.append(f"{path}:{line}: cites `{name}` (team notes that are not in the repository); "
                       "cite docs/methods.md §N instead")
    assert not bad, "\n".join(bad)


def test_pending_list_names_existing_files():
    missing = [p for p in OLD_NAMES_PENDING if not (ROOT / p).is_file()]
    assert not missing, f"OLD_NAMES_PENDING names files that do not exist: {missing}"


# ---------------------------------------------------------------------------------------------------------------
# the checks themselves catch what they should (so a regex that matches nothing cannot pass silently)


@pytest.mark.parametrize("snippet, ids", [
    ("see docs/methods.md §2b.", ["2b"]),
    ("(docs/methods.md §3, §4, §5 and §7)", ["3", "4", "5", "7"]),
    ("docs/methods.md §1\n    and §9", ["1", "9"]),
    ("# docs/methods.md §6 or\n# §6c", ["6", "6c"]),
    ("docs/methods.md (no section)", []),
])
def test_citation_parser(snippet, ids):
    assert [sid for _, sid, _ in _section_refs(snippet)] == ids


def test_a_nonexistent_section_is_caught():
    sections = _sections(_doc_text())
    refs = _section_refs("as docs/methods.md §11 and §2z say")
    assert [sid for _, sid, _ in refs] == ["11", "2z"]
    assert all(sid not in sections for _, sid, _ in refs)


def test_old_names_are_found_in_prose_not_in_code():
    code = 'METHODS = ["grpo"]\nfor m in METHODS:\n    pass  # see METHODS 5\nx = """a\nMETHODS.md section 2"""\n'
    assert _old_names("x.py", code) == [(3, "METHODS"), (5, "METHODS")]
    assert _old_names("x.yaml", "a: 1\n# (DESIGN: Runs)\n") == [(2, "DESIGN")]
