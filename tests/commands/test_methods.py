"""`explorl methods`: every registered method with its paper, equations, options and the `file:line` of its code;
`explorl methods NAME` one name in full; an unknown name fails with the valid names."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

import explorl.commands.common as common
from explorl.algos.registry import METHOD_KINDS, _REGISTRY
from explorl.commands import main
from explorl.commands.methods import _summary
from explorl.config.validation import fill_registry
import explorl.train.loop_methods as loop_methods
from explorl.train.loop_methods import LOOP_METHODS

fill_registry()
ENTRIES = [e for kind, table in _REGISTRY.items() if kind in METHOD_KINDS for e in table.values()
           if e.fn.__module__.startswith("explorl.")] + list(LOOP_METHODS)  # and what the loop carries out itself
_LOCATION = re.compile(r"(\S+\.py):([0-9]+)")


@pytest.fixture
def out(monkeypatch):
    """What the command prints (a wide console, so a table row stays on one line)."""
    buf = io.StringIO()
    monkeypatch.setattr(common, "console", Console(file=buf, width=1000, color_system=None, highlight=False))
    return buf.getvalue


def _defines_or_registers(path: Path, line: int, entry) -> bool:
    """The line defines the entry's function or class, and the file registers it under its name (a method of the
    loop: `explorl.train.loop_methods` declares its `LoopEntry`)."""
    text = path.read_text(encoding="utf-8")
    defines = re.match(rf"\s*(async\s+)?(def|class)\s+{re.escape(entry.fn.__name__)}\b", text.splitlines()[line - 1])
    registers = re.search(rf"register\w*\(\s*(\"{entry.kind}\",\s*)?\"{re.escape(entry.name)}\"", text)
    declares = entry in LOOP_METHODS and f'name="{entry.name}"' in Path(loop_methods.__file__).read_text()
    return bool(defines and (registers or declares))


def test_methods_lists_every_entry_with_its_paper_and_code(out):
    assert main(["methods"]) == 0
    text = out()
    rows = text.splitlines()
    for entry in ENTRIES:
        assert entry.kind in text
        matching = [row for row in rows if re.search(rf"│ {re.escape(entry.name)}\s+│", row)
                    and any(c.paper in row for c in entry.cites)]
        located = [(Path(m.group(1)), int(m.group(2))) for row in matching for m in _LOCATION.finditer(row)]
        assert any(path.is_file() and _defines_or_registers(path, line, entry) for path, line in located), \
            f"{entry.kind} {entry.name}: no row with its paper and a file:line of its code in\n{text}"


def test_methods_shows_the_options_with_their_defaults(out):
    assert main(["methods"]) == 0
    text = out()
    assert "beta_progress=0.1" in text and "gamma=5.0" in text  # ERPO's (docs/methods.md §3: 0.1, 5)
    assert "cw's: bandwidth=1.0" in text  # cw_group reads cw's options


def test_methods_paths_exist_from_another_working_directory(out, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["methods"]) == 0
    paths = {Path(m.group(1)) for m in _LOCATION.finditer(out())}
    assert paths and all(p.is_absolute() and p.is_file() for p in paths), paths


def test_methods_erpo_shows_it_in_full(out):
    assert main(["methods", "erpo"]) == 0
    text = out()
    assert "estimator erpo" in text
    assert "ERPO eq. 7, eq. 8, eq. 9, eq. 10, eq. 16 (docs/methods.md §3)" in text
    assert "arXiv 2603.28204" in text and "Entropy-Regulated Policy Optimization" in text
    assert re.search(r"algo\.erpo\.gamma\s+│\s+5\.0\s+│ Sharpness gamma of the entropy gate", text), text
    assert re.search(r"code: \S+methods/erpo\.py:[0-9]+", text)


def test_methods_name_shows_every_kind_of_that_name(out):
    assert main(["methods", "e3"]) == 0
    text = out()
    assert "temperature_schedule e3" in text and "budget_policy e3" in text
    assert "no arXiv id given" in text  # E3's text gives none


def test_methods_of_explorls_own_say_so(out):
    assert main(["methods", "uniform"]) == 0
    assert "explorl's own (in no paper" in out()


def test_methods_unknown_name_fails_with_the_valid_names(out):
    assert main(["methods", "nonsense"]) == 2
    text = " ".join(out().split())
    assert "no method named 'nonsense'" in text
    valid = text.split("valid:", 1)[1]
    assert all(re.search(rf"\b{re.escape(e.name)}\b", valid) for e in ENTRIES)


def _assert_every_cell_whole(text: str) -> None:
    """No table, and each method's cells each whole on a line of their own: its name alone on a line, then what it
    implements, its options and its code's file:line (the blocks an 80-column console or a pipe gets)."""
    lines = text.splitlines()
    assert "│" not in text and "┃" not in text, text
    for entry in ENTRIES:
        name, cites, _, options, code = _summary(entry)
        assert f"  {name}" in lines, f"{entry.kind} {name} not whole on a line of its own in\n{text}"
        assert any(line.startswith(f"    implements: {cites}") for line in lines), (name, cites)
        assert f"    options: {options}" in lines and f"    code: {code}" in lines, (name, options, code)


