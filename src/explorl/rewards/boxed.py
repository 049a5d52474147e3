"""The final answer of a response: the content of its last \\boxed{...} (or \\fbox{...}), found by a bounded,
brace-matching scan (no regex backtracking), and whether it is worth sending to a parser (`plausible_box`)."""

from __future__ import annotations

import re

MAX_SCAN = 100_000
"""extract_boxed looks at the last this-many characters only: the final answer is at the end, and scanning
megabytes of adversarial output per sample would cost more than the answer is worth."""
MAX_DEPTH = 50
"""Brace nesting deeper than this is not a plausible answer (and makes parsers recurse); it scores 0."""

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")


def closing_brace(text: str, start: int, stop: int | None = None) -> int:
    """Index of the `}` closing a brace opened just before `start`, or -1 if none before `stop`.

    Nested braces are matched; a backslash escapes the next character, so `\\{` and `\\}` do not count.
    Linear in the scanned length.
    """
    depth, i = 1, start
    stop = len(text) if stop is None else min(stop, len(text))
    while i < stop:
        c = text[i]
        if c == "\\":
            i += 2  # an escaped character, e.g. \{ or \\
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1


def extract_boxed(text: str, max_len: int = 2000) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}) in `text`, brace-matched; None if absent or unbalanced.

    Escaped braces (`\\{`, `\\}`) do not count. Only the last `MAX_SCAN` characters are examined, and content
    longer than `max_len` gives None, so the cost is bounded on any input.
    """
    if not isinstance(text, str):
        return None
    tail = text[-MAX_SCAN:]
    last = None
    for last in _BOX_RE.finditer(tail):
        pass
    if last is None:
        return None
    start = last.end()
    end = closing_brace(tail, start, start + max_len + 1)
    return tail[start:end] if end >= 0 else None  # None: unbalanced, or longer than max_len


def brace_depth(s: str) -> int:
    """Maximum nesting depth of unescaped braces in `s`."""
    depth = deepest = 0
    escaped = False
    for c in s:
        if escaped:
            escaped = False
        elif c == "\\":
            escaped = True
        elif c == "{":
            depth += 1
            deepest = max(deepest, depth)
        elif c == "}":
            depth -= 1
    return deepest


def plausible_box(completion: str) -> str | None:
    """The last boxed answer if it is worth sending to a parser: present, short and not absurdly nested."""
    content = extract_boxed(completion)
    if content is None or not content.strip() or brace_depth(content) > MAX_DEPTH:
        return None
    return content
