"""File task: JSONL / JSON / Parquet rows, field names, templates, split and error messages."""

import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from explorl.config import TaskConfig
from explorl.rewards import math_check
from explorl.tasks import load_task
from explorl.tasks.files import load_file_task


def _rows(n):
    """`n` rows with numeric answers and braces in the questions."""
    return [{"problem": f"What is {i}+{i}? Use {{braces}}.", "answer": 2 * i, "solution": "..."} for i in range(n)]


def _write_jsonl(path, rows, blank_after=None):
    """Write rows as JSONL, optionally with a blank line inserted after `blank_after` rows."""
    lines = [json.dumps(r) for r in rows]
    if blank_after is not None:
        lines.insert(blank_after, "   ")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_jsonl_round_trip_and_holdout(tmp_path):
    path = _write_jsonl(tmp_path / "data.jsonl", _rows(10), blank_after=3)
    train, eval_ = load_file_task(TaskConfig(name="file", path=str(path), eval_size=3))
    assert [p.answer for p in train] == [str(2 * i) for i in range(7)]  # numbers become strings
    assert [p.answer for p in eval_] == ["14", "16", "18"]  # the last eval_size rows
    assert train[1].prompt == "What is 1+1? Use {braces}."
    # every column but the answer (passed positionally) reaches the reward; the id is file:line (blank line 4)
    assert train[0].meta == {"id": "data.jsonl:1", "problem": "What is 0+0? Use {braces}.", "solution": "..."}
    assert eval_[0].meta["id"] == "data.jsonl:9"


def test_train_size_caps_and_template(tmp_path):
    path = _write_jsonl(tmp_path / "d.jsonl", _rows(10))
    cfg = TaskConfig(name="file", path=str(path), eval_size=2, train_size=4, prompt_template="Q: {question}\nA:")
    train, eval_ = load_file_task(cfg)
    assert len(train) == 4 and len(eval_) == 2
    assert train[2].prompt == "Q: What is 2+2? Use {braces}.\nA:"


