"""Which weights a model is: a hash of its weight files, recorded with every run and evaluation so that results of
two different models are never paired or pooled silently."""

from __future__ import annotations

import hashlib
from pathlib import Path

from explorl.config import ConfigError, ModelConfig
from explorl.models.paths import adapter_base, is_adapter_dir, resolve_model_path

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
_FINGERPRINTS: dict[tuple, str] = {}


def weights_fingerprint(path: str | Path) -> str:
    """A hash of a model's weights: sha256 (first 16 hex digits) over the weight files of the model directory
    `path` (or `embedded`), in name order, each file's name and bytes; a LoRA adapter's hash covers its base's
    fingerprint too. Recorded in `bootstrap.json`, in every run's `config.yaml` (`model.fingerprint`) and in every
    evaluation record, so results of two different models are never paired or pooled silently. Memoised per
    process by (path, file sizes, modification times); a 15 GB checkpoint takes some seconds the first time."""
    path = resolve_model_path(str(path))
    files = sorted(f for f in path.iterdir() if f.is_file() and f.name.endswith(WEIGHT_SUFFIXES)
                   and f.name not in ("training_args.bin", "optimizer.pt", "scheduler.pt", "rng_state.pth"))
    if not files:
        raise FileNotFoundError(f"{path}: no weight files ({', '.join(WEIGHT_SUFFIXES)}) to fingerprint")
    key = (str(path.resolve()), *((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files))
    if key not in _FINGERPRINTS:
        h = hashlib.sha256()
        if is_adapter_dir(path):
            h.update(weights_fingerprint(adapter_base(path)).encode())
        for f in files:
            h.update(f.name.encode() + b"\0")
            with open(f, "rb") as stream:
                while chunk := stream.read(1 << 24):
                    h.update(chunk)
        _FINGERPRINTS[key] = h.hexdigest()[:16]
    return _FINGERPRINTS[key]


def check_fingerprint(cfg: ModelConfig) -> str:
    """The fingerprint of `cfg.path`'s weights (`weights_fingerprint`); raises ConfigError naming `model.fingerprint`
    when the config records another one (a resumed or replayed run whose model changed under it)."""
    fingerprint = weights_fingerprint(cfg.path)
    if cfg.fingerprint and cfg.fingerprint != fingerprint:
        raise ConfigError(
            f"model.fingerprint: the config was made with the weights {cfg.fingerprint}, but model.path={cfg.path!r} "
            f"now holds {fingerprint}; continuing would mix two models in one run. Point model.path at the model it "
            f"was made with, or drop model.fingerprint to start a new run on this one.")
    return fingerprint
