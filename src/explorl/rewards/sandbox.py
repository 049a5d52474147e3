"""A small pool of worker processes that runs scoring functions on untrusted model output with a hard time limit.

Reward checkers (sympy through math-verify, reasoning-gym scorers, user functions) can hang, exhaust memory or
crash on adversarial completions, and signal-based timeouts only work in the main thread and cannot interrupt
long C calls such as a huge integer power. So each item runs in a separate process that is killed when its
wall-clock limit passes, and restarted. The items of a batch run in parallel across the pool (sized to the
machine by `default_workers()`), and calls from several threads each get workers of their own, so the limit
bounds an item's time as the caller sees it rather than queueing items behind each other.

    with WorkerPool(workers=2, timeout_s=5) as pool:
        outcomes = pool.map(module.function, [(arg1, arg2), ...])   # one Outcome per tuple, in order

Workers, and every process a reward starts in one, never outlive the item, the pool or the process that started
them (a reward that loops, or forks a daemon, would otherwise run on, orphaned, forever). On Linux:
- each worker runs under a guard process of its own, in a session of its own (`explorl.rewards.worker`); worker and
  guard are child subreapers (`prctl(PR_SET_CHILD_SUBREAPER)`), so a descendant that calls `setsid()` or
  double-forks stays in their tree instead of being re-parented to PID 1;
- when an item returns (or raises), the worker kills everything below it before it answers (so a reward cannot
  keep a helper process from one item to the next; one that a thread of the reward starts later dies after the
  worker's next item or with the worker);
- on a timeout, a crash, `close()` and at interpreter exit the pool kills the guard's whole tree: every descendant
  frozen with SIGSTOP, then SIGKILLed (`process_tree.kill_descendants`: no fork race), then the process group;
- when the trainer dies, even by SIGKILL, the guard kills the tree and exits: the kernel sends it SIGTERM
  (`prctl(PR_SET_PDEATHSIG)`, for workers started from the main thread: the signal follows the thread that started
  the guard), and a watchdog thread sees its parent's pid change (for workers started from other threads, within
  `worker.PARENT_POLL_S`). The guard only waits, so this holds while the worker is stuck in a long C call that
  holds the GIL (a huge integer power): the worker is SIGKILLed with the rest.
Not covered: a process that leaves the tree by other means than forking (`clone(CLONE_PARENT)` from the worker
makes a sibling of it, killed only with the guard; a job handed to another daemon: systemd-run, at, docker), and
a guard that is itself SIGKILLed by someone else than the pool (the OOM killer picks the big worker, not it).
Elsewhere (macOS) a worker has no guard: it runs in a process group of its own, which the pool kills on a timeout
and `close()` and the worker kills when its watchdog sees the trainer gone; a reward's process that changes its
group (`setsid()`, `setpgid()`) escapes, and nothing is killed between items.

Workers are fresh interpreters (fork + exec, like multiprocessing's "spawn": forking a process that runs torch
threads can deadlock the child; the one fork into guard and worker happens before any thread starts) started with
the parent's `sys.path`. Unlike multiprocessing they do not
re-import the parent's `__main__`, so scripts need no `if __name__ == "__main__"` guard and a worker does not
import torch. `fn` must therefore be importable by module and name (a module-level function, not one defined
in `__main__`): it is pickled by reference. What a worker runs is `explorl.rewards.worker`.
"""

from __future__ import annotations

import atexit
import json
import os
import pickle
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Pipe, wait
from typing import Any

from explorl.rewards.process_tree import kill_tree

STARTUP_TIMEOUT_S = 120.0
"""Limit for starting a worker and importing its modules (not counted in an item's limit; slow on a busy host)."""
MAX_DEFAULT_WORKERS = 16
"""Upper bound of `default_workers()`: each worker is an interpreter of its own (~60 MB with math-verify loaded)."""

_CHILD = ("import json, sys; sys.path[:] = json.loads(sys.argv[1]); "
          "from explorl.rewards.worker import worker_main; "
          "worker_main(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == '1')")


