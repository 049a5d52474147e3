"""Saved completions (`explorl eval --save-completions`) and their report (`explorl analyze FILE`)."""

from __future__ import annotations

import json

import pytest

from explorl.analysis.completions import COMPLETION_FIELDS, completions_report, read_completions


def row(problem, sample, completion, correct):
    return dict(zip(COMPLETION_FIELDS, (problem, sample, "q", "4", completion, "4" if correct else "5",
                                        float(correct), correct)))


ROWS = [
    row("p0", 0, "2 + 2 = 4, therefore \\boxed{4}", True),       # clean
    row("p0", 1, "Wait, 2 + 3 = 5 so \\boxed{5}", False),          # clean, wrong
    row("p1", 0, "no box here at all", False),                       # format issue
    row("p1", 1, "\\boxed{4} and again \\boxed{4}", True),           # format issue (two boxes)
    row("p2", 0, "答案 is \\boxed{4}", True),                          # language mixing
    row("p2", 1, " ".join(["the same words again"] * 10) + " \\boxed{5}", False),  # repetition
]


def test_report_by_hand():
    report = completions_report(ROWS, cases=2)
    assert report["n"] == 6 and report["accuracy"] == pytest.approx(3 / 6)
    q = report["quality"]
    # format: rows 2 and 3 of 6; of the correct (rows 0, 3, 4) one; of the incorrect (1, 2, 5) one
    assert q["all"]["format"] == pytest.approx(2 / 6) and report["format_rate"] == pytest.approx(4 / 6)
    assert q["correct"]["format"] == pytest.approx(1 / 3) and q["incorrect"]["format"] == pytest.approx(1 / 3)
    assert q["all"]["language_mixing"] == pytest.approx(1 / 6) and q["all"]["repetition"] == pytest.approx(1 / 6)
    assert [c["problem"] for c in report["cases"]["format"]] == ["p1", "p1"]
    assert report["cases"]["repetition"][0]["sample"] == 1 and not report["cases"]["repetition"][0]["correct"]
    # words of the incorrect completions: "Wait," is metacognitive, "so" logical, "2", "+", "3", "=", "5" formal
    cats = report["categories"]["incorrect"]
    assert cats["metacognitive"]["count"] == 1
    assert sum(c["share"] for c in cats.values()) == pytest.approx(1.0)


def test_malformed_lines_are_reported_with_their_number(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n{oops\n")
    with pytest.raises(ValueError, match=r"c\.jsonl:2: not JSON"):
        read_completions(path)
    path.write_text(json.dumps({"completion": "x"}) + "\n")
    with pytest.raises(ValueError, match=r":1: .*missing: correct.*--save-completions"):
        read_completions(path)


def test_eval_saves_completions_and_analyze_reports_them(tmp_path, capsys, tiny_model_dir):
    from explorl import commands

    model_dir = tiny_model_dir
    saved = tmp_path / "completions.jsonl"
    rc = commands.main(["eval", "--model", str(model_dir), "--task", "arith", "--n", "3", "--k", "1,3", "--limit", "4",
                   "--max-new-tokens", "8", "--device", "cpu", "--task-opt", "train_size=8", "--task-opt",
                   "eval_size=8", "--out", str(tmp_path / "eval.json"), "--save-completions", str(saved),
                   "--curve"])
    assert rc == 0
    rows = read_completions(saved)
    summary = json.loads((tmp_path / "eval.json").read_text())
    assert len(rows) == 4 * 3 and {r["sample"] for r in rows} == {0, 1, 2}
    assert sum(r["correct"] for r in rows) / 12 == pytest.approx(summary["avg@3"])
    assert summary["curve"]["k"] == [1, 2, 3]
    assert summary["curve"]["pass@k"][0][0] == pytest.approx(summary["pass@1"])
    capsys.readouterr()
    assert commands.main(["analyze", str(saved)]) == 0
    report = json.loads((tmp_path / "completions.report.json").read_text())
    assert report["n"] == 12 and report["format_rate"] == pytest.approx(summary["format_rate"])
    assert "format issue" in capsys.readouterr().out
