"""A run's outputs as models: `RUN/final` (a full model, or a LoRA adapter) and `RUN/checkpoints/step_N` (the
trained tensors, `trainable.safetensors`, on top of the run's own model). `find_run_output` tells what a path
names; `load_run_output` loads it as a plain model, for evaluation and export; `load_model_under_test` is what
`explorl eval`, `frontier` and `probe` evaluate (a run's output or a model directory)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from safetensors.torch import load_file

from explorl.config import Config, LoraConfig
from explorl.config.recorded import is_run_dir
from explorl.models.fingerprint import check_fingerprint
from explorl.models.loading import is_peft, load_policy


@dataclasses.dataclass
class RunOutput:
    """A model written by `explorl train`: `final/` or a checkpoint of the run directory `run_dir`."""

    run_dir: Path
    model_dir: Path
    kind: str
    """`final` or `checkpoint`."""

    @property
    def config_path(self) -> Path:
        return self.run_dir / "config.yaml"

    @property
    def label(self) -> str:
        """`RUN_final` or `RUN_step_N`: names the run and the output, e.g. for `runs/eval/` files."""
        if self.kind == "checkpoint":
            return f"{self.run_dir.resolve().name}_step_{int(self.model_dir.name.rsplit('_', 1)[-1])}"
        return f"{self.run_dir.resolve().name}_final"


def find_run_output(path: str | Path) -> RunOutput | None:
    """The run output `path` names: a run directory (its `final/`), `RUN/final` or `RUN/checkpoints/step_N`
    (each with the run's config.yaml above it); None for anything else (a plain model directory)."""
    if str(path) in ("embedded", "embedded:testbed"):
        return None
    p = Path(path).expanduser()
    if is_run_dir(p) and not (p / "config.json").exists():
        if (p / "final").is_dir():
            return RunOutput(p, p / "final", "final")
        ckpts = sorted(c for c in (p / "checkpoints").glob("step_*") if c.is_dir())
        hint = f"; give a checkpoint instead, e.g. {ckpts[-1]}" if ckpts else " and no checkpoints"
        raise FileNotFoundError(f"{p} is a run directory without final/ (the run has not finished){hint}")
    if p.name == "final" and is_run_dir(p.parent):
        return RunOutput(p.parent, p, "final")
    if p.parent.name == "checkpoints" and p.name.startswith("step_") and is_run_dir(p.parent.parent):
        if not (p / "trainable.safetensors").exists():
            raise FileNotFoundError(f"{p}: no trainable.safetensors there; not a complete checkpoint")
        return RunOutput(p.parent.parent, p, "checkpoint")
    return None


def load_trainable(model, checkpoint_dir: str | Path) -> None:
    """Copy a checkpoint's `trainable.safetensors` (the parameters that were trained) into `model`."""
    path = Path(checkpoint_dir)
    weights = load_file(str(path / "trainable.safetensors"))
    named = dict(model.named_parameters())
    unknown = [n for n in weights if n not in named]
    missing = [n for n, p in named.items() if p.requires_grad and n not in weights]
    if unknown or missing:
        raise ValueError(f"{path}: the checkpoint does not fit the model its run's config.yaml describes "
                         f"({len(missing)} parameters missing, e.g. {missing[:3]}; {len(unknown)} unknown, e.g. "
                         f"{unknown[:3]}); was model.path or model.lora changed in config.yaml after the run?")
    with torch.no_grad():
        for n, t in weights.items():
            named[n].copy_(t.to(named[n].device, named[n].dtype))


def load_run_output(out: RunOutput, run_cfg: Config, device: str = "auto", dtype: str = "auto"):
    """(model, tokenizer, device) of a run output as a plain model (LoRA adapters merged), for evaluation and
    export. A checkpoint is the run's model (`run_cfg.model`) with the checkpoint's trainable weights; the caller
    has checked the base's fingerprint (`check_fingerprint`). A run directory is not trusted to run code: its
    config.yaml's `model.trust_remote_code` is not followed here."""
    base = dataclasses.replace(run_cfg.model, device=device, dtype=dtype, gradient_checkpointing=False,
                               trust_remote_code=False)
    if out.kind == "final":
        return load_policy(dataclasses.replace(base, path=str(out.model_dir), lora=LoraConfig(enabled=False)))
    model, tok, dev = load_policy(base)
    load_trainable(model, out.model_dir)
    if is_peft(model):
        model = model.merge_and_unload()
    return model, tok, dev


def load_model_under_test(run, run_cfg, model_cfg, console=None):
    """(model, tokenizer) of what `explorl eval` / `explorl probe` evaluate: a run's output (`models.find_run_output`:
    RUN, RUN/final, RUN/checkpoints/step_N, with `run_cfg` its config) or the model directory / `embedded` of
    `model_cfg`. A checkpoint is its run's base model plus the trained weights: the base must still be the model the
    run started from (`model.fingerprint` of its config.yaml)."""
    if run is not None:
        if run.kind == "checkpoint":
            check_fingerprint(run_cfg.model)
        model, tok, _ = load_run_output(run, run_cfg, device=model_cfg.device, dtype=model_cfg.dtype)
    else:
        model, tok, _ = load_policy(model_cfg)
    return model, tok
