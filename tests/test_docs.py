"""The docs list every config field and every per-step metric (they are generated from the code).

The configuration reference page (docs/configuration.md) holds a marker that the site's build hook
(docs/hooks/config_reference.py) replaces with `explorl config --markdown`'s table; the metrics table is on the
run-directory page (docs/run-directory.md). The README is the front page: it keeps the two quickstart commands."""

import importlib.util
from pathlib import Path

from explorl.config import reference
from explorl.runs.metrics import STEP_METRICS

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
CONFIG_PAGE = (ROOT / "docs" / "configuration.md").read_text()
RUN_DIRECTORY_PAGE = (ROOT / "docs" / "run-directory.md").read_text()


def _hook(name: str = "config_reference"):
    spec = importlib.util.spec_from_file_location(name, ROOT / "docs" / "hooks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_config_page_is_generated_at_build_time():
    hook = _hook()
    assert CONFIG_PAGE.count(hook.MARKER) == 1, "docs/configuration.md lost the marker the table is generated into"
    assert "hooks:\n  - docs/hooks/config_reference.py" in (ROOT / "mkdocs.yml").read_text()
    assert hook.render("no marker here") == "no marker here"


def test_the_config_page_lists_every_config_field():
    page = _hook().render(CONFIG_PAGE)
    missing = [name for name, *_ in reference() if f"| `{name}` |" not in page]
    assert not missing, f"the configuration reference page lacks {missing}"


def test_the_config_page_table_is_the_generated_one(capsys):
    from explorl.commands import main

    assert main(["config", "--markdown"]) == 0
    table = capsys.readouterr().out.strip()
    assert table.startswith("| field | type | default | meaning |")
    assert table in _hook().render(CONFIG_PAGE), "the site's config table differs from `explorl config --markdown`"


def test_the_run_directory_page_lists_every_step_metric():
    missing = [k for k in STEP_METRICS if f"| `{k}` |" not in RUN_DIRECTORY_PAGE]
    assert not missing, f"docs/run-directory.md's metrics table lacks {missing}"


def test_readme_quickstart_is_the_two_make_commands():
    assert "make demo" in README and "make test" in README


def test_each_paper_has_a_page_made_of_its_section_of_docs_methods():
    """docs/methods-*.md hold a marker that docs/hooks/methods_sections.py replaces with that section of
    docs/methods.md at build time: sections 1-7 (GRPO, E3, ERPO, CW-GRPO, the baselines, EAD, STILL) each on a page."""
    hook = _hook("methods_sections")
    assert "  - docs/hooks/methods_sections.py" in (ROOT / "mkdocs.yml").read_text()
    pages = {m.group(1): p for p in (ROOT / "docs").glob("methods-*.md") for m in hook.MARKER.finditer(p.read_text())}
    assert sorted(pages, key=int) == [str(n) for n in range(1, 8)]
    methods = (ROOT / "docs" / "methods.md").read_text()
    for number, page in pages.items():
        rendered = hook.render(page.read_text())
        body = hook.section(number)
        assert body.startswith(f"## {number}. ") and body in methods and body in rendered
        assert "\n## " not in body  # one section: it stops before the next one
    assert hook.section("2", "## 1. a\ntext\n## 2. E3\neq. 4\n### 2a. x\n## 3. ERPO\n") == "## 2. E3\neq. 4\n### 2a. x"
