"""Question/answer rows from JSONL (one object per line), JSON (a list of objects) or Parquet files.

Every malformed row is reported with the file, its 1-based line (JSONL) or row / item number and 0-based index
(Parquet / JSON), and what is wrong, e.g. `data.jsonl:17: missing field 'answer' (task.answer_field='answer'); fields
present: problem, solution` or `data.parquet: row 17 (index 16): missing field ...`. Rows are streamed
(`explorl.tasks.rows.RowReader`); training (`load_file_task`) and the checks before a run (`check_file_task`, every
row of every file) read them through the same code.
"""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import rich
from rich.progress import (BarColumn, DownloadColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)

from explorl.algos.registry import register
from explorl.rewards import extract_boxed, math_check
from explorl.tasks.base import PREFLIGHT_SAMPLES, Problem, spread
from explorl.tasks.rows import RowReader

if TYPE_CHECKING:
    from explorl.config.schema import TaskConfig


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
            got = "null (the row has no value there)" if row[name] is None else type(row[name]).__name__
            raise ValueError(f"{where}: field {name!r} (task.{role}_field) must be a string or a number, got {got}")
    # chat messages are used as given; a text question goes through the template
    prompt = values["prompt"] if messages else fill_template(cfg.prompt_template, values["prompt"], row)
    solution = _text(row.get(cfg.solution_field))  # optional: the worked solution `explorl sft` trains on
    return Problem(prompt=prompt, answer=values["answer"].strip(), meta=row_meta(row, row_id), messages=messages,
                   solution=solution)


POSITIONAL = ("completion", "answer", "completions", "answers")
"""Names a reward function takes positionally (`fn(completion, answer, **meta)`, batched `fn(completions, answers,
**meta)`): a column of one of these names is not passed again as a keyword (the answer column is the `answer`)."""


def row_meta(row: dict, row_id: str) -> dict:
    """The keyword arguments a row's reward functions get: every column of the row (TRL's convention: a reward
    reads the dataset's columns by name), less those named in `POSITIONAL`, and `id` (the row's own `id` column,
    else `row_id`, `file:line`)."""
    meta = {str(k): v for k, v in row.items() if k not in POSITIONAL}
    meta.setdefault("id", row_id)
    return meta


PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
"""A `{name}` in `task.prompt_template`."""


def fill_template(template: str, question: str, row: dict) -> str:
    """`task.prompt_template` for one row: `{question}` is the question (the `task.prompt_field` column) and
    `{name}` any column of the row (`{problem}`, `{context}`), as text; any other `{...}` stays as written. One pass,
    so braces inside the inserted values (LaTeX, code) are never read as placeholders."""
    def value(m: re.Match) -> str:
        name = m.group(1)
        if name == "question":
            return question
        if name not in row:
            return m.group(0)
        text = _text(row[name])
        return text if text is not None else json.dumps(row[name], ensure_ascii=False, default=str)

    return PLACEHOLDER.sub(value, template)


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
    """Every row of `path` as a Problem (streamed: the decoded rows are not kept beside the problems)."""
    name = Path(path).name
    return [to_problem(row, where, f"{name}:{n}", cfg) for n, where, row in RowReader(path, config_field)]


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


LARGE_FILE_BYTES = 20 * 2**20
LARGE_FILE_ROWS = 50_000
"""`check_rows` shows a progress bar (on a terminal) for a file larger than this many bytes or rows."""


class _Progress:
    """A transient rich progress bar over a `RowReader`, started once the file proves large; only on a terminal."""

    def __init__(self, reader: RowReader, console=None):
        """Start at once for a file known to be large (its size, a Parquet file's rows); else maybe later."""
        self.reader, self.console = reader, console if console is not None else rich.get_console()
        self.bar = None
        self.task = None
        limit = LARGE_FILE_ROWS if reader.unit == "rows" else LARGE_FILE_BYTES
        if reader.total > limit:
            self.start()

    def start(self) -> None:
        """Show the bar (once), if the console is a terminal."""
        if self.bar is not None or not self.console.is_terminal:
            return
        amount = DownloadColumn() if self.reader.unit == "bytes" else MofNCompleteColumn()
        self.bar = Progress(TextColumn("checking {task.description}"), BarColumn(), amount, TimeElapsedColumn(),
                            TimeRemainingColumn(), console=self.console, transient=True)
        self.bar.start()
        self.task = self.bar.add_task(str(self.reader.path), total=self.reader.total)

    def update(self, rows: int) -> None:
        """Called every row; refreshes the bar every 1024 rows."""
        if rows & 1023:
            return
        if self.bar is None and rows > LARGE_FILE_ROWS:
            self.start()
        if self.bar is not None:
            self.bar.update(self.task, completed=self.reader.done)

    def close(self) -> None:
        """Stop the bar; being transient, it leaves nothing on the screen."""
        if self.bar is not None:
            self.bar.stop()


