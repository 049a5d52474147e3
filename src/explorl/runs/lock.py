"""One writer per run directory, and what a new run's `run.out_dir` may be.

`RunLock` is an advisory lock (`fcntl.flock`) on RUN/.lock, taken before anything of a run is written and held until
the run ends. The kernel drops it when its holder exits, however it exits (SIGKILL included), so a killed run never
leaves its directory locked. The file holds the holder's pid, host and start time as JSON: a second run or resume
into a locked directory is refused naming them (`RunDirLocked`). Two cases are taken over with a warning: a lock
file naming a process that ended without releasing it (the lock itself is free: the previous run was killed), and a
lock still held although the process the file names is gone on this host (a child it forked outlived it: the file
is replaced, so the child keeps a lock on a file nobody reads). Within one process a later run of the same directory
takes it from an earlier one (a run that stopped with an error, still referenced by its traceback in a notebook);
the earlier `RunLog` then refuses to write (`RunLock.check`).

`check_out_dir` is what a new run's directory may be: absent, empty, or a run explorl made that has not logged a
step yet; anything else is refused before anything is written, naming what is there. A run directory holds no
symbolic links (`refuse_links_in_run`): a link planted there, `.lock` included, is refused by name before a run
starts or resumes, and the lock file is opened with O_NOFOLLOW (`explorl.runs.nofollow`).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import stat
import time
import warnings
import weakref
from pathlib import Path

from explorl.runs import nofollow

LOCK_FILE = ".lock"
"""The lock file inside a run directory; its presence also marks the directory as made by explorl."""


class RunDirLocked(ValueError):
    """Another process is writing the run directory (its pid and host in the message). A ValueError, so `explorl
    train` prints it as one error line."""


class RunDirWarning(UserWarning):
    """Something about a run directory was repaired (a stale lock taken over, a torn last line dropped)."""


_HELD: dict[str, "weakref.ref[RunLock]"] = {}
"""The run directories this process holds, by real path: a later run of one takes it from an earlier one."""


def _host() -> str:
    return socket.gethostname()


def _pid_alive(pid: int) -> bool:
    """Whether process `pid` exists on this host (a zombie counts as gone: it can hold nothing)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _read_holder(path: Path) -> dict:
    """The JSON a lock file holds ({} when empty, unreadable or not JSON)."""
    try:
        data = json.loads(path.read_text() or "{}")
    except (OSError, ValueError, RecursionError):  # RecursionError: brackets nested past Python's stack
        return {}
    return data if isinstance(data, dict) else {}


def _describe(holder: dict) -> str:
    started = f", started {holder['started']}" if holder.get("started") else ""
    return f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}{started}"


class RunLock:
    """The lock of one run directory, held from `acquire` until `release` (or the process's exit)."""

    def __init__(self, run_dir: Path, fd: int):
        self.dir, self.path, self._fd = run_dir, run_dir / LOCK_FILE, fd
        self.taken_by_later_run = False
        # an object dropped without `release` (an error before the caller's `finally`) still lets go of the lock
        self._finalizer = weakref.finalize(self, os.close, fd)

    @classmethod
    def acquire(cls, run_dir: str | Path) -> RunLock:
        """Lock `run_dir` (which must exist) for this process; RunDirLocked naming the holder when another process
        holds it. A stale lock (its process gone) is taken over with a `RunDirWarning`."""
        run_dir = Path(run_dir)
        path = run_dir / LOCK_FILE
        refuse_links_in_run(run_dir)  # `.lock -> elsewhere` would lock, empty and rewrite that file
        _release_earlier_run_of_this_process(run_dir)
        for _ in range(5):
            fd = nofollow.open_fd(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                holder = _read_holder(path)
                if not holder:  # its holder is between taking the lock and writing its name: ask again
                    time.sleep(0.2)
                    holder = _read_holder(path)
                if _stale(holder):
                    warnings.warn(f"{run_dir}: its lock is still held although the run that took it "
                                  f"({_describe(holder)}) has ended (a process it started holds it); taking the "
                                  f"directory over", RunDirWarning, stacklevel=3)
                    _unlink_if_same(path, holder)
                    continue
                raise _locked(run_dir, holder) from None
            try:
                if os.fstat(fd).st_ino != os.lstat(path).st_ino:  # replaced while we waited: lock the new file
                    os.close(fd)
                    continue
            except FileNotFoundError:
                os.close(fd)
                continue
            previous = _read_holder(path)
            if previous and (previous.get("pid"), previous.get("host")) != (os.getpid(), _host()):
                if previous.get("host") != _host():
                    gone = f"the run on another host that held it ({_describe(previous)}) did not release it"
                    fix = "; if that run is still going, stop this one: locks may not reach across hosts"
                else:
                    gone = f"the run that held it ({_describe(previous)}) ended without releasing it (killed?)"
                    fix = ""
                warnings.warn(f"{run_dir}: {gone}; taking the directory over{fix}", RunDirWarning, stacklevel=3)
            record = json.dumps({"pid": os.getpid(), "host": _host(),
                                 "started": time.strftime("%Y-%m-%dT%H:%M:%S")}).encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, record, 0)
            os.fsync(fd)
            lock = cls(run_dir, fd)
            _HELD[os.path.realpath(run_dir)] = weakref.ref(lock)
            return lock
        raise RunDirLocked(f"{run_dir}: could not take its lock ({path} keeps being replaced by another process); "
                           f"is another run starting in it?")

    @property
    def held(self) -> bool:
        return self._finalizer.alive

    def check(self) -> None:
        """RunDirLocked when a later run of this process took the directory over (this run must not write)."""
        if self.taken_by_later_run:
            raise RunDirLocked(f"{self.dir}: a later run in this process took the directory over; this run stopped "
                               f"writing to it")

    def release(self) -> None:
        """Empty the lock file (so the next run sees a clean hand-over) and let go of the lock."""
        if not self.held:
            return
        try:
            os.ftruncate(self._fd, 0)
        except OSError:
            pass
        self._finalizer()  # closes the descriptor: the kernel releases the lock
        entry = _HELD.get(os.path.realpath(self.dir))
        if entry is not None and entry() is self:
            del _HELD[os.path.realpath(self.dir)]


