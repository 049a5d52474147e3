"""Checkpoints of a run directory (`checkpoints/step_<step>/`) and the random state they hold.

Checkpoints are written to a temporary name and renamed, so a kill never leaves a half checkpoint; they hold the
trainable weights, the optimizer and scheduler, every RNG (`rng_state`) and the loop's state (prompt stream,
controllers), so `--resume` continues a killed run exactly. They hold data only (safetensors, and tensors, numbers,
strings, lists and dicts in trainer_state.pt, checked when written), read back with `torch.load(weights_only=True)`:
a run directory is untrusted input (shared, downloaded), and loading one never unpickles an object, so it never runs
code; nor does writing one follow a symbolic link planted there (`explorl.runs.nofollow`): pruning deletes only
real `step_*` directories inside the run's own real `checkpoints/`.

A damaged checkpoint (truncated, or not a safetensors or torch file at all) is an error naming the file, what is
wrong and the earlier checkpoint to fall back to (`DamagedCheckpoint`); a full disk while one is written is an
error naming the path (`CheckpointNotWritten`), and the previous checkpoint stays as it was.
"""

from __future__ import annotations

import errno
import pickle
import random
import re
import shutil
from pathlib import Path

import safetensors.torch  # `safetensors.torch.save_file` looked up at call time: tests replace it
import torch
from safetensors import SafetensorError

from explorl.runs import nofollow
from explorl.runs.checkpoint_damage import DamagedCheckpoint, damaged, fallback, safetensors_damage, torch_damage


def rng_state(generators: dict[str, torch.Generator], device: torch.device) -> dict:
    """Every random state a step consumes: the named generators, torch's, CUDA's and Python's."""
    return {**{k: g.get_state() for k, g in generators.items()}, "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
            "python_rng": random.getstate()}


def restore_rng(state: dict, generators: dict[str, torch.Generator], device: torch.device) -> None:
    for k, g in generators.items():
        g.set_state(state[k])
    torch.set_rng_state(state["torch_rng"])
    if device.type == "cuda" and state.get("cuda_rng") is not None:
        torch.cuda.set_rng_state(state["cuda_rng"], device)
    random.setstate(state["python_rng"])


def checkpoint_dirs(run_dir: Path) -> list[Path]:
    """The run's checkpoint directories, oldest first (`step_<step>`, the step zero-padded, sorts by step)."""
    root = run_dir / "checkpoints"
    if root.is_symlink() or not root.is_dir():
        return []
    return sorted(p for p in root.glob("step_*") if p.is_dir() and not p.is_symlink())


def save_checkpoint(run_dir: Path, step: int, model, optimizer, scheduler, state: dict, keep: int,
                    every: int = 0) -> Path:
    """Write checkpoint `step_<step>` (through a temporary directory) and prune the older ones: with `every` > 0
    a checkpoint off that schedule (a stop's, written so the run can resume) goes once a newer one exists, so it
    never evicts a scheduled one; of the rest the newest `keep` stay. Nothing is written or deleted through a
    symbolic link (`nofollow`); CheckpointNotWritten when the disk is full, the temporary directory removed."""
    final = run_dir / "checkpoints" / f"step_{step:07d}"
    tmp = run_dir / "checkpoints" / f".tmp_step_{step:07d}"
    nofollow.remove(tmp, run_dir)
    nofollow.make_dirs(tmp, run_dir)  # a fresh, real directory: the files below are written nowhere else
    try:
        trainable = {n: p.detach().cpu().contiguous() for n, p in model.named_parameters() if p.requires_grad}
        safetensors.torch.save_file(trainable, str(tmp / "trainable.safetensors"))
        trainer_state = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), **state}
        check_data_only(trainer_state)  # what `load_checkpoint` can read back without unpickling objects
        torch.save(trainer_state, tmp / "trainer_state.pt")
    except Exception as e:
        shutil.rmtree(tmp, ignore_errors=True)  # checked above: a real directory inside the run
        if _write_failed(e):
            raise _not_written(tmp, final, e) from e
        raise
    nofollow.remove(final, run_dir)
    nofollow.replace(tmp, final, run_dir)
    older = checkpoint_dirs(run_dir)[:-1]
    off_schedule = [p for p in older if every > 0 and int(p.name[len("step_"):]) % every]
    kept = [p for p in older if p not in off_schedule]
    for old in off_schedule + kept[:max(len(kept) + 1 - max(keep, 1), 0)]:
        nofollow.remove(old, run_dir)
    return final


class CheckpointNotWritten(OSError, ValueError):
    """A checkpoint could not be written (no space left on device); the previous one is intact. An OSError with
    the errno, and a ValueError, so the command line prints it as one error line."""


def _write_failed(e: Exception) -> bool:
    """Whether `e` is a failed write: ENOSPC (or another OSError), safetensors' IoError, torch's stream errors
    (`basic_ios::clear: iostream error`, `file write failed`), which name neither the file nor the cause."""
    if isinstance(e, OSError):
        return True
    return any(s in str(e) for s in ("No space left", "StorageFull", "IoError", "iostream error", "write failed",
                                     "unexpected pos"))


