"""What was sampled, in numbers: quality issues, token categories and case studies of saved completions.

`explorl eval --save-completions FILE` writes one JSON line per sampled completion (`COMPLETION_FIELDS`);
`explorl analyze FILE` reads it back through `read_completions` and `completions_report`:
- quality-issue rates (STILL section 3.1, Fig. 3d and Table 5: format, repetition, language mixing), over all
  completions and separately over correct and incorrect ones; the boxed-answer format rate (ERPO's);
- token categories (STILL section 3.3, Table 1 / Fig. 5d: formal, logical, metacognitive, semantic) counted
  over the completions' words (`analysis.text.token_category`; words, not model tokens, since a file of text
  carries no tokenizer), for correct and incorrect completions;
- case studies: the first few completions showing each issue, with their problem and reward.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from explorl.analysis.text import (CATEGORIES, REDUNDANCY_THRESHOLD, category_counts, format_issue, language_mixing,
                                   quality_report, repetition_issue)

COMPLETION_FIELDS = ("problem", "sample", "prompt", "answer", "completion", "extracted", "reward", "correct")
"""The keys of one line of a completions file (`problem`: the problem's id; `sample`: 0-based index among its n)."""
ISSUES = {"format": format_issue, "repetition": repetition_issue, "language_mixing": language_mixing}
_WORD = re.compile(r"\S+")


def read_completions(path: str | Path) -> list[dict]:
    """The rows of a completions file; a malformed line is reported with its number."""
    path = Path(path)
    rows = []
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{i}: not JSON ({e.msg})") from None
            except RecursionError:  # brackets nested past Python's stack
                raise ValueError(f"{path}:{i}: not JSON (nested too deeply)") from None
            missing = [k for k in ("completion", "correct") if k not in row]
            if not isinstance(row, dict) or missing:
                raise ValueError(f"{path}:{i}: a completions line needs the keys {', '.join(COMPLETION_FIELDS)} "
                                 f"(missing: {', '.join(missing) or 'a JSON object'}); write the file with "
                                 f"`explorl eval --save-completions`")
            rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no completions")
    return rows


def words(texts: Iterable[str]) -> list[str]:
    return [w for t in texts for w in _WORD.findall(t)]


def completions_report(rows: Sequence[dict], *, cases: int = 3, threshold: float = REDUNDANCY_THRESHOLD,
                       excerpt: int = 400) -> dict:
    """Quality-issue rates, token categories and case studies of saved completions (module docstring).

    Returns `{"n", "accuracy", "quality": {"all"|"correct"|"incorrect": quality_report or None},
    "format_rate", "categories": {"correct"|"incorrect": {category: {"count", "share"}}}, "cases": {issue:
    [{problem, sample, reward, correct, excerpt}]}}`; `excerpt` characters of each case's completion.
    """
    if not rows:
        raise ValueError("completions_report: no completions")
    texts = [str(r["completion"]) for r in rows]
    correct = [bool(r["correct"]) for r in rows]
    by = {"all": texts, "correct": [t for t, c in zip(texts, correct) if c],
          "incorrect": [t for t, c in zip(texts, correct) if not c]}
    quality = {k: quality_report(v, threshold=threshold) if v else None for k, v in by.items()}
    categories = {}
    for k in ("correct", "incorrect"):
        counts = category_counts(words(by[k]))
        total = sum(counts.values())
        categories[k] = {c: {"count": counts[c], "share": counts[c] / total if total else 0.0} for c in CATEGORIES}
    found: dict[str, list[dict]] = {name: [] for name in ISSUES}
    for row, text in zip(rows, texts):
        for name, check in ISSUES.items():
            if len(found[name]) < cases and (check(text, threshold) if name == "repetition" else check(text)):
                found[name].append({"problem": row.get("problem"), "sample": row.get("sample"),
                                    "reward": row.get("reward"), "correct": bool(row["correct"]),
                                    "excerpt": text[:excerpt]})
    return {"n": len(rows), "accuracy": sum(correct) / len(rows), "quality": quality,
            "format_rate": 1.0 - quality["all"]["format"], "categories": categories, "cases": found}