def _stale(holder: dict) -> bool:
    """Whether a held lock's recorded process is gone from this host (then a child it started holds the lock)."""
    return holder.get("host") == _host() and isinstance(holder.get("pid"), int) and not _pid_alive(holder["pid"])


def _locked(run_dir: Path, holder: dict) -> RunDirLocked:
    who = _describe(holder) if holder else "holder unknown"
    return RunDirLocked(f"{run_dir} is in use by another explorl run ({who}); a run directory has one writer. Wait "
                        f"for that run to end (or stop it), or choose another run.out_dir")


def refuse_if_locked(run_dir: Path) -> None:
    """RunDirLocked naming the holder when another process holds `run_dir`'s lock; writes nothing (a new run checks
    this before it looks at what the directory holds, so a run in progress is named as such)."""
    path = run_dir / LOCK_FILE
    entry = _HELD.get(os.path.realpath(run_dir))
    if (entry is not None and entry() is not None) or not _is_file(path):
        return  # this process's own (`acquire` hands it over), or no lock at all (a link is refused by `acquire`)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_holder(path)
        if not _stale(holder):
            raise _locked(run_dir, holder) from None
    finally:
        os.close(fd)


def _release_earlier_run_of_this_process(run_dir: Path) -> None:
    """A run directory this process already holds goes to the new run (with a warning): the earlier run stopped
    with an error before releasing it, or it is still going, and then it may write no more."""
    entry = _HELD.pop(os.path.realpath(run_dir), None)
    earlier = entry() if entry is not None else None
    if earlier is None or not earlier.held:
        return
    warnings.warn(f"{run_dir}: an earlier run in this process still held it (it stopped with an error, or is "
                  f"still going); the new run takes it over and the earlier one may no longer write to it",
                  RunDirWarning, stacklevel=4)
    earlier.taken_by_later_run = True
    earlier.release()


def _unlink_if_same(path: Path, holder: dict) -> None:
    """Remove a stale lock file, unless another process has replaced it meanwhile (it names another holder)."""
    if _read_holder(path) == holder:
        try:
            path.unlink()
        except FileNotFoundError:
            pass


# ----------------------------------------------------------------------------------------------------------------
# what a new run's directory may be


STEP_FILES = ("metrics.jsonl", "checkpoints")
"""What makes a run directory hold a run (steps logged or checkpointed): a new run there is refused (--resume)."""


def _is_file(path: Path) -> bool:
    """A regular file, not a symbolic link to one (`Path.is_file` follows links)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def refuse_links_in_run(run_dir: Path) -> None:
    """LinkRefused naming every symbolic link among the run directory's entries and its checkpoints' (`.lock`,
    `metrics.jsonl.tmp`, `final`, `checkpoints` itself, ...): checked before a run starts or resumes, so that a link
    planted there stops it before any work and before anything is written."""
    nofollow.refuse_linked_entries(run_dir)
    nofollow.refuse_linked_entries(run_dir / "checkpoints")


def is_explorl_run(run_dir: Path) -> bool:
    """Whether `run_dir` is a run directory explorl made: its lock file (every run since explorl took locks), or a
    config.yaml beside metrics.jsonl or checkpoints/ (runs from before)."""
    if _is_file(run_dir / LOCK_FILE):
        return True
    return _is_file(run_dir / "config.yaml") and any((run_dir / f).exists() for f in STEP_FILES)


def holds_steps(run_dir: Path) -> bool:
    """Whether the run directory has logged or checkpointed a step."""
    return (run_dir / "metrics.jsonl").exists() or any((run_dir / "checkpoints").glob("step_*"))


def check_out_dir(out_dir: Path, resume_hint: str = "explorl train --resume") -> None:
    """What a new run's `run.out_dir` may be, checked before anything is written: absent, an empty directory, or a
    run explorl made that has not logged a step (a run stopped while starting, begun again). FileExistsError
    otherwise: a run with steps (continue it with `resume_hint`) or a directory explorl did not make (its entries
    named)."""
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise FileExistsError(f"run.out_dir {out_dir} is a file, not a directory; choose another run.out_dir")
    refuse_links_in_run(out_dir)
    entries = sorted(p.name for p in out_dir.iterdir())
    if not entries:
        return
    if is_explorl_run(out_dir):
        if holds_steps(out_dir):
            raise FileExistsError(f"run directory {out_dir} already holds a run; continue it with "
                                  f"`{resume_hint} {out_dir}` or choose another run.out_dir")
        return
    shown = ", ".join(entries[:8]) + (f" and {len(entries) - 8} more" if len(entries) > 8 else "")
    raise FileExistsError(f"run.out_dir {out_dir} is a directory explorl did not make (it holds {shown}); a run "
                          f"writes config.yaml, metrics.jsonl, checkpoints/ ... there and would replace files of those "
                          f"names. Choose a new or empty directory for run.out_dir")
