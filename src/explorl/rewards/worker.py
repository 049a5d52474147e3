"""The worker process's side of the sandbox (`explorl.rewards.sandbox`): the loop a worker runs (`worker_main`:
import what it is asked to, call functions, send back values or errors with their traceback, kill what the call
left running), its memory cap, and how it and everything it started die with the trainer.

A worker is a fresh interpreter that imports this module only (no torch): `WorkerPool` starts it with the parent's
`sys.path` and one end of a pipe, in a session of its own. On Linux that process forks at once and becomes the
worker's guard (`_guard`): the fork runs the items, the guard only waits. The guard is what `WorkerPool` sees
(its pid, its exit code, which is the worker's), and it stays responsive when the worker is stuck in a long C call
that holds the GIL, so it can always clean up: when the trainer dies (the kernel's parent-death signal, SIGTERM,
for guards started from the main thread; a watchdog on the parent's pid for the others) and when the worker dies
(a crash, `os._exit`), the guard kills every process below it and exits. Guard and worker are both subreapers
(`process_tree.become_subreaper`), so a descendant that calls `setsid()` and loses its parent is re-parented to
the worker (or, once the worker is gone, to the guard), never to PID 1; the worker dies by SIGKILL with its guard."""

from __future__ import annotations

import importlib
import os
import pickle
import resource
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import NoReturn

from explorl.rewards.process_tree import LINUX, become_subreaper, kill_descendants, reap_children, set_death_signal

PARENT_POLL_S = 0.5
"""How often a guard (off Linux: a worker) checks that the trainer is alive (the watchdog that backs
`PR_SET_PDEATHSIG`, and stands in for it for workers started from other threads than the main one)."""


def _vm_bytes() -> int:
    """Current virtual memory size of this process (0 where /proc is unavailable)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _user_traceback(e: BaseException) -> str:
    """The traceback of `e` without the worker loop's own frame (it starts at the function the pool called)."""
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(e), e, tb))


def _watch_parent(parent_pid: int, gone: Callable[[], None]) -> None:
    """Call `gone` as soon as this process's parent is gone (it is then re-parented, so its parent pid changes)."""
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        gone()

    threading.Thread(target=watch, name="explorl-parent-watchdog", daemon=True).start()


def _end_tree(*_: object) -> None:
    """Kill every process below this one and exit (the guard's end when the trainer is gone)."""
    kill_descendants(os.getpid())
    os._exit(1)


def _end_group() -> None:
    """Kill this process's process group, itself included (the end of a worker without a guard, off Linux)."""
    try:
        os.killpg(os.getpgid(0), signal.SIGKILL)
    finally:
        os._exit(1)


def _guard(worker: int, parent_pid: int) -> NoReturn:
    """The guard's life (the process `WorkerPool` started, once it has forked `worker`): wait for the worker, then
    kill what is left below it and exit with the worker's exit code (128 + N for a signal N); on SIGTERM (the
    parent-death signal) or when the watchdog sees the trainer gone, kill everything below and exit 1."""
    become_subreaper()
    if parent_pid:
        if os.getppid() != parent_pid:
            _end_tree()
        _watch_parent(parent_pid, _end_tree)
    try:
        _, status = os.waitpid(worker, 0)
        code = os.waitstatus_to_exitcode(status)
    except ChildProcessError:
        code = 1
    kill_descendants(os.getpid())
    os._exit(code if code >= 0 else 128 - code)


def _start(fd: int, parent_pid: int, death_signal: bool) -> None:
    """Tie this process to the trainer `parent_pid` (0: to none); on Linux, fork: this process becomes the guard
    (`_guard`, never returns) and the fork returns as the worker, a subreaper that dies by SIGKILL with its guard."""
    if LINUX:  # the guard's: set before the parent-death signal is asked for, so that it never kills unhandled
        signal.signal(signal.SIGTERM, _end_tree)
    if parent_pid:
        if death_signal:  # before the check: a parent that dies after the check then still signals
            set_death_signal(signal.SIGTERM)
        if os.getppid() != parent_pid:  # the parent died before the signal was asked for
            os._exit(1)
    if not LINUX:
        if parent_pid:
            _watch_parent(parent_pid, _end_group)
        return
    guard = os.getpid()
    worker = os.fork()  # no thread runs yet: forking is safe
    if worker:
        os.close(fd)  # the worker's end of the pipe only: the trainer sees EOF when the worker dies
        _guard(worker, parent_pid)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    become_subreaper()
    if not set_death_signal(signal.SIGKILL):
        _watch_parent(guard, lambda: os._exit(1))
    if os.getppid() != guard:
        os._exit(1)


def worker_main(fd: int, memory_mb: int, parent_pid: int = 0, death_signal: bool = False) -> None:
    """Child loop: ("import", names, the parent's sys.path) -> ("ready",); ("call", fn, args) -> (True, value) |
    (False, error repr, traceback), sent once every process the call started is killed. The process and its
    descendants die with `parent_pid` (`death_signal`: also by the kernel's parent-death signal, asked for here)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it then closes the pool
    _start(fd, parent_pid, death_signal)
    if memory_mb > 0:
        # The cap is on top of what the interpreter maps already, so it means the same wherever it runs.
        limit = _vm_bytes() + memory_mb * 2**20
        hard = resource.getrlimit(resource.RLIMIT_AS)[1]
        resource.setrlimit(resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))
    conn = Connection(fd)
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError, KeyboardInterrupt):  # the parent closed the pool or died
            return
        try:  # unpickled here, not by recv(), so that a function the child cannot import is a per-item error
            msg = pickle.loads(data)
        except Exception as e:
            conn.send((False, f"could not load the function in the worker: {e!r}"))
            continue
        if msg is None:
            return
        if msg[0] == "import":
            sys.path[:] = msg[2]  # the parent's path now: a module of a directory added since this worker started
            for name in msg[1]:
                try:
                    importlib.import_module(name)
                except Exception:  # the call itself will then fail and report the error
                    pass
            reply: tuple = ("ready",)
        else:
            try:
                reply = (True, msg[1](*msg[2]))
            except BaseException as e:  # noqa: BLE001 - MemoryError, SystemExit... all become a per-item error
                try:
                    reply = (False, repr(e), _user_traceback(e))
                except BaseException:  # noqa: BLE001 - e.g. no memory left to format it
                    reply = (False, repr(e))
        if LINUX:  # whatever the call started dies before its answer goes back
            kill_descendants(os.getpid())
            reap_children()
        try:
            conn.send(reply)
        except Exception as e:  # an unpicklable return value
            conn.send((False, f"could not send the result back: {e!r}"))
