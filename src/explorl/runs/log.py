"""A run directory and what is written to it: config.yaml, metrics.jsonl, samples.jsonl, reward_errors.log,
checkpoints/, final/, eval.json (`RunLog`).

The append-only files (metrics.jsonl, samples.jsonl, config_history.jsonl, reward_errors.log) are written record by
record, each flushed (`explorl.runs.jsonl`); on resume the records and samples of steps after the checkpoint, and the
final evaluation line, are dropped (they will be recomputed identically), and a last line a kill tore is dropped with
a warning naming the file and line; any other line that is not JSON is an error naming them. eval.json is written
last, after final/: a run directory whose eval.json has the last step is complete. One process writes a run
directory: `RunLog.open` takes its lock (`explorl.runs.lock`) before writing anything and `close` releases it. A run
directory holds no symbolic links: `open` refuses one planted among its entries or its checkpoints' before any work,
and every write goes through `explorl.runs.nofollow`, which never follows one.

The rest of the run directory's work has a module each: checkpoints and the RNG state they hold
(`explorl.runs.checkpoints`), the per-step metrics (`explorl.runs.metrics`), the reward failure log
(`explorl.runs.failures`), the progress bar (`explorl.runs.progress`), final/ and its model card
(`explorl.runs.final`).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import yaml

from explorl.config.files import read_yaml
from explorl.runs import nofollow
from explorl.runs.checkpoints import checkpoint_dirs, save_checkpoint
from explorl.runs.final import save_final_model
from explorl.runs.jsonl import append_jsonl, clean_record, drop_torn_last_line, truncate_jsonl, write_atomic
from explorl.runs.lock import RunLock, check_out_dir, holds_steps, is_explorl_run, refuse_if_locked, refuse_links_in_run
from explorl.runs.tracking import Trackers


class RunLog:
    """The files of one run directory."""

    def __init__(self, run_dir: Path):
        self.dir = Path(run_dir)
        self.metrics_path = self.dir / "metrics.jsonl"
        self.samples_path = self.dir / "samples.jsonl"
        self.reward_errors_path = self.dir / "reward_errors.log"
        self.trackers = None
        """`tracking.Trackers` (run.report_to): every metrics record also goes to them."""
        self.lock: RunLock | None = None
        """The directory's lock while this object writes it (`open`), released by `close`."""

    @classmethod
    def open(cls, out_dir: str | Path, config_yaml: str, resume: str | Path | None,
             resume_hint: str = "explorl train --resume") -> "RunLog":
        """The run directory to continue (`resume`: a run explorl made) or a new one at `out_dir` (absent, empty, or
        a run explorl made that logged no step: `lock.check_out_dir`), locked for this process before anything is
        written (RunDirLocked naming the holder when another process writes it). `resume_hint`: the command that
        continues a run, named when `out_dir` already holds one. A symbolic link among the directory's entries is
        refused first (`lock.refuse_links_in_run`): the run would write, rename or delete through it."""
        refuse_links_in_run(Path(resume if resume is not None else out_dir))
        if resume is not None:
            log = cls(Path(resume))
            if not (log.dir / "config.yaml").exists():
                raise FileNotFoundError(f"--resume {log.dir}: no config.yaml there; is it a run directory?")
            if not is_explorl_run(log.dir):
                raise FileExistsError(f"--resume {log.dir}: not a run directory explorl made (no {log.dir / '.lock'}, "
                                      f"metrics.jsonl or checkpoints/ beside its config.yaml); nothing to continue")
            log.lock = RunLock.acquire(log.dir)
            log.write_config(config_yaml, resumed=True)
            return log
        log = cls(Path(out_dir))
        refuse_if_locked(log.dir)  # a run in progress is named as such
        check_out_dir(log.dir, resume_hint)  # before anything is written, even the lock file
        log.dir.mkdir(parents=True, exist_ok=True)
        log.lock = RunLock.acquire(log.dir)
        if holds_steps(log.dir):  # another run logged steps between the check and the lock
            log.close()
            check_out_dir(log.dir, resume_hint)
        write_atomic(log.dir / "config.yaml", config_yaml)
        return log

    def _writing(self) -> None:
        """Refuse to write once a later run of this process took the directory over (`RunLock.check`)."""
        if self.lock is not None:
            self.lock.check()

    def write_config(self, config_yaml: str, resumed: bool = False) -> None:
        """Rewrite config.yaml (a setting resolved at load time, e.g. `task.chat_template: auto`, or a resumed run's
        overrides), so it always describes the run that produces the next weights. When a resumed run's config
        differs from the file's, the change is appended to `config_history.jsonl` first: when, after which step
        (the checkpoint it continues from), which keys changed (old and new values) and the whole previous file."""
        self._writing()
        path = self.dir / "config.yaml"
        previous = path.read_text() if path.exists() else None
        if resumed and previous is not None and previous != config_yaml:
            # the file as it is on disk is someone else's input: read under the config files' bounds
            old, new = _flatten(read_yaml(path)), _flatten(yaml.safe_load(config_yaml) or {})
            changes = {k: [old.get(k), new.get(k)] for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)}
            ckpts = self.checkpoints()
            record = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                      "resumed_after_step": int(ckpts[-1].name.rsplit("_", 1)[-1]) if ckpts else 0,
                      "changes": changes, "previous": previous}
            history = self.dir / "config_history.jsonl"
            drop_torn_last_line(history)  # a kill while appending the last change: that record is incomplete
            append_jsonl(history, record)
        if previous != config_yaml:
            write_atomic(path, config_yaml)

    def checkpoints(self) -> list[Path]:
        return checkpoint_dirs(self.dir)

    def save_checkpoint(self, step: int, model, optimizer, scheduler, state: dict, keep: int,
                        every: int = 0) -> Path:
        self._writing()
        return save_checkpoint(self.dir, step, model, optimizer, scheduler, state, keep, every)

    def truncate_metrics(self, done_steps: int, step_key: str = "reward/mean") -> None:
        """Drop the step records after `done_steps` and the final evaluation line (a resume writes them again);
        `step_key` is a key every step record has (`sft/loss` for `explorl sft`)."""
        self._writing()
        truncate_jsonl(self.metrics_path, lambda r: r["step"] <= done_steps and step_key in r)

    def truncate_samples(self, done_steps: int) -> None:
        """Drop the samples of steps after `done_steps` (a resume samples them again)."""
        self._writing()
        truncate_jsonl(self.samples_path, lambda r: r["step"] <= done_steps)

    def is_complete(self, steps: int) -> bool:
        """Whether this run finished all `steps`: eval.json (written last) is for that step and final/ exists."""
        try:
            done = json.loads((self.dir / "eval.json").read_text()).get("step") == steps
        except (OSError, ValueError, AttributeError, RecursionError):
            return False
        return done and (self.dir / "final").is_dir()

    def append_metrics(self, record: dict) -> None:
        self._writing()
        append_jsonl(self.metrics_path, clean_record(record))
        if self.trackers is not None:
            self.trackers.log(clean_record(record))

    def start_trackers(self, run, config: dict, resume_step: int | None) -> None:
        """TensorBoard / W&B beside metrics.jsonl as `run.report_to` (a `RunConfig`) asks, with `config` as the tracked
        run's config; `resume_step` (a resumed run's last done step, else None) continues the same tracked run."""
        if run.report_to:
            self.trackers = Trackers(run.report_to, self.dir, config, resume_step=resume_step,
                                     project=run.wandb_project)

    def close(self) -> None:
        """Finish the trackers (the files are flushed record by record) and release the directory's lock."""
        try:
            if self.trackers is not None:
                self.trackers.close()
                self.trackers = None
        finally:
            if self.lock is not None:
                self.lock.release()

    def log_samples(self, step: int, problems, ro, texts, rewards, k: int) -> None:
        """The first `k` prompts of the step with their completions and rewards."""
        if k <= 0:
            return
        self._writing()
        group = ro.group.tolist()
        with nofollow.open_append(self.samples_path) as f:
            for j, p in enumerate(problems[:k]):
                rows = [i for i, g in enumerate(group) if g == j]
                f.write(json.dumps({"step": step, "prompt": p.prompt, "answer": p.answer,
                                    "completions": [texts[i] for i in rows],
                                    "rewards": [rewards[i] for i in rows]}) + "\n")
                f.flush()  # record by record: a kill tears at most the last line
            os.fsync(f.fileno())

    def write_eval(self, step: int, summary: dict, base_fingerprint: str) -> None:
        """eval.json, written whole under a temporary name and renamed (it marks the run complete); it names the
        weights the run started from (`base_fingerprint`, `evaluate.check_same_base`)."""
        self._writing()
        write_atomic(self.dir / "eval.json",
                     json.dumps({"step": step, "base_fingerprint": base_fingerprint, **summary}, indent=2))

    def save_final_model(self, model, tok, card: str | None = None) -> Path:
        """`final/`: a standard Hugging Face model directory, with `card` as its README.md (the model card)."""
        self._writing()
        save_final_model(self.dir / "final", model, tok, card)
        return self.dir / "final"


def _flatten(data: dict, prefix: str = "") -> dict:
    """A nested config mapping as {dotted key: value} (lists and scalars are leaves)."""
    out = {}
    for k, v in data.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out
