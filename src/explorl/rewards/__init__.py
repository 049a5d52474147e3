"""Verifiable reward functions `fn(completion, answer, **meta) -> float` and the batch scorer.

Completions are untrusted model output: nothing here evaluates them, slow checkers (math-verify, which runs
sympy) run in the sandbox's worker processes under a hard time limit, and every failure scores 0 and is
counted instead of crashing the run.

- `extract_boxed`: the content of the last \\boxed{...} (bounded scan, no regex backtracking).
- `math_reward`: public API; math-verify equivalence of the last \\boxed{} with the ground truth, in the pool.
- `math_check`: the same check run in the current process (the function the workers call).
- `exact_reward`, `int_reward`: cheap in-process checks.
- `false_equations`, `verified_reward`: the stated integer equations of a response (`12+7=19`, `3 \\times 4 = 12`)
  checked by a small parser; `task.reward: verified` is the task's own checker scoring 0 when any of them is false
  (a right answer reached through wrong arithmetic). `chain_reward` (`task.reward: chain`): the response's lines
  are the problem's worked solution (`meta["solution"]`, which the `arith` task carries), an evaluation instrument.
- `RewardRunner`: scores a batch, isolated (in parallel across the worker pool) or in-process; every failure
  comes back with its text (`RewardResult.failures`); `resolve_reward`: maps one `task.reward` entry to a function.
- Rewards as TRL users write them: `WeightedRewards`, several functions scored as their weighted sum (TRL's
  `reward_funcs` with `reward_weights`; `resolve_rewards` builds it from `task.reward` and `task.reward_weights`),
  each function's scores kept apart for the `reward/<name>` metrics; `batched`, the mark of a reward called once
  per batch as `fn(completions, answers, **meta) -> list[float]`.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import math
import numbers
import os
import re
import sys
import threading
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

from explorl.rewards.sandbox import Outcome, default_workers, shared_pool

MAX_SCAN = 100_000
"""extract_boxed looks at the last this-many characters only: the final answer is at the end, and scanning
megabytes of adversarial output per sample would cost more than the answer is worth."""
MAX_DEPTH = 50
"""Brace nesting deeper than this is not a plausible answer (and makes parsers recurse); it scores 0."""
SOFT_TIMEOUT_S = 2
"""math-verify's own per-parse / per-comparison timeout (whole seconds, signal.alarm) inside a worker; it ends
most slow cases cheaply, before the pool's hard limit kills and restarts the worker."""

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_INT_RE = re.compile(r"-?\d{1,30}")
BUILTIN_REWARDS = ("auto", "math", "exact", "verified", "chain")
"""The `task.reward` entries that name explorl's own checkers (anything else is `module:function`)."""
_OP = r"(?:[-+*×]|\\times|\\cdot)"
_EQUATION_RE = re.compile(
    # an integer expression with at least one operator, `=`, an integer; not inside a longer expression (a
    # variable, a power, a decimal or a thousands separator before it; an operator, a power or a digit group after)
    r"(?<![\w,^/()*+×=-])(?<!\d\.)(-?\d{1,30}(?:[ \t]*" + _OP + r"[ \t]*-?\d{1,30}){1,20})[ \t]*=[ \t]*(-?\d{1,30})"
    r"(?![\w^/(]|[.,]\d|[ \t]*(?:[-+*×=]|\\times|\\cdot))")
_TERM_RE = re.compile(r"[ \t]*(" + _OP + r")?[ \t]*(-?\d{1,30})")


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


def _plausible_box(completion: str) -> str | None:
    """The last boxed answer if it is worth sending to a parser: present, short and not absurdly nested."""
    content = extract_boxed(completion)
    if content is None or not content.strip() or brace_depth(content) > MAX_DEPTH:
        return None
    return content


def _soft_timeout() -> int | None:
    """math-verify's timeouts use signal.alarm, which only works in the main thread: disable them elsewhere."""
    return SOFT_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


@functools.lru_cache(maxsize=4096)
def _parse_gold(answer: str) -> list:
    """math-verify parse of a ground-truth answer; bare answers are wrapped in \\boxed{} as math-verify expects."""
    from math_verify import parse

    text = answer if ("$" in answer or "\\boxed" in answer) else "\\boxed{" + answer + "}"
    gold = parse(text, parsing_timeout=_soft_timeout())
    return gold or parse(answer, parsing_timeout=_soft_timeout())


