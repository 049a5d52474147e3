"""Issue 56 items 1 and 8: a run directory (or a report folder, or an `--out` path's contents) is untrusted input at
rest, and a symbolic link planted in it never makes explorl write, rename or delete outside it.

Each test plants links into a folder `outside`, lists and hashes everything in `outside` before, runs explorl, and
checks that `outside` is exactly as it was and that the error names the planted entry. The first tests go through
the command line (a planted link is refused before any work); the others call the writers directly, past that first
check, so each writer is shown to refuse a link on its own (`explorl.runs.nofollow`).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path

import pytest
import torch
from rich.console import Console

from explorl import commands
from explorl.config import dump_yaml
from explorl.runs import nofollow
from explorl.runs.checkpoints import checkpoint_dirs, save_checkpoint
from explorl.runs.final import save_final_model
from explorl.runs.jsonl import append_jsonl, write_atomic
from explorl.runs.lock import RunLock, check_out_dir, is_explorl_run
from explorl.runs.log import RunLog
from explorl.runs.nofollow import LinkRefused
from test_run_control import _cfg

REFUSED = "is a symbolic link"
FIX = "Remove the link: a run directory holds no symbolic links"
TRUSTED_REWARD = "task.reward=rewards_for_tests:contains_digit"  # a run's own code is named again to run


def snapshot(folder: Path) -> dict[str, str]:
    """Every entry below `folder` (links not followed) with a hash of what a file holds ("dir" for a directory)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames:
            out[os.path.relpath(os.path.join(dirpath, name), folder)] = "dir"
        for name in filenames:
            path = os.path.join(dirpath, name)
            out[os.path.relpath(path, folder)] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    return out


@pytest.fixture
def outside(tmp_path):
    """A folder someone else's links point into: a file, and a directory holding a file."""
    folder = tmp_path / "outside"
    (folder / "dir").mkdir(parents=True)
    (folder / "file").write_text("not explorl's\n")
    (folder / "dir" / "keep.txt").write_text("not explorl's either\n")
    (folder / "dir" / "index.html").write_text("<p>someone's page</p>\n")
    return folder


@pytest.fixture
def said(monkeypatch):
    buf = io.StringIO()
    monkeypatch.setattr(commands.common, "console", Console(file=buf, width=400, force_terminal=False))
    return lambda: " ".join(buf.getvalue().split())


def _run_dir(tmp_path: Path, model_dir: Path) -> Path:
    """A run directory as `explorl train` leaves one after a step: lock file, config.yaml, a metrics record."""
    run = tmp_path / "run"
    log = RunLog.open(run, dump_yaml(_cfg(model_dir, run)), None)
    log.append_metrics({"step": 1, "reward/mean": 0.5, "entropy/mean": 1.0})
    log.close()
    return run


def _plant(run: Path, name: str, outside: Path) -> Path:
    entry = run / name
    if entry.is_dir() and not entry.is_symlink():
        import shutil

        shutil.rmtree(entry)
    elif entry.exists() or entry.is_symlink():
        entry.unlink()
    entry.parent.mkdir(parents=True, exist_ok=True)
    linked_dir = name in ("final", "final.tmp", "checkpoints", "tensorboard") or name.startswith("checkpoints/")
    entry.symlink_to(outside / ("dir" if linked_dir else "file"))
    return entry


# ------------------------------------------------------------------------------------- refused before any work


@pytest.mark.parametrize("name", [".lock", "metrics.jsonl.tmp", "samples.jsonl.tmp", "eval.json.tmp", "final.tmp",
                                  "final", "checkpoints", "config.yaml.tmp", "samples.jsonl", "reward_errors.log",
                                  "tensorboard", "checkpoints/step_0000009"])
