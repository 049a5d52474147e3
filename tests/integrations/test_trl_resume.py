"""A resumed TRL run runs what its config.yaml says: the configured AdamW settings and schedule are put back after
TRL loads a checkpoint's (`explorl.integrations.trl.run`)."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("trl")

from explorl.integrations.trl.run import (configured_hyperparameters, keep_configured_optimizer,  # noqa: E402
                                          record_resume_step, resumed_round)


def linear_decay(step: int) -> float:
    return 1 - step / 10  # at step 3: 0.7


def adamw(lr: float, weight_decay: float):
    weights = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.AdamW([weights], lr=lr, weight_decay=weight_decay, betas=(0.9, 0.99))
    return weights, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, linear_decay)


def test_the_configured_rate_and_settings_replace_the_checkpoints_and_the_moments_stay():
    weights, optimizer, scheduler = adamw(1e-3, 0.1)
    for _ in range(3):
        weights.grad = torch.ones(3)
        optimizer.step()
        scheduler.step()
    saved = optimizer.state_dict(), scheduler.state_dict()
    _, resumed, resumed_scheduler = adamw(2e-4, 0.0)  # the resumed run's config: lr 2e-4, no weight decay
    configured = configured_hyperparameters(resumed)
    resumed.load_state_dict(saved[0])
    resumed_scheduler.load_state_dict(saved[1])
    assert resumed.param_groups[0]["lr"] == pytest.approx(7e-4)  # torch alone: the old run's 1e-3 x 0.7
    keep_configured_optimizer(resumed, resumed_scheduler, configured)
    group = resumed.param_groups[0]
    assert group["lr"] == pytest.approx(1.4e-4) and resumed_scheduler.get_last_lr() == [pytest.approx(1.4e-4)]
    assert group["weight_decay"] == 0.0 and group["initial_lr"] == 2e-4 and resumed_scheduler.last_epoch == 3
    assert torch.equal(resumed.state_dict()["state"][0]["exp_avg"], saved[0]["state"][0]["exp_avg"])
    resumed_scheduler.step()  # the schedule goes on from there with the configured base rate: 2e-4 x 0.6
    assert resumed.param_groups[0]["lr"] == pytest.approx(1.2e-4)


def test_the_resumed_step_is_the_checkpoints_round(tmp_path):
    ckpt = tmp_path / "checkpoint-4"
    ckpt.mkdir()
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": 4}))
    assert resumed_round(ckpt, updates_per_round=2) == 2  # 4 optimizer steps of 2 per round
    (ckpt / "explorl_schedule.json").write_text(json.dumps({"round": 3}))
    assert resumed_round(ckpt, updates_per_round=2) == 3  # explorl's own record wins
    assert resumed_round(tmp_path / "missing", 1) == 0


def test_only_the_record_this_resume_appended_is_corrected(tmp_path):
    history = tmp_path / "config_history.jsonl"
    history.write_text(json.dumps({"resumed_after_step": 5, "changes": {}}) + "\n")
    record_resume_step(history, 1, 9)  # nothing appended since: unchanged
    assert json.loads(history.read_text())["resumed_after_step"] == 5
    with open(history, "a") as f:
        f.write(json.dumps({"resumed_after_step": 0, "changes": {"optim.lr": [1, 2]}}) + "\n")
    record_resume_step(history, 1, 9)
    records = [json.loads(line) for line in history.read_text().splitlines()]
    assert [r["resumed_after_step"] for r in records] == [5, 9] and records[1]["changes"] == {"optim.lr": [1, 2]}
