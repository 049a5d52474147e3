"""Issue 56 item 3: nothing a reward starts outlives its item, its pool or the trainer.

Each reward here (`sandbox_helpers.fork_sleepers`) forks a sleeping child and an orphaned grandchild (a double
fork), both with or without `os.setsid()`, and records their pids; it then returns, hangs into its timeout, dies,
or spins in one C call that holds the GIL. The tests look for the sleepers (and the workers) a bounded while after
the item ends, the pool closes, or the trainer (a harness process running a pool) is SIGKILLed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))  # workers start with this sys.path, so they find the helpers in tests/
import sandbox_helpers as h  # noqa: E402

from explorl.rewards import process_tree  # noqa: E402
from explorl.rewards.process_tree import descendants, kill_descendants  # noqa: E402
from explorl.rewards.sandbox import WorkerPool  # noqa: E402

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux: subreaper and /proc")

DETACH = pytest.mark.parametrize("detach", [False, True], ids=["same-session", "setsid"])


def _ours(pid: int) -> bool:
    """Whether `pid` still runs a forked worker (a zombie runs nothing; a pid reused by another program is not
    one of ours: the forks share the worker's command line)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, IndexError):
        return False
    return state != "Z" and b"explorl.rewards.worker" in cmdline


def _recorded(directory: Path) -> dict[int, list[int]]:
    """{worker pid: its sleepers' pids} from the files `fork_sleepers` wrote."""
    return {int(p.name): [int(x) for x in p.read_text().split()] for p in directory.iterdir()
            if p.name.isdigit()}


def _none_left(pids: list[int], timeout: float = 3.0) -> list[int]:
    """The pids of `pids` still running after up to `timeout` seconds."""
    h.wait_for(lambda: not any(_ours(p) for p in pids), timeout)
    return [p for p in pids if _ours(p)]


def _sweep(pids) -> None:
    """Never leave one behind, even when a test fails."""
    for p in pids:
        if _ours(p):
            os.kill(p, signal.SIGKILL)


@DETACH
@pytest.mark.parametrize("then", ["return", "hang", "die"])
def test_what_a_reward_forks_dies_when_its_item_ends(tmp_path, detach, then):
    pids: list[int] = []
    try:
        with WorkerPool(workers=1, timeout_s=1.5, memory_mb=0) as pool:
            (out,) = pool.map(h.fork_sleepers, [(str(tmp_path), detach, then)])
            ((worker, pids),) = _recorded(tmp_path).items()
            assert len(pids) == 2
            if then == "return":
                assert out.value == 1.0
                # killed before the answer came back, the worker itself kept for the next item
                assert _none_left(pids, 0.5) == [] and _ours(worker)
                assert pool.map(h.add, [(1, 2)])[0].value == 3  # the same worker: it still serves
            elif then == "hang":
                assert out.timed_out
                assert _none_left([*pids, worker]) == []
            else:
                assert out.error == "worker died (exit code 3)"
                assert _none_left([*pids, worker]) == []
        assert _none_left([*pids, worker]) == []
    finally:
        _sweep(pids)


def test_a_process_that_keeps_forking_away_is_caught(tmp_path):
    """Each generation forks and exits, so the live one always has a new pid: killing pids as they are listed
    would lose the race; freezing the tree first does not."""
    try:
        with WorkerPool(workers=1, timeout_s=30, memory_mb=0) as pool:
            (out,) = pool.map(h.runaway, [(str(tmp_path), "return")])
            assert out.value == 1.0
            born = [int(x) for x in (tmp_path / "runaway").read_text().split()]
            assert len(born) >= 2 and _none_left(born, 0.5) == []
            time.sleep(0.1)
            assert [int(x) for x in (tmp_path / "runaway").read_text().split()] == born  # no new generation
    finally:
        _sweep(int(x) for x in (tmp_path / "runaway").read_text().split())


@pytest.mark.parametrize("children_files", [True, False], ids=["children-files", "stat-scan"])
def test_kill_descendants_freezes_then_kills_a_whole_tree(monkeypatch, children_files):
    """Read from /proc/PID/task/TID/children, or (kernels without that file) from every process's parent pid."""
    monkeypatch.setattr(process_tree, "_CHILDREN_FILES", children_files and process_tree._CHILDREN_FILES)
    parent = subprocess.Popen(["bash", "-c", "bash -c 'sleep 600 & wait' & sleep 600 & wait"])
    try:
        assert h.wait_for(lambda: len(descendants(parent.pid)) == 3, 10)  # a bash, two sleep
        below = descendants(parent.pid)
        assert kill_descendants(parent.pid) == 3
        for p in below:  # reaped by bash or init; SIGKILLed either way
            assert h.wait_for(lambda p=p: _gone_or_zombie(p), 5)
    finally:
        parent.kill()
        parent.wait()


HARNESS = textwrap.dedent("""
    import sys, threading
    sys.path.insert(0, {tests!r})
    import sandbox_helpers
    from explorl.rewards.sandbox import shared_pool

    def score():
        shared_pool(2).map(sandbox_helpers.fork_sleepers, [({pids!r}, {detach!r}, {then!r})] * 2, timeout_s=600)

    if {thread!r}:
        worker = threading.Thread(target=score)
        worker.start()
        worker.join()
    else:
        score()
""")


@DETACH
@pytest.mark.parametrize("thread,then", [(False, "hang"), (True, "hang"), (False, "spin")],
                         ids=["main-thread:pdeathsig", "other-thread:watchdog", "worker-stuck-in-C"])
def test_sigkill_of_the_trainer_leaves_nothing_a_reward_forked(tmp_path, detach, thread, then):
    harness = subprocess.Popen([sys.executable, "-c", HARNESS.format(tests=str(TESTS), pids=str(tmp_path),
                                                                      detach=detach, then=then, thread=thread)])
    recorded: dict[int, list[int]] = {}
    try:
        assert h.wait_for(lambda: len(_recorded(tmp_path)) == 2, 120), "the rewards never forked"
        recorded = _recorded(tmp_path)
        everyone = [*recorded, *(p for pids in recorded.values() for p in pids)]
        assert len(everyone) == 6 and all(_ours(p) for p in everyone)
        harness.send_signal(signal.SIGKILL)
        harness.wait(10)
        assert _none_left(everyone, 5.0) == [], "still running 5 s after the trainer was SIGKILLed"
    finally:
        if harness.poll() is None:
            harness.kill()
        _sweep([*recorded, *(p for pids in recorded.values() for p in pids)])


def _gone_or_zombie(pid: int) -> bool:
    """The process `pid` has exited: no /proc entry, or a zombie. Its entry can vanish between two reads (it is
    reaped meanwhile), which counts as gone."""
    try:
        return "Z" in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1][:3]
    except FileNotFoundError:
        return True
