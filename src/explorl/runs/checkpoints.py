"""Checkpoints of a run directory (`checkpoints/step_<step>/`) and the random state they hold.

Checkpoints are written to a temporary name and renamed, so a kill never leaves a half checkpoint; they hold the
trainable weights, the optimizer and scheduler, every RNG (`rng_state`) and the loop's state (prompt stream,
controllers), so `--resume` continues a killed run exactly. They hold data only (safetensors, and tensors, numbers,
strings, lists and dicts in trainer_state.pt, checked when written), read back with `torch.load(weights_only=True)`:
a run directory is untrusted input (shared, downloaded), and loading one never unpickles an object, so it never runs
code.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import torch


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
    return sorted(p for p in root.glob("step_*") if p.is_dir()) if root.exists() else []


def save_checkpoint(run_dir: Path, step: int, model, optimizer, scheduler, state: dict, keep: int,
                    every: int = 0) -> Path:
    """Write checkpoint `step_<step>` (through a temporary directory) and prune the older ones: with `every` > 0
    a checkpoint off that schedule (a stop's, written so the run can resume) goes once a newer one exists, so it
    never evicts a scheduled one; of the rest the newest `keep` stay."""
    from safetensors.torch import save_file

    root = run_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:07d}"
    tmp = root / f".tmp_step_{step:07d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    trainable = {n: p.detach().cpu().contiguous() for n, p in model.named_parameters() if p.requires_grad}
    save_file(trainable, str(tmp / "trainable.safetensors"))
    trainer_state = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), **state}
    check_data_only(trainer_state)  # what `load_checkpoint` can read back without unpickling objects
    torch.save(trainer_state, tmp / "trainer_state.pt")
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    older = checkpoint_dirs(run_dir)[:-1]
    off_schedule = [p for p in older if every > 0 and int(p.name[len("step_"):]) % every]
    kept = [p for p in older if p not in off_schedule]
    for old in off_schedule + kept[:max(len(kept) + 1 - max(keep, 1), 0)]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(path: Path, model, optimizer, scheduler) -> dict:
    from safetensors.torch import load_file

    weights = load_file(str(path / "trainable.safetensors"))
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


def load_trainer_state(path: Path) -> dict:
    """A checkpoint's trainer_state.pt, read as data only (`weights_only=True`: tensors, numbers, strings, lists,
    dicts; no object is unpickled, so no code in the file runs). UnsafeCheckpointError naming the file and the fix
    when it holds anything else."""
    import pickle

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        detail = next((line.strip() for line in str(e).splitlines() if "GLOBAL" in line or "global" in line), "")
        raise UnsafeCheckpointError(
            f"{path}: holds more than data ({detail or 'objects a data-only load refuses'}); explorl never unpickles "
            f"objects from a run directory, since loading them could run any code the file names. explorl writes "
            f"its checkpoints as data only, so this file was written by something else or altered: continue from an "
            f"earlier checkpoint (remove {path.parent}), or start the run again from its config "
            f"(`explorl train {path.parent.parent.parent / 'config.yaml'} run.out_dir=NEW_DIR`)") from None
    if not isinstance(state, dict) or not {"optimizer", "scheduler"} <= set(state):
        raise UnsafeCheckpointError(f"{path}: not an explorl trainer state (a mapping with optimizer and scheduler "
                                    f"states); remove {path.parent} to continue from an earlier checkpoint")
    return state