@dataclass
class Outcome:
    """Result of one item: `value` when it returned, else `error` (a repr) and/or `timed_out`; `traceback` is the
    worker's traceback of an exception (None for timeouts, crashes and normal returns)."""

    value: Any = None
    error: str | None = None
    timed_out: bool = False
    traceback: str | None = None

    @property
    def ok(self) -> bool:
        """True when the function returned normally."""
        return self.error is None and not self.timed_out


class _Worker:
    """One worker plus the parent's view of it: the modules it has imported and the item it runs. `proc` is the
    process started here: on Linux the worker's guard (its exit code is the worker's), elsewhere the worker."""

    def __init__(self, memory_mb: int, modules: set[str]):
        """Start the child and ask it to import `modules`."""
        self.conn, child = Pipe()
        # One BLAS/OpenMP thread: scoring is sequential, the trainer owns the cores, and every thread's arena
        # would count against RLIMIT_AS. Prints go to stderr so that they never mix into the parent's stdout.
        env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        # the kernel's parent-death signal follows the thread that starts the child: only the main thread lives
        # as long as the process (guards started from other threads rely on their parent-pid watchdog)
        death_signal = threading.current_thread() is threading.main_thread()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, json.dumps(sys.path), str(child.fileno()), str(memory_mb),
             str(os.getpid()), "1" if death_signal else "0"],
            pass_fds=[child.fileno()], stdin=subprocess.DEVNULL, stdout=2, env=env, start_new_session=True)
        child.close()  # so that the parent sees EOF when the child dies
        _LIVE.add(self)
        self.modules: set[str] = set()
        self.item: int | None = None
        self.warm(modules)

    def warm(self, modules: set[str]) -> None:
        """Ask the child to import `modules`; until it answers, the worker is 'starting' (item is None)."""
        self.starting = True
        self.deadline = time.monotonic() + STARTUP_TIMEOUT_S
        self.modules |= modules
        try:
            self.conn.send(("import", sorted(modules), list(sys.path)))
        except OSError:  # it died; the receive reports it
            pass

    def alive(self) -> bool:
        """Whether the child process is still running."""
        return self.proc.poll() is None

    def kill(self) -> None:
        """Stop the child and every process below it now (`process_tree.kill_tree`)."""
        kill_tree(self.proc)
        self.conn.close()
        _LIVE.discard(self)


_LIVE: weakref.WeakSet[_Worker] = weakref.WeakSet()
"""Every worker not yet killed, for `_kill_live_workers` at exit."""


@atexit.register
def _kill_live_workers() -> None:
    """At interpreter exit, kill the workers still running and all below them (busy in a call of a daemon thread,
    or of a pool nobody closed)."""
    for w in list(_LIVE):
        w.kill()