def test_custom_fields_parquet_and_eval_path(tmp_path):
    rows = [{"q": f"q{i}", "a": f"{i}/2"} for i in range(6)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    (tmp_path / "eval.json").write_text(json.dumps([{"q": "e0", "a": 1.5}, {"q": "e1", "a": "x"}]))
    cfg = TaskConfig(name="file", path=str(tmp_path / "train.parquet"), eval_path=str(tmp_path / "eval.json"),
                     prompt_field="q", answer_field="a", eval_size=1)
    train, eval_ = load_file_task(cfg)
    assert [(p.prompt, p.answer) for p in train] == [(f"q{i}", f"{i}/2") for i in range(6)]
    assert [(p.prompt, p.answer) for p in eval_] == [("e0", "1.5")]


def test_malformed_line_reports_its_number(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text('{"problem": "a", "answer": "1"}\n\n{"problem": "b", "answer": \n')
    with pytest.raises(ValueError, match=r"data.jsonl:3: not valid JSON"):
        load_file_task(TaskConfig(name="file", path=str(path), eval_size=1))


@pytest.mark.parametrize("line, column", [
    ('{"problem": "b", "answer": ', 28),          # value missing at the end of the line: just past its end
    ('{"problem": "b" "answer": 1}', 17),         # the second key, where a comma was expected
    ('{"problem": "b", "answer": 1}}', 30),       # extra data after the object
])
@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_malformed_line_reports_the_column_in_that_line(tmp_path, line, column, newline):
    path = tmp_path / "data.jsonl"
    path.write_bytes(('{"problem": "a", "answer": "1"}' + newline + line + newline).encode())
    with pytest.raises(ValueError) as e:
        load_file_task(TaskConfig(name="file", path=str(path), eval_size=1))
    assert str(e.value).startswith(f"{path}:2: not valid JSON (")
    assert str(e.value).endswith(f" at column {column})")


def test_check_file_task_reads_every_row(tmp_path):
    from explorl.tasks.files import check_file_task
    from explorl.tasks.rows import count_rows

    rows = _rows(30) + [{"problem": "p", "solution": "no answer field"}]  # row 31, line 32 (a blank line 6)
    path = _write_jsonl(tmp_path / "d.jsonl", rows, blank_after=5)
    assert count_rows(path) == 31
    cfg = TaskConfig(name="file", path=str(path), eval_size=4)
    expected = f"{path}:32: missing field 'answer' (task.answer_field='answer'); fields present: problem, solution"
    with pytest.raises(ValueError) as checked:
        check_file_task(cfg)
    with pytest.raises(ValueError) as loaded:  # the real load: the same message, word for word
        load_file_task(cfg)
    assert str(checked.value) == str(loaded.value) == expected
    good = _write_jsonl(tmp_path / "good.jsonl", _rows(30), blank_after=5)
    described = check_file_task(TaskConfig(name="file", path=str(good), eval_size=4))
    assert described == (f"file {good}: 30 rows, every one parses with fields 'problem' and 'answer'; "
                         f"held out: its last 4 rows")
    # task.eval_path: every row of it too, named as task.eval_path's file
    with pytest.raises(ValueError, match=re.escape(f"{path}:32: missing field 'answer'")):
        check_file_task(TaskConfig(name="file", path=str(good), eval_path=str(path)))
    bad_first = _write_jsonl(tmp_path / "e.jsonl", [{"question": "p", "answer": "1"}] * 3)
    with pytest.raises(ValueError, match=r"e.jsonl:1: missing field 'problem' \(task.prompt_field='problem'\); "
                                         r"fields present: question, answer"):
        check_file_task(TaskConfig(name="file", path=str(good), eval_path=str(bad_first)))
    other = _write_jsonl(tmp_path / "f.jsonl", _rows(5))
    assert check_file_task(TaskConfig(name="file", path=str(good), eval_path=str(other), eval_size=3)).endswith(
        f"held out: first 3 rows of {other} (5 rows, every one parses)")
    with pytest.raises(ValueError, match="task.eval_size: .* has 30 rows"):
        check_file_task(TaskConfig(name="file", path=str(good), eval_size=30))
    (tmp_path / "empty.jsonl").write_text("\n  \n")
    with pytest.raises(ValueError, match="task.path: .*empty.jsonl holds no rows"):
        check_file_task(TaskConfig(name="file", path=str(tmp_path / "empty.jsonl")))
    pq.write_table(pa.Table.from_pylist([{"q": f"q{i}", "a": i} for i in range(50)]), tmp_path / "t.parquet")
    assert count_rows(tmp_path / "t.parquet") == 50
    assert "50 rows" in check_file_task(TaskConfig(name="file", path=str(tmp_path / "t.parquet"), prompt_field="q",
                                                   answer_field="a", eval_size=10))


def test_parquet_and_json_rows_are_named_with_their_index(tmp_path):
    from explorl.tasks.files import check_file_task

    rows = [{"q": f"q{i}", "a": i} for i in range(30)]
    rows[19]["a"] = None  # a Parquet column has a value or null in every row: row 20 has none
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "t.parquet")
    cfg = TaskConfig(name="file", path=str(tmp_path / "t.parquet"), prompt_field="q", answer_field="a")
    expected = (f"{tmp_path / 't.parquet'}: row 20 (index 19): field 'a' (task.answer_field) must be a string or a "
                f"number, got null (the row has no value there)")
    for check in (check_file_task, load_file_task):  # the dry run's check and the real load agree
        with pytest.raises(ValueError) as e:
            check(cfg)
        assert str(e.value) == expected
    # a column the file lacks: the first row says so, with the columns it has
    with pytest.raises(ValueError, match=re.escape("t.parquet: row 1 (index 0): missing field 'answer' "
                                                   "(task.answer_field='answer'); fields present: q, a")):
        check_file_task(TaskConfig(name="file", path=str(tmp_path / "t.parquet"), prompt_field="q"))
    (tmp_path / "d.json").write_text(json.dumps([{"problem": "p", "answer": 1}] * 2 + [{"problem": "p"}]))
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path / 'd.json'}: item 3 (index 2): missing field "
                                                   f"'answer' (task.answer_field='answer'); fields present: problem")):
        check_file_task(TaskConfig(name="file", path=str(tmp_path / "d.json"), eval_size=1))


