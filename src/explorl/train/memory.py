"""Peak accelerator memory of each phase of a training step, for the `perf/mem_<phase>_gib` metrics.

On CUDA the allocator's peak is reset as a phase begins and read as it ends, so each metric is the most memory the
tensors of that phase (and everything alive beside them: weights, optimizer state, the reference) held at once:
`sample` (rollouts and rewards), `logprob` (pi_old's and the reference's forward passes before the update) and
`update` (the update's forward and backward passes and the optimizer step). `perf/mem_peak_gib` is the step's
largest. On other devices nothing is measured and no metric is written (the CPU allocator keeps no such count).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

GIB = 2**30


class PhasePeaks:
    """Peak memory per phase on `device` (CUDA only): `with peaks.phase("sample"): ...`, then `peaks.metrics()`."""

    def __init__(self, device: torch.device):
        self.device = device
        self.enabled = device.type == "cuda"
        self.peaks: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        torch.cuda.reset_peak_memory_stats(self.device)
        try:
            yield
        finally:
            self.peaks[name] = torch.cuda.max_memory_allocated(self.device) / GIB

    def metrics(self) -> dict[str, float]:
        """`perf/mem_<phase>_gib` of each phase measured, and `perf/mem_peak_gib`; empty off CUDA."""
        if not self.peaks:
            return {}
        out = {f"perf/mem_{name}_gib": value for name, value in self.peaks.items()}
        out["perf/mem_peak_gib"] = max(self.peaks.values())
        return out