class WorkerPool:
    """Up to `workers` spawned processes; each item of `map` runs in one with a hard limit of `timeout_s` seconds.

    A batch is spread over `min(workers, len(items))` processes, so n items that all hang take about
    `timeout_s * ceil(n / workers)`. A worker whose item times out is killed and restarted; one that dies
    (segfault, os._exit) gives that item an error and is restarted. `memory_mb` caps each worker's additional
    address space with RLIMIT_AS, so a memory hog gets a MemoryError instead of taking the machine down (0 = no
    cap). Started lazily on the first `map`. Safe to call from several threads at once: each call checks out idle
    workers (starting new ones up to `workers` in all), and a call that finds every worker busy starts one of its
    own for the duration of the call, so the per-item limit holds from every caller's view instead of calls
    queueing behind each other; at most `workers` idle processes are kept between calls.
    """

    def __init__(self, workers: int = 1, timeout_s: float = 5.0, memory_mb: int = 2048):
        """Configure the pool; no process starts until the first `map`."""
        if workers < 1 or timeout_s <= 0:
            raise ValueError(f"WorkerPool: need workers >= 1 and timeout_s > 0, got {workers}, {timeout_s}")
        self.workers, self.timeout_s, self.memory_mb = workers, timeout_s, memory_mb
        self._idle: list[_Worker] = []
        self._busy = 0  # slots checked out by calls in progress (a slot holds a worker or will start one)
        self._generation = 0  # bumped by close(): workers of an older generation are stopped when checked in
        self._lock = threading.Lock()
        self.restarts = 0
        """Workers replaced after a timeout or a crash (a diagnostic)."""

    def map(self, fn: Callable, items: Iterable[Sequence[Any]], *, timeout_s: float | None = None,
            preload: Iterable[str] = ()) -> list[Outcome]:
        """Run `fn(*args)` for each args tuple, spread over the workers; one Outcome per item, in order.

        `timeout_s` overrides the pool's limit for this call. `fn`'s module and the `preload` modules are
        imported in each worker before its first item, so slow imports do not count against the limit.
        """
        items = [tuple(a) for a in items]
        if not items:
            return []
        limit = self.timeout_s if timeout_s is None else timeout_s
        modules = {fn.__module__, *preload}
        out: list[Outcome | None] = [None] * len(items)
        todo = deque(range(len(items)))
        slots, generation = self._checkout(min(self.workers, len(items)))
        try:
            while True:
                for s in range(len(slots)):
                    if todo:
                        self._dispatch(slots, s, fn, items, todo, modules, limit)
                active = {w.conn: s for s, w in enumerate(slots)
                          if w is not None and (w.item is not None or w.starting)}
                if not active:
                    break
                wait_s = max(0.0, min(slots[s].deadline for s in active.values()) - time.monotonic())
                for conn in wait(list(active), timeout=wait_s):
                    self._receive(slots, active[conn], out)
                for s in active.values():
                    self._check_deadline(slots, s, out, limit)
        except BaseException:
            for s, w in enumerate(slots):  # a half-finished item must not answer the next call
                if w is not None and (w.item is not None or w.starting):
                    self._replace(slots, s)
            raise
        finally:
            self._checkin(slots, generation)
        return out  # type: ignore[return-value]

    def _checkout(self, want: int) -> tuple[list[_Worker | None], int]:
        """Reserve `want` slots for a call: idle workers first, then new ones (None: started on first use) while
        the pool holds fewer than `workers`; at least one slot even when every worker is busy elsewhere."""
        with self._lock:
            taken = self._idle[len(self._idle) - min(want, len(self._idle)):]
            del self._idle[len(self._idle) - len(taken):]
            room = self.workers - len(self._idle) - self._busy - len(taken)
            new = max(0, min(want - len(taken), room))
            if not taken and not new:
                new = 1
            self._busy += len(taken) + new
            return [*taken, *([None] * new)], self._generation

    def _checkin(self, slots: list[_Worker | None], generation: int) -> None:
        """Return a call's slots: live workers go back to the idle list while the pool has room, others stop."""
        surplus = []
        with self._lock:
            self._busy -= len(slots)
            for w in slots:
                if w is None:
                    continue
                if generation == self._generation and w.alive() and len(self._idle) + self._busy < self.workers:
                    self._idle.append(w)
                else:
                    surplus.append(w)
        for w in surplus:
            w.kill()

    def _dispatch(self, slots: list[_Worker | None], s: int, fn: Callable, items: list, todo: deque,
                  modules: set[str], limit: float) -> None:
        """Give slot `s` the next item if it is idle; (re)start it or have it import `modules` first."""
        w = slots[s]
        if w is not None and w.item is None and not w.starting and not w.alive():
            self._replace(slots, s)  # died while idle (e.g. the OOM killer)
            w = None
        if w is None:
            w = slots[s] = _Worker(self.memory_mb, modules)
        elif not w.starting and w.item is None and not modules <= w.modules:
            w.warm(modules - w.modules)
        if not w.starting and w.item is None:
            w.item, w.deadline = todo.popleft(), time.monotonic() + limit
            try:
                w.conn.send(("call", fn, items[w.item]))
            except (OSError, ValueError):  # it died just now; the receive reports it
                pass

    def _check_deadline(self, slots: list[_Worker | None], s: int, out: list[Outcome | None], limit: float) -> None:
        """Kill the worker in slot `s` if its item (or its start-up) ran past the deadline."""
        w = slots[s]
        if w is None or time.monotonic() < w.deadline:
            return
        if w.starting:
            raise RuntimeError(f"sandbox worker did not start within {STARTUP_TIMEOUT_S:.0f} s")
        if w.item is not None:
            out[w.item] = Outcome(error=f"timed out after {limit:g} s", timed_out=True)
            self._replace(slots, s)

    def _receive(self, slots: list[_Worker | None], s: int, out: list[Outcome | None]) -> None:
        """Read one reply from worker slot `s`; a closed pipe means the worker died."""
        w = slots[s]
        assert w is not None
        try:
            data = w.conn.recv_bytes()
        except (EOFError, OSError):
            try:
                code = w.proc.wait(1)
            except subprocess.TimeoutExpired:
                code = None
            if w.starting:
                self._replace(slots, s)
                raise RuntimeError(f"sandbox worker exited during start-up (exit code {code})") from None
            out[w.item] = Outcome(error=f"worker died (exit code {code})")
            self._replace(slots, s)
            return
        try:  # a value the worker could pickle need not load here (a class's __reduce__ that raises)
            reply = pickle.loads(data)
        except Exception as e:  # noqa: BLE001
            reply = (False, f"could not load the result from the worker: {e!r}")
        if reply[0] == "ready":
            w.starting = False
        else:
            ok, value, *tb = reply
            out[w.item] = Outcome(value=value) if ok else Outcome(error=value, traceback=tb[0] if tb else None)
            w.item = None

    def _replace(self, slots: list[_Worker | None], s: int) -> None:
        """Kill the worker in slot `s`; a fresh one is started when there is work for it."""
        w = slots[s]
        if w is not None:
            w.kill()
        slots[s] = None
        self.restarts += 1

    def close(self) -> None:
        """Stop the idle workers (asking politely first), and those busy in a call when that call ends; the pool
        restarts them if used again."""
        with self._lock:
            idle, self._idle = self._idle, []
            self._generation += 1
        for w in idle:
            try:
                w.conn.send(None)
                w.proc.wait(1)
            except (OSError, subprocess.TimeoutExpired):
                pass
            w.kill()

    def __enter__(self) -> WorkerPool:
        """The pool itself; workers start on the first `map`."""
        return self

    def __exit__(self, *exc: Any) -> None:
        """Close the pool."""
        self.close()