def math_check(completion: str, answer: str, **meta: Any) -> float:
    """1.0 if the last \\boxed{} of `completion` equals `answer` by math-verify, else 0.0; runs in this process.

    This is the worker-side function behind `math_reward` and the `math` reward of `RewardRunner`: call it
    through the pool (it has no hard time limit of its own). Only the boxed content reaches math-verify.
    """
    import logging

    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # it logs whole inputs on every soft timeout
    content = _plausible_box(completion)
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
    content = _plausible_box(completion)
    if content is None:  # answered here: no need to wake a worker
        return 0.0
    # Only the extracted answer travels to the worker, not a possibly huge completion.
    run = RewardRunner(math_check, isolate=True, timeout_s=timeout_s)
    return run(["\\boxed{" + content + "}"], [answer]).rewards[0]


def exact_reward(completion: str, answer: str, **meta: Any) -> float:
    """1.0 if the last \\boxed{} content, stripped, equals `answer` stripped."""
    content = extract_boxed(completion)
    return float(content is not None and content.strip() == str(answer).strip())


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
    """1.0 when the completion's non-empty lines, stripped, are those of the problem's worked solution
    (`meta["solution"]`, as the `arith` task gives it): every step right, not only the answer (`task.reward:
    chain`). ValueError when the problem carries no solution."""
    solution = meta.get("solution")
    if not isinstance(solution, str):
        raise ValueError("task.reward: chain compares a response with the problem's worked solution, and this "
                         "problem has none (meta 'solution'); the arith task provides it")
    return float(_lines(completion[-MAX_SCAN:]) == _lines(solution))


def _lines(text: str) -> list[str]:
    """The non-empty lines of `text`, stripped."""
    return [x.strip() for x in text.splitlines() if x.strip()]


def int_reward(completion: str, answer: str, **meta: Any) -> float:
    """1.0 if the last \\boxed{} holds a plain integer (optional minus, up to 30 digits) equal to int(answer)."""
    content = extract_boxed(completion, max_len=64)
    if content is None or not _INT_RE.fullmatch(content.strip()):
        return 0.0
    return float(int(content.strip()) == int(answer))


# ----------------------------------------------------------------------------------------------------------------
# batch scoring


FAILURE_EXCERPT = 300
"""Characters of a failed sample's completion and answer kept in its `RewardFailure` (for the run's error log)."""


@dataclass
class RewardFailure:
    """One sample whose reward failed or timed out (it scored 0): what happened and on which input."""

    index: int
    """Position of the sample in the scored batch."""
    kind: str
    """`error` (the function raised, or its worker died), `value` (it returned something that is not a finite
    number) or `timeout`."""
    message: str
    """One line: the exception's repr, the bad value, or the time limit."""
    detail: str
    """The traceback of an exception (from the worker); the message itself for the other kinds."""
    completion: str = ""
    """The start of the completion that was scored (at most `FAILURE_EXCERPT` characters)."""
    answer: str = ""
    """The start of the ground-truth answer."""

    @property
    def key(self) -> str:
        """What makes two failures the same for reporting: the kind, and for exceptions their type and the code
        locations of the traceback (not the message, which often quotes the input)."""
        if self.kind == "error" and self.detail != self.message:
            where = [line for line in self.detail.splitlines() if line.startswith("  File ")]
            return "\n".join(["error", self.message.split("(", 1)[0], *where])
        if self.kind == "value":  # the function's name (several rewards) and the type of the bad value
            return "value:" + self.message.split(": returned", 1)[0]
        return f"{self.kind}:{self.message}"


@dataclass
class RewardResult:
    """Scores of a batch plus how many samples failed (exception, bad value) or timed out; those score 0.
    `failures` says what happened to each of them, in batch order."""

    rewards: list[float]
    errors: int = 0
    timeouts: int = 0
    failures: list[RewardFailure] = field(default_factory=list)
    by_function: dict[str, list[float]] = field(default_factory=dict)
    """With several reward functions (`WeightedRewards`): each function's own scores (unweighted, failures 0),
    by metric name; empty for a single function."""
    judged: list[float] = field(default_factory=list)
    """The unweighted scores of the one reward entry that decides correctness (`RewardRunner`'s `judge`; failures
    0): never the weighted sum, so a format bonus cannot make a wrong answer correct (`tasks.Task.correct`)."""


