"""The worker process's side of the sandbox (`explorl.rewards.sandbox`): the loop a worker runs (`worker_main`:
import what it is asked to, call functions, send back values or errors with their traceback), its memory cap, and
how it dies with its parent (the kernel's parent-death signal, and a watchdog on the parent's pid).

A worker is a fresh interpreter that imports this module only (no torch): `WorkerPool` starts it with the parent's
`sys.path` and one end of a pipe."""

from __future__ import annotations

import importlib
import os
import pickle
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection

PARENT_POLL_S = 0.5
"""How often a worker checks that its parent is alive (the watchdog that backs `PR_SET_PDEATHSIG`)."""


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


def _kill_me_with_parent() -> bool:
    """Ask Linux to SIGKILL this process when the thread that started it dies (`prctl(PR_SET_PDEATHSIG)`, through
    libc); False where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1  # <linux/prctl.h>
        return libc.prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(parent_pid: int) -> None:
    """Exit this process as soon as its parent is gone (it is then re-parented, so its parent pid changes)."""
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="explorl-parent-watchdog", daemon=True).start()


def worker_main(fd: int, memory_mb: int, parent_pid: int = 0, death_signal: bool = False) -> None:
    """Child loop: ("import", names, the parent's sys.path) -> ("ready",); ("call", fn, args) -> (True, value) |
    (False, error repr, traceback). The process dies with `parent_pid` (`death_signal`: also by the kernel's
    parent-death signal, asked for here)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it then closes the pool
    if parent_pid:
        if death_signal:
            _kill_me_with_parent()
        if os.getppid() != parent_pid:  # the parent died before the signal was asked for
            os._exit(1)
        _watch_parent(parent_pid)
    if memory_mb > 0:
        import resource

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
        try:
            conn.send(reply)
        except Exception as e:  # an unpicklable return value
            conn.send((False, f"could not send the result back: {e!r}"))
