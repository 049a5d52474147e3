"""Question/answer rows from JSONL (one object per line), JSON (a list of objects) or Parquet files.

Every malformed row is reported with the file, its 1-based line (JSONL) or row number, and what is wrong,
e.g. `data.jsonl:17: missing field 'answer' (task.answer_field='answer'); fields present: problem, solution`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from explorl.algos.registry import register
from explorl.tasks.base import Problem

if TYPE_CHECKING:
    from explorl.config.schema import TaskConfig

SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".parquet": "parquet", ".pq": "parquet"}


def _kind(p: Path, config_field: str) -> str:
    kind = SUFFIXES.get(p.suffix.lower())
    if kind is None:
        raise ValueError(f"{config_field}: {p} has an unsupported extension; use one of {', '.join(SUFFIXES)}")
    if not p.is_file():
        raise ValueError(f"{config_field}: {p} does not exist or is not a file")
    return kind


def _json_error(p: Path, n: int, line: str, e: json.JSONDecodeError) -> ValueError:
    """`file:line: not valid JSON (... at column c)` with c the 1-based column of the error in that line (an
    error at the end of the line, such as a missing value, points just past its last character)."""
    return ValueError(f"{p}:{n}: not valid JSON ({e.msg} at column {min(e.pos, len(line)) + 1})")


def read_rows(path: str | Path, config_field: str = "task.path",
              limit: int | None = None) -> list[tuple[int, str, Any]]:
    """(1-based line/row number, location for messages, decoded row) per row; blank JSONL lines are skipped.
    `limit`: only the first that-many rows (JSONL and Parquet are then read only that far)."""
    p = Path(path)
    kind = _kind(p, config_field)
    if kind == "parquet":
        import pyarrow.parquet as pq

        try:
            if limit is None:
                rows = pq.read_table(p).to_pylist()
            else:
                batch = next(pq.ParquetFile(p).iter_batches(batch_size=max(limit, 1)), None)
                rows = [] if batch is None else batch.to_pylist()[:limit]
        except Exception as e:
            raise ValueError(f"{config_field}: {p} is not a readable Parquet file: {e}") from None
        return [(n, f"{p}: row {n}", row) for n, row in enumerate(rows, start=1)]
    if kind == "json":
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{p}: not valid JSON: {e}") from None
        if not isinstance(data, list):
            raise ValueError(f"{p}: a .json file must hold a list of objects, got {type(data).__name__}")
        return [(n, f"{p}: item {n}", row) for n, row in enumerate(data[:limit], start=1)]
    rows = []
    with p.open(encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if limit is not None and len(rows) >= limit:
                break
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            try:
                rows.append((n, f"{p}:{n}", json.loads(line)))
            except json.JSONDecodeError as e:
                raise _json_error(p, n, line, e) from None
    return rows


def count_rows(path: str | Path, config_field: str = "task.path") -> int:
    """Number of rows of a data file without decoding them (non-blank JSONL lines, Parquet metadata)."""
    p = Path(path)
    kind = _kind(p, config_field)
    if kind == "parquet":
        import pyarrow.parquet as pq

        try:
            return pq.ParquetFile(p).metadata.num_rows
        except Exception as e:
            raise ValueError(f"{config_field}: {p} is not a readable Parquet file: {e}") from None
    if kind == "json":
        return len(read_rows(p, config_field))
    with p.open(encoding="utf-8") as f:
        return sum(1 for line in f if line.strip())


def _text(value: Any) -> str | None:
    """A question or answer value as text: strings as they are, numbers (not booleans) via str()."""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return None


def to_problem(row: Any, where: str, row_id: str, cfg: TaskConfig) -> Problem:
    """One row as a Problem; raises ValueError starting with `where` (file and line) and saying what is wrong."""
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected an object with fields, got {type(row).__name__}")
    values = {}
    messages = None
    for role, name in (("prompt", cfg.prompt_field), ("answer", cfg.answer_field)):
        if name not in row:
            raise ValueError(f"{where}: missing field {name!r} (task.{role}_field={name!r}); "
                             f"fields present: {', '.join(map(str, row)) or 'none'}")
        if role == "prompt" and isinstance(row[name], list):  # a conversational row, as TRL's datasets have
            messages = _messages(row[name], f"{where}: field {name!r} (task.prompt_field)")
            values[role] = "\n".join(m["content"] for m in messages)
            continue
        values[role] = _text(row[name])
        if values[role] is None:
            raise ValueError(f"{where}: field {name!r} (task.{role}_field) must be a string or a number, "
                             f"got {type(row[name]).__name__}")
    # str.replace, not str.format: questions are full of braces (LaTeX, code). Chat messages are used as given.
    prompt = values["prompt"] if messages else cfg.prompt_template.replace("{question}", values["prompt"])
    solution = _text(row.get(cfg.solution_field))  # optional: the worked solution `explorl sft` trains on
    return Problem(prompt=prompt, answer=values["answer"].strip(), meta={"id": row_id}, messages=messages,
                   solution=solution)


CHAT_ROLES = ("system", "user", "assistant")


def _messages(value: list, where: str) -> list[dict]:
    """A list of chat messages, checked: objects with a `role` in CHAT_ROLES and a string `content`."""
    if not value:
        raise ValueError(f"{where}: an empty list of messages")
    out = []
    for i, m in enumerate(value):
        if not (isinstance(m, dict) and m.get("role") in CHAT_ROLES and isinstance(m.get("content"), str)):
            raise ValueError(f"{where}: message {i} must be an object with a role ({', '.join(CHAT_ROLES)}) and a "
                             f"string content, got {m!r:.80}")
        out.append({"role": m["role"], "content": m["content"]})
    return out


def load_problems(path: str | Path, cfg: TaskConfig, config_field: str) -> list[Problem]:
    """Every row of `path` as a Problem."""
    name = Path(path).name
    return [to_problem(row, where, f"{name}:{n}", cfg) for n, where, row in read_rows(path, config_field)]


def load_file_task(cfg: TaskConfig) -> tuple[list[Problem], list[Problem]]:
    """(train, eval) from `cfg.path` and `cfg.eval_path`; without an eval file the last `eval_size` rows are held out.

    `train_size` keeps the first that-many training rows; `eval_size` caps the eval rows.
    """
    if not cfg.path:
        raise ValueError("task.path: the `file` task needs a .jsonl, .json or .parquet file")
    rows = load_problems(cfg.path, cfg, "task.path")
    if cfg.eval_path:
        eval_ = load_problems(cfg.eval_path, cfg, "task.eval_path")[: cfg.eval_size]
        train = rows
    else:
        if len(rows) <= cfg.eval_size:
            raise ValueError(f"task.eval_size: {cfg.path} has {len(rows)} rows; holding out the last "
                             f"eval_size={cfg.eval_size} would leave none for training. Lower task.eval_size "
                             f"or give task.eval_path")
        train, eval_ = rows[: -cfg.eval_size], rows[-cfg.eval_size:]
    if not train or not eval_:
        raise ValueError(f"task.path: no {'training' if not train else 'eval'} rows found")
    return train[: cfg.train_size], eval_


def check_file_task(cfg: TaskConfig, rows: int = 8) -> str:
    """What `load_file_task` needs, checked cheaply before a run: the files exist, their first `rows` rows parse
    with the configured fields and template, and the split leaves training and held-out rows. Returns a one-line
    description; raises ValueError naming the field (and file and line) like the real load."""
    if not cfg.path:
        raise ValueError("task.path: the `file` task needs a .jsonl, .json or .parquet file")
    for field, path in (("task.path", cfg.path), ("task.eval_path", cfg.eval_path)):
        if not path:
            continue
        head = read_rows(path, field, limit=rows)
        if not head:
            raise ValueError(f"{field}: {path} holds no rows")
        for n, where, row in head:
            to_problem(row, where, f"{Path(path).name}:{n}", cfg)
    total = count_rows(cfg.path, "task.path")
    if cfg.eval_path:
        split = f"held out: first {min(cfg.eval_size, count_rows(cfg.eval_path, 'task.eval_path'))} rows of " \
                f"{cfg.eval_path}"
    else:
        if total <= cfg.eval_size:
            raise ValueError(f"task.eval_size: {cfg.path} has {total} rows; holding out the last "
                             f"eval_size={cfg.eval_size} would leave none for training. Lower task.eval_size "
                             f"or give task.eval_path")
        split = f"held out: its last {cfg.eval_size} rows"
    fields = f"{cfg.prompt_field!r} and {cfg.answer_field!r}"
    return f"file {cfg.path}: {total} rows, the first ones parse with fields {fields}; {split}"


def default_reward() -> tuple[Callable, bool]:
    """(math_check, isolated): math-verify equivalence of the last \\boxed{} with the answer, in the worker pool."""
    from explorl.rewards import math_check

    return math_check, True


def _check_file(cfg) -> str | None:
    return None if cfg.task.path else "task.path: the `file` task needs a path to a .jsonl or .parquet file"


@register("task", "file", reads=("path", "eval_path", "prompt_field", "answer_field", "solution_field",
                                 "prompt_template", "train_size", "eval_size"),
          check=_check_file, preflight=check_file_task)
def load_file(cfg: TaskConfig) -> tuple[list[Problem], list[Problem], tuple[Callable, bool], Callable]:
    """The `file` task: (train, eval, default reward, answer extractor); answers are read from the last \\boxed{}."""
    from explorl.rewards import extract_boxed

    train, eval_ = load_file_task(cfg)
    return train, eval_, default_reward(), extract_boxed