def test_resume_refuses_a_planted_link_before_any_work(tmp_path, tiny_model_dir, outside, said, name):
    run = _run_dir(tmp_path, tiny_model_dir)
    entry = _plant(run, name, outside)
    before, own = snapshot(outside), snapshot(run)
    assert commands.main(["train", "--resume", str(run), "run.keep_checkpoints=1", TRUSTED_REWARD]) == 2
    assert f"{entry} (-> {os.readlink(entry)}) {REFUSED}" in said() and FIX in said(), said()
    assert snapshot(outside) == before
    assert snapshot(run) == own  # nothing written, not even the config.yaml of the resume


def test_a_new_run_into_a_directory_holding_only_a_lock_link_is_refused(tmp_path, tiny_model_dir, outside):
    run = tmp_path / "run"
    run.mkdir()
    (run / ".lock").symlink_to(outside / "file")
    before = snapshot(outside)
    assert not is_explorl_run(run)  # a linked .lock is not a lock file
    with pytest.raises(LinkRefused, match=f"{run / '.lock'} .*{REFUSED}"):
        check_out_dir(run)  # what the dry run checks
    with pytest.raises(LinkRefused, match=f"{run / '.lock'} .*{REFUSED}"):
        RunLog.open(run, dump_yaml(_cfg(tiny_model_dir, run)), None)
    assert snapshot(outside) == before and sorted(os.listdir(run)) == [".lock"]


def test_analyze_refuses_a_report_link(tmp_path, tiny_model_dir, outside, said):
    run = _run_dir(tmp_path, tiny_model_dir)
    (run / "report").symlink_to(outside / "dir")
    before = snapshot(outside)
    assert commands.main(["analyze", str(run)]) == 2
    assert f"{run / 'report'} (-> {outside / 'dir'}) {REFUSED}" in said(), said()
    assert snapshot(outside) == before


def test_analyze_refuses_a_link_inside_the_report_folder(tmp_path, tiny_model_dir, outside, said):
    run = _run_dir(tmp_path, tiny_model_dir)
    (run / "report").mkdir()
    (run / "report" / "index.html").symlink_to(outside / "dir" / "index.html")
    before = snapshot(outside)
    assert commands.main(["analyze", str(run)]) == 2
    assert f"{run / 'report' / 'index.html'} (-> " in said() and REFUSED in said(), said()
    assert snapshot(outside) == before


# -------------------------------------------------------------------- each writer refuses a link on its own


def test_the_lock_is_never_taken_through_a_link(tmp_path, outside):
    run = tmp_path / "run"
    run.mkdir()
    (run / ".lock").symlink_to(outside / "file")
    before = snapshot(outside)
    with pytest.raises(LinkRefused, match=r"\.lock"):
        RunLock.acquire(run)
    assert snapshot(outside) == before  # the target was neither emptied nor rewritten


@pytest.mark.parametrize("link", ["metrics.jsonl.tmp", "metrics.jsonl"])
def test_a_whole_file_is_never_written_or_renamed_through_a_link(tmp_path, outside, link):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    if link == "metrics.jsonl":
        (run / "metrics.jsonl").unlink()
    (run / link).symlink_to(outside / "file")
    before = snapshot(outside)
    with pytest.raises(LinkRefused, match=link.replace(".", r"\.")):
        write_atomic(run / "metrics.jsonl", '{"step": 2}\n')
    assert snapshot(outside) == before and (run / link).is_symlink()  # not renamed into place either


def test_records_are_never_appended_through_a_link(tmp_path, outside):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").symlink_to(outside / "file")
    (run / "samples.jsonl").symlink_to(outside / "file")
    before = snapshot(outside)
    with pytest.raises(LinkRefused, match="metrics.jsonl"):
        append_jsonl(run / "metrics.jsonl", {"step": 1})
    ro = type("Rollout", (), {"group": torch.tensor([0, 0])})()
    problem = type("Problem", (), {"prompt": "1+1", "answer": "2"})()
    with pytest.raises(LinkRefused, match="samples.jsonl"):
        RunLog(run).log_samples(1, [problem], ro, ["a", "b"], [1.0, 0.0], 1)
    assert snapshot(outside) == before


