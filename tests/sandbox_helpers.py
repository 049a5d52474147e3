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
