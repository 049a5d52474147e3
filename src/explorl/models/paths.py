"""What `model.path` names: `embedded`, `embedded:testbed`, a local Hugging Face model directory, or a LoRA adapter
directory (`adapter_config.json`) whose base model is a local directory too. Hub downloads are never attempted."""

from __future__ import annotations

import json
import os
from pathlib import Path

from explorl.models.embedded import EMBEDDED_TESTBED_DIR, embedded_dir

ADAPTER_CONFIG = "adapter_config.json"  # what makes a directory a peft adapter


def resolve_model_path(path: str) -> Path:
    """`embedded` names the tiny default shipped with the package, `embedded:testbed` the second shipped model
    (`EMBEDDED_TESTBED_DIR`); anything else must be a local directory. Loading never trains a model."""
    if path == "embedded":
        target = embedded_dir()
        if not (target / "config.json").exists():
            where = "EXPLORL_EMBEDDED" if os.environ.get("EXPLORL_EMBEDDED") else "the installed package"
            raise FileNotFoundError(
                f"model.path='embedded': no model at {target} ({where}). Reinstall explorl (the weights ship with "
                f"it), or point EXPLORL_EMBEDDED at a directory written by `explorl bootstrap --out DIR`.")
        return target
    if path == "embedded:testbed":
        if not (EMBEDDED_TESTBED_DIR / "config.json").exists():
            raise FileNotFoundError(f"model.path='embedded:testbed': no model at {EMBEDDED_TESTBED_DIR}; reinstall "
                                    f"explorl (the weights ship with it)")
        return EMBEDDED_TESTBED_DIR
    p = Path(path).expanduser()
    if (p / "config.json").exists():
        return p
    if (p / ADAPTER_CONFIG).exists():
        adapter_base(p)  # the base model must be a local directory too
        return p
    if not p.exists():  # say so first: "no config.json there" reads as if the directory were there
        parent = next((a for a in p.parents if a.exists()), None)
        raise FileNotFoundError(
            f"model.path={path!r}: the directory {p} does not exist" + (f" ({parent} does)" if parent else "")
            + ". Give a local Hugging Face model directory (a relative model.path is relative to the config file "
              "that sets it; hub downloads are not attempted), or `embedded` for the built-in default.")
    hint = ""
    if (p / "trainable.safetensors").exists():
        hint = (" It is a training checkpoint (trainable.safetensors): `explorl eval --model` and `explorl export` "
                "take it where it lies, as RUN/checkpoints/step_N.")
    raise FileNotFoundError(
        f"model.path={path!r}: no config.json (a Hugging Face model) or {ADAPTER_CONFIG} (a LoRA adapter) there. "
        f"Give a local Hugging Face model directory (hub downloads are not attempted), or `embedded` for the "
        f"built-in default.{hint}")


def is_adapter_dir(path: str | Path) -> bool:
    """A peft adapter directory (adapter_config.json) that is not itself a full model (no config.json)."""
    p = Path(path)
    return (p / ADAPTER_CONFIG).exists() and not (p / "config.json").exists()


def adapter_base(adapter_dir: str | Path) -> Path:
    """The local base model directory of a LoRA adapter: `base_model_name_or_path` in its adapter_config.json, as
    written (absolute, or relative to the working directory) or relative to the adapter directory."""
    p = Path(adapter_dir)
    try:
        base = json.loads((p / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    except (OSError, json.JSONDecodeError, AttributeError) as e:
        raise FileNotFoundError(f"{p / ADAPTER_CONFIG}: not a readable adapter config ({e})") from None
    if not base or not isinstance(base, str):
        raise FileNotFoundError(f"{p / ADAPTER_CONFIG}: names no base_model_name_or_path; set it to the local "
                                f"directory of the model the adapter was trained on")
    candidates = [Path(base).expanduser()]
    if not candidates[0].is_absolute():
        candidates.append(p / base)
    for c in candidates:
        if (c / "config.json").exists():
            return c
    raise FileNotFoundError(
        f"{p} is a LoRA adapter whose base model {base!r} ({ADAPTER_CONFIG}: base_model_name_or_path) is not a local "
        f"model directory with config.json (hub downloads are not attempted); put the base model there or edit "
        f"base_model_name_or_path in {p / ADAPTER_CONFIG}")


def has_tokenizer(path: Path) -> bool:
    """The directory holds a tokenizer (tokenizer.json or tokenizer_config.json)."""
    return (path / "tokenizer.json").exists() or (path / "tokenizer_config.json").exists()
