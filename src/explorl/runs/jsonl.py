"""The files of a run directory written record by record: append-only JSONL (metrics.jsonl, samples.jsonl,
config_history.jsonl), each record flushed and fsynced, so a kill tears at most the last line; reading one back, a
torn last line dropped with a warning naming the file and line, any other line that is not JSON an error naming
them; and whole files written under a temporary name and renamed (`write_atomic`). Nothing here follows a symbolic
link planted in the run directory (`explorl.runs.nofollow`): writing, appending or renaming onto one is refused."""

from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path

from explorl.runs import nofollow
from explorl.runs.lock import RunDirWarning


def append_jsonl(path: Path, record: dict) -> None:
    """Append one record as a line, flushed and fsynced (a kill tears at most this line); never through a link."""
    with nofollow.open_append(path) as f:
        f.write(json.dumps(record, default=_json_default) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path: Path, *, torn_last_line_ok: bool = False) -> list[dict]:
    """The records of a JSONL file. A line that is not a JSON object is a ValueError naming the file and line, except,
    with `torn_last_line_ok`, the last line: a kill can tear a line only while it is being appended, so a last line
    that does not parse is an incomplete record, dropped with a `RunDirWarning` naming the file and line."""
    records = []
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError(f"a JSON {type(record).__name__}, not an object")
        except (ValueError, RecursionError) as e:  # RecursionError: brackets nested past Python's stack
            if torn_last_line_ok and i == last:
                warnings.warn(f"{path}:{i + 1}: the last line is incomplete (a kill while it was written: "
                              f"{line[:60]!r}...); dropped", RunDirWarning, stacklevel=2)
                break
            raise ValueError(f"{path}:{i + 1}: not a JSON record ({e}); the file was altered or damaged: repair or "
                             f"remove that line") from None
        records.append(record)
    return records


def drop_torn_last_line(path: Path) -> None:
    """Before appending to a JSONL file after a kill: rewrite it without a torn last line (with a warning)."""
    if path.exists() and path.stat().st_size and not path.read_bytes().endswith(b"\n"):
        _rewrite_jsonl(path, read_jsonl(path, torn_last_line_ok=True))


def _rewrite_jsonl(path: Path, records: list[dict]) -> None:
    write_atomic(path, "".join(json.dumps(r, default=_json_default) + "\n" for r in records))


def write_atomic(path: Path, text: str) -> None:
    """`path` written whole under a temporary name, fsynced and renamed: a kill leaves the old file or the new; a
    symbolic link at either name is refused (`nofollow.write_atomic`)."""
    nofollow.write_atomic(path, text)


def _json_default(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return str(x)


def clean_record(record: dict) -> dict:
    """NaN (e.g. entropy/pos with no correct response) is written as null: metrics.jsonl stays valid JSON."""
    def fix(v):
        if isinstance(v, list):
            return [fix(x) for x in v]
        return None if isinstance(v, float) and not math.isfinite(v) else v
    return {k: fix(v) for k, v in record.items()}


def truncate_jsonl(path: Path, keep) -> None:
    """On resume, keep only the records that satisfy `keep` (the rest will be recomputed identically); a torn last
    line is dropped with a warning (`read_jsonl`). The kept lines are written back as they were."""
    if not path.exists():
        return
    records = read_jsonl(path, torn_last_line_ok=True)
    lines = [line for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    kept = []
    for n, (line, record) in enumerate(zip(lines, records), 1):
        try:
            wanted = keep(record)
        except (KeyError, TypeError) as e:
            raise ValueError(f"{path}:{n}: not a record of this run ({type(e).__name__}: {e}); repair or remove that "
                             f"line") from None
        if wanted:
            kept.append(line)
    write_atomic(path, "".join(line + "\n" for line in kept))