def _as_score(value: Any) -> float | None:
    """A reward value as a finite float (bools and numpy scalars included), or None if it is not one."""
    if isinstance(value, numbers.Real) or getattr(value, "shape", None) == ():  # 0-d numpy / torch values too
        try:
            value = float(value)
        except (TypeError, ValueError):
            return None
        if math.isfinite(value):
            return value
    return None


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _bad_value(value: Any) -> str:
    """Why a returned value is not a score, in one line."""
    return f"{type(value).__name__}: returned {_short_repr(value)}, not a finite number (a reward must be a float)"


def _excerpt(text: Any) -> str:
    text = str(text)
    return text if len(text) <= FAILURE_EXCERPT else text[:FAILURE_EXCERPT] + f"... ({len(text)} characters)"


def _apply(fn: Callable, completion: str, answer: str, meta: dict) -> Any:
    """Call a reward function with meta as keyword arguments (the function the pool runs)."""
    return fn(completion, answer, **meta)


def _apply_batched(fn: Callable, completions: list[str], answers: list[str], columns: dict) -> Any:
    """Call a batched reward function once on the whole batch (the function the pool runs for one)."""
    return fn(completions, answers, **columns)


def _as_scores(value: Any) -> list | None:
    """A batched reward's return value as a list (list, tuple, 1-d array or tensor), or None if it is not one."""
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__len__") or getattr(value, "shape", None) == ():
        return None
    try:
        return list(value)
    except TypeError:
        return None


