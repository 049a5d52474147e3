"""Data files read row by row: JSONL (one object per line), JSON (a list of objects) or Parquet (`RowReader`).

Rows are streamed: JSONL line by line, Parquet batch by batch, so a large file is never held in memory whole. A
row that cannot be decoded is an error naming the file and its 1-based line (JSONL) or row / item number and 0-based
index (Parquet / JSON), e.g. `data.jsonl:17: not valid JSON (...)`; what a decoded row must hold is
`explorl.tasks.files`'s."""

from __future__ import annotations

import contextlib
import itertools
import json
from pathlib import Path
from typing import Any, Iterator

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


PARQUET_BATCH = 4096
"""Rows per Parquet batch when streaming a file (`RowReader`)."""


class RowReader:
    """The rows of one data file, streamed: `for n, where, row in RowReader(path)` gives the 1-based line (JSONL) or
    row number, the location for messages (`data.jsonl:20`, `data.parquet: row 20 (index 19)`, `data.json: item 20
    (index 19)`) and the decoded row; blank JSONL lines are skipped. JSONL is read line by line and Parquet batch by
    batch, so a large file is never held in memory whole (a JSON list is one document and is decoded whole).
    `done` out of `total` is how far the iteration has got, in `unit`s (`bytes` for JSONL and JSON, `rows` for
    Parquet), for a progress bar. Training (`load_problems`) and the checks before a run (`check_file_task`) read
    rows through this one reader, so they never disagree."""

    def __init__(self, path: str | Path, config_field: str = "task.path", batch_size: int = PARQUET_BATCH):
        """Check the file's extension and existence (errors name `config_field`); nothing is read yet but its size
        (or a Parquet file's metadata). `batch_size`: Parquet rows decoded at a time."""
        self.path = Path(path)
        self.config_field = config_field
        self.kind = _kind(self.path, config_field)
        self.batch_size = max(batch_size, 1)
        self.unit = "rows" if self.kind == "parquet" else "bytes"
        self.total = self._parquet_rows() if self.kind == "parquet" else self.path.stat().st_size
        self.done = 0

    def _parquet_error(self, e: Exception) -> ValueError:
        """The error of a file pyarrow cannot read, naming the config field."""
        return ValueError(f"{self.config_field}: {self.path} is not a readable Parquet file: {e}")

    def _parquet_rows(self) -> int:
        """Rows of a Parquet file, from its metadata."""
        import pyarrow.parquet as pq  # ~25 ms at import, paid only for a parquet file

        try:
            return pq.ParquetFile(self.path).metadata.num_rows
        except Exception as e:
            raise self._parquet_error(e) from None

    def __iter__(self) -> Iterator[tuple[int, str, Any]]:
        """(number, location, row) per row, read as it goes; ValueError naming the line (or row) at a bad one."""
        p, self.done = self.path, 0
        if self.kind == "parquet":
            import pyarrow.parquet as pq  # ~25 ms at import, paid only for a parquet file

            n = 0
            try:
                batches = pq.ParquetFile(p).iter_batches(batch_size=self.batch_size)
                for batch in batches:
                    for row in batch.to_pylist():
                        n += 1
                        self.done = n
                        yield n, f"{p}: row {n} (index {n - 1})", row
            except Exception as e:  # pyarrow's errors (a GeneratorExit from closing us is no Exception)
                raise self._parquet_error(e) from None
            return
        if self.kind == "json":
            try:
                with p.open(encoding="utf-8") as f:
                    data = json.load(f)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise ValueError(f"{p}: not valid JSON: {e}") from None
            except RecursionError:  # brackets nested past Python's stack
                raise ValueError(f"{p}: not valid JSON: nested too deeply") from None
            if not isinstance(data, list):
                raise ValueError(f"{p}: a .json file must hold a list of objects, got {type(data).__name__}")
            for i, row in enumerate(data):
                self.done = self.total * (i + 1) // len(data)
                yield i + 1, f"{p}: item {i + 1} (index {i})", row
            return
        with p.open("rb") as f:  # bytes, so progress is exact; each line decoded as UTF-8 on its own
            for n, raw in enumerate(f, start=1):
                self.done += len(raw)
                try:
                    line = raw.decode("utf-8").rstrip("\r\n")
                except UnicodeDecodeError as e:
                    raise ValueError(f"{p}:{n}: not valid UTF-8 (byte {e.start + 1} of the line: "
                                     f"{e.reason})") from None
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise _json_error(p, n, line, e) from None
                except RecursionError:  # brackets nested past Python's stack
                    raise ValueError(f"{p}:{n}: not a JSON object: nested too deeply") from None
                yield n, f"{p}:{n}", row


def read_rows(path: str | Path, config_field: str = "task.path",
              limit: int | None = None) -> list[tuple[int, str, Any]]:
    """(1-based line/row number, location for messages, decoded row) per row (`RowReader`); blank JSONL lines are
    skipped. `limit`: only the first that-many rows (JSONL and Parquet are then read only that far)."""
    reader = RowReader(path, config_field, batch_size=PARQUET_BATCH if limit is None else limit)
    with contextlib.closing(iter(reader)) as rows:  # closes the file when `limit` stops early
        return list(rows if limit is None else itertools.islice(rows, limit))


def count_rows(path: str | Path, config_field: str = "task.path") -> int:
    """Number of rows of a data file without decoding them (non-blank JSONL lines, Parquet metadata)."""
    p = Path(path)
    kind = _kind(p, config_field)
    if kind == "parquet":
        return RowReader(p, config_field).total
    if kind == "json":
        return len(read_rows(p, config_field))
    with p.open("rb") as f:
        return sum(1 for raw in f if raw.decode("utf-8", "replace").strip())
