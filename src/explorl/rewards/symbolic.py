"""Math answers compared by math-verify (which runs sympy): `math_check`, the check itself as the worker processes
run it, and `math_reward`, the public function that runs it in the sandbox's pool under a hard time limit."""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any

from explorl.rewards.boxed import plausible_box
from explorl.rewards.runner import RewardRunner

SOFT_TIMEOUT_S = 2
"""math-verify's own per-parse / per-comparison timeout (whole seconds, signal.alarm) inside a worker; it ends
most slow cases cheaply, before the pool's hard limit kills and restarts the worker."""


def _soft_timeout() -> int | None:
    """math-verify's timeouts use signal.alarm, which only works in the main thread: disable them elsewhere."""
    return SOFT_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


@functools.lru_cache(maxsize=4096)
def _parse_gold(answer: str) -> list:
    """math-verify parse of a ground-truth answer; bare answers are wrapped in \\boxed{} as math-verify expects."""
    from math_verify import parse  # ~50 ms at import, paid only by the math checker

    text = answer if ("$" in answer or "\\boxed" in answer) else "\\boxed{" + answer + "}"
    gold = parse(text, parsing_timeout=_soft_timeout())
    return gold or parse(answer, parsing_timeout=_soft_timeout())


def math_check(completion: str, answer: str, **meta: Any) -> float:
    """1.0 if the last \\boxed{} of `completion` equals `answer` by math-verify, else 0.0; runs in this process.

    This is the worker-side function behind `math_reward` and the `math` reward of `RewardRunner`: call it
    through the pool (it has no hard time limit of its own). Only the boxed content reaches math-verify.
    """
    from math_verify import parse, verify  # ~50 ms at import, paid only by the math checker

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # it logs whole inputs on every soft timeout
    content = plausible_box(completion)
    if content is None:
        return 0.0
    gold = _parse_gold(str(answer).strip())
    pred = parse("\\boxed{" + content + "}", parsing_timeout=_soft_timeout())
    return float(bool(gold) and bool(pred) and verify(gold, pred, timeout_seconds=_soft_timeout()))


math_check.preload = ("math_verify",)  # type: ignore[attr-defined]  # imported when a worker starts


def math_reward(completion: str, answer: str, timeout_s: float = 5.0) -> float:
    """1.0 when the completion's final answer (last \\boxed{...}) equals `answer` by math-verify, else 0.0.

    Runs in the shared worker pool with a hard limit of `timeout_s` seconds, so it is safe on adversarial
    output, from any thread; a timeout or an error scores 0.0.
    """
    content = plausible_box(completion)
    if content is None:  # answered here: no need to wake a worker
        return 0.0
    # Only the extracted answer travels to the worker, not a possibly huge completion.
    run = RewardRunner(math_check, isolate=True, timeout_s=timeout_s)
    return run(["\\boxed{" + content + "}"], [answer]).rewards[0]