class RewardRunner:
    """Scores batches with `fn(completion, answer, **meta)`, a batched `fn` or a `WeightedRewards`.

    `isolate=True` runs the samples in parallel in the shared worker pool (`workers` processes; None or 0:
    `sandbox.default_workers()`, one per CPU, 2 to 16) with a hard limit of `timeout_s` per sample, so a batch
    of n hanging samples takes about `timeout_s * ceil(n / workers)`; `isolate=False` calls `fn` here (for fast
    pure functions such as `int_reward`). Exceptions, timeouts and values that are not finite numbers score 0.0,
    are counted, and are described in `RewardResult.failures` (with the traceback of an exception).

    A batched function (`is_batched`) is called once per batch, in one worker with the limit of the whole batch,
    `timeout_s * ceil(n / workers)` (or here); if it raises or times out every sample fails, if it returns the
    wrong number of scores every sample fails as a `value` failure, and each score that is not a finite number
    fails on its own. A `WeightedRewards` scores each of its functions as above, each isolated or not as its
    `RewardPart.isolate` says (the runner's `isolate` applies to a plain function only), one function after the
    other; the reward is the weighted sum, and `errors` and `timeouts` count failed calls (a sample on which two
    functions fail counts twice), each failure's message starting with its function's name.
    """

    def __init__(self, fn: Callable, *, isolate: bool, timeout_s: float = 5.0, workers: int | None = None,
                 judge: str | None = None):
        """Remember the function and how to run it; the pool is the process-wide shared one of that size. `judge`:
        the metric name (`reward_metric_name`) of the `WeightedRewards` function whose scores are `judged`; None:
        the first (a single function judges itself)."""
        self.fn, self.isolate, self.timeout_s = fn, isolate, timeout_s
        self.workers = workers if workers else default_workers()
        names = [p.name for p in fn.parts] if isinstance(fn, WeightedRewards) else []
        if judge is not None and names and judge not in names:
            raise ValueError(f"task.correct_by: {judge!r} is not one of the reward functions {names}")
        self.judge = judge if judge is not None else (names[0] if names else None)

    def __call__(self, completions: list[str], answers: list[str], metas: list[dict] | None = None) -> RewardResult:
        """Score `completions[i]` against `answers[i]` with `metas[i]` as keyword arguments."""
        metas = metas if metas is not None else [{} for _ in completions]
        if not len(completions) == len(answers) == len(metas):
            raise ValueError(f"RewardRunner: {len(completions)} completions, {len(answers)} answers, "
                             f"{len(metas)} metas")
        if not isinstance(self.fn, WeightedRewards):
            rewards, failures = self._score(self.fn, self.isolate, completions, answers, metas)
            result = self._result(rewards, failures)
            result.judged = list(rewards)
            return result
        parts = self.fn.parts
        total: list[float] = []
        failures, by_function = [], {}
        judged: list[float] = []
        for k, part in enumerate(parts):
            scores, failed = self._score(part.fn, part.isolate, completions, answers, metas)
            if part.name == self.judge:
                judged = list(scores)
            weighted = [part.weight * x for x in scores]
            total = weighted if k == 0 else [t + x for t, x in zip(total, weighted)]
            if len(parts) > 1:
                by_function[part.name] = scores
                for f in failed:
                    f.message = f"{part.name}: {f.message}"
            failures += failed
        failures.sort(key=lambda f: f.index)  # batch order; stable, so function order within a sample
        result = self._result(total, failures)
        result.by_function, result.judged = by_function, judged
        return result

    @staticmethod
    def _result(rewards: list[float], failures: list[RewardFailure]) -> RewardResult:
        timeouts = sum(f.kind == "timeout" for f in failures)
        return RewardResult(rewards, len(failures) - timeouts, timeouts, failures)

    def _score(self, fn: Callable, isolate: bool, completions: list[str], answers: list[str],
               metas: list[dict]) -> tuple[list[float], list[RewardFailure]]:
        """One function's scores of the batch (0.0 where it failed) and its failures, in batch order."""
        if not completions:
            return [], []
        if is_batched(fn):
            return self._score_batched(fn, isolate, completions, answers, metas)
        if isolate:
            preload = (fn.__module__, *getattr(fn, "preload", ()))
            outcomes = shared_pool(self.workers).map(
                _apply, [(fn, c, a, m) for c, a, m in zip(completions, answers, metas)],
                timeout_s=self.timeout_s, preload=preload)
        else:
            outcomes = [self._call_here(fn, (c, a), m) for c, a, m in zip(completions, answers, metas)]
        scores, failures = [], []
        for i, o in enumerate(outcomes):
            score = _as_score(o.value) if o.ok else None
            scores.append(0.0 if score is None else score)
            if score is not None:
                continue
            if o.timed_out:
                kind, message = "timeout", f"timed out after {self.timeout_s:g} s (task.reward_timeout_s)"
            else:
                kind, message = ("error", str(o.error)) if not o.ok else ("value", _bad_value(o.value))
            failures.append(RewardFailure(i, kind, message, o.traceback or message,
                                          _excerpt(completions[i]), _excerpt(answers[i])))
        return scores, failures

    def _score_batched(self, fn: Callable, isolate: bool, completions: list[str], answers: list[str],
                       metas: list[dict]) -> tuple[list[float], list[RewardFailure]]:
        """`_score` of a batched function: one call with the whole batch; meta as one list per key (None where a
        sample lacks the key), as TRL passes dataset columns."""
        n = len(completions)
        keys = dict.fromkeys(k for m in metas for k in m)
        columns = {k: [m.get(k) for m in metas] for k in keys}
        limit = self.timeout_s * math.ceil(n / self.workers)
        if isolate:
            preload = (fn.__module__, *getattr(fn, "preload", ()))
            (o,) = shared_pool(self.workers).map(_apply_batched, [(fn, list(completions), list(answers), columns)],
                                                 timeout_s=limit, preload=preload)
        else:
            o = self._call_here(fn, (list(completions), list(answers)), columns)

        def all_fail(kind: str, message: str, detail: str) -> tuple[list[float], list[RewardFailure]]:
            return [0.0] * n, [RewardFailure(i, kind, message, detail, _excerpt(completions[i]),
                                             _excerpt(answers[i])) for i in range(n)]

        if o.timed_out:
            message = (f"batched reward timed out after {limit:g} s (task.reward_timeout_s x ceil({n} samples / "
                       f"{self.workers} workers))")
            return all_fail("timeout", message, message)
        if not o.ok:
            return all_fail("error", str(o.error), o.traceback or str(o.error))
        values = _as_scores(o.value)
        if values is None or len(values) != n:
            what = f"{len(values)} scores" if values is not None else _short_repr(o.value)
            message = (f"{type(o.value).__name__}: returned {what} for {n} completions; a batched reward must "
                       f"return a list of {n} finite numbers, one per completion, in order")
            return all_fail("value", message, message)
        scores, failures = [], []
        for i, v in enumerate(values):
            score = _as_score(v)
            scores.append(0.0 if score is None else score)
            if score is None:
                message = f"{_bad_value(v)} (score {i} of a batched reward)"
                failures.append(RewardFailure(i, "value", message, message, _excerpt(completions[i]),
                                              _excerpt(answers[i])))
        return scores, failures

    @staticmethod
    def _call_here(fn: Callable, args: tuple, meta: dict) -> Outcome:
        """In-process call."""
        try:
            return Outcome(value=fn(*args, **meta))
        except Exception as e:
            return Outcome(error=repr(e), traceback=traceback.format_exc())