_SHARED: dict[tuple[int, int], WorkerPool] = {}
_SHARED_LOCK = threading.Lock()


def shared_pool(workers: int | None = None, memory_mb: int = 2048) -> WorkerPool:
    """A process-wide pool for these settings, reused across calls so workers import sympy & co. only once.

    `workers` None: `default_workers()`. Pass the per-call limit to `map(..., timeout_s=...)`. The pools are
    closed at interpreter exit.
    """
    key = (default_workers() if workers is None else workers, memory_mb)
    with _SHARED_LOCK:
        if key not in _SHARED:
            if not _SHARED:
                atexit.register(close_shared_pools)
            _SHARED[key] = WorkerPool(workers=key[0], memory_mb=memory_mb)
        return _SHARED[key]


def close_shared_pools() -> None:
    """Stop the workers of every shared pool."""
    with _SHARED_LOCK:
        for pool in _SHARED.values():
            pool.close()
        _SHARED.clear()


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the platform has one, else os.cpu_count())."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_workers() -> int:
    """Worker count for batch scoring: one per usable CPU, at least 2 (hanging items cost no CPU, and one
    worker would make a batch's time the sum of its timeouts), at most `MAX_DEFAULT_WORKERS`. The model waits
    while its batch is scored, so the CPUs are free for it."""
    return min(MAX_DEFAULT_WORKERS, max(2, usable_cpus()))
