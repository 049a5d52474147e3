"""What stops a training run, and how, in one object (`RunGuards`): SIGINT / SIGTERM (the current step finishes,
a checkpoint is written, `--resume` continues), reward functions that fail on too many samples (`RunStopped`
before the update), losses or gradients that are not finite (the update is skipped; too many in a row stop the
run) and weights left non-finite (`RunStopped`, nothing of them written).
"""

from __future__ import annotations

import signal
import threading

from rich.markup import escape

from explorl.config import Config
from explorl.runs.failures import RewardFailureLog
from explorl.runs.log import RunLog
from explorl.train.update import NonFiniteError, NonFiniteWeightsError


class RunStopped(ValueError):
    """The run stopped itself for a reason the user has to fix (a broken reward function, non-finite weights); the
    message says what happened, what was kept and what to do. A ValueError, so `explorl train` prints it as one
    error line."""


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM stopped the run after its current step, with a checkpoint; `--resume` continues it."""


class _StopOnSignal:
    """While training, SIGINT (Ctrl-C) and SIGTERM ask the loop to stop at its next safe point (after the current
    step, with a checkpoint); a second signal aborts at once (KeyboardInterrupt, no checkpoint). Handlers can only
    be installed from the main thread; elsewhere signals keep their usual meaning."""

    def __init__(self, console):
        self.console, self.signum, self.previous = console, None, {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum
        self.console.print(f"[yellow]{signal.Signals(signum).name}[/]: the run stops after this step, with a "
                           f"checkpoint (send it again to abort at once, without one)")

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        self.previous = {}


def too_many_reward_failures(failed: float, scored: float, cfg: Config) -> bool:
    """Whether `failed` of `scored` samples is more than `task.max_reward_failure_frac` of them: the rule that stops
    a step before its update, in `explorl train`, TRL's trainer and verl's (one place, so the engines agree)."""
    return failed > cfg.task.max_reward_failure_frac * scored


def stop_if_rewards_failed(step: int, got, cfg: Config, log: RunLog, last_checkpoint: str, *,
                           failed: int | None = None, resume: str | None = None) -> None:
    """RunStopped, before the step's update, when more than `task.max_reward_failure_frac` of its samples' rewards
    failed or timed out: such a step would train on zeros. A sample counts once however many of several reward
    functions failed on it. `failed`: the count when `got.failures` holds only some of them (an engine's main
    process); `resume`: how to continue (default `explorl train --resume RUN`)."""
    failed = len({f.index for f in got.failures}) if failed is None else failed
    first = got.failures[0].message if got.failures else "on another process (its rows are not logged here)"
    if not too_many_reward_failures(failed, got.scored, cfg):
        return
    raise RunStopped(
        f"stopping before the update of step {step}: the reward failed or timed out on {failed} of "
        f"{got.scored} samples ({got.errors} errors, {got.timeouts} timeouts; more than "
        f"task.max_reward_failure_frac={cfg.task.max_reward_failure_frac:g}), so the step would train "
        f"on zeros; the weights were not changed by it. First failure: {first}; "
        f"every distinct failure, with its traceback and input, is in {log.reward_errors_path}. Fix "
        f"task.reward={cfg.task.reward} (or raise task.reward_timeout_s), then continue with "
        f"{resume or f'`explorl train --resume {log.dir}`'} (last checkpoint: {last_checkpoint}); or raise "
        f"task.max_reward_failure_frac to train anyway")


class RunGuards:
    """The guards of one run (`train`): `rewards` after scoring, `update` around the policy update, `after_step`
    once a step is logged; `stopping` / `interrupted` for a signal's stop at the next safe point."""

    def __init__(self, cfg: Config, log: RunLog, console, start: int, nonfinite_run: int = 0):
        self.cfg, self.log, self.console = cfg, log, console
        self.nonfinite_run = nonfinite_run
        self.failures = RewardFailureLog(log.reward_errors_path, console, start)
        self.signal = _StopOnSignal(console)

    def last_checkpoint(self) -> str:
        ckpts = self.log.checkpoints()
        return str(ckpts[-1]) if ckpts else "none yet, so a resume starts over from step 1"

    def rewards(self, step: int, got) -> None:
        """Record the step's reward failures; RunStopped when too many of its samples failed."""
        self.failures.record(step, got.failures, got.scored)
        stop_if_rewards_failed(step, got, self.cfg, self.log, self.last_checkpoint())

    def update(self, step: int, fn) -> dict:
        """`fn()`'s statistics with `loss/nonfinite` 0, or `{"loss/nonfinite": 1}` when its loss or gradient was not
        finite (the weights unchanged); RunStopped when it left the weights non-finite."""
        try:
            record = fn()
        except NonFiniteError as e:
            self.nonfinite_run += 1
            self.console.print(f"[bold red]step {step}: {escape(str(e))}.[/] The weights were not changed by it "
                               f"({self.nonfinite_run} such step(s) in a row; limit run.max_nonfinite_steps="
                               f"{self.cfg.run.max_nonfinite_steps}).")
            return {"loss/nonfinite": 1}
        except NonFiniteWeightsError as e:
            raise RunStopped(f"stopping at step {step}: {e}, so the weights in memory are ruined; nothing of them "
                             f"is written (no record, checkpoint or final/ for this step). Last good checkpoint: "
                             f"{self.last_checkpoint()}. Lower optim.lr (or use model.dtype=float32), then continue "
                             f"with `explorl train --resume {self.log.dir} optim.lr=...`") from None
        self.nonfinite_run = 0
        return {**record, "loss/nonfinite": 0}

    def after_step(self) -> None:
        """Stop the run when too many steps in a row had a non-finite loss or gradient."""
        if self.nonfinite_run >= self.cfg.run.max_nonfinite_steps:
            raise RuntimeError(f"stopping: {self.nonfinite_run} consecutive steps had a non-finite loss or gradient. "
                               f"Lower optim.lr, check the reward function, or raise run.max_nonfinite_steps. Last "
                               f"good checkpoint: {self.last_checkpoint()}")

    @property
    def stopping(self) -> bool:
        """A signal asked the run to stop at its next safe point."""
        return self.signal.signum is not None

    def interrupted(self, step: int) -> Interrupted:
        self.failures.print_summary()
        self.console.print(f"[yellow]stopped by {self.signal.name}[/] after step {step}/{self.cfg.run.steps}; "
                           f"checkpoint {escape(self.last_checkpoint())}; continue with `explorl train --resume "
                           f"{escape(str(self.log.dir))}`", soft_wrap=True)  # never break the command a user copies
        return Interrupted(f"stopped by {self.signal.name} after step {step}; checkpoint written")

    def close(self) -> None:
        self.signal.restore()