# ----------------------------------------------------------------------------------------------------------------
# several reward functions, batched ones


def batched(fn: Callable) -> Callable:
    """Mark `fn` as a batched reward, called once per batch: `fn(completions: list[str], answers: list[str],
    **meta) -> list[float]`, one score per completion in order; each meta key holds one value per completion
    (None where a sample lacks it), as TRL passes dataset columns. Returns `fn` itself (with `fn.batched = True`),
    so it stays importable by name for the worker pool."""
    fn.batched = True  # type: ignore[attr-defined]
    return fn


def is_batched(fn: Callable) -> bool:
    """Whether `fn` scores a whole batch per call: marked with `@batched` (a true `batched` attribute), or its first
    parameter is named `completions`, as TRL's reward functions are written."""
    if getattr(fn, "batched", False):
        return True
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return False
    return bool(params) and params[0] == "completions"


@dataclass(frozen=True)
class RewardPart:
    """One function of a `WeightedRewards`."""

    name: str
    """Metric name, logged as `reward/<name>` (`reward_metric_name` of its `task.reward` entry)."""
    fn: Callable
    """`fn(completion, answer, **meta) -> float`, or a batched function (`is_batched`)."""
    isolate: bool
    """Whether `fn` runs in the worker pool."""
    weight: float = 1.0
    """Its weight in the sum."""


class WeightedRewards:
    """Several reward functions scored as one: reward = sum_i weight_i * r_i, r_i the score of function i (0.0 where
    it failed), as TRL's `reward_funcs` with `reward_weights`. `RewardRunner` scores each function on the batch
    and keeps each one's scores (`RewardResult.by_function`); calling the object scores one sample here."""

    def __init__(self, parts: list[RewardPart]):
        if not parts:
            raise ValueError("WeightedRewards: no reward functions")
        self.parts = list(parts)

    @property
    def isolate(self) -> bool:
        """True when any of the functions runs in the worker pool."""
        return any(p.isolate for p in self.parts)

    def __call__(self, completion: str, answer: str, **meta: Any) -> float:
        """The weighted sum for one sample, every function called in this process, without time limit; an exception
        propagates (for direct use such as `experiments.impact`; training and evaluation use `RewardRunner`)."""
        total = 0.0
        for k, p in enumerate(self.parts):
            if is_batched(p.fn):
                value = p.fn([completion], [answer], **{key: [v] for key, v in meta.items()})[0]
            else:
                value = p.fn(completion, answer, **meta)
            total = p.weight * float(value) if k == 0 else total + p.weight * float(value)
        return total

    def __repr__(self) -> str:
        return "WeightedRewards(" + ", ".join(f"{p.weight:g} * {p.name}" for p in self.parts) + ")"


def reward_entries(spec: str | list[str]) -> list[str]:
    """The entries of `task.reward`: a list as it is, a string split at commas (`math,my_rewards:fmt`)."""
    if isinstance(spec, str):
        return [x.strip() for x in spec.split(",")] if "," in spec else [spec]
    return list(spec)


