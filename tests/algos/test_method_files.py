"""Each built-in method is one file under `explorl.algos.methods`, written as a user's plugin is (issue 40): the file
registers its entries by name, its header names every paper they cite (short name, authors, title, arXiv id where
one is recorded), and the public modules `advantages` / `losses` re-export the same objects."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import pytest

import explorl.algos  # noqa: F401  (registers the built-in methods)
from explorl.algos import advantages as A
from explorl.algos import losses as L
from explorl.algos.papers import OWN, PAPERS
from explorl.algos.registry import _REGISTRY

ALGO_KINDS = ("estimator", "shaper", "policy_loss", "token_filter", "reward_shaper", "importance_weights")
BUILT_IN = [e for kind, table in _REGISTRY.items() if kind in ALGO_KINDS
            for e in table.values() if e.fn.__module__.startswith("explorl.")]


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("entry", BUILT_IN, ids=lambda e: f"{e.kind}-{e.name}")
def test_a_built_in_method_lives_in_its_own_file_and_registers_itself_there(entry):
    module = sys.modules[entry.fn.__module__]
    assert module.__name__.startswith("explorl.algos.methods."), module.__name__
    text = Path(module.__file__).read_text(encoding="utf-8")
    assert re.search(rf'register\(\s*"{entry.kind}",\s*"{re.escape(entry.name)}"', text)


@pytest.mark.parametrize("entry", BUILT_IN, ids=lambda e: f"{e.kind}-{e.name}")
def test_its_file_header_names_each_paper_it_cites(entry):
    header = _flat(sys.modules[entry.fn.__module__].__doc__ or "")
    for cite in entry.cites:
        if cite.paper == OWN:
            continue
        paper = PAPERS[cite.paper]
        for part in (f"{cite.paper}:", paper.authors, paper.title) + ((f"arXiv {paper.arxiv}",) if paper.arxiv else ()):
            assert _flat(part) in header, f"{entry.name}: the header of {entry.fn.__module__} lacks {part!r}"


@pytest.mark.parametrize("public", [A, L], ids=["advantages", "losses"])
def test_the_public_modules_re_export_the_methods_objects(public):
    for name in public.__all__:
        obj = getattr(public, name)
        home = getattr(obj, "__module__", None)
        if home and home.startswith("explorl.algos.") and home != public.__name__:
            assert getattr(importlib.import_module(home), name) is obj
    assert A.erpo is importlib.import_module("explorl.algos.methods.erpo").erpo
    assert L.policy_loss is importlib.import_module("explorl.algos.methods.ppo").policy_loss