@pytest.mark.parametrize("link", ["final.tmp", "final"])
def test_the_final_model_is_never_written_through_a_link(tmp_path, tiny_model, char_tokenizer, outside, link):
    run = tmp_path / "run"
    run.mkdir()
    (run / link).symlink_to(outside / "dir")
    before = snapshot(outside)
    with pytest.raises(LinkRefused, match=f"{run / link} "):
        save_final_model(run / "final", tiny_model, char_tokenizer, card="# a card\n")
    assert snapshot(outside) == before
    assert sorted(os.listdir(run)) == [link]  # refused before anything was written


def _optim(model):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)


def test_checkpoints_are_never_written_or_pruned_through_a_link(tmp_path, tiny_model, outside):
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoints").symlink_to(outside / "dir")
    before = snapshot(outside)
    with pytest.raises(LinkRefused, match="checkpoints"):
        save_checkpoint(run, 2, tiny_model, *_optim(tiny_model), {"step": 2}, keep=1)
    assert snapshot(outside) == before


def test_pruning_deletes_only_real_checkpoint_directories(tmp_path, tiny_model, outside):
    run = tmp_path / "run"
    save_checkpoint(run, 2, tiny_model, *_optim(tiny_model), {"step": 2}, keep=5)
    (run / "checkpoints" / "step_0000001").symlink_to(outside / "dir")  # older, by name
    before = snapshot(outside)
    assert [p.name for p in checkpoint_dirs(run)] == ["step_0000002"]  # a link is no checkpoint
    save_checkpoint(run, 4, tiny_model, *_optim(tiny_model), {"step": 4}, keep=1)
    assert snapshot(outside) == before
    assert [p.name for p in checkpoint_dirs(run)] == ["step_0000004"]  # the real older one went
    assert (run / "checkpoints" / "step_0000001").is_symlink()


def test_a_report_is_never_written_through_a_link(tmp_path, tiny_model_dir, outside):
    from explorl.report import analyze

    run = _run_dir(tmp_path, tiny_model_dir)
    out = tmp_path / "elsewhere"
    out.mkdir()
    (out / "reward.png").symlink_to(outside / "file")
    before = snapshot(outside)
    with pytest.raises(LinkRefused, match="reward.png"):
        analyze(run, out)
    assert snapshot(outside) == before


# ----------------------------------------------------------------------------------------------- the primitives


def test_nofollow_primitives(tmp_path, outside):
    root = tmp_path / "root"
    root.mkdir()
    (root / "sub").symlink_to(outside / "dir")
    before = snapshot(outside)
    # a directory between the root and the path: rmtree(root/sub/x, ignore_errors=True) would follow it
    for act in (lambda: nofollow.remove(root / "sub" / "keep.txt", root),
                lambda: nofollow.make_dirs(root / "sub" / "new", root),
                lambda: nofollow.write_file(root / "sub" / "new.txt", "x", root),
                lambda: nofollow.replace(root / "sub" / "keep.txt", root / "moved", root)):
        with pytest.raises(LinkRefused, match=f"{root / 'sub'} "):
            act()
    assert snapshot(outside) == before
    # a left-over regular file is replaced by a new one (O_EXCL), never appended to or written through
    (root / "left.tmp").write_text("old")
    nofollow.write_file(root / "left.tmp", "new")
    assert (root / "left.tmp").read_text() == "new"
    with nofollow.open_append(root / "log") as f:
        f.write("a\n")
    with nofollow.open_append(root / "log") as f:
        f.write("b\n")
    assert (root / "log").read_text() == "a\nb\n"
    # the root itself may be a link (the user's choice: a run directory on a scratch disk)
    (tmp_path / "scratch").mkdir()
    (tmp_path / "linked_root").symlink_to(tmp_path / "scratch")
    nofollow.write_atomic(tmp_path / "linked_root" / "eval.json", json.dumps({"step": 1}))
    assert json.loads((tmp_path / "scratch" / "eval.json").read_text()) == {"step": 1}
