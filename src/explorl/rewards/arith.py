"""Checks of a response's working, not only its answer: `false_equations`, the stated integer equations of a
response (`12+7=19`, `3 \\times 4 = 12`) checked by a small parser, behind `verified_reward` (`task.reward:
verified`: the task's own checker scoring 0 when any of them is false, a right answer reached through wrong
arithmetic); `chain_reward` (`task.reward: chain`): the response's lines are the problem's worked solution
(`meta["solution"]`, which the `arith` task carries), an evaluation instrument."""

from __future__ import annotations

import re
from typing import Any, Callable

from explorl.rewards.boxed import MAX_SCAN, extract_boxed

_OP = r"(?:[-+*×]|\\times|\\cdot)"
_EQUATION_RE = re.compile(
    # an integer expression with at least one operator, `=`, an integer; not inside a longer expression (a
    # variable, a power, a decimal or a thousands separator before it; an operator, a power or a digit group after)
    r"(?<![\w,^/()*+×=-])(?<!\d\.)(-?\d{1,30}(?:[ \t]*" + _OP + r"[ \t]*-?\d{1,30}){1,20})[ \t]*=[ \t]*(-?\d{1,30})"
    r"(?![\w^/(]|[.,]\d|[ \t]*(?:[-+*×=]|\\times|\\cdot))")
_TERM_RE = re.compile(r"[ \t]*(" + _OP + r")?[ \t]*(-?\d{1,30})")


def _evaluate_integers(expression: str) -> int:
    """The value of `12+7*3-4` (integers joined by + - * × \\times \\cdot, products first): a parser, not eval."""
    total, product = 0, None
    sign = 1
    for op, number in _TERM_RE.findall(expression):
        value = int(number)
        if op in ("*", "×", "\\times", "\\cdot") and product is not None:
            product *= value
            continue
        if product is not None:
            total += sign * product
        sign = -1 if op == "-" else 1
        product = value
    return total + sign * (product or 0)


def false_equations(text: str) -> tuple[int, int]:
    """(stated, false): how many integer equations `expression = integer` the text states, and how many of them
    are false. Only equations whose left side is integers joined by + - * (× \\times \\cdot) and whose right
    side is one integer count; anything else (variables, decimals, fractions, powers, chains `a=b=c`) is not
    checked. Bounded: the last `MAX_SCAN` characters, numbers of at most 30 digits, at most 20 operators."""
    stated = false = 0
    for m in _EQUATION_RE.finditer(text[-MAX_SCAN:]):
        stated += 1
        false += _evaluate_integers(m.group(1)) != int(m.group(2))
    return stated, false


def verified_reward(completion: str, answer: str, *, checker: Callable, **meta: Any) -> float:
    """`checker`'s score (the task's own reward), or 0 when the completion states a false integer equation
    (`false_equations`): a right answer reached through wrong arithmetic earns nothing (`task.reward: verified`)."""
    if false_equations(completion)[1]:
        return 0.0
    return checker(completion, answer, **meta)


def chain_reward(completion: str, answer: str, **meta: Any) -> float:
    """1.0 when the completion is the problem's worked solution (`meta["solution"]`, as the `arith` task gives it):
    its non-empty lines, stripped, are the solution's working lines and then its answer line, which opens with the
    solution's `\\boxed{answer}` and reads as that answer (`extract_boxed`). Every step right, not only the answer
    (`task.reward: chain`). Text after the boxed answer on its line is not work and is not judged: a policy trained
    on the answer alone can learn to write stray closing braces there (`\\boxed{-4}}}`), which version 1 of this
    judge counted as a wrong chain (`REWARD_VERSIONS`). ValueError when the problem carries no solution."""
    solution = meta.get("solution")
    if not isinstance(solution, str):
        raise ValueError("task.reward: chain compares a response with the problem's worked solution, and this "
                         "problem has none (meta 'solution'); the arith task provides it")
    lines, wanted = _lines(completion[-MAX_SCAN:]), _lines(solution)
    if len(lines) != len(wanted) or lines[:-1] != wanted[:-1]:
        return 0.0
    return float(lines[-1].startswith(wanted[-1]) and extract_boxed(lines[-1]) == extract_boxed(wanted[-1]))


def _lines(text: str) -> list[str]:
    """The non-empty lines of `text`, stripped."""
    return [x.strip() for x in text.splitlines() if x.strip()]