@pytest.mark.parametrize("terminal", [False, True])
def test_methods_at_80_columns_prints_whole_lines(monkeypatch, terminal):
    """At 80 columns a table row does not fit, and rich would fold every cell to a few characters: each method is
    printed as a block of whole lines instead, on a terminal and off one."""
    buf = io.StringIO()
    monkeypatch.setattr(common, "console", Console(file=buf, width=80, force_terminal=terminal, color_system=None))
    assert main(["methods"]) == 0
    _assert_every_cell_whole(buf.getvalue())


def test_methods_piped_prints_whole_lines():
    """`explorl methods | cat`: rich gives a pipe 80 columns, so the output is the blocks of whole lines."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    res = subprocess.run([sys.executable, "-m", "explorl", "methods"], capture_output=True, text=True, timeout=120,
                         env=env)
    assert res.returncode == 0, res.stderr
    _assert_every_cell_whole(res.stdout)


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: f"{e.kind}:{e.name}")
def test_every_method_has_a_formula_and_a_place_of_action_that_resolve(entry):
    """`Entry.formula` names functions whose `def` (or `class`) is at the file:line shown, and every `Entry.acts_at`
    site is found: the line shown holds its marker (a step changed without the registry's `ACTS_AT` fails here)."""
    from explorl.commands.methods import code_location, site_location

    assert entry.formula and entry.acts_at, entry.name
    for fn in entry.formula:
        path, line = code_location(fn)
        assert re.match(rf"\s*(async\s+)?(def|class)\s+{re.escape(fn.__name__)}\b",
                        Path(path).read_text(encoding="utf-8").splitlines()[line - 1]), (entry.name, fn)
    for site in entry.acts_at:
        path, line = site_location(site)
        assert site.marker in Path(path).read_text(encoding="utf-8").splitlines()[line - 1], (entry.name, site)


def _lines_of(text: str, header: str) -> list[str]:
    """The lines of the entry printed under `header` (up to the next blank line)."""
    block = text.split(header, 1)[1].split("\n\n", 1)[0]
    return block.splitlines()


def test_methods_e3_shows_eq_1_with_its_formula_and_where_it_acts(out):
    """`explorl methods e3`: the entries named e3 and those citing E3, among them the per-question aggregation (E3
    eq. 1) with the file:line of its weights and of the step line that applies them."""
    assert main(["methods", "e3"]) == 0
    text = out()
    assert "temperature_schedule e3" in text and "budget_policy e3" in text
    lines = _lines_of(text, "aggregation seq-mean-token-mean-per-question")
    assert any(line.startswith("  implements: E3 eq. 1 (docs/methods.md §1d)") for line in lines), lines
    assert any(re.fullmatch(r"  formula: \S+algos/aggregation\.py:[0-9]+ \(explorl\.algos\.aggregation\."
                            r"question_weights\)", line) for line in lines), lines
    assert any(re.fullmatch(r"  acts at: \S+algos/step\.py:[0-9]+ \(compute_advantages: .*\)", line)
               for line in lines), lines


def test_methods_ead_shows_the_temperature_formula_and_the_sampler_line(out):
    assert main(["methods", "ead"]) == 0
    text = out()
    lines = _lines_of(text, "temperature_schedule ead")
    assert any(re.fullmatch(r"  formula: \S+rollout/temperature\.py:[0-9]+ \(explorl\.rollout\.temperature\.ead\)",
                            line) for line in lines), lines
    acts = [line for line in lines if line.startswith("  acts at: ")]
    assert any(re.fullmatch(r"  acts at: \S+rollout/engines/native\.py:[0-9]+ \(_decode: .*temperature.*\)", line)
               for line in acts), acts  # where the sampler takes each token's temperature from the table
    assert "importance_weights tis" in text  # it cites EAD too


def test_methods_name_at_80_columns_keeps_each_location_whole(monkeypatch):
    buf = io.StringIO()
    monkeypatch.setattr(common, "console", Console(file=buf, width=80, color_system=None))
    assert main(["methods", "ead"]) == 0
    lines = buf.getvalue().splitlines()
    assert any(re.fullmatch(r"  formula: \S+:[0-9]+ \(explorl\.rollout\.temperature\.ead\)", line) for line in lines)


def test_methods_lists_what_the_loop_carries_out(out):
    """Skywork-OR1's adaptive entropy coefficient and ProRL's reference reset are no registry entries (a config
    section switches each on): `explorl methods` lists them under `loop` with their papers, config keys and code."""
    assert main(["methods"]) == 0
    text = out()
    assert "loop (carried out by explorl's loop" in text
    for name, paper, path, option in [("entropy_control", "Skywork-OR1", "train/adaptive_entropy.py", "target=0.2"),
                                      ("reference_reset", "ProRL", "train/reference_reset.py", "every=0")]:
        row = next(r for r in text.splitlines() if re.search(rf"│ {name}\s+│", r))
        assert paper in row and option in row and re.search(rf"\S+{re.escape(path)}:[0-9]+", row), row


def test_methods_entropy_control_shows_it_in_full(out):
    assert main(["methods", "entropy_control"]) == 0
    text = out()
    lines = _lines_of(text, "loop entropy_control")
    assert any(re.fullmatch(r"  code: \S+train/adaptive_entropy\.py:[0-9]+", line) for line in lines), lines
    assert any(re.fullmatch(r"  formula: \S+train/adaptive_entropy\.py:[0-9]+ \(explorl\.train\.adaptive_entropy\."
                            r"EntropyCoefficient\.step\)", line) for line in lines), lines
    assert any(re.fullmatch(r"  acts at: \S+train/loop\.py:[0-9]+ \(train_step: .*\)", line) for line in lines), lines
    assert any(line.startswith("  implements: Skywork-OR1 (docs/methods.md §5aa)") for line in lines), lines
    assert "arXiv 2505.22312" in text
    assert re.search(r"algo\.entropy_control\.target\s+│\s+0\.2\s+│", text), text


def test_methods_by_paper_finds_the_reference_reset(out):
    assert main(["methods", "prorl"]) == 0
    text = out()
    lines = _lines_of(text, "loop reference_reset")
    assert any(re.fullmatch(r"  acts at: \S+train/loop\.py:[0-9]+ \(train_step: .*\)", line) for line in lines), lines
    assert "arXiv 2505.24864" in text and re.search(r"algo\.reference_reset\.every\s+│\s+0\s+│", text), text