def check_rows(path: str | Path, cfg: TaskConfig, config_field: str, console=None) -> int:
    """Read every row of `path` as training does (`RowReader` and `to_problem`, with the configured fields and
    template) without keeping any; returns the number of rows. The first malformed row raises the ValueError the
    real load raises: the file and line (JSONL) or row / item with its index (Parquet / JSON), what is wrong, and
    for a missing field its name and the fields the row has. A large file (> 20 MB or 50,000 rows) shows a
    progress bar when `console` (default: rich's) is a terminal."""
    reader = RowReader(path, config_field)
    name = Path(path).name
    progress = _Progress(reader, console)
    rows = 0
    try:
        with contextlib.closing(iter(reader)) as it:
            for n, where, row in it:
                to_problem(row, where, f"{name}:{n}", cfg)
                rows += 1
                progress.update(rows)
    finally:
        progress.close()
    return rows


def check_file_task(cfg: TaskConfig, console=None) -> str:
    """What `load_file_task` needs, checked before a run without keeping the data: the files exist, EVERY row of
    `task.path` and `task.eval_path` parses with the configured fields and template (`check_rows`, streamed; a
    progress bar on a terminal for large files), and the split leaves training and held-out rows. Returns a
    one-line description; raises ValueError naming the field, or the file and line of the first malformed row,
    like the real load."""
    if not cfg.path:
        raise ValueError("task.path: the `file` task needs a .jsonl, .json or .parquet file")
    total = check_rows(cfg.path, cfg, "task.path", console)
    if not total:
        raise ValueError(f"task.path: {cfg.path} holds no rows")
    fields = f"{cfg.prompt_field!r} and {cfg.answer_field!r}"
    described = f"file {cfg.path}: {total} rows, every one parses with fields {fields}"
    if cfg.eval_path:
        same = Path(cfg.eval_path).resolve() == Path(cfg.path).resolve()
        n_eval = total if same else check_rows(cfg.eval_path, cfg, "task.eval_path", console)
        if not n_eval:
            raise ValueError(f"task.eval_path: {cfg.eval_path} holds no rows")
        split = f"held out: first {min(cfg.eval_size, n_eval)} rows of {cfg.eval_path}"
        if not same:
            split += f" ({n_eval} rows, every one parses)"
    else:
        if total <= cfg.eval_size:
            raise ValueError(f"task.eval_size: {cfg.path} has {total} rows; holding out the last "
                             f"eval_size={cfg.eval_size} would leave none for training. Lower task.eval_size "
                             f"or give task.eval_path")
        split = f"held out: its last {cfg.eval_size} rows"
    return f"{described}; {split}"


def spread_problems(cfg: TaskConfig, k: int = PREFLIGHT_SAMPLES) -> list[Problem]:
    """Up to `k` training problems spread evenly over the training rows of `task.path` (the first and the last
    included), read in one streamed pass that keeps at most 4k rows: every row is a candidate until 4k are kept,
    then every other one is dropped and only every second row after that is kept, and so on."""
    if not cfg.path:
        raise ValueError("task.path: the `file` task needs a .jsonl, .json or .parquet file")
    kept: list[tuple[int, str, Any]] = []
    stride, total = 1, 0
    with contextlib.closing(iter(RowReader(cfg.path, "task.path"))) as rows:
        for index, (n, where, row) in enumerate(rows):
            total = index + 1
            if index % stride == 0:
                kept.append((n, where, row))
                if len(kept) >= 4 * k:
                    kept, stride = kept[::2], stride * 2
            last = (n, where, row)
    if not total:
        raise ValueError(f"task.path: {cfg.path} holds no rows")
    train_rows = total if cfg.eval_path else max(total - cfg.eval_size, 1)
    train_rows = min(train_rows, cfg.train_size)
    candidates = [r for i, r in enumerate(kept) if i * stride < train_rows]
    if train_rows == total and candidates[-1] is not last:
        candidates.append(last)  # the last training row too
    name = Path(cfg.path).name
    return [to_problem(row, where, f"{name}:{n}", cfg) for n, where, row in spread(candidates, k)]


def preflight_sample(cfg: TaskConfig) -> tuple[list[Problem], tuple[Callable, bool]]:
    """(up to 8 training problems spread over `task.path`'s training rows, default reward) without loading the task:
    what the checks before a run call `task.reward` on (the registry's `preflight_sample` of the `file` task)."""
    return spread_problems(cfg), default_reward()


def default_reward() -> tuple[Callable, bool]:
    """(math_check, isolated): math-verify equivalence of the last \\boxed{} with the answer, in the worker pool."""
    return math_check, True


def _check_file(cfg) -> str | None:
    return None if cfg.task.path else "task.path: the `file` task needs a path to a .jsonl or .parquet file"


@register("task", "file", reads=("path", "eval_path", "prompt_field", "answer_field", "solution_field",
                                 "prompt_template", "train_size", "eval_size"),
          check=_check_file, preflight=check_file_task, preflight_sample=preflight_sample)
def load_file(cfg: TaskConfig) -> tuple[list[Problem], list[Problem], tuple[Callable, bool], Callable]:
    """The `file` task: (train, eval, default reward, answer extractor); answers are read from the last \\boxed{}."""
    train, eval_ = load_file_task(cfg)
    return train, eval_, default_reward(), extract_boxed
