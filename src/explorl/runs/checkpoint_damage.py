"""What is wrong with a checkpoint file that does not read, in words a user can act on (`DamagedCheckpoint`: the
file, the damage, the checkpoint to fall back to), and the check a resume makes before it writes anything
(`check_checkpoint_files`). Apart from `explorl.runs.checkpoints`, which loads and writes them, so the checks
before a run (`explorl.models`) can use it without the loop's modules."""

from __future__ import annotations

import zipfile
from pathlib import Path

from safetensors import SafetensorError, safe_open


class DamagedCheckpoint(ValueError):
    """A checkpoint file that is truncated or not the kind of file it should be (a disk that filled up, a copy cut
    short, bytes changed); the message names the file and the earlier checkpoint to continue from."""


def fallback(checkpoint: Path) -> str:
    """What to do instead of loading `checkpoint` (a `step_*` directory): the earlier checkpoint beside it, by name,
    or starting again when there is none."""
    earlier = [p.name for p in sorted(checkpoint.parent.glob("step_*"))
               if p.name < checkpoint.name and p.is_dir() and not p.is_symlink()]
    if earlier:
        return f"remove {checkpoint} to continue from {earlier[-1]} (`--resume` takes the newest checkpoint)"
    return (f"there is no earlier checkpoint: remove {checkpoint} and `--resume` starts the run again from step 1, "
            f"or start again in a new directory (run.out_dir=NEW_DIR)")


def damaged(file: Path, what: str) -> DamagedCheckpoint:
    return DamagedCheckpoint(f"{file}: damaged checkpoint file: {what}; {fallback(file.parent)}")


def safetensors_damage(file: Path, e: Exception) -> str:
    """What is wrong with a safetensors file that does not load (from its size and safetensors' message)."""
    if isinstance(e, FileNotFoundError):
        return "missing"
    size = file.stat().st_size if file.is_file() else 0
    if size == 0:
        return "empty (truncated)"
    if any(s in str(e) for s in ("incomplete metadata", "not fully covered", "too small")):
        return f"truncated ({size} bytes; the header describes more)"
    return f"not a safetensors file ({str(e).splitlines()[0][:120]})"


def torch_damage(file: Path, e: Exception) -> str:
    """What is wrong with a trainer_state.pt that does not load: torch writes a zip archive, so one that starts like
    a zip was cut short or altered inside, and anything else was never a torch file."""
    if isinstance(e, FileNotFoundError):
        return "missing"
    with open(file, "rb") as f:
        head = f.read(4)
    if not head:
        return "empty (truncated)"
    if head == b"PK\x03\x04":
        return f"truncated or altered (a torch archive that does not read: {str(e).splitlines()[0][:100]})"
    return "not a torch file (its bytes are neither a torch archive nor a pickle of data)"


def check_checkpoint_files(path: Path) -> None:
    """DamagedCheckpoint when checkpoint directory `path` is visibly damaged, read without loading it (a resume's
    check before anything of the run is written): trainable.safetensors' header must describe bytes the file holds,
    and trainer_state.pt must be a whole torch archive (a zip whose directory, written last, is there). What only a
    full load finds (bytes changed inside, an object in the pickle) `load_checkpoint` still refuses."""
    file = path / "trainable.safetensors"
    try:
        with safe_open(str(file), framework="pt") as f:
            f.keys()
    except (SafetensorError, OSError) as e:
        raise damaged(file, safetensors_damage(file, e)) from None
    state = path / "trainer_state.pt"
    try:
        zipfile.ZipFile(state).close()
    except (zipfile.BadZipFile, OSError) as e:
        raise damaged(state, torch_damage(state, e)) from None
