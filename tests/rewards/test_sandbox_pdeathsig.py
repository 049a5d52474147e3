"""Issue 39 item 3: reward workers die with the trainer, also when it is SIGKILLed while they are busy on an item.

A tiny harness process stands in for the trainer: it scores items that never finish (`sandbox_helpers.record_pid_
then_hang`, the reward that loops after its preflight calls in the issue) through the pool the trainer uses
(`sandbox.shared_pool`), from its main thread (the kernel's parent-death signal) or from another thread (the parent-pid
watchdog). The test SIGKILLs it mid-item and looks for the workers 5 s later.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))
import sandbox_helpers  # noqa: E402

HARNESS = textwrap.dedent("""
    import sys, threading
    sys.path.insert(0, {tests!r})
    import sandbox_helpers
    from explorl.rewards.sandbox import shared_pool

    def score():
        shared_pool(2).map(sandbox_helpers.record_pid_then_hang, [({pids!r},), ({pids!r},)], timeout_s=600)

    if {thread!r}:
        worker = threading.Thread(target=score)
        worker.start()
        worker.join()
    else:
        score()
""")


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie waiting for a reaper counts as dead: it runs nothing)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("thread", [False, True], ids=["main-thread:pdeathsig", "other-thread:watchdog"])
def test_sigkill_of_the_trainer_mid_reward_leaves_no_worker_alive_5s_later(tmp_path, thread):
    pids = tmp_path / "pids"
    pids.mkdir()
    harness = subprocess.Popen([sys.executable, "-c", HARNESS.format(tests=str(TESTS), pids=str(pids), thread=thread)])
    try:
        assert sandbox_helpers.wait_for(lambda: len(list(pids.iterdir())) == 2, 120), "the workers never started their items"
        workers = [int(p.name) for p in pids.iterdir()]
        assert all(_alive(w) for w in workers)  # busy on their items, as the trainer is killed
        harness.send_signal(signal.SIGKILL)
        harness.wait(10)
        assert sandbox_helpers.wait_for(lambda: not any(_alive(w) for w in workers), 5.0), \
            f"workers still running 5 s after their parent was killed: {[w for w in workers if _alive(w)]}"
    finally:
        if harness.poll() is None:
            harness.kill()
        for p in pids.iterdir():  # never leave one behind, even when the test fails
            try:
                os.kill(int(p.name), signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_worker_whose_parent_is_already_gone_exits_at_once(tmp_path):
    """The parent can die between starting a worker and the worker asking for the signal: the worker sees its parent
    pid is not the one it was given, and exits instead of serving nobody."""
    code = ("import sys; from explorl.rewards.worker import worker_main; "
            "worker_main(0, 0, parent_pid=1, death_signal=False)")  # pid 1 is never this process's parent here
    if os.getpid() == 1:
        pytest.skip("the test process is pid 1")
    done = subprocess.run([sys.executable, "-c", code], timeout=60, capture_output=True, text=True)
    assert (done.returncode, done.stderr) == (1, "")  # exited on purpose, not on an error
