"""Issue 39 items 2 and 5: a run directory has one writer, and a new run goes only where explorl may write.

Another process holds a run directory through the same call `explorl train` makes (`RunLog.open`); a second run or
resume into it is refused naming the holder's pid and host, with nothing of the directory changed. A lock whose
holder was killed is taken over with a warning. A directory explorl did not make is refused before anything is
written, naming what it holds.
"""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest
from rich.console import Console

from explorl import commands
from explorl.config import load_config
from explorl.runs.log import RunLog

LOCK_FILE = ".lock"  # explorl.runs.lock.LOCK_FILE (named here so the tests of behaviour also run against older code)

HOLDER = textwrap.dedent("""
    import sys, time
    from explorl.runs.log import RunLog
    log = RunLog.open(sys.argv[1], "run: {seed: 1}\\n", None)
    if sys.argv[2] == "steps":
        log.append_metrics({"step": 1, "reward/mean": 0.5})
    print("ready", flush=True)
    time.sleep(600)
""")


@pytest.fixture
def holder(tmp_path):
    """Start a process that opens a run directory (as `explorl train` does) and keeps it: `holder(dir, steps)` ->
    the process, once it holds the directory."""
    procs = []

    def start(run_dir, steps: bool = False):
        proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir), "steps" if steps else "none"],
                                stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        assert proc.stdout.readline().strip() == "ready"
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _console():
    buf = io.StringIO()
    return Console(file=buf, width=400, force_terminal=False), buf


OVERRIDES = ["run.steps=2", "run.batch_size=2", "sampling.group_size=2", "sampling.max_new_tokens=4",
             "task.train_size=8", "task.eval_size=2", "run.eval_n=1", "run.eval_k=[1]",
             "task.reward=rewards_for_tests:contains_digit"]


def _train_argv(model_dir, out_dir):
    """`explorl train CONFIG overrides` for a 2-step run of the tiny model (CONFIG written beside `out_dir`)."""
    config = out_dir.parent / "c.yaml"
    config.write_text(f"model: {{path: {model_dir}}}\n")
    return ["train", str(config), f"run.out_dir={out_dir}", *OVERRIDES]


def _snapshot(run_dir):
    return {p.name: p.read_bytes() for p in sorted(run_dir.iterdir()) if p.is_file() and p.name != LOCK_FILE}


@pytest.mark.parametrize("steps", [False, True], ids=["starting", "with-steps"])
def test_a_second_run_into_a_directory_in_use_is_refused_naming_pid_and_host(tiny_model_dir, tmp_path, holder,
                                                                            monkeypatch, steps):
    run_dir = tmp_path / "x"
    first = holder(run_dir, steps)
    before = _snapshot(run_dir)
    console, buf = _console()
    monkeypatch.setattr(commands.common, "console", console)
    assert commands.main(_train_argv(tiny_model_dir, run_dir)) == 2
    said = " ".join(buf.getvalue().split())
    assert f"in use by another explorl run (pid {first.pid} on host {socket.gethostname()}" in said, said
    assert _snapshot(run_dir) == before  # config.yaml still the first run's, no record added


def test_a_resume_of_a_directory_in_use_is_refused(tmp_path, holder):
    from explorl.runs.lock import RunDirLocked

    run_dir = tmp_path / "x"
    first = holder(run_dir, steps=True)
    with pytest.raises(RunDirLocked, match=f"pid {first.pid} on host"):
        RunLog.open(None, "run: {seed: 2}\n", resume=run_dir)
    assert (run_dir / "config.yaml").read_text() == "run: {seed: 1}\n"


def test_a_killed_runs_lock_is_taken_over_with_a_warning(tmp_path, holder):
    from explorl.runs.lock import RunDirWarning

    run_dir = tmp_path / "x"
    first = holder(run_dir, steps=True)
    first.send_signal(signal.SIGKILL)
    first.wait()
    with pytest.warns(RunDirWarning, match=f"pid {first.pid} on host .* ended without releasing it"):
        log = RunLog.open(None, "run: {seed: 1}\n", resume=run_dir)
    try:
        assert json.loads((run_dir / LOCK_FILE).read_text())["pid"] == os.getpid()
    finally:
        log.close()
    assert (run_dir / LOCK_FILE).read_text() == ""  # released: the next run finds a clean hand-over


