"""Batch scoring: `RewardRunner` scores a batch, isolated (in parallel across the sandbox's worker pool, under a hard
time limit) or in-process; every failure (an exception, a timeout, a value that is not a finite number) scores 0,
is counted and comes back with its text (`RewardResult.failures`, `RewardFailure`)."""

from __future__ import annotations

import decimal
import math
import numbers
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

from explorl.rewards.sandbox import Outcome, default_workers, shared_pool
from explorl.rewards.weighted import WeightedRewards, is_batched

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
    """A reward value as a finite float, or None if it is not one. Taken: Python numbers (bools, ints, fractions),
    `Decimal`s, numpy and torch scalars and 0-d arrays and tensors (by their `.item()`); refused: anything else
    (strings, complex numbers, arrays of several values), NaN, infinities and exact numbers too large for a float
    (an int of 400 digits). Never raises, whatever the value's conversions do."""
    try:
        if getattr(value, "shape", None) == () and hasattr(value, "item"):  # 0-d numpy / torch values
            value = value.item()
        if not isinstance(value, (numbers.Real, decimal.Decimal)):
            return None
        value = float(value)
    except Exception:  # noqa: BLE001 - OverflowError, a signalling NaN's ValueError, a user type's own error
        return None
    return value if math.isfinite(value) else None


def short_repr(value: Any) -> str:
    """`repr(value)` cut to 80 characters, for one-line messages; never raises (an int past Python's limit on
    digits for `repr`, a `__repr__` that raises) and never writes out a long string whole."""
    try:
        if isinstance(value, (str, bytes)) and len(value) > 80:
            value = value[:80]
        text = repr(value)
    except Exception as e:  # noqa: BLE001
        if isinstance(value, int):
            return f"<an int of about {int(value.bit_length() * math.log10(2)) + 1} digits>"
        return f"<a {type(value).__name__} whose repr raised {type(e).__name__}>"
    return text if len(text) <= 80 else text[:77] + "..."


def _too_large(value: Any) -> bool:
    """Whether `value` is an exact number (an int, a fraction, a finite Decimal; 0-d arrays by their `.item()`) that
    no float can hold."""
    try:
        if getattr(value, "shape", None) == () and hasattr(value, "item"):
            value = value.item()
        if isinstance(value, decimal.Decimal):
            return value.is_finite() and math.isinf(float(value))
        return isinstance(value, numbers.Rational) and math.isinf(float(value))
    except OverflowError:
        return True
    except Exception:  # noqa: BLE001
        return False


def _bad_value(value: Any) -> str:
    """Why a returned value is not a score, in one line."""
    why = ", too large for a float" if _too_large(value) else ""
    return (f"{type(value).__name__}: returned {short_repr(value)}, not a finite number{why} (a reward must be a "
            f"float)")


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
    try:
        if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__len__") or \
                getattr(value, "shape", None) == ():
            return None
        return list(value)
    except Exception:  # noqa: BLE001 - a length past sys.maxsize, a user type's own error
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
            what = f"{len(values)} scores" if values is not None else short_repr(o.value)
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
