"""Issue 56, item 6 beside YAML: a JSON value nested past Python's stack (`json.loads` raises RecursionError, not
ValueError) in a run directory's files or a data file is read as damage, named by file (and line), never a
traceback. 100,000 nested brackets are 200 kB: a file anyone can plant."""

from __future__ import annotations

import json

import pytest

DEEP = "[" * 100_000 + "]" * 100_000


def _run_dir(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("run: {seed: 0}\n")
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5}) + "\n" + DEEP + "\n")
    return run


def test_a_report_skips_a_deep_metrics_line_and_names_a_deep_eval_json(tmp_path):
    from explorl.report.runs import RunError, load_run

    run = _run_dir(tmp_path)
    loaded = load_run(run)
    assert [r["step"] for r in loaded.steps] == [1] and loaded.skipped_lines == 1
    (run / "eval.json").write_text(DEEP)
    with pytest.raises(RunError, match="eval.json: not valid JSON"):
        load_run(run)


def test_a_deep_lock_file_reads_as_no_holder_and_a_deep_eval_json_as_unfinished(tmp_path):
    from explorl.runs.lock import _read_holder
    from explorl.runs.log import RunLog

    (tmp_path / ".lock").write_text(DEEP)
    assert _read_holder(tmp_path / ".lock") == {}
    (tmp_path / "eval.json").write_text(DEEP)
    assert RunLog(tmp_path).is_complete(1) is False


def test_a_deep_row_of_a_data_file_is_an_error_naming_file_and_line(tmp_path):
    from explorl.tasks.rows import read_rows

    data = tmp_path / "d.jsonl"
    data.write_text('{"question": "1+1", "answer": "2"}\n' + DEEP + "\n")
    with pytest.raises(ValueError, match=r"d.jsonl:2: not a JSON object: nested too deeply"):
        list(read_rows(data))
    whole = tmp_path / "d.json"
    whole.write_text(DEEP)
    with pytest.raises(ValueError, match=r"d.json: not valid JSON: nested too deeply"):
        list(read_rows(whole))


def test_curves_and_completions_name_the_deep_file(tmp_path):
    from explorl import commands
    from explorl.analysis.completions import read_completions

    record = tmp_path / "deep.json"
    record.write_text(DEEP)
    assert commands.main(["curves", str(record), "--out", str(tmp_path / "c.png")]) != 0
    lines = tmp_path / "c.jsonl"
    lines.write_text(DEEP + "\n")
    with pytest.raises(ValueError, match=r"c.jsonl:1: not JSON \(nested too deeply\)"):
        read_completions(lines)
