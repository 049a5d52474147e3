"""The suite's device pin (tests/conftest.py): tests not marked `gpu` run on the CPU on a machine with CUDA too,
module-scoped fixtures included (pytest sets those up before any function-scoped fixture of their first test)."""

from __future__ import annotations

import os

import pytest
import torch

import explorl.models.devices as devices


@pytest.fixture(scope="module")
def seen_by_a_module_fixture():
    """What a module-scoped fixture (one that trains a run, say) sees: `auto` with CUDA present, and the environment
    its subprocesses inherit."""
    real = torch.cuda.is_available
    torch.cuda.is_available = lambda: True  # as on a GPU machine; `auto` must still be the CPU
    try:
        return devices.resolve_device("auto"), os.environ.get("CUDA_VISIBLE_DEVICES")
    finally:
        torch.cuda.is_available = real


def test_auto_is_the_cpu_even_for_a_module_fixture(seen_by_a_module_fixture):
    device, visible = seen_by_a_module_fixture
    assert device == torch.device("cpu")
    assert visible == ""  # a torchrun or explorl subprocess started there sees no GPU (TRL's test then uses gloo)


def test_an_explicit_device_is_left_as_asked():
    assert devices.resolve_device("cpu") == torch.device("cpu")
    if not torch.cuda.is_available():
        with pytest.raises(devices.DeviceError, match="model.device='cuda'"):
            devices.resolve_device("cuda")


def test_a_failure_is_logged_the_moment_it_happens(tmp_path, monkeypatch):
    """`EXPLORL_FAILURE_LOG` (bench/gpu_lent.sh): a failed report is appended with its id, phase and error, in the
    controller only; a passed one and a worker's copy are not."""
    from types import SimpleNamespace

    import conftest

    log = tmp_path / "failures.txt"
    monkeypatch.setattr(conftest, "_FAILURE_LOG", str(log))
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    report = dict(nodeid="tests/x.py::test_y", when="setup", longreprtext="x" * 5000 + "RuntimeError: on cuda")
    conftest.pytest_runtest_logreport(SimpleNamespace(failed=False, **report))
    assert not log.exists()
    conftest.pytest_runtest_logreport(SimpleNamespace(failed=True, **report))
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")  # the same report seen in a worker: the controller wrote it
    conftest.pytest_runtest_logreport(SimpleNamespace(failed=True, **report))
    text = log.read_text()
    assert text.count("=== tests/x.py::test_y (setup)\n") == 1
    assert text.endswith("RuntimeError: on cuda\n") and len(text) < 4100  # the error's end, 4,000 characters
