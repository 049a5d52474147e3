"""Issue 56 item 7: a damaged checkpoint, or a disk that fills up while one is written, is one clear error.

Loading: a truncated or garbage `trainable.safetensors`, a truncated or random-bytes `trainer_state.pt`, is refused
naming the file, what is wrong with it and the checkpoint to fall back to ("remove .../step_0000004 to continue from
step_0000002", or starting again when there is none); random bytes read as damage, not as an attack (the "holds
more than data" message stays for a file that really names an object to build). Writing: ENOSPC, and torch's
`basic_ios::clear: iostream error` that names neither file nor cause, give an error naming the checkpoint and "no
space left on device", with the previous checkpoint intact and no temporary directory left.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import random

import pytest
import torch
from rich.console import Console

from explorl import commands
from explorl.config import dump_yaml
from explorl.runs.checkpoints import (CheckpointNotWritten, DamagedCheckpoint, UnsafeCheckpointError,
                                      checkpoint_dirs, load_checkpoint, save_checkpoint)
from explorl.runs.log import RunLog
from test_run_control import _cfg


def _optim(model):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)


@pytest.fixture
def run(tmp_path, tiny_model):
    """A run directory with checkpoints step_0000002 and step_0000004."""
    run = tmp_path / "run"
    for step in (2, 4):
        save_checkpoint(run, step, tiny_model, *_optim(tiny_model), {"step": step}, keep=5)
    return run


def _hashes(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])


def _garbage(path):
    path.write_bytes(random.Random(0).randbytes(4096))


DAMAGE = [("trainable.safetensors", _truncate, "truncated"),
          ("trainable.safetensors", _garbage, "not a safetensors file"),
          ("trainable.safetensors", lambda p: p.write_bytes(b""), "empty"),
          ("trainer_state.pt", _truncate, "truncated"),
          ("trainer_state.pt", _garbage, "not a torch file"),
          ("trainer_state.pt", lambda p: p.write_bytes(b""), "empty"),
          ("trainer_state.pt", lambda p: p.unlink(), "missing")]


@pytest.mark.parametrize("file, damage, what", DAMAGE)
def test_a_damaged_checkpoint_names_the_file_and_the_one_to_fall_back_to(run, tiny_model, file, damage, what):
    newest = run / "checkpoints" / "step_0000004"
    damage(newest / file)
    with pytest.raises(DamagedCheckpoint) as e:
        load_checkpoint(newest, tiny_model, *_optim(tiny_model))
    said = str(e.value)
    assert said.startswith(f"{newest / file}: damaged checkpoint file: {what}"), said
    assert f"remove {newest} to continue from step_0000002" in said, said
    assert "more than data" not in said and "unpickles" not in said  # damage, not an attack


def test_random_bytes_never_read_as_an_attack(tmp_path):
    from explorl.runs.checkpoints import load_trainer_state

    file = tmp_path / "step_0000001" / "trainer_state.pt"
    file.parent.mkdir()
    for seed in range(50):
        rng = random.Random(seed)
        file.write_bytes(rng.randbytes(rng.choice([1, 10, 100, 4096])))
        with pytest.raises(DamagedCheckpoint, match="not a torch file"):
            load_trainer_state(file)


def test_with_no_earlier_checkpoint_the_fix_is_to_start_again(run, tiny_model):
    oldest = run / "checkpoints" / "step_0000002"
    _garbage(oldest / "trainer_state.pt")
    with pytest.raises(DamagedCheckpoint, match=f"no earlier checkpoint: remove {oldest} and `--resume` starts the "
                                                f"run again from step 1"):
        load_checkpoint(oldest, tiny_model, *_optim(tiny_model))


def test_a_pickled_object_still_reads_as_more_than_data(run, tiny_model):
    newest = run / "checkpoints" / "step_0000004"
    torch.save({"optimizer": {}, "scheduler": {}, "x": os.system}, newest / "trainer_state.pt")
    with pytest.raises(UnsafeCheckpointError, match=r"holds more than data \(.*GLOBAL posix.system"):
        load_checkpoint(newest, tiny_model, *_optim(tiny_model))


def test_resume_from_a_damaged_checkpoint_is_one_error_line(tmp_path, tiny_model, tiny_model_dir, monkeypatch):
    run = tmp_path / "run"
    log = RunLog.open(run, dump_yaml(_cfg(tiny_model_dir, run)), None)
    log.close()
    for step in (2, 4):
        save_checkpoint(run, step, tiny_model, *_optim(tiny_model), {"step": step}, keep=5)
    _truncate(run / "checkpoints" / "step_0000004" / "trainable.safetensors")
    buf = io.StringIO()
    monkeypatch.setattr(commands.common, "console", Console(file=buf, width=400, force_terminal=False))
    assert commands.main(["train", "--resume", str(run), "task.reward=rewards_for_tests:contains_digit"]) == 2
    said = " ".join(buf.getvalue().split())
    assert "Traceback" not in said
    assert (f"error: {run / 'checkpoints' / 'step_0000004' / 'trainable.safetensors'}: damaged checkpoint file: "
            f"truncated") in said, said
    assert f"remove {run / 'checkpoints' / 'step_0000004'} to continue from step_0000002" in said


def _fail(error):
    def write(*args, **kwargs):
        raise error
    return write


@pytest.mark.parametrize("writer, error, cause", [
    ("torch", OSError(errno.ENOSPC, "No space left on device"), "no space left on device"),
    ("torch", RuntimeError("basic_ios::clear: iostream error"), "the write failed (basic_ios::clear: iostream error): "
                                                                "most likely no space left on device"),
    ("safetensors", OSError(errno.ENOSPC, "No space left on device"), "no space left on device"),
])
def test_a_full_disk_names_the_checkpoint_and_keeps_the_previous_one(run, tiny_model, monkeypatch, writer, error,
                                                                     cause):
    import safetensors.torch

    previous = _hashes(run / "checkpoints" / "step_0000004")
    monkeypatch.setattr(*((torch, "save") if writer == "torch" else (safetensors.torch, "save_file")), _fail(error))
    with pytest.raises(CheckpointNotWritten) as e:
        save_checkpoint(run, 6, tiny_model, *_optim(tiny_model), {"step": 6}, keep=1)
    said = str(e.value)
    assert said.startswith(f"{run / 'checkpoints' / 'step_0000006'}: could not write the checkpoint: "), said
    assert cause in said and said.count("no space left on device") == 1, said
    assert "the previous checkpoint step_0000004 is intact" in said and ".tmp_step_0000006 was removed" in said
    assert isinstance(e.value, ValueError)  # the command line prints it as one line
    assert e.value.errno == (errno.ENOSPC if isinstance(error, OSError) else None)
    assert sorted(os.listdir(run / "checkpoints")) == ["step_0000002", "step_0000004"]  # nothing pruned, no temp
    assert [p.name for p in checkpoint_dirs(run)] == ["step_0000002", "step_0000004"]
    assert _hashes(run / "checkpoints" / "step_0000004") == previous


@pytest.mark.parametrize("file, damage, what", DAMAGE)
def test_a_checkpoint_cut_short_is_found_without_loading_it(run, file, damage, what):
    """What a resume checks before it writes anything (`check_checkpoint_files`, from `resume_checks.check_resume`)."""
    from explorl.runs.checkpoint_damage import check_checkpoint_files

    check_checkpoint_files(run / "checkpoints" / "step_0000004")  # whole: nothing said
    damage(run / "checkpoints" / "step_0000004" / file)
    with pytest.raises(DamagedCheckpoint, match=f"{file}: damaged checkpoint file: {what}.*continue from "
                                                f"step_0000002"):
        check_checkpoint_files(run / "checkpoints" / "step_0000004")


def test_a_refused_resume_from_a_damaged_checkpoint_writes_nothing(tmp_path, tiny_model, tiny_model_dir,
                                                                     monkeypatch):
    """Issue 56 item 8: the refusal comes before config.yaml, config_history.jsonl or the lock are touched."""
    run = tmp_path / "run"
    RunLog.open(run, dump_yaml(_cfg(tiny_model_dir, run)), None).close()
    (run / "metrics.jsonl").write_text('{"step": 2}\n')
    for step in (2, 4):
        save_checkpoint(run, step, tiny_model, *_optim(tiny_model), {"step": step}, keep=5)
    _truncate(run / "checkpoints" / "step_0000004" / "trainer_state.pt")
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    monkeypatch.setattr(commands.common, "console", Console(file=io.StringIO(), width=400, force_terminal=False))
    assert commands.main(["train", "--resume", str(run), "optim.lr=1e-4",
                          "task.reward=rewards_for_tests:contains_digit"]) == 2
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