def reward_metric_name(entry: str) -> str:
    """The `<name>` of a reward's `reward/<name>` metric: its `task.reward` entry with `:` written `.` and anything
    other than letters, digits, `_`, `.` and `-` written `_` (`my_rewards:fmt` -> `my_rewards.fmt`)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", entry.strip().replace(":", "."))


def resolve_rewards(spec: str | list[str], weights: list[float] | None,
                    task_default: tuple[Callable, bool]) -> tuple[Callable, bool]:
    """Map `task.reward` and `task.reward_weights` to (fn, isolate): a single unweighted per-sample function as
    `resolve_reward` gives it, anything else (several functions, a weight other than 1, a batched function) as a
    `WeightedRewards`. ValueError names the field."""
    entries = reward_entries(spec)
    if not entries:
        raise ValueError(f"task.reward: name at least one reward function ({', '.join(BUILTIN_REWARDS)} or "
                         f"module:function)")
    weights = [1.0] * len(entries) if weights is None else [float(w) for w in weights]
    if len(weights) != len(entries):
        raise ValueError(f"task.reward_weights: {len(weights)} weight(s) for {len(entries)} reward function(s) in "
                         f"task.reward; give one weight per entry, in order (or null for all 1)")
    resolved = [resolve_reward(e, task_default) for e in entries]
    if len(entries) == 1 and weights[0] == 1.0 and not is_batched(resolved[0][0]):
        return resolved[0]
    combined = WeightedRewards([RewardPart(reward_metric_name(e), fn, isolate, w)
                                for e, (fn, isolate), w in zip(entries, resolved, weights)])
    return combined, combined.isolate


def resolve_reward(spec: str, task_default: tuple[Callable, bool]) -> tuple[Callable, bool]:
    """Map `task.reward` to (fn, isolate): `auto` keeps the task's default, `math`, `exact`, or `module:function`."""
    if spec == "auto":
        return task_default
    if spec == "math":
        return math_check, True
    if spec == "exact":
        return exact_reward, False
    if spec == "verified":
        checker, isolate = task_default
        if checker is not None and is_batched(checker):
            raise ValueError("task.reward: verified wraps the task's own per-sample checker, and this task's is "
                             "batched; write your own module:function that zeroes what false_equations flags")
        return functools.partial(verified_reward, checker=checker), isolate
    if spec == "chain":
        return chain_reward, False
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"task.reward: {spec!r} is not {', '.join(BUILTIN_REWARDS)} or module:function")
    if "" not in sys.path and os.getcwd() not in sys.path:
        # The `explorl` console script does not put the working directory on sys.path, but users expect
        # `my_rewards:fn` next to their config to work; workers inherit sys.path, so they find it too.
        sys.path.append(os.getcwd())
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except ImportError as e:
        raise ValueError(f"task.reward: cannot import module {module_name!r} ({e}). A module next to your config "
                         f"file is found there (its directory goes on run.python_path); else put its directory on "
                         f"run.python_path, or give `explorl eval` --python-path DIR") from None
    except AttributeError:
        raise ValueError(f"task.reward: module {module_name!r} has no attribute {attr!r}") from None
    if not callable(fn):
        raise ValueError(f"task.reward: {spec} is not callable")
    return fn, True  # user code may be slow or unsafe: always in the pool


# ----------------------------------------------------------------------------------------------------------------
# the checks before a run: every reward function called once on a sample


