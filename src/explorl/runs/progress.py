"""Training progress on the console: a rich bar on a terminal, plain lines otherwise (`Progress`)."""

from __future__ import annotations

import time

import rich.progress as rich_progress
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn


def format_duration(seconds: float) -> str:
    """h:mm:ss (m:ss under an hour)."""
    s = int(round(max(0.0, seconds)))
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


class Progress:
    """Training progress: steps done of the total, seconds per step smoothed over the last steps (an exponential
    moving average with weight `EMA` on the newest step, wall time between updates, evaluations and checkpoints
    included) and the time left at that pace, with the last step's key metrics. Each evaluation during training
    is printed as one line with its pass@k. A rich bar on a terminal; plain lines every 10 steps otherwise.

    With `compiling` (the first step of this process compiles the decoding step or the training forward), a line
    says so before the first step, and that step's time is left out of the pace: a step that compiles for two
    minutes would otherwise put an hour on the time left."""

    EMA = 0.3

    def __init__(self, console, total: int, start: int, enabled: bool = True, clock=time.monotonic,
                 compiling: bool = False):
        self.console = console
        self.total, self.start, self.clock = total, start, clock
        self.live = enabled and console.is_terminal
        self.enabled = enabled
        self.progress = None
        self.s_per_step: float | None = None
        self._last = (start, clock())
        self.compiling = compiling
        if enabled and compiling:
            console.print("compiling the decoding step and the training forward (torch.compile; first step only, "
                          "about a minute or two on the CPU; cached on disk for later runs)", highlight=False)
        if self.live:
            self.progress = rich_progress.Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                                                   TextColumn("steps"), TextColumn("{task.fields[pace]}"),
                                                   TextColumn("{task.fields[info]}"), console=console)
            self.progress.start()
            self.task = self.progress.add_task("train", total=total, completed=start, info="", pace=self.pace(start))

    @staticmethod
    def _info(rec: dict) -> str:
        def g(k):
            v = rec.get(k)
            return float("nan") if v is None else v
        failed = (rec.get("reward/errors") or 0) + (rec.get("reward/timeouts") or 0)
        return (f"reward {g('reward/mean'):.3f}  entropy {g('entropy/mean'):.3f}  "
                f"all-wrong {g('reward/all_wrong_frac'):.2f}  len {g('length/mean'):.1f}"
                + (f"  reward failures {failed}" if failed else ""))

    def pace(self, step: int) -> str:
        """`s/step` (smoothed) and the time left at that pace, once a step has been timed."""
        if self.s_per_step is None:
            return "-- s/step" + (" (first step compiled)" if step > self.start else "")
        return f"{self.s_per_step:.2f} s/step, {format_duration(self.s_per_step * (self.total - step))} left"

    def eval_line(self, step: int, rec: dict) -> str | None:
        """One line for an evaluation during training (the step's `eval/*` metrics), or None."""
        ks = sorted((k for k in rec if k.startswith("eval/pass@")), key=lambda k: int(k.split("@")[1]))
        if not ks:
            return None
        parts = [f"{k[5:]} {rec[k]:.3f}" for k in ks]
        if rec.get("eval/entropy") is not None:
            parts.append(f"entropy {rec['eval/entropy']:.3f}")
        return f"step {step}/{self.total} held-out eval: " + "  ".join(parts)

    def update(self, step: int, rec: dict) -> None:
        now = self.clock()
        last_step, last_t = self._last
        if step > last_step and self.compiling:  # the compiling step: timed, but not a pace
            self.compiling = False
            self._last = (step, now)
        elif step > last_step:
            dt = (now - last_t) / (step - last_step)
            self.s_per_step = dt if self.s_per_step is None else (1 - self.EMA) * self.s_per_step + self.EMA * dt
            self._last = (step, now)
        if not self.enabled:
            return
        line = self.eval_line(step, rec)
        if line is not None:
            self.console.print(line, highlight=False)
        if self.live:
            self.progress.update(self.task, completed=step, info=self._info(rec), pace=self.pace(step))
        elif step % 10 == 0 or step == self.start + 1 or step == self.total:
            self.console.print(f"step {step}/{self.total}: {self._info(rec)}  {self.pace(step)}", highlight=False)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
