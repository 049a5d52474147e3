"""Cheap in-process checks of the last \\boxed{} answer: `exact_reward` (the text, stripped) and `int_reward` (a
plain integer)."""

from __future__ import annotations

import re
from typing import Any

from explorl.rewards.boxed import extract_boxed

_INT_RE = re.compile(r"-?\d{1,30}")


def exact_reward(completion: str, answer: str, **meta: Any) -> float:
    """1.0 if the last \\boxed{} content, stripped, equals `answer` stripped."""
    content = extract_boxed(completion)
    return float(content is not None and content.strip() == str(answer).strip())


def int_reward(completion: str, answer: str, **meta: Any) -> float:
    """1.0 if the last \\boxed{} holds a plain integer (optional minus, up to 30 digits) equal to int(answer)."""
    content = extract_boxed(completion, max_len=64)
    if content is None or not _INT_RE.fullmatch(content.strip()):
        return 0.0
    return float(int(content.strip()) == int(answer))
