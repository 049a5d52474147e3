"""Where a model runs and in which precision: `model.device` and `model.dtype` resolved.

Every caller looks `resolve_device` up here at call time (`devices.resolve_device(...)`, or a function-level
`from explorl.models.devices import resolve_device`), so replacing it in this module (the test suite pins `auto` to
the CPU this way) reaches every model explorl loads.
"""

from __future__ import annotations

import torch

from explorl.config import ConfigError


class DeviceError(ConfigError, RuntimeError):
    """The configured device cannot be used here (a config error, so the command line prints one line)."""


def resolve_device(spec: str = "auto") -> torch.device:
    """`auto` picks cuda when present, else cpu; an explicit cuda request without a GPU fails clearly."""
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if spec.startswith("cuda") and not torch.cuda.is_available():
        raise DeviceError(f"model.device={spec!r} but no CUDA device is available (torch.cuda.is_available() is "
                          f"False); use model.device=cpu or auto (`explorl eval`: --device cpu)")
    return torch.device(spec)


def resolve_dtype(spec: str, device: torch.device) -> torch.dtype:
    """`auto`: bfloat16 on GPUs that support it, float32 elsewhere (CPU bf16 matmuls are slow and imprecise)."""
    if spec == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[spec]
