"""Every registered method says what it implements (`cites=`), and docs/methods.md says the same.

What "appears" means (`cited_in_doc`): a `Cite(paper, where, doc)` names sections of docs/methods.md (`doc`: "2b" is
the heading `### 2b.`, "2" the heading `## 2.`); the text of a section runs from its heading to the next heading of
the same or a higher level (a `## N.` section holds its subsections). Each item of `where` (e.g. `eq. 4`,
`section 4.2`, `Algorithm 1`) must occur, ignoring case and with any whitespace between its words, as a whole item
(`eq. 1` does not occur in `eq. 13`, `section 4.1` not in `section 4.1.2`) in the text of one of the cited sections,
either
- on its own, when that section is (or lies inside) one of the paper's own sections of docs/methods.md
  (`Paper.doc_sections`: E3's is `## 2.`, so `eq. 4` cited for E3 under `2b` must occur in `### 2b.`), or
- right after the paper's short name (`E3 eq. 2`), in any cited section (how docs/methods.md cites a paper outside
  its own section).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

import explorl.algos  # noqa: F401  (registers the estimators, shapers, losses and token filters)
import explorl.rollout.controllers  # noqa: F401  (registers the temperature schedules and budget policies)
from explorl.algos.papers import OWN, PAPERS
from explorl.algos.registry import METHOD_KINDS, Cite, _REGISTRY, register

DOC = (Path(__file__).resolve().parents[2] / "docs" / "methods.md").read_text(encoding="utf-8")
_HEADING = re.compile(r"^(##|###)\s+([0-9]+[a-z]{0,2})\.\s", re.MULTILINE)

METHOD_ENTRIES = [e for kind, table in _REGISTRY.items() if kind in METHOD_KINDS for e in table.values()
                  if e.fn.__module__.startswith("explorl.")]  # explorl's own, not a test's or a user's plugin


def section_text(sid: str, doc: str = DOC) -> str:
    """The text of docs/methods.md's section `sid`, from its heading to the next heading of the same or a higher
    level; KeyError when no such heading exists."""
    headings = [(m.start(), len(m.group(1)), m.group(2)) for m in _HEADING.finditer(doc)]
    for i, (start, level, found) in enumerate(headings):
        if found == sid:
            end = next((s for s, lvl, _ in headings[i + 1:] if lvl <= level), len(doc))
            return doc[start:end]
    raise KeyError(f"docs/methods.md has no heading `## {sid}.` / `### {sid}.`")


def occurs(item: str, text: str) -> bool:
    """`item` occurs in `text` as a whole item: case and the whitespace between its words aside, not preceded by a
    word character or a dot and not followed by one (nor by a dot and a word character)."""
    pattern = r"\s+".join(re.escape(word) for word in item.split())
    return re.search(rf"(?<![\w.]){pattern}(?!\.?\w)", text, re.IGNORECASE) is not None


def _inside(sid: str, home: str) -> bool:
    """Section `sid` is the section `home` or one of its subsections."""
    return sid == home or (home.isdigit() and re.fullmatch(rf"{home}[a-z]", sid) is not None)


def cited_in_doc(cite: Cite, item: str, doc: str = DOC) -> bool:
    """Whether `item` of `cite.where` appears in docs/methods.md as the module docstring defines."""
    homes = PAPERS[cite.paper].doc_sections if cite.paper in PAPERS else ()
    for sid in cite.sections:
        text = section_text(sid, doc)
        if any(_inside(sid, home) for home in homes) and occurs(item, text):
            return True
        if occurs(f"{cite.paper} {item}", text):
            return True
    return False


def _id(entry) -> str:
    return f"{entry.kind}:{entry.name}"


def test_every_method_kind_has_entries_to_check():
    assert {e.kind for e in METHOD_ENTRIES} == set(METHOD_KINDS), "a method kind has no entry of explorl's own"
    assert len(METHOD_ENTRIES) >= 27


@pytest.mark.parametrize("entry", METHOD_ENTRIES, ids=_id)
def test_every_method_cites_a_known_paper_and_a_section(entry):
    assert entry.cites, f"{_id(entry)}: register(..., cites=(Cite(paper, equations, doc=section),)) is missing"
    for cite in entry.cites:
        assert cite.paper in PAPERS or cite.paper == OWN, \
            f"{_id(entry)} cites {cite.paper!r}, which is not in explorl.algos.papers.PAPERS (nor {OWN!r})"
        assert cite.sections, f"{_id(entry)}: its cite of {cite.paper} names no docs/methods.md section (doc=...)"
    assert any(c.paper in PAPERS or c.paper == OWN for c in entry.cites)


@pytest.mark.parametrize("entry", METHOD_ENTRIES, ids=_id)
def test_every_cited_equation_appears_in_the_cited_section_of_the_paper(entry):
    for cite in entry.cites:
        for sid in cite.sections:
            section_text(sid)  # KeyError names a section that does not exist
        missing = [item for item in cite.locators if not cited_in_doc(cite, item)]
        assert not missing, (f"{_id(entry)}: {cite.paper} {missing} not found in docs/methods.md "
                             f"§{', §'.join(cite.sections)} (see this test module's docstring)")


def test_a_papers_own_section_holds_its_bare_equations_and_elsewhere_its_name_must_precede_them():
    assert cited_in_doc(Cite("ERPO", "eq. 8", doc="3"), "eq. 8")
    assert not cited_in_doc(Cite("ERPO", "eq. 99", doc="3"), "eq. 99")
    assert cited_in_doc(Cite("E3", "eq. 2", doc="1a"), "eq. 2")  # written "E3 eq. 2" there
    assert not cited_in_doc(Cite("ERPO", "eq. 2", doc="1a"), "eq. 2")  # §1a is not ERPO's and never says so
    assert cited_in_doc(Cite("E3", "eq. 4", doc="2b"), "eq. 4")  # §2b lies inside E3's `## 2.`
    assert not cited_in_doc(Cite("E3", "eq. 4", doc="3"), "eq. 4")
    with pytest.raises(KeyError, match="no heading"):
        cited_in_doc(Cite("E3", "eq. 4", doc="2z"), "eq. 4")


@pytest.mark.parametrize("item, text, found", [
    ("eq. 1", "(E3 eq. 1)", True),
    ("eq. 1", "eq. 13 and eq. 10", False),
    ("eq. 1", "eq. 1.", True),  # the end of a sentence
    ("section 4.1", "section 4.1.2", False),
    ("section 4.2", "Section\n  4.2: the", True),
    ("Algorithm 1", "(Algorithm 12)", False),
    ("eq. 5", "its eq. 5", True),
    ("eq. 5", "seq. 5", False),
])
def test_occurs_matches_whole_items_only(item, text, found):
    assert occurs(item, text) is found


def test_section_text_runs_to_the_next_heading_of_its_level():
    doc = "## 1. A\nx\n### 1a. B\ny\n### 1b. C\nz\n## 2. D\nw\n"
    assert section_text("1", doc) == "## 1. A\nx\n### 1a. B\ny\n### 1b. C\nz\n"
    assert section_text("1a", doc) == "### 1a. B\ny\n"
    assert section_text("2", doc) == "## 2. D\nw\n"


@pytest.mark.parametrize("short", list(PAPERS))
def test_every_paper_is_documented_where_it_says(short):
    paper = PAPERS[short]
    flat = " ".join(DOC.split())
    assert " ".join(paper.title.split()).lower() in flat.lower(), f"{short}: title not in docs/methods.md"
    assert paper.doc_sections, short
    for sid in paper.doc_sections:
        section_text(sid)
    assert paper.arxiv is None or re.fullmatch(r"[0-9]{4}\.[0-9]{4,5}", paper.arxiv), paper.arxiv


def test_the_five_papers_are_named_by_short_name_in_the_doc():
    for short in ("E3", "ERPO", "CW-GRPO", "EAD", "STILL"):
        assert f"**{short}**" in DOC
    assert re.search(r"\bpapers? 00[0-4]\b", DOC, re.IGNORECASE) is None
    assert re.search(r"(?<![\w.,])00[0-4](?![\w.])", DOC) is None  # nor a bare file number


def test_the_arxiv_ids_are_the_ones_the_papers_give():
    # the five: as their own texts give them (two do); the engines' losses (issue 52): as the paper's arXiv page does
    assert {s: p.arxiv for s, p in PAPERS.items() if p.arxiv} == {"ERPO": "2603.28204", "CW-GRPO": "2605.11538",
                                                                  "GSPO": "2507.18071",
                                                                  "MiniMax-M1": "2506.13585", "SAPO": "2511.20347",
                                                                  # verl's estimators: as verl's code cites them
                                                                  "RLOO": "2402.14740", "REINFORCE++": "2501.03262",
                                                                  "ReMax": "2310.10505",
                                                                  "OPO": "2505.23585", "GPG": "2504.02546",
                                                                  "GDPO": "2601.05242",
                                                                  # verl's losses: as verl's code cites them
                                                                  "DPPO": "2602.04879", "GMPO": "2507.20673",
                                                                  "DRO": "2405.19107",
                                                                  # TRL's off-policy mask: as TRL's GRPOConfig cites it
                                                                  "DeepSeek-V3.2": "2512.02556",
                                                                  # TRL's LUSPO and VESPO: as TRL's GRPOConfig cites
                                                                  # them; verl's grpo_passk: as verl's code cites it
                                                                  "LUSPO": "2602.05261", "VESPO": "2602.10693",
                                                                  "inference-time objectives": "2503.19595",
                                                                  # issue 53's exploration methods: as each paper's
                                                                  # abstract page (MaxRL: its LaTeX source) gives it
                                                                  "NSR": "2506.01347", "QAE": "2509.22611",
                                                                  "RL-ZVP": "2509.21880", "SimKO": "2510.14807",
                                                                  "MaxRL": "2602.02710",
                                                                  # issue 53's loop methods: as TRL's GRPOConfig
                                                                  # cites Skywork-OR1, as ProRL's abstract page does
                                                                  "Skywork-OR1": "2505.22312", "ProRL": "2505.24864",
                                                                  # outcome-based exploration's and FR3E's abstract
                                                                  # pages
                                                                  "Outcome-based Exploration": "2509.06941",
                                                                  "FR3E": "2507.07017"}


# ---------------------------------------------------------------------------------------------------------------
# Cite and register


def test_cite_splits_its_items():
    cite = Cite("E3", "eq. 4, eq. 5 , section 4.2", doc="2, 2b")
    assert cite.locators == ("eq. 4", "eq. 5", "section 4.2") and cite.sections == ("2", "2b")
    assert Cite("explorl", doc="2c").locators == ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cite.paper = "ERPO"  # type: ignore[misc]


@pytest.mark.parametrize("args, kwargs", [
    (("",), {"doc": "2"}),  # no paper
    (("E3", "eq. 4,, eq. 5"), {"doc": "2b"}),  # an empty item
    (("E3", "eq. 4"), {"doc": "§2b"}),  # the section is written without its sign
    (("E3", "eq. 4"), {"doc": "2b 3"}),
])
def test_cite_refuses_malformed_values(args, kwargs):
    with pytest.raises(ValueError, match="short name"):
        Cite(*args, **kwargs)


def test_register_records_cites_and_refuses_anything_else():
    table = _REGISTRY["token_filter"]
    try:
        register("token_filter", "_cites_test", cites=Cite("explorl", doc="5d"))(lambda batch, mask, cfg: None)
        assert table["_cites_test"].cites == (Cite("explorl", doc="5d"),)
        register("token_filter", "_cites_test_none")(lambda batch, mask, cfg: None)
        assert table["_cites_test_none"].cites == ()
        with pytest.raises(ValueError, match="Cite"):
            register("token_filter", "_cites_test_bad", cites=("E3 eq. 4",))
    finally:
        for name in ("_cites_test", "_cites_test_none", "_cites_test_bad"):
            table.pop(name, None)
