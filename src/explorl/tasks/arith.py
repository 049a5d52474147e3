"""Built-in procedural arithmetic: chains of + and - on small integers, with worked solutions.

Difficulty d means d operations on d+1 operands drawn uniformly from `task.operands` ([1, 20] by default, the
range the embedded model was trained on; another range is a test of generalisation). The prompt is the expression
followed by "=?\\n"; the worked solution evaluates left to right, one operation per line, and ends with the
boxed result. The embedded tiny model is trained on exactly this format, so keep it stable:

    prompt   "7+12-5=?\\n"
    solution "7+12=19\\n19-5=14\\n\\boxed{14}"
"""

from __future__ import annotations

import random
import re
from typing import TYPE_CHECKING, Callable

from explorl.algos.registry import register
from explorl.rewards import extract_boxed, int_reward
from explorl.tasks.base import Problem
from explorl.tasks.files import fill_template

if TYPE_CHECKING:
    from explorl.config.schema import TaskConfig

OPERANDS = (1, 20)
"""The default inclusive range of operands (`task.operands`)."""
MAX_DIFFICULTY = 12
MAX_OPERAND = 10**6
"""Operands stay below this, so prompts and worked solutions stay short."""
_EXPR_RE = re.compile(r"\d+(?:[+-]\d+)*")
_TOKEN_RE = re.compile(r"\d+|[+-]")


def operations(expr: str) -> tuple[int, list[tuple[str, int]]]:
    """The first operand and the (operator, operand) pairs of an expression such as "7+12-5", or of its prompt
    ("7+12-5=?\\n"): (7, [("+", 12), ("-", 5)])."""
    expr = expr.split("=", 1)[0]
    if not _EXPR_RE.fullmatch(expr):
        raise ValueError(f"not an expression of positive integers joined by + and -: {expr!r}")
    tokens = _TOKEN_RE.findall(expr)
    return int(tokens[0]), [(op, int(x)) for op, x in zip(tokens[1::2], tokens[2::2])]


def from_expression(expr: str) -> Problem:
    """The Problem for an expression such as "7+12-5" (positive integer operands, + and - only)."""
    if "=" in expr:
        raise ValueError(f"not an expression of positive integers joined by + and -: {expr!r}")
    value, steps = operations(expr)
    lines = []
    for op, operand in steps:
        new = value + operand if op == "+" else value - operand
        lines.append(f"{value}{op}{operand}={new}")
        value = new
    lines.append(f"\\boxed{{{value}}}")
    prompt, solution = f"{expr}=?\n", "\n".join(lines)
    return Problem(prompt=prompt, answer=str(value),
                   meta={"difficulty": len(steps), "solution": solution, "id": prompt}, solution=solution)


def make_problem(rng: random.Random, difficulty: int, operands: tuple[int, int] = OPERANDS) -> Problem:
    """A random problem with `difficulty` operations; operands uniform in the inclusive range `operands`, operators
    uniform in {+, -}."""
    lo, hi = operands
    parts = [str(rng.randint(lo, hi))]
    for _ in range(difficulty):
        parts += [rng.choice("+-"), str(rng.randint(lo, hi))]
    return from_expression("".join(parts))


def solution(problem: Problem) -> str:
    """The worked solution of an arith problem (the completion a perfect model writes)."""
    return problem.meta["solution"]


def space_size(difficulty: int, operands: tuple[int, int] = OPERANDS) -> int:
    """Number of distinct expressions with `difficulty` operations on operands in the inclusive range `operands`."""
    return (operands[1] - operands[0] + 1) ** (difficulty + 1) * 2**difficulty


def _draw_unique(rng: random.Random, difficulties: list[int], n: int, taken: set[str], what: str,
                 operands: tuple[int, int]) -> list[Problem]:
    """`n` problems whose prompts are new to `taken` (which is updated); difficulty uniform over the list."""
    out: list[Problem] = []
    budget = 50 * n + 10_000  # enough unless the space is nearly exhausted
    while len(out) < n:
        if budget == 0:
            raise ValueError(f"task.{what}_size: found only {len(out)} of {n} distinct arith problems for "
                             f"task.difficulties={difficulties}; lower task.train_size / task.eval_size or add "
                             f"harder levels")
        budget -= 1
        p = make_problem(rng, rng.choice(difficulties), operands)
        if p.prompt not in taken:
            taken.add(p.prompt)
            out.append(p)
    return out


def arith_task(difficulties: list[int], train_size: int, eval_size: int, seed: int,
               operands: tuple[int, int] = OPERANDS) -> tuple[list[Problem], list[Problem]]:
    """(train, eval) problems of mixed difficulty, deterministic for `seed`, all prompts distinct.

    Eval problems are drawn first; train problems then skip every prompt already drawn, so the splits never
    overlap and neither has duplicates.
    """
    if not difficulties or any(d < 1 for d in difficulties):
        raise ValueError(f"task.difficulties: need levels >= 1, got {difficulties}")
    total = sum(space_size(d, operands) for d in set(difficulties))
    if train_size + eval_size > total:
        raise ValueError(f"task.train_size: {train_size} train + {eval_size} eval problems exceed the {total} "
                         f"distinct expressions of task.difficulties={difficulties}")
    rng = random.Random(seed)
    taken: set[str] = set()
    eval_ = _draw_unique(rng, difficulties, eval_size, taken, "eval", operands)
    train = _draw_unique(rng, difficulties, train_size, taken, "train", operands)
    return train, eval_


def default_reward() -> tuple[Callable, bool]:
    """(int_reward, in-process): the answer is a plain integer, checked without a worker."""
    return int_reward, False


def _check_arith(cfg) -> str | None:
    d, ops = cfg.task.difficulties, cfg.task.operands
    # 12 operations: a prompt of 13 operands and a 12-line solution stay far inside the embedded model's 512 positions
    if not d or not all(1 <= x <= MAX_DIFFICULTY for x in d):
        return f"task.difficulties: levels (operations per problem) must be in 1..{MAX_DIFFICULTY}, got {d}"
    if len(ops) != 2 or not 1 <= ops[0] <= ops[1] <= MAX_OPERAND:
        return (f"task.operands: an inclusive range [low, high] with 1 <= low <= high <= {MAX_OPERAND}, got {ops} "
                f"(the default [1, 20] is the embedded model's training range)")
    return None


@register("task", "arith", reads=("difficulties", "operands", "train_size", "eval_size", "data_seed",
                                  "prompt_template"), check=_check_arith)
def load_arith(cfg: TaskConfig) -> tuple[list[Problem], list[Problem], tuple[Callable, bool], Callable]:
    """The `arith` task: (train, eval, default reward, answer extractor); answers are read from the last \\boxed{}.
    `task.prompt_template` wraps each question (`7+12-5=?\\n`, the one format the embedded model was trained on)."""
    train, eval_ = arith_task(cfg.difficulties, cfg.train_size, cfg.eval_size, cfg.data_seed, tuple(cfg.operands))
    if cfg.prompt_template != "{question}":
        for p in train + eval_:
            p.prompt = fill_template(cfg.prompt_template, p.prompt, {})
    return train, eval_, default_reward(), extract_boxed
