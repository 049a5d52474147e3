"""Module-level functions for the sandbox tests; spawned workers import them by name (tests/ is on sys.path)."""

import os
import time


def add(a, b):
    """Return a + b."""
    return a + b


def sleep_then(seconds, value):
    """Sleep, then return `value`."""
    time.sleep(seconds)
    return value


def sleep_forever():
    """Never return."""
    while True:
        time.sleep(1)


def boom(message):
    """Raise a ValueError."""
    raise ValueError(message)


def hog():
    """Try to allocate 10 GB (the pool's RLIMIT_AS turns this into a MemoryError)."""
    block = bytearray(10 * 2**30)
    return len(block)


def die(code):
    """Exit the process abruptly, as a crash would."""
    os._exit(code)


def pid():
    """The worker's process id."""
    return os.getpid()


def flaky_reward(completion, answer, **meta):
    """A reward function that misbehaves on request: the completion names what to do."""
    if completion == "sleep":
        sleep_forever()
    if completion == "raise":
        raise RuntimeError("reward bug")
    if completion == "die":
        os._exit(1)
    special = {"nan": float("nan"), "inf": float("inf"), "str": "1.0", "none": None, "true": True}
    if completion in special:
        return special[completion]
    return float(completion == answer) * meta.get("scale", 1.0)


def record_pid_then_hang(directory):
    """Leave a file named by the worker's pid in `directory`, then never return (sleeping: the GIL is free)."""
    open(os.path.join(directory, str(os.getpid())), "w").close()
    sleep_forever()


def _start_sleeper(detach, orphan, out_fd):
    """Fork a process that writes its pid to `out_fd` and sleeps for 10 minutes: after `os.setsid()` with `detach`,
    and with `orphan` under an intermediate process that exits at once (a double fork: its parent is gone)."""
    pid = os.fork()
    if pid:
        if orphan:
            os.waitpid(pid, 0)  # the intermediate
        return
    try:
        if detach:
            os.setsid()
        if orphan and os.fork():
            os._exit(0)
        os.write(out_fd, f"{os.getpid()}\n".encode())
        time.sleep(600)
    finally:
        os._exit(0)


def fork_sleepers(directory, detach, then):
    """Start two sleeping processes (a child and an orphaned grandchild, both `setsid()` with `detach`), write
    their pids into `directory/<worker pid>`, then `then`: "return" 1.0, "hang" (sleeping), "spin" (one C call that
    holds the GIL for hours) or "die" (os._exit(3))."""
    r, w = os.pipe()
    _start_sleeper(detach, False, w)
    _start_sleeper(detach, True, w)
    os.close(w)
    text = b""
    while text.count(b"\n") < 2:
        text += os.read(r, 64)
    os.close(r)
    path = os.path.join(directory, str(os.getpid()))
    with open(path + ".tmp", "w") as f:
        f.write(text.decode())
    os.rename(path + ".tmp", path)  # whole or absent
    if then == "hang":
        sleep_forever()
    if then == "spin":
        return sum(range(10**14))
    if then == "die":
        os._exit(3)
    return 1.0


def runaway(directory, then):
    """Start a process that forks forever, each generation appending its pid to `directory/runaway` and exiting
    after its fork (so every live one is an orphan with a new pid), then `then` as in `fork_sleepers`."""
    path = os.path.join(directory, "runaway")
    if not os.fork():
        try:
            os.setsid()
            while True:
                with open(path, "a") as f:
                    f.write(f"{os.getpid()}\n")
                time.sleep(0.002)
                if os.fork():
                    os._exit(0)
        finally:
            os._exit(0)
    while not os.path.exists(path):
        time.sleep(0.01)
    time.sleep(0.1)
    if then == "hang":
        sleep_forever()
    return 1.0


def wait_for(predicate, timeout: float, poll: float = 0.05) -> bool:
    """Whether `predicate()` becomes true within `timeout` seconds (asked every `poll` s, and once more at the end)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(poll)
    return predicate()