def _not_written(tmp: Path, final: Path, e: Exception) -> CheckpointNotWritten:
    full = (isinstance(e, OSError) and e.errno == errno.ENOSPC) or "No space left" in str(e) or \
        "StorageFull" in str(e)
    try:
        free = f"{shutil.disk_usage(tmp.parent).free / 2**20:.0f} MiB free there now"
    except OSError:
        free = "free space unknown"
    if full:
        cause = "no space left on device"
    elif isinstance(e, OSError):
        cause = e.strerror or str(e)
    else:  # torch and safetensors name neither the file nor the cause
        cause = f"the write failed ({str(e).splitlines()[0][:120]}): most likely no space left on device"
    previous = [p.name for p in checkpoint_dirs(final.parent.parent)]
    kept = f"the previous checkpoint {previous[-1]} is intact" if previous else "no earlier checkpoint exists"
    fix = "free some space" if full or not isinstance(e, OSError) else "fix that"
    error = CheckpointNotWritten(f"{final}: could not write the checkpoint: {cause} ({free}); {kept} and the "
                                 f"temporary directory {tmp.name} was removed. {fix.capitalize()}, then continue the "
                                 f"run with `--resume {final.parent.parent}`")
    error.errno = errno.ENOSPC if full else getattr(e, "errno", None)
    return error


def load_checkpoint(path: Path, model, optimizer, scheduler) -> dict:
    """Load checkpoint directory `path` into the model, optimizer and scheduler; the rest of its trainer state is
    returned. DamagedCheckpoint (naming the file and the earlier checkpoint) when a file is truncated or not what
    it should be."""
    file = path / "trainable.safetensors"
    try:
        weights = safetensors.torch.load_file(str(file))
    except (SafetensorError, OSError) as e:
        raise damaged(file, safetensors_damage(file, e)) from None
    named = dict(model.named_parameters())
    missing = [n for n, p in named.items() if p.requires_grad and n not in weights]
    if missing:
        raise RuntimeError(f"checkpoint {path} lacks parameters {missing[:5]}... (config changed since the run?)")
    with torch.no_grad():
        for n, t in weights.items():
            named[n].copy_(t.to(named[n].device, named[n].dtype))
    state = load_trainer_state(path / "trainer_state.pt")
    optimizer.load_state_dict(state.pop("optimizer"))
    scheduler.load_state_dict(state.pop("scheduler"))
    return state


DATA_TYPES = (torch.Tensor, dict, list, tuple, str, bytes, int, float, bool, type(None))
"""What a checkpoint's trainer_state.pt may hold: `torch.load(weights_only=True)` reads these without running code."""


def check_data_only(value, where: str = "trainer_state") -> None:
    """TypeError naming the entry when `value` holds anything but `DATA_TYPES` (an object a data-only load would
    refuse): a controller's `state_dict` must return plain data."""
    if not isinstance(value, DATA_TYPES):
        raise TypeError(f"{where}: a checkpoint holds data only (tensors, numbers, strings, lists, dicts), not "
                        f"{type(value).__module__}.{type(value).__qualname__}; return plain data from its state_dict")
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, (str, int, float, bool, type(None))):
                raise TypeError(f"{where}: key {k!r} of type {type(k).__qualname__}; keys must be strings or numbers")
            check_data_only(v, f"{where}[{k!r}]")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            check_data_only(v, f"{where}[{i}]")


class UnsafeCheckpointError(ValueError):
    """A checkpoint file that cannot be read as data only (it names code to run); never unpickled."""


PICKLED_OBJECT = re.compile(r"\bGLOBAL [A-Za-z_][\w.]* (whose|was)\b")
"""How `torch.load(weights_only=True)` names an object a pickle asks for (`unsupported GLOBAL posix.system whose
module posix is blocked`, `GLOBAL __main__.R was not an allowed global`): the one sign that a file holds more than
data, rather than random or cut-off bytes (whose opcodes torch calls unsupported, or that end early)."""


def load_trainer_state(path: Path) -> dict:
    """A checkpoint's trainer_state.pt, read as data only (`weights_only=True`: tensors, numbers, strings, lists,
    dicts; no object is unpickled, so no code in the file runs). UnsafeCheckpointError naming the file and the fix
    when it names an object to build; DamagedCheckpoint when it is truncated or not a torch file."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        detail = PICKLED_OBJECT.search(str(e))
        if detail is None:
            raise damaged(path, torch_damage(path, e)) from None
        detail = next((line.strip() for line in str(e).splitlines() if "GLOBAL" in line), detail.group(0))
        raise UnsafeCheckpointError(
            f"{path}: holds more than data ({detail or 'objects a data-only load refuses'}); explorl never unpickles "
            f"objects from a run directory, since loading them could run any code the file names. explorl writes "
            f"its checkpoints as data only, so this file was written by something else or altered: continue from an "
            f"earlier checkpoint (remove {path.parent}), or start the run again from its config "
            f"(`explorl train {path.parent.parent.parent / 'config.yaml'} run.out_dir=NEW_DIR`)") from None
    except Exception as e:  # cut short, or bytes torch cannot parse (EOFError, RuntimeError, IndexError, ...)
        raise damaged(path, torch_damage(path, e)) from None
    if not isinstance(state, dict) or not {"optimizer", "scheduler"} <= set(state):
        raise DamagedCheckpoint(f"{path}: not an explorl trainer state (a mapping with optimizer and scheduler "
                                f"states); {fallback(path.parent)}")
    return state
