"""Each built-in method is one file under `explorl.algos.methods`, written as a user's plugin is (issue 40): the file
registers its entries by name, its header names every paper they cite (short name, authors, title, arXiv id where
one is recorded), and the public modules `advantages` / `losses` re-export the same objects."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import pytest

import explorl.algos.methods  # registers the built-in methods
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


def test_a_new_built_in_method_is_one_new_file(tmp_path):
    """`explorl.algos.methods` imports every module beside it by name, so a file dropped there registers its
    entries with no other edit: its `__init__.py` copied into a fresh package beside one new method file (the
    built-in files are not copied: their names are taken) and imported in a fresh interpreter."""
    import subprocess

    package = Path(explorl.algos.methods.__file__).parent
    copy = tmp_path / "methods_copy"
    copy.mkdir()
    (copy / "__init__.py").write_text((package / "__init__.py").read_text())
    (copy / "zz_new.py").write_text(
        "from explorl.algos.registry import register\n\n\n"
        "@register('estimator', 'zz_new_estimator', needs_old_logprobs=False)\n"
        "def zz_new(batch, cfg):\n    return batch.mask * 0\n")
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import explorl.algos, methods_copy; "
            "from explorl.algos.registry import names; print(methods_copy.MODULES, 'zz_new_estimator' in "
            "names('estimator'))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["('zz_new',)", "True"]


def test_every_file_of_the_methods_package_is_imported():
    files = sorted(p.stem for p in Path(explorl.algos.methods.__file__).parent.glob("*.py") if p.stem != "__init__")
    assert list(explorl.algos.methods.MODULES) == files and all(f"explorl.algos.methods.{f}" in sys.modules
                                                                 for f in files)
