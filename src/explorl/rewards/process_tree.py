"""Finding and killing the processes below a process, for the reward sandbox (`explorl.rewards.sandbox`): a reward
that forks (a solver it starts, a `setsid` daemon) must not leave anything running once its item is over.

Linux only for the walk (`/proc`): `descendants` reads each process's children from `/proc/PID/task/TID/children`
(or, where the kernel lacks that file, the parent pid of every process in `/proc`). `kill_descendants` first freezes
every descendant with SIGSTOP, listing again until no new one appears (a stopped process cannot fork, and a fork
under way when SIGSTOP arrives is cancelled by the kernel), then SIGKILLs them: killing one by one as they are found
would lose a race against a process that forks faster than it is killed. `become_subreaper` keeps the descendants
that call `setsid()` and lose their parent in the tree: they are re-parented to the subreaper, not to PID 1.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

LINUX = sys.platform.startswith("linux")
"""Whether the tree can be walked (`/proc`) and a process can be made a subreaper (`prctl`)."""

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> bool:
    """`prctl(option, value)` through libc; False where that is not available or fails."""
    if not LINUX:
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def set_death_signal(signum: int) -> bool:
    """Ask Linux to send `signum` to this process when the thread that started it dies (`PR_SET_PDEATHSIG`)."""
    return _prctl(_PR_SET_PDEATHSIG, int(signum))


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (`PR_SET_CHILD_SUBREAPER`, Linux 3.4+): one whose
    parent dies is re-parented here, not to PID 1, so `setsid()` does not take it out of the tree."""
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def _children_files_work() -> bool:
    """Whether the kernel has `/proc/PID/task/TID/children` (CONFIG_PROC_CHILDREN)."""
    return os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


_CHILDREN_FILES = LINUX and _children_files_work()


def _children(pid: int) -> list[int]:
    """The children of `pid`, from the children file of each of its threads."""
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(p) for p in f.read().split()]
        except (OSError, ValueError):
            pass
    return out


def _parents() -> dict[int, list[int]]:
    """Every process's children, from the parent pid in `/proc/PID/stat` (the fallback of `_children`)."""
    tree: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        tree.setdefault(ppid, []).append(int(name))
    return tree


def descendants(pid: int) -> list[int]:
    """The pids below `pid` (children, their children...), parents before children; [] where /proc is missing."""
    if not LINUX:
        return []
    tree = None if _CHILDREN_FILES else _parents()
    out: list[int] = []
    seen = {pid}
    todo = [pid]
    while todo:
        p = todo.pop()
        for c in _children(p) if tree is None else tree.get(p, []):
            if c not in seen:
                seen.add(c)
                out.append(c)
                todo.append(c)
    return out


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def kill_descendants(pid: int) -> int:
    """SIGKILL every process below `pid`, freezing them all with SIGSTOP first (`_freeze`); returns how many were
    found. A pid stopped here that has left the tree by the end (it exited; its pid may be someone else's now) is
    sent SIGCONT instead of SIGKILL. The kernel's children lists are exact only for stopped processes, so a child
    forked while they were read can be missed; it stays below `pid` (a subreaper), so a second pass finds it."""
    found: set[int] = set()
    for _ in range(10):
        stopped = _freeze(pid, found)
        if not stopped:
            break
        last = set(descendants(pid))
        for p in stopped:
            _signal(p, signal.SIGKILL if p in last else signal.SIGCONT)
        found |= stopped
    return len(found)


def _freeze(pid: int, skip: set[int]) -> set[int]:
    """SIGSTOP every process below `pid` but `skip`, round after round, until three listings in a row find nothing
    new (a tree cannot outgrow this for long: each round stops what the last one found)."""
    stopped: set[int] = set()
    quiet = 0
    for _ in range(1000):
        new = [p for p in descendants(pid) if p not in stopped and p not in skip]
        if not new:
            quiet += 1
            if quiet == 3:
                break
            continue
        quiet = 0
        for p in new:
            _signal(p, signal.SIGSTOP)
        stopped.update(new)
    return stopped


def reap_children(timeout_s: float = 1.0) -> None:
    """Collect this process's exited children (zombies), waiting up to `timeout_s` for those still dying; returns
    when it has none left (`ChildProcessError`) or at the deadline (one stuck in the kernel is collected later)."""
    end = time.monotonic() + timeout_s
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            if time.monotonic() >= end:
                return
            time.sleep(0.005)


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL `proc` (started with `start_new_session=True`) and everything below it, and wait for it: its
    descendants first (`kill_descendants`), then its process group (it, and any member that left the tree: the
    only means off Linux). Nothing is signalled once `proc` has been waited for: its pid may be someone else's."""
    if proc.returncode is None:
        kill_descendants(proc.pid)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError, AttributeError):
            proc.kill()
    proc.wait()