def test_a_lock_kept_by_a_child_of_a_dead_run_is_taken_over(tmp_path):
    """flock held by a process other than the recorded (dead) one, as a child the killed run started would hold it:
    the directory is taken over (a new lock file), with a warning."""
    from explorl.runs.lock import RunDirWarning, RunLock

    run_dir = tmp_path / "x"
    run_dir.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    code = textwrap.dedent(f"""
        import fcntl, json, os, socket, time
        fd = os.open({str(run_dir / LOCK_FILE)!r}, os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, json.dumps({{"pid": {dead.pid}, "host": socket.gethostname()}}).encode())
        print("ready", flush=True)
        time.sleep(600)
    """)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        with pytest.warns(RunDirWarning, match=f"pid {dead.pid} .* has ended"):
            lock = RunLock.acquire(run_dir)
        assert json.loads((run_dir / LOCK_FILE).read_text())["pid"] == os.getpid()
        lock.release()
    finally:
        child.kill()
        child.wait()


def test_a_later_run_in_the_same_process_takes_the_directory_and_the_earlier_stops_writing(tmp_path):
    """A run that stopped with an error keeps its RunLog alive through the traceback (a notebook's last error): the
    next run of the directory in that process takes it over; the earlier object may not write any more."""
    from explorl.runs.lock import RunDirLocked, RunDirWarning

    earlier = RunLog.open(tmp_path / "x", "run: {}\n", None)
    with pytest.warns(RunDirWarning, match="earlier run in this process"):
        later = RunLog.open(None, "run: {}\n", resume=tmp_path / "x")
    with pytest.raises(RunDirLocked, match="took the directory over"):
        earlier.append_metrics({"step": 1})
    later.append_metrics({"step": 1})
    later.close()
    assert (tmp_path / "x" / "metrics.jsonl").read_text().count("\n") == 1


def test_a_directory_explorl_did_not_make_is_refused_before_anything_is_written(tiny_model_dir, tmp_path):
    """The issue: `run.out_dir=DIR` where DIR/config.yaml is the user's own file replaced it."""
    user_dir = tmp_path / "mine"
    user_dir.mkdir()
    (user_dir / "config.yaml").write_text("my: own settings\n")
    (user_dir / "notes.txt").write_text("keep")
    from explorl.train.loop import train

    cfg = load_config(None, [f"model.path={tiny_model_dir}", f"run.out_dir={user_dir}", *OVERRIDES])
    with pytest.raises(FileExistsError, match="is a directory explorl did not make .*config.yaml, notes.txt"):
        train(cfg, progress=False)
    assert sorted(p.name for p in user_dir.iterdir()) == ["config.yaml", "notes.txt"]  # not even a lock file
    assert (user_dir / "config.yaml").read_text() == "my: own settings\n"
    with pytest.raises(FileExistsError, match="not a run directory explorl made"):
        RunLog.open(None, "run: {}\n", resume=user_dir)
    assert (user_dir / "config.yaml").read_text() == "my: own settings\n"


def test_a_run_directory_with_steps_is_refused_and_one_without_is_started_over(tmp_path):
    started = RunLog.open(tmp_path / "started", "run: {seed: 1}\n", None)  # stopped before its first step
    started.close()
    again = RunLog.open(tmp_path / "started", "run: {seed: 2}\n", None)
    again.close()
    assert (tmp_path / "started" / "config.yaml").read_text() == "run: {seed: 2}\n"
    again = RunLog.open(tmp_path / "started", "run: {seed: 2}\n", resume=tmp_path / "started")
    again.append_metrics({"step": 1})
    again.close()
    with pytest.raises(FileExistsError, match="already holds a run; continue it with `explorl sft --resume"):
        RunLog.open(tmp_path / "started", "run: {seed: 3}\n", None, resume_hint="explorl sft --resume")
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileExistsError, match="is a file, not a directory"):
        RunLog.open(tmp_path / "file", "run: {}\n", None)
