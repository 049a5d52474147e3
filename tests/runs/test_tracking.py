"""run.report_to: TensorBoard event files and W&B offline runs, read back after a real short run and its resume."""

from __future__ import annotations

import json

import pytest

from explorl.config import ConfigError, load_config
from explorl.runs.tracking import scalars


def _cfg(model_dir, out, *extra):
    return load_config(None, [f"model.path={model_dir}", f"run.out_dir={out}", "run.steps=3", "run.batch_size=2",
                              "sampling.group_size=2", "sampling.max_new_tokens=8", "task.train_size=4",
                              "task.eval_size=2", "task.difficulties=[1]", "run.eval_n=2", "run.eval_k=[1,2]",
                              "run.eval_every=2", "run.save_every=2", "task.reward=rewards_for_tests:contains_digit",
                              *extra])


def test_scalars_flatten_lists_and_drop_what_is_not_a_number():
    rec = {"step": 3, "reward/mean": 0.5, "entropy/by_position": [0.1, None, 0.3], "entropy/pos": None,
           "loss/nonfinite": 0, "flag": True}
    assert scalars(rec) == {"reward/mean": 0.5, "entropy/by_position/0": 0.1, "entropy/by_position/2": 0.3,
                            "loss/nonfinite": 0.0}


def test_unknown_tracker_is_refused():
    with pytest.raises(ConfigError, match="run.report_to: unknown tracker"):
        load_config(None, ["run.report_to=[mlflow]"])


def test_tensorboard_gets_every_step_and_eval_and_a_resume_continues_it(tiny_model_dir, tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from explorl.train.loop import train
    from run_helpers import train_killed_at

    out = tmp_path / "run"
    train_killed_at(monkeypatch, _cfg(tiny_model_dir, out, "run.report_to=[tensorboard]"), 3)  # after step 2's
    train(load_config(out / "config.yaml"), resume=out, progress=False)
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    for key in ("reward/mean", "entropy/mean", "loss/pg", "eval/pass@1", "entropy/by_position/0"):
        assert key in tags, key
    # one value per step, equal to metrics.jsonl: the killed step 3 was purged and logged again once
    steps = [e.step for e in events.Scalars("reward/mean")]
    assert sorted(set(steps)) == [1, 2, 3]
    last = {e.step: e.value for e in events.Scalars("reward/mean")}
    want = {r["step"]: r["reward/mean"] for r in records if "reward/mean" in r}
    assert last == pytest.approx(want)
    assert [e.step for e in events.Scalars("eval/pass@1")] == [2, 3]  # the mid-run and the final evaluation


def test_wandb_offline_run_holds_the_metrics_and_is_resumed(tiny_model_dir, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from explorl.train.loop import train
    from run_helpers import train_killed_at

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "run"
    train_killed_at(monkeypatch, _cfg(tiny_model_dir, out, "run.report_to=[wandb]", "run.wandb_project=explorl-test"),
                    3)
    run_id = (out / "wandb_run_id").read_text().strip()
    train(load_config(out / "config.yaml"), resume=out, progress=False)
    assert (out / "wandb_run_id").read_text().strip() == run_id  # the resume continued the same W&B run
    files = sorted((out / "wandb").glob(f"offline-run-*-{run_id}*/run-{run_id}.wandb"))
    assert len(files) == 2  # the first part and the resumed part, under one run id
    data = b"".join(f.read_bytes() for f in files)  # W&B's own record files (protobuf)
    for key in (b"reward/mean", b"eval/pass@1", b"explorl-test", b"max_new_tokens"):
        assert key in data, key
