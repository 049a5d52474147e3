"""The checks before a resume (`check_resume`): everything `explorl train --resume RUN` (and `sft --resume`) would
refuse that can be known without loading weights, checked before anything of RUN is written (config.yaml,
config_history.jsonl, the lock's pid) and by `--dry-run` alike, with the real run's messages: RUN is a run explorl
made, no other process writes it, it holds no symbolic link, its last checkpoint is whole (not cut short),
`model.path` still holds the weights the run started from (`model.fingerprint`), and the overrides change nothing
the run's checkpoints cannot take (`model.lora`'s shape). The code RUN's config.yaml names was refused before it
was loaded (`explorl.config.trust`). `check_run_inputs(cfg, resume=RUN)` calls it.
"""

from __future__ import annotations

from pathlib import Path

from explorl.config import Config, ConfigError
from explorl.config.recorded import recorded_model
from explorl.models.fingerprint import check_fingerprint
from explorl.runs.checkpoint_damage import check_checkpoint_files
from explorl.runs.lock import is_explorl_run, refuse_if_locked, refuse_links_in_run

LORA_SHAPE = ("enabled", "rank", "target_modules")
"""The `model.lora` fields that decide which tensors a checkpoint holds: a resume cannot change them."""


def check_resume(cfg: Config, run: str | Path, command: str = "train") -> list[tuple[str, str]]:
    """Refuse, before anything is written, a resume of `run` with `cfg` that the real run would refuse: not a run
    explorl made (FileExistsError), locked by another process (RunDirLocked), `model.path` holding other weights
    than `model.fingerprint` (ConfigError), a `model.lora` shape other than its checkpoints' (ConfigError). Returns
    the dry run's line. Also a symbolic link in RUN (LinkRefused) and a last checkpoint visibly damaged
    (DamagedCheckpoint: cut short, not a safetensors or torch file)."""
    run = Path(run)
    if not (run / "config.yaml").exists():
        raise FileNotFoundError(f"--resume {run}: no config.yaml there; is it a run directory?")
    if not is_explorl_run(run):
        raise FileExistsError(f"--resume {run}: not a run directory explorl made (no {run / '.lock'}, metrics.jsonl "
                              f"or checkpoints/ beside its config.yaml); nothing to continue")
    refuse_if_locked(run)
    refuse_links_in_run(run)
    check_fingerprint(cfg.model)  # memoised: the real run's check costs nothing more
    checkpoints = sorted(p.name for p in (run / "checkpoints").glob("step_*") if p.is_dir())
    if checkpoints:
        _refuse_lora_change(cfg, run, checkpoints[-1], command)
        check_checkpoint_files(run / "checkpoints" / checkpoints[-1])
    last = f"continues from {checkpoints[-1]}" if checkpoints else "has no checkpoint yet: restarts from step 1"
    return [("--resume", f"{run}: a run explorl made, not in use; model.path holds the weights it started from; "
                         f"{last}")]


def _refuse_lora_change(cfg: Config, run: Path, checkpoint: str, command: str) -> None:
    """ConfigError naming each `LORA_SHAPE` field of `model.lora` whose value differs from RUN/config.yaml's: the
    checkpoint's tensors would not fit the model."""
    try:
        recorded = recorded_model(run / "config.yaml").lora
    except ConfigError:
        return  # loading the config names the problem
    now = cfg.model.lora
    changed = [f"model.lora.{f} {getattr(recorded, f)!r} -> {getattr(now, f)!r}" for f in LORA_SHAPE
               if getattr(recorded, f) != getattr(now, f) and (recorded.enabled or now.enabled)]
    if changed:
        raise ConfigError(f"{'; '.join(changed)}: {run / 'checkpoints' / checkpoint} holds the trained tensors of the "
                          f"run's model.lora, which a resume cannot change (they would not fit the model). Resume "
                          f"without changing it, or start a new run: explorl {command} "
                          f"{run / 'config.yaml'} run.out_dir=NEW_DIR ...")
