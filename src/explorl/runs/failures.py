"""The reward failures of a run: RUN/reward_errors.log, written failure by failure, and what the console says of
them (`RewardFailureLog`)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from rich.markup import escape

from explorl.runs import nofollow


class RewardFailureLog:
    """The reward failures of a run (`rewards.RewardFailure`s, as collected per step).

    Every distinct failure (by `RewardFailure.key`, at most `MAX_DISTINCT`) is appended to RUN/reward_errors.log
    with its step, input and traceback. On the console: the first failure's traceback once per run, with the
    step's count; afterwards one line for each step that brings a new kind of failure; and `summary()` at the end.
    """

    MAX_DISTINCT = 100

    def __init__(self, path: Path, console, start_step: int = 0):
        self.path, self.console = Path(path), console
        self.start_step = start_step
        self.seen: set[str] = set()
        self.errors = self.timeouts = self.steps = 0
        self.first = None

    def record(self, step: int, failures: list, scored: int) -> None:
        """Report the failures of training step `step` (1-based), out of `scored` samples."""
        if not failures:
            return
        self.steps += 1
        timeouts = sum(f.kind == "timeout" for f in failures)
        self.timeouts += timeouts
        self.errors += len(failures) - timeouts
        new: list = []  # the first failure of each kind not seen before, in batch order
        for f in failures:
            if f.key not in self.seen and all(f.key != x.key for x in new):
                new.append(f)
        logged = new[:max(0, self.MAX_DISTINCT - len(self.seen))]
        self.seen.update(f.key for f in new)
        failed = len({f.index for f in failures})  # samples (several reward functions may fail on one)
        if logged:
            self._write(step, logged, failed, scored, truncated=len(logged) < len(new))
        counts = f"{failed} of {scored} samples ({len(failures) - timeouts} errors, {timeouts} timeouts)"
        if self.first is None:
            self.first = failures[0]
            self.console.print(f"[bold red]reward function failed[/] at step {step} on {counts}; the first "
                               f"failure (sample {self.first.index}, answer {escape(repr(self.first.answer))}):")
            self.console.print(self.first.detail.rstrip(), markup=False, highlight=False)
            more = f"{len(failures) - 1} more failure(s) in this step. " if len(failures) > 1 else ""
            self.console.print(f"{more}Failed samples score 0 and are counted (reward/errors, reward/timeouts); "
                               f"every distinct failure is logged to {escape(str(self.path))}", highlight=False)
        elif new:
            self.console.print(f"[red]step {step}: a new kind of reward failure[/] ({counts}): "
                               f"{escape(new[0].message)}; see {escape(str(self.path))}", highlight=False)

    def _write(self, step: int, failures: list, failed: int, scored: int, truncated: bool) -> None:
        with nofollow.open_append(self.path) as f:  # record by record, each flushed (a kill tears at most the last)
            if self.start_step is not None:
                f.write(f"##### {time.strftime('%Y-%m-%d %H:%M:%S')}: run started at step {self.start_step + 1}\n")
                f.flush()
                self.start_step = None
            for x in failures:
                detail = "" if x.detail == x.message else x.detail.rstrip() + "\n"
                f.write(f"=== step {step}, sample {x.index} ({failed} of {scored} samples of the step failed): "
                        f"{x.kind}: {x.message}\nanswer: {x.answer!r}\ncompletion: {x.completion!r}\n{detail}\n")
                f.flush()
            if truncated:
                f.write(f"(more than {self.MAX_DISTINCT} distinct failures: the others are only counted)\n")
            f.flush()
            os.fsync(f.fileno())

    def summary(self) -> str | None:
        """One line with the run's totals, or None when nothing failed."""
        if not self.steps:
            return None
        return (f"reward failures in this run: {self.errors} errors and {self.timeouts} timeouts over {self.steps} "
                f"step(s), {len(self.seen)} distinct; details in {self.path}")

    def print_summary(self) -> None:
        """`summary()` on the console, when anything failed."""
        line = self.summary()
        if line:
            self.console.print(line, markup=False, highlight=False)
