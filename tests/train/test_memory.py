"""`explorl.train.memory.PhasePeaks`: one allocator peak per phase on CUDA, nothing elsewhere."""

from __future__ import annotations

import pytest
import torch

from explorl.train.memory import GIB, PhasePeaks


def test_no_metrics_off_cuda():
    peaks = PhasePeaks(torch.device("cpu"))
    with peaks.phase("sample"):
        torch.zeros(1000)
    assert peaks.metrics() == {}


def test_each_phase_reads_the_peak_since_its_own_reset(monkeypatch):
    # a stand-in allocator: the peak since the last reset, driven by the phases' "allocations" below
    allocator = {"peak": 0.0, "resets": 0}
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: allocator.update(
        peak=0.0, resets=allocator["resets"] + 1))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: allocator["peak"])

    def allocate(gib: float) -> None:
        allocator["peak"] = max(allocator["peak"], gib * GIB)

    peaks = PhasePeaks(torch.device("cuda"))
    with peaks.phase("sample"):
        allocate(3.0)
    with peaks.phase("logprob"):
        allocate(1.5)  # below the sampling peak: read on its own, since the phase reset the count
    with pytest.raises(RuntimeError), peaks.phase("update"):  # a failing phase still records its peak
        allocate(5.25)
        raise RuntimeError("out of memory")
    assert allocator["resets"] == 3
    assert peaks.metrics() == {"perf/mem_sample_gib": 3.0, "perf/mem_logprob_gib": 1.5, "perf/mem_update_gib": 5.25,
                               "perf/mem_peak_gib": 5.25}