def check_rewards(spec: str | list[str], task_default: tuple[Callable, bool], answer: str | list[str],
                  completion: str | list[str], meta: dict | list[dict] | None = None, *, timeout_s: float = 5.0,
                  workers: int | None = None, max_failure_frac: float = 0.0,
                  where: list[str] | None = None) -> list[tuple[str, str]]:
    """Call every entry of `task.reward` (`spec`; `auto` is `task_default`, the task's own reward) on sample
    completions, as training calls it: through a `RewardRunner` of that function alone, so per-sample as
    `fn(completion, answer, **meta)` or batched (`is_batched`) with lists, in the worker pool or here as
    `resolve_reward` says, under the limit `timeout_s` (`task.reward_timeout_s`). `answer`, `meta` (and `where`,
    each sample's row for messages, e.g. `data.jsonl:17`) are training problems', `completion` a sample completion
    for each (its worked solution, or a boxed answer); one sample or lists of them (the checks before a run take up
    to 8 rows spread over the data).

    The run's own rule decides (`task.max_reward_failure_frac`, `max_failure_frac`): an entry that fails on more
    than that fraction of the samples raises ValueError naming `task.reward[i]`, the function, the rows and the first
    failure (with the exception's traceback): what would stop training; fewer failures give a `warning:` line
    naming the rows (training scores them 0 and counts them). An entry that cannot be imported always raises.
    Returns one (`task.reward[i]`, description) per entry, for the dry run to print."""
    answers = [answer] if isinstance(answer, str) else list(answer)
    completions = [completion] if isinstance(completion, str) else list(completion)
    metas = [dict(m or {}) for m in meta] if isinstance(meta, list) else [dict(meta or {}) for _ in answers]
    rows = list(where) if where is not None else [str(m.get("id", f"sample {i + 1}")) for i, m in enumerate(metas)]
    entries = reward_entries(spec)
    resolved = []
    for i, entry in enumerate(entries):  # all imported first, as training does, before a worker starts
        try:
            resolved.append(resolve_reward(entry, task_default))
        except ValueError as e:
            raise ValueError(str(e).replace("task.reward:", f"task.reward[{i}]:", 1)) from None
    n = len(answers)
    on = "a sample completion" if n == 1 else f"{n} sample completions (rows {', '.join(rows)})"
    lines = []
    for i, (entry, (fn, isolate)) in enumerate(zip(entries, resolved)):
        label = f"task.reward[{i}]"
        name = entry
        if entry in BUILTIN_REWARDS:
            named = getattr(fn, "func", fn)  # verified: a partial of verified_reward
            name = f"{entry} ({getattr(named, '__module__', '?')}:{getattr(named, '__qualname__', named)!s})"
        runner = RewardRunner(fn, isolate=isolate, timeout_s=timeout_s, workers=workers)
        result = runner(completions, answers, metas)
        failed = sorted({f.index for f in result.failures})
        if failed and len(failed) > max_failure_frac * n:
            raise ValueError(_failure_message(label, name, fn, result.failures[0], completions, answers, rows,
                                              len(failed), n, max_failure_frac))
        scores = ", ".join(f"{x!r}" for x in result.rewards[:8])
        if failed:
            f = result.failures[0]
            detail = f"\n{f.detail.rstrip()}" if f.detail and f.detail != f.message else ""
            lines.append((label, f"warning: {name} failed on {len(failed)} of {n} sample rows "
                                 f"({', '.join(rows[j] for j in failed)}; the first: {f.message}); training scores "
                                 f"such samples 0 and counts them, stopping only when more than "
                                 f"task.max_reward_failure_frac={max_failure_frac:g} of a step's fail{detail}"))
            continue
        lines.append((label, f"{name} returned {scores} on {on}"))
    return lines


def _failure_message(label: str, name: str, fn: Callable, f: RewardFailure, completions: list[str],
                     answers: list[str], rows: list[str], failed: int, n: int, frac: float) -> str:
    """Why `check_rewards` refuses an entry: the first failure (on which row, what it did) and the rule."""
    sample = f"completion {_short_repr(completions[f.index])}, answer {_short_repr(answers[f.index])}"
    where = f"on a sample completion ({sample})" if n == 1 else \
        f"on {failed} of {n} sample rows, more than task.max_reward_failure_frac={frac:g}; first on {rows[f.index]} " \
        f"({sample})"
    if f.kind == "timeout":
        return (f"{label}: {name} {f.message} {where}; training would score 0 on every sample it times out on. "
                f"Make the function faster or raise task.reward_timeout_s")
    if f.kind == "value":
        return (f"{label}: {name} returned a value that is not a score {where}: {f.message}; training would count "
                f"it as a failure and score 0")
    detail = f"\n{f.detail.rstrip()}" if f.detail and f.detail != f.message else ""
    call = "fn(completions, answers, **meta), batched" if is_batched(fn) else "fn(completion, answer, **meta)"
    return (f"{label}: {name} raised {f.message} when called as training calls it ({call}) {where}; training would "
            f"score 0 wherever it raises.{detail}")
