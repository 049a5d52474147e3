"""Issue 39 item 6: one rule for every command that writes where you say (`commands.common.refuse_to_replace`): a
file you name that exists, or a directory you name that holds anything, is not replaced; the command stops before
any work, naming the flag and the path, unless `--overwrite`. (Before: `eval --save-completions FILE` and `compare
--out DIR` replaced them silently, `eval --out` warned and replaced.)"""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from explorl import commands

EVAL = ["eval", "--task", "arith", "--n", "2", "--k", "1,2", "--limit", "2", "--max-new-tokens", "4", "--device",
        "cpu", "--task-opt", "train_size=8", "--task-opt", "eval_size=4"]


@pytest.fixture
def said(monkeypatch):
    """What the commands print, as one line."""
    buf = io.StringIO()
    monkeypatch.setattr(commands.common, "console", Console(file=buf, width=400, force_terminal=False))
    return lambda: " ".join(buf.getvalue().split())


def _mine(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("the user's own file\n")
    return path


@pytest.mark.parametrize("argv, flag, target", [
    (["eval", "--model", "embedded", "--save-completions", "{t}"], "--save-completions", "c.jsonl"),
    (["eval", "--model", "embedded", "--out", "{t}"], "--out", "e.json"),
    (["eval", "--model", "embedded", "--per-problem", "{t}"], "--per-problem", "p.jsonl"),
    (["compare", "runs/a", "runs/b", "--out", "{t}"], "--out", "cmp/index.html"),
    (["analyze", "runs/a", "--out", "{t}"], "--out", "report/index.html"),
    (["curves", "a.json", "--out", "{t}"], "--out", "curves.png"),
    (["venn", "a.jsonl", "b.jsonl", "--out", "{t}"], "--out", "venn.png"),
    (["probe", "position", "--model", "embedded", "--out", "{t}"], "--out", "probe.json"),
    (["export", "runs/a", "--out", "{t}"], "--out", "model/weights.bin"),
    (["frontier", "embedded", "--out", "{t}"], "--out", "frontier/notes.txt"),
])
def test_every_command_refuses_to_replace_what_you_name_before_any_work(tmp_path, said, argv, flag, target):
    mine = _mine(tmp_path / target)
    named = mine if "/" not in target else mine.parent  # a directory's own path is what the flag names
    rc = commands.main([a.replace("{t}", str(named)) for a in argv])
    assert rc == 2
    assert f"{flag} {named}: already exists" in said(), said()
    assert mine.read_text() == "the user's own file\n"


def test_overwrite_replaces_what_you_name(tmp_path, said, tiny_model_dir):
    completions, summary = _mine(tmp_path / "c.jsonl"), _mine(tmp_path / "e.json")
    argv = [*EVAL, "--model", str(tiny_model_dir), "--save-completions", str(completions), "--out", str(summary)]
    assert commands.main(argv) == 2 and completions.read_text() == "the user's own file\n"
    assert commands.main([*argv, "--overwrite"]) == 0, said()
    assert len(completions.read_text().splitlines()) == 2 * 2  # 2 problems x n = 2
    assert json.loads(summary.read_text())["problems"] == 2


def test_export_overwrite_replaces_only_a_model_directory(tmp_path, said, tiny_model_dir):
    notes = _mine(tmp_path / "notes" / "todo.txt")
    assert commands.main(["export", str(tiny_model_dir), "--out", str(notes.parent), "--overwrite"]) == 2
    assert "is not one" in said() and notes.read_text() == "the user's own file\n"
    dest = tmp_path / "model"
    assert commands.main(["export", str(tiny_model_dir), "--out", str(dest)]) == 0
    (dest / "stale.bin").write_text("from an older export")
    assert commands.main(["export", str(tiny_model_dir), "--out", str(dest)]) == 2
    assert commands.main(["export", str(tiny_model_dir), "--out", str(dest), "--overwrite"]) == 0
    assert (dest / "config.json").is_file() and not (dest / "stale.bin").exists()  # replaced whole, not mixed
