"""`rollout.engines.static`'s CUDA-graph control on the CPU, with a stand-in for torch.cuda: how many steps run
before capture, that a failed capture warns and falls back to the step itself with nothing lost, and that a decode
too short to warm up is not captured. The graph's replay itself is checked on CUDA (tests/test_gpu.py)."""

from __future__ import annotations

import contextlib

import pytest
import torch

import explorl.rollout.engines.static as static


class FakeCuda:
    """torch.cuda's stream and graph calls the replayer makes; a captured step is recorded, not run (as CUDA's
    capture records kernels without running them), and replayed by calling it."""

    def __init__(self, capture_fails: bool = False):
        self.capture_fails = capture_fails
        self.capturing = False
        self.captures = 0  # graph() entered

    def is_available(self):
        return True

    def is_current_stream_capturing(self):
        return self.capturing

    def synchronize(self, device=None):
        pass

    def Stream(self, device=None):  # noqa: N802 (torch's name)
        return self

    def current_stream(self, device=None):
        return self

    def wait_stream(self, other):
        pass

    @contextlib.contextmanager
    def stream(self, s):
        yield

    def CUDAGraph(self):  # noqa: N802
        fake = self

        class Graph:
            def __init__(self):
                self.recorded = []

            def replay(self):
                for fn in self.recorded:
                    fn()

        graph = Graph()
        fake.made = graph
        return graph

    @contextlib.contextmanager
    def graph(self, graph):
        self.captures += 1
        if self.capture_fails:
            raise RuntimeError("operation not permitted when stream is capturing")
        self.capturing = True
        try:
            yield
        finally:
            self.capturing = False


@pytest.fixture(autouse=True)
def fresh_graph_counts(monkeypatch):
    """Each test starts with no capture made or failed in the process (`static.GRAPHS`)."""
    monkeypatch.setattr(static, "GRAPHS", {"captured": 0, "failed": 0})


def _counting_step(fake: FakeCuda):
    ran = []

    def step():
        if fake.capturing:  # the kernels a capture records: replayed later, not run now
            fake.made.recorded.append(lambda: ran.append("replay"))
        else:
            ran.append("eager")
    return step, ran


def test_the_step_runs_warmup_steps_then_is_captured_once_and_replayed(monkeypatch):
    fake = FakeCuda()
    monkeypatch.setattr(torch, "cuda", fake)
    step, ran = _counting_step(fake)
    run, done = static.replayer(step, torch.device("cuda"), steps=10)
    assert done == static.WARMUP_STEPS and ran == ["eager"] * static.WARMUP_STEPS  # the capture ran nothing
    for _ in range(10 - done):
        run()
    assert ran == ["eager"] * static.WARMUP_STEPS + ["replay"] * (10 - static.WARMUP_STEPS)


def test_a_failed_capture_warns_and_goes_on_with_the_step_itself(monkeypatch):
    fake = FakeCuda(capture_fails=True)
    monkeypatch.setattr(torch, "cuda", fake)
    step, ran = _counting_step(fake)
    with pytest.warns(RuntimeWarning, match="CUDA graph failed.*sampling.cuda_graph: false"):
        run, done = static.replayer(step, torch.device("cuda"), steps=10)
    assert done == static.WARMUP_STEPS and run is step  # the warm-up steps count: none is lost or repeated
    run()
    assert ran == ["eager"] * (static.WARMUP_STEPS + 1)
    assert static.GRAPHS == {"captured": 0, "failed": 1}


def test_after_a_failed_capture_none_is_tried_again_in_the_process(monkeypatch):
    """PyTorch leaves the allocator in an undefined state after a failed capture: the next decodes run the step
    itself from their first step (no warm-up on a side stream, no capture, no second warning)."""
    fake = FakeCuda(capture_fails=True)
    monkeypatch.setattr(torch, "cuda", fake)
    step, ran = _counting_step(fake)
    with pytest.warns(RuntimeWarning, match="CUDA graph failed"):
        static.replayer(step, torch.device("cuda"), steps=10)
    ran.clear()
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert static.replayer(step, torch.device("cuda"), steps=10) == (step, 0)
    assert fake.captures == 1 and ran == []


def test_a_capture_that_raises_inside_a_compiled_step_is_not_taken_for_a_compile_failure(monkeypatch):
    """An error inside capture raised through `maybe_compiled`'s wrapper reaches the replayer (which decodes without
    the graph) and is not recorded as a failed compilation, which would turn compiling off for the whole run,
    training included; outside capture the same error is a compile failure (eager from then on)."""
    import explorl.rollout.forward as fwd

    fake = FakeCuda()
    monkeypatch.setattr(torch, "cuda", fake)
    monkeypatch.setattr(fwd, "_COMPILED", {})
    monkeypatch.setattr(fwd, "_COMPILE_FAILED", [])

    ran = []

    def compiled_step(*args):  # compiles and runs, but an op of it is not permitted while capturing
        if fake.capturing:
            raise RuntimeError("operation not permitted when stream is capturing")
        ran.append("compiled")
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: compiled_step)
    call = fwd.maybe_compiled("capture test", lambda: ran.append("eager"), True, lambda: [])
    with pytest.warns(RuntimeWarning, match="CUDA graph failed") as caught:
        run, done = static.replayer(call, torch.device("cuda"), steps=10)
    assert not any("torch.compile" in str(w.message) for w in caught)
    assert not fwd.compile_failed() and static.GRAPHS["failed"] == 1
    run()  # decoding goes on, compiled, without the graph
    assert ran == ["compiled"] * (static.WARMUP_STEPS + 1)


@pytest.mark.parametrize("device, steps", [("cpu", 10), ("cuda", static.WARMUP_STEPS)])
def test_no_graph_off_cuda_or_for_a_decode_shorter_than_the_warmup(monkeypatch, device, steps):
    fake = FakeCuda()
    monkeypatch.setattr(torch, "cuda", fake)
    step, ran = _counting_step(fake)
    assert static.replayer(step, torch.device(device), steps) == (step, 0) and ran == []


def test_the_tables_hold_each_steps_temperature_and_the_dynamic_decoders_uniforms():
    # temp_at(t) per step, broadcast to N rows; the uniforms those of `uniforms(N)` called once per step in order
    from explorl.rollout.draw import uniforms

    temps, u = static.tables(lambda t: torch.tensor(1.0 + t), num=3, max_new_tokens=4, device="cpu",
                             generator=torch.Generator().manual_seed(7))
    assert temps.shape == (4, 3) and temps[:, 0].tolist() == [1.0, 2.0, 3.0, 4.0] and (temps == temps[:, :1]).all()
    gen = torch.Generator().manual_seed(7)
    assert torch.equal(u, torch.stack([uniforms(3, "cpu", gen) for _ in range(4)]))
    assert u.shape == (4, 3, 1) and (u > 0).all() and (u <= 1).all()