def test_rows_are_streamed_and_bad_utf8_names_its_line(tmp_path):
    from explorl.tasks.rows import RowReader

    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"problem": "a", "answer": 1}\n{"problem": "b", "answer": 2}\n{"problem": \n')
    reader = iter(RowReader(path))
    assert next(reader)[2] == {"problem": "a", "answer": 1}  # rows come one by one, before the bad line is read
    assert next(reader)[:2] == (2, f"{path}:2")
    with pytest.raises(ValueError, match=re.escape(f"{path}:3: not valid JSON")):
        next(reader)
    path.write_bytes(b'{"problem": "a", "answer": 1}\n{"problem": "\xff", "answer": 2}\n')
    with pytest.raises(ValueError, match=re.escape(f"{path}:2: not valid UTF-8 (byte 14 of the line")):
        load_file_task(TaskConfig(name="file", path=str(path), eval_size=1))


@pytest.mark.parametrize("terminal", [True, False])
def test_a_large_file_shows_a_progress_bar_on_a_terminal(tmp_path, monkeypatch, terminal):
    import io

    from rich.console import Console

    from explorl.tasks import files

    path = _write_jsonl(tmp_path / "big.jsonl", _rows(3000))
    monkeypatch.setattr(files, "LARGE_FILE_BYTES", 1000)  # "large" here: a 3000-row file of ~150 kB
    buf = io.StringIO()
    console = Console(file=buf, width=200, force_terminal=terminal, color_system=None)
    assert files.check_file_task(TaskConfig(name="file", path=str(path), eval_size=4), console=console).startswith(
        f"file {path}: 3000 rows")
    shown = buf.getvalue()
    if terminal:
        assert f"checking {path}" in shown and "kB" in shown  # bytes of the file, a transient bar
    else:
        assert shown == ""


def test_missing_field_message(tmp_path):
    rows = [{"problem": "p", "answer": "1"}] * 16 + [{"problem": "p", "solution": "s"}]
    path = _write_jsonl(tmp_path / "data.jsonl", rows)
    with pytest.raises(ValueError) as e:
        load_file_task(TaskConfig(name="file", path=str(path), eval_size=1))
    assert str(e.value) == (f"{path}:17: missing field 'answer' (task.answer_field='answer'); "
                            "fields present: problem, solution")


@pytest.mark.parametrize("row, message", [
    ({"problem": "p", "answer": [1, 2]}, "field 'answer' (task.answer_field) must be a string or a number, got list"),
    ({"problem": None, "answer": "1"}, "field 'problem' (task.prompt_field) must be a string or a number"),
    ({"problem": "p", "answer": True}, "field 'answer' (task.answer_field) must be a string or a number, got bool"),
    (["p", "1"], "expected an object with fields, got list"),
])
def test_bad_values(tmp_path, row, message):
    path = _write_jsonl(tmp_path / "d.jsonl", [{"problem": "p", "answer": "1"}, row])
    with pytest.raises(ValueError, match=re.escape(f"d.jsonl:2: {message}")):
        load_file_task(TaskConfig(name="file", path=str(path), eval_size=1))


def test_file_errors(tmp_path):
    path = _write_jsonl(tmp_path / "d.jsonl", _rows(3))
    with pytest.raises(ValueError, match="task.eval_size: .* has 3 rows"):
        load_file_task(TaskConfig(name="file", path=str(path), eval_size=3))
    with pytest.raises(ValueError, match="task.path: .* does not exist"):
        load_file_task(TaskConfig(name="file", path=str(tmp_path / "missing.jsonl")))
    with pytest.raises(ValueError, match="task.path: .* unsupported extension"):
        load_file_task(TaskConfig(name="file", path=str(tmp_path / "d.csv")))
    with pytest.raises(ValueError, match="task.eval_path: .* does not exist"):
        load_file_task(TaskConfig(name="file", path=str(path), eval_path=str(tmp_path / "nope.jsonl")))
    (tmp_path / "d.json").write_text('{"problem": "p"}')
    with pytest.raises(ValueError, match="must hold a list of objects"):
        load_file_task(TaskConfig(name="file", path=str(tmp_path / "d.json")))


def test_load_task_uses_math_verify_isolated(tmp_path):
    path = _write_jsonl(tmp_path / "d.jsonl", _rows(5))
    task = load_task(TaskConfig(name="file", path=str(path), eval_size=1))
    assert task.reward_fn is math_check and task.isolate
    assert task.reward_fn("\\boxed{4}", task.train[2].answer) == 1.0
