"""Interrupting a training run the way a kill does, for the tests that resume it."""

from __future__ import annotations

import pytest

from explorl.runs.log import RunLog
from explorl.train.loop import train


def train_killed_at(monkeypatch, cfg, step: int) -> None:
    """`train(cfg)` stopped mid-way through `step`: a KeyboardInterrupt where that step logs its samples, after the
    checkpoints of the steps before it; `RunLog` is restored afterwards, so the run can then be resumed."""
    real_log = RunLog.log_samples

    def killed(self, at, *args, **kwargs):
        if at == step:
            raise KeyboardInterrupt
        return real_log(self, at, *args, **kwargs)

    monkeypatch.setattr(RunLog, "log_samples", killed)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, progress=False)
    monkeypatch.setattr(RunLog, "log_samples", real_log)
