"""Issue 39 items 1 and 4: loading a run directory never runs code, and a kill's torn lines do not stop a resume.

A checkpoint is read as data only (`torch.load(weights_only=True)`): one whose trainer_state.pt names code (an object
whose `__reduce__` calls `os.system`) is refused with the file and the fix on `explorl train --resume`, and the code
does not run. Records are flushed one by one, so a SIGKILL loses at most the line being written; on resume such a
torn last line of metrics.jsonl, samples.jsonl or config_history.jsonl is dropped with a warning naming the file and
line, and the resumed run is the uninterrupted one; a damaged line elsewhere is an error naming file and line.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
from rich.console import Console

from explorl import commands
from explorl.config import load_config
from explorl.runs.checkpoints import load_checkpoint
from explorl.runs.log import RunLog
from explorl.train.loop import train
from test_run_control import _killed_after_step_3, _records, _strip, full  # noqa: F401  (full: a fixture)


class RunsCode:
    """Unpickling this runs `touch MARKER` (the issue's malicious trainer state)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


# ------------------------------------------------------------------------------------------- data-only checkpoints


def test_resume_never_runs_code_from_a_checkpoint(full, tmp_path, monkeypatch):
    run = tmp_path / "run"
    shutil.copytree(full, run)
    (run / "eval.json").unlink()  # unfinished: the resume loads its last checkpoint
    state_file = run / "checkpoints" / "step_0000004" / "trainer_state.pt"
    state = torch.load(state_file, weights_only=True)
    marker = tmp_path / "pwned"
    torch.save({**state, "stream": RunsCode(marker)}, state_file)
    buf = io.StringIO()
    monkeypatch.setattr(commands.common, "console", Console(file=buf, width=400, force_terminal=False))
    # the run's reward is code of the test suite's own, repeated on the command line as a user trusting it would
    assert commands.main(["train", "--resume", str(run), "task.reward=rewards_for_tests:contains_digit"]) == 2
    said = " ".join(buf.getvalue().split())
    assert not marker.exists()  # the code in the file did not run
    assert f"{state_file}: holds more than data" in said and "never unpickles" in said, said
    assert "remove" in said and "run.out_dir=NEW_DIR" in said  # the fix


def test_explorls_own_checkpoints_load_as_data_and_anything_else_is_refused_when_written(full, tiny_model, tmp_path):
    from explorl.runs.checkpoints import UnsafeCheckpointError, check_data_only, load_trainer_state

    state = load_trainer_state(full / "checkpoints" / "step_0000004" / "trainer_state.pt")  # weights_only=True
    assert {"optimizer", "scheduler", "step", "stream", "torch_rng", "python_rng"} <= set(state)
    with pytest.raises(TypeError, match=r"trainer_state\['stream'\]\['order'\]: .* not builtins.object"):
        check_data_only({"stream": {"order": object()}})
    bad = tmp_path / "step_0000001"
    bad.mkdir()
    torch.save({"optimizer": {}, "scheduler": {}, "x": RunsCode(tmp_path / "pwned")}, bad / "trainer_state.pt")
    from safetensors.torch import save_file

    save_file({n: p.detach().contiguous() for n, p in tiny_model.named_parameters()},
              str(bad / "trainable.safetensors"))
    opt = torch.optim.AdamW(tiny_model.parameters())
    # `explorl sft --resume` goes through the same load
    with pytest.raises(UnsafeCheckpointError, match="holds more than data"):
        load_checkpoint(bad, tiny_model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0))
    assert not (tmp_path / "pwned").exists()


# ------------------------------------------------------------------------------------- torn lines after a kill


def test_a_torn_last_line_is_dropped_with_a_warning_and_the_resume_matches(tiny_model_dir, tmp_path, monkeypatch,
                                                                          full):
    """The issue: a torn last line of metrics.jsonl made `--resume` fail with `Expecting ':' delimiter`, naming
    neither file nor line."""
    killed = _killed_after_step_3(tiny_model_dir, tmp_path / "killed", monkeypatch)  # checkpoint: step 2
    with open(killed / "metrics.jsonl", "a") as f:  # a kill in the middle of writing step 4's record
        f.write('{"step": 4, "reward/mean": 0.25, "entrop')
    with open(killed / "samples.jsonl", "a") as f:
        f.write('{"step": 4, "prompt": "1+')
    with pytest.warns(Warning) as caught:
        resumed = train(load_config(killed / "config.yaml"), resume=killed, progress=False)
    said = [str(w.message) for w in caught]
    assert any(f"{killed / 'metrics.jsonl'}:4: the last line is incomplete" in m for m in said), said
    assert any(f"{killed / 'samples.jsonl'}:4: the last line is incomplete" in m for m in said), said
    assert _strip(_records(resumed)) == _strip(_records(full))
    assert (resumed / "samples.jsonl").read_text() == (full / "samples.jsonl").read_text()


def test_a_damaged_line_before_the_last_is_an_error_naming_file_and_line(tmp_path):
    log = RunLog(tmp_path)
    log.metrics_path.write_text('{"step": 1, "reward/mean": 0.5}\n{"step": 2, "rew\n{"step": 3, "reward/mean": 1}\n')
    before = log.metrics_path.read_text()
    with pytest.raises(ValueError, match=f"{log.metrics_path}:2: not a JSON record"):
        log.truncate_metrics(3)
    assert log.metrics_path.read_text() == before  # nothing dropped silently
    log.metrics_path.write_text('{"step": 1, "reward/mean": 0.5}\n{"reward/mean": 0.5}\n')
    with pytest.raises(ValueError, match=f"{log.metrics_path}:2: not a record of this run"):
        log.truncate_metrics(3)


def test_a_torn_config_history_line_is_dropped_before_the_next_change(tmp_path):
    log = RunLog.open(tmp_path / "run", "run: {seed: 1}\n", None)
    log.close()
    history = tmp_path / "run" / "config_history.jsonl"
    history.write_text('{"time": "t", "resumed_after_step": 0, "changes": {}, "previous": "x"}\n{"time": "t", "re')
    with pytest.warns(Warning, match="config_history.jsonl:2: the last line is incomplete"):
        log = RunLog.open(None, "run: {seed: 2}\n", resume=tmp_path / "run")
    log.close()
    records = [json.loads(line) for line in history.read_text().splitlines()]
    assert [r["previous"] for r in records] == ["x", "run: {seed: 1}\n"]
    assert records[1]["changes"] == {"run.seed": [1, 2]}


def test_samples_are_flushed_record_by_record(tmp_path):
    """SIGKILL while the second sample record is being made: the first is in samples.jsonl, whole (before, the
    records of a step sat in a buffer until the file was closed, and a kill lost them all)."""
    code = textwrap.dedent(f"""
        import os, signal, types
        import torch
        from explorl.runs.log import RunLog

        class Killed:
            answer = "2"
            @property
            def prompt(self):
                os.kill(os.getpid(), signal.SIGKILL)

        first = types.SimpleNamespace(prompt="1+1", answer="2")
        ro = types.SimpleNamespace(group=torch.tensor([0, 0, 1, 1]))
        RunLog({str(tmp_path)!r}).log_samples(1, [first, Killed()], ro, ["a", "b", "c", "d"], [1.0, 0.0, 0.0, 0.0], 2)
    """)
    done = subprocess.run([sys.executable, "-c", code], timeout=120)
    assert done.returncode == -9
    lines = (tmp_path / "samples.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [{"step": 1, "prompt": "1+1", "answer": "2",
                                                     "completions": ["a", "b"], "rewards": [1.0, 0.0]}]
