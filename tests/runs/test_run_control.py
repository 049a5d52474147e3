"""Issue 10 items 1, 5, 6 and 8 on real short runs (tiny random model, CPU): broken rewards are shown and stop the
run before an update, SIGINT/SIGTERM write a checkpoint, untrainable dtypes and non-finite weights are refused,
and resumed or finished runs leave exactly the files of an uninterrupted run."""

from __future__ import annotations

import io
import json
import os
import signal

import pytest
import torch
from rich.console import Console

import explorl.evaluation.evaluate as evaluate_module
import explorl.train.loop as trainer
from explorl.config import ConfigError, load_config
from explorl.runs.log import RunLog
from explorl.runs.progress import Progress
from explorl.train.loop import Interrupted, RunStopped, train


def _cfg(model_dir, out_dir, *extra):
    return load_config(None, [
        f"model.path={model_dir}", f"run.out_dir={out_dir}", "run.steps=4", "run.batch_size=3",
        "sampling.group_size=4", "sampling.max_new_tokens=12", "task.eval_size=4", "task.train_size=64",
        "task.difficulties=[1]", "run.eval_n=2", "run.eval_k=[1,2]", "optim.lr=1e-3", "run.save_every=2",
        "run.log_samples=1", "run.threads=1", "task.reward=rewards_for_tests:contains_digit", *extra])


def _console():
    buf = io.StringIO()
    return Console(file=buf, width=250, force_terminal=False), buf


def _records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _strip(records):
    return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in records]


def _params(path):
    from safetensors.torch import load_file
    return load_file(str(path / "model.safetensors"))


def _same_run(a, b):
    """Two run directories hold the same training: metrics (wall times aside), samples and final weights."""
    assert _strip(_records(a)) == _strip(_records(b))
    assert (a / "samples.jsonl").read_text() == (b / "samples.jsonl").read_text()
    pa, pb = _params(a / "final"), _params(b / "final")
    assert pa.keys() == pb.keys() and all(torch.equal(pa[k], pb[k]) for k in pa)


@pytest.fixture(scope="module")
def full(tiny_model_dir, tmp_path_factory):
    """The uninterrupted run that the stopped-and-resumed ones must reproduce (treat as read-only)."""
    return train(_cfg(tiny_model_dir, tmp_path_factory.mktemp("full") / "run"), progress=False)


@pytest.fixture
def update_calls(monkeypatch):
    """Counts the policy updates of the runs in a test."""
    calls = []
    real = trainer.update_policy

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer, "update_policy", counted)
    return calls


@pytest.fixture
def no_reward_precheck(monkeypatch):
    """Skip the call of each reward on a sample before the run (`rewards.check_rewards`, which refuses a reward that
    fails there before any work: tests/commands/test_cli.py): these tests are about rewards failing on the model's own
    completions during the run, which the trainer must still handle."""
    import explorl.rewards

    monkeypatch.setattr(explorl.rewards, "check_rewards", lambda *args, **kwargs: [])


# --------------------------------------------------------------------------- item 1: a broken reward is shown


@pytest.mark.parametrize("reward, shown", [
    ("divides_by_zero", ["Traceback (most recent call last)", "in divides_by_zero",
                         "ZeroDivisionError: division by zero"]),
    ("one_argument", ["Traceback (most recent call last)", "return fn(completion, answer, **meta)",
                      "TypeError: one_argument() got an unexpected keyword argument"]),
    ("returns_text", ["str: returned '1.0', not a finite number"]),
])
def test_a_broken_reward_is_shown_and_stops_the_run_before_any_update(tiny_model_dir, tmp_path, update_calls,
                                                                       no_reward_precheck, reward, shown):
    console, out = _console()
    run = tmp_path / "run"
    with pytest.raises(RunStopped, match=r"stopping before the update of step 1: the reward failed or timed out on "
                                         r"12 of 12 samples \(12 errors, 0 timeouts; more than "
                                         r"task.max_reward_failure_frac=0.5\)"):
        train(_cfg(tiny_model_dir, run, f"task.reward=broken_rewards:{reward}"), console=console, progress=False)
    assert update_calls == []  # the weights were never changed
    text = out.getvalue()
    assert text.count("reward function failed at step 1 on 12 of 12 samples") == 1
    assert all(s in text for s in shown), text
    log = (run / "reward_errors.log").read_text()
    assert log.count("=== step 1, sample 0 (12 of 12 samples of the step failed)") == 1  # one bug, logged once
    assert all(s in log for s in shown)
    assert not (run / "metrics.jsonl").exists() and not (run / "checkpoints").exists()
    assert not (run / "final").exists()


def test_a_reward_that_breaks_mid_run_stops_before_that_steps_update(tiny_model_dir, tmp_path, monkeypatch,
                                                                     update_calls):
    from explorl.rewards.sandbox import close_shared_pools

    flag = tmp_path / "broken"
    monkeypatch.setenv("EXPLORL_TEST_BREAK_FLAG", str(flag))
    close_shared_pools()  # workers start afresh and inherit the variable
    real_log = RunLog.log_samples

    def break_after_step_2(self, step, *args, **kwargs):
        if step == 2:
            flag.touch()
        return real_log(self, step, *args, **kwargs)

    monkeypatch.setattr(RunLog, "log_samples", break_after_step_2)
    console, out = _console()
    run = tmp_path / "run"
    with pytest.raises(RunStopped, match=r"before the update of step 3: .* First failure: KeyError\(\"no field") as e:
        train(_cfg(tiny_model_dir, run, "task.reward=broken_rewards:raises_once_flag_exists"), console=console,
              progress=False)
    assert len(update_calls) == 2  # steps 1 and 2 trained; step 3 stopped before its update
    assert str(run / "checkpoints" / "step_0000002") in str(e.value)  # the last checkpoint to continue from
    assert [r["step"] for r in _records(run)] == [1, 2]
    assert "KeyError" in out.getvalue() and "in raises_once_flag_exists" in out.getvalue()
    close_shared_pools()


def test_failures_below_the_threshold_are_reported_once_and_counted(tiny_model_dir, tmp_path):
    # NaN for completions without a digit: 4, 5, 3 and 1 of the 12 samples of the four steps (seed 0)
    console, out = _console()
    run = train(_cfg(tiny_model_dir, tmp_path / "run", "task.reward=broken_rewards:nan_without_digit"),
                console=console, progress=False)
    records = [r for r in _records(run) if "reward/mean" in r]
    assert [r["reward/errors"] for r in records] == [4, 5, 3, 1]
    text = out.getvalue()
    assert text.count("reward function failed") == 1  # the first failure, once per run
    assert "float: returned nan, not a finite number" in text and "3 more failure(s) in this step" in text
    assert "reward failures in this run: 13 errors and 0 timeouts over 4 step(s), 1 distinct" in text
    assert (run / "reward_errors.log").read_text().count("=== step") == 1  # one distinct failure


def test_the_failure_threshold_is_configurable(tiny_model_dir, tmp_path, update_calls, no_reward_precheck):
    with pytest.raises(ConfigError, match=r"task.max_reward_failure_frac: must be in \[0, 1\]"):
        _cfg(tiny_model_dir, tmp_path, "task.max_reward_failure_frac=1.5")
    with pytest.raises(ConfigError, match="task.reward_workers: must be >= 0"):
        _cfg(tiny_model_dir, tmp_path, "task.reward_workers=-1")
    console, _ = _console()
    run = train(_cfg(tiny_model_dir, tmp_path / "run", "task.reward=broken_rewards:divides_by_zero", "run.steps=2",
                     "task.max_reward_failure_frac=1"), console=console, progress=False)
    assert len(update_calls) == 2 and [r["reward/errors"] for r in _records(run)[:2]] == [12, 12]


# ------------------------------------------------------------------------ item 5: a signal writes a checkpoint


def _signal_at(monkeypatch, step_to_hit: int, signals: list[int]):
    """Send `signals` to this process while step `step_to_hit` logs its samples (mid-way through the step)."""
    real_log = RunLog.log_samples

    def send(self, step, *args, **kwargs):
        if step == step_to_hit:
            for sig in signals:
                os.kill(os.getpid(), sig)
        return real_log(self, step, *args, **kwargs)

    monkeypatch.setattr(RunLog, "log_samples", send)
    return real_log


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_before_the_first_checkpoint_writes_one_and_resume_matches(tiny_model_dir, tmp_path, monkeypatch,
                                                                             full, sig):
    before = signal.getsignal(sig)
    real_log = _signal_at(monkeypatch, 1, [sig])
    console, out = _console()
    with pytest.raises(Interrupted):
        train(_cfg(tiny_model_dir, tmp_path / "stopped"), console=console, progress=False)
    assert signal.getsignal(sig) is before  # the handler is put back
    stopped = tmp_path / "stopped"
    assert [p.name for p in (stopped / "checkpoints").iterdir()] == ["step_0000001"]  # save_every is 2
    assert [r["step"] for r in _records(stopped)] == [1]
    assert f"stopped by {signal.Signals(sig).name} after step 1/4" in out.getvalue()
    assert f"explorl train --resume {stopped}" in out.getvalue()
    monkeypatch.setattr(RunLog, "log_samples", real_log)
    resumed = train(load_config(stopped / "config.yaml"), resume=stopped, progress=False)
    _same_run(full, resumed)


def test_a_second_signal_aborts_at_once_and_resume_restarts_cleanly(tiny_model_dir, tmp_path, monkeypatch,
                                                                      full):
    real_log = _signal_at(monkeypatch, 1, [signal.SIGINT, signal.SIGINT])
    aborted = tmp_path / "aborted"
    with pytest.raises(KeyboardInterrupt) as e:
        train(_cfg(tiny_model_dir, aborted), progress=False)
    assert not isinstance(e.value, Interrupted)  # aborted: no checkpoint
    assert not (aborted / "checkpoints").exists() and [r["step"] for r in _records(aborted)] == [1]
    monkeypatch.setattr(RunLog, "log_samples", real_log)
    console, out = _console()
    resumed = train(load_config(aborted / "config.yaml"), resume=aborted, console=console, progress=False)
    assert "restarting" in out.getvalue() and "from step 1: it has no checkpoint yet" in out.getvalue()
    _same_run(full, resumed)  # the logged step 1 was dropped, not kept beside the new one


# ----------------------------------------------------------------- item 6: untrainable dtypes, non-finite weights


def test_float16_adamw_premise():
    # why float16 is refused on every device: AdamW keeps its moments in the weights' dtype, where a squared
    # gradient of 1e-5 (1e-10) and eps = 1e-8 both round to 0, so the update divides by zero
    p = torch.nn.Parameter(torch.ones(3, dtype=torch.float16))
    opt = torch.optim.AdamW([p], lr=1e-3)
    p.grad = torch.tensor([1e-5, 0.0, 1.0], dtype=torch.float16)
    opt.step()
    assert torch.isinf(p[0]) and torch.isnan(p[1]) and torch.isfinite(p[2])


def test_float16_is_refused_before_anything_is_written(tiny_model_dir, tmp_path):
    from dataclasses import replace

    for device in ("cpu", "auto"):
        with pytest.raises(ConfigError, match="model.dtype: float16 weights cannot be trained"):
            _cfg(tiny_model_dir, tmp_path / "run", f"model.device={device}", "model.dtype=float16")
    cfg = _cfg(tiny_model_dir, tmp_path / "run")
    cfg.model = replace(cfg.model, dtype="float16")  # not validated: the load-time check still refuses it
    with pytest.raises(ConfigError, match="model.dtype: float16 resolves to float16 on cpu"):
        train(cfg, progress=False)
    assert not (tmp_path / "run").exists()
    cfg.model = replace(cfg.model, dtype="bfloat16")
    trainer.check_trainable_dtype(cfg.model)  # bfloat16 trains on the CPU (slowly): allowed


def test_non_finite_weights_stop_the_run_and_are_never_saved(tiny_model_dir, tmp_path, monkeypatch):
    real_step = torch.optim.AdamW.step
    calls = []

    def poisoned(self, *args, **kwargs):  # the second optimizer step leaves a NaN, as float16 AdamW did
        out = real_step(self, *args, **kwargs)
        calls.append(1)
        if len(calls) == 2:
            with torch.no_grad():
                self.param_groups[0]["params"][0].view(-1)[0] = float("nan")
        return out

    monkeypatch.setattr(torch.optim.AdamW, "step", poisoned)
    run = tmp_path / "run"
    with pytest.raises(RunStopped, match=r"stopping at step 2: the optimizer step left NaN or infinite values in 1 "
                                         r"trainable tensor\(s\) \(model.embed_tokens.weight\)") as e:
        train(_cfg(tiny_model_dir, run, "run.save_every=1"), progress=False)
    assert f"Last good checkpoint: {run / 'checkpoints' / 'step_0000001'}" in str(e.value)
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step_0000001"]
    assert not (run / "final").exists() and not (run / "eval.json").exists()
    assert [r["step"] for r in _records(run)] == [1]
    from safetensors.torch import load_file

    good = load_file(str(run / "checkpoints" / "step_0000001" / "trainable.safetensors"))
    assert all(torch.isfinite(t).all() for t in good.values())


# ------------------------------------------------------------------------ item 8: resumed and finished runs


def _killed_after_step_3(model_dir, out_dir, monkeypatch):
    """`_cfg`'s run stopped by a KeyboardInterrupt right after step 3's metrics and samples were written (its
    checkpoint is step 2's); returns its directory."""
    real_update = Progress.update

    def killed_after_step_3(self, step, rec):
        if step == 3:
            raise KeyboardInterrupt
        return real_update(self, step, rec)

    monkeypatch.setattr(Progress, "update", killed_after_step_3)
    with pytest.raises(KeyboardInterrupt):
        train(_cfg(model_dir, out_dir), progress=False)
    monkeypatch.setattr(Progress, "update", real_update)
    return out_dir


def test_resume_after_samples_were_written_does_not_repeat_them(tiny_model_dir, tmp_path, monkeypatch, full):
    killed = _killed_after_step_3(tiny_model_dir, tmp_path / "killed", monkeypatch)
    assert [json.loads(x)["step"] for x in (killed / "samples.jsonl").read_text().splitlines()] == [1, 2, 3]
    _same_run(full, train(load_config(killed / "config.yaml"), resume=killed, progress=False))


def test_resuming_a_finished_run_does_nothing(tiny_model_dir, tmp_path, monkeypatch):
    run = train(_cfg(tiny_model_dir, tmp_path / "run", "run.steps=2"), progress=False)
    files = {name: (run / name).read_bytes() for name in ("metrics.jsonl", "samples.jsonl", "eval.json")}
    # the run's evaluations go through explorl.evaluation.evaluate.held_out_evaluator, which calls evaluate.evaluate
    monkeypatch.setattr(evaluate_module, "evaluate", lambda *a, **k: pytest.fail("a finished run was evaluated again"))
    import explorl.train.setup

    monkeypatch.setattr(explorl.train.setup, "load_policy",
                        lambda *a, **k: pytest.fail("a finished run was loaded again"))
    console, out = _console()
    assert train(load_config(run / "config.yaml"), resume=run, console=console, progress=False) == run
    assert f"{run} is a complete run (2/2 steps; final/ and eval.json are written): nothing to do" in out.getvalue()
    assert {name: (run / name).read_bytes() for name in files} == files


def test_a_run_killed_during_its_final_evaluation_finishes_with_one_final_line(tiny_model_dir, tmp_path,
                                                                               monkeypatch, full):
    real_eval = evaluate_module.evaluate

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(evaluate_module, "evaluate", killed)
    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        train(_cfg(tiny_model_dir, run), progress=False)
    assert (run / "checkpoints" / "step_0000004").is_dir() and not (run / "eval.json").exists()
    monkeypatch.setattr(evaluate_module, "evaluate", real_eval)
    resumed = train(load_config(run / "config.yaml"), resume=run, progress=False)
    _same_run(full, resumed)
    assert sum("reward/mean" not in r for r in _records(resumed)) == 1  # one final evaluation line
    assert json.loads((resumed / "eval.json").read_text()) == json.loads((full / "eval.json").read_text())


def test_a_resumed_run_with_overrides_rewrites_its_config_and_keeps_the_history(tiny_model_dir, tmp_path):
    """`explorl train --resume RUN key=value`: config.yaml always describes the latest weights; each change is kept
    in config_history.jsonl (which keys, after which step, the previous file)."""
    run = train(_cfg(tiny_model_dir, tmp_path / "run", "run.steps=2", "run.save_every=1"), progress=False)
    first = (run / "config.yaml").read_text()
    assert not (run / "config_history.jsonl").exists()
    # a longer run and another reward: the resumed run trains steps 3-4 with them
    cli_config = load_config(run / "config.yaml", ["run.steps=4", "task.reward=rewards_for_tests:has_equals"])
    train(cli_config, resume=run, progress=False)
    now = load_config(run / "config.yaml")
    assert now.run.steps == 4 and now.task.reward == "rewards_for_tests:has_equals"
    (record,) = [json.loads(x) for x in (run / "config_history.jsonl").read_text().splitlines()]
    assert record["resumed_after_step"] == 2 and record["previous"] == first
    assert record["changes"] == {"run.steps": [2, 4],
                                 "task.reward": ["rewards_for_tests:contains_digit", "rewards_for_tests:has_equals"]}
    card = (run / "final" / "README.md").read_text()
    assert "4 steps" in card  # the model card agrees with config.yaml, and says what changed on the resume
    assert "after step 2: `run.steps` 2 -> 4, `task.reward` 'rewards_for_tests:contains_digit' -> " in card
    # resuming the finished run without overrides changes nothing, nor does resuming it from the config it started
    # from, where task.chat_template is still `auto` (config.yaml holds what it resolved to: off, for these weights)
    train(load_config(run / "config.yaml"), resume=run, progress=False)
    started_from = _cfg(tiny_model_dir, tmp_path / "run", "run.steps=4", "run.save_every=1",
                        "task.reward=rewards_for_tests:has_equals")
    assert started_from.task.chat_template == "auto" and now.task.chat_template == "off"
    train(started_from, resume=run, progress=False)
    assert len((run / "config_history.jsonl").read_text().splitlines()) == 1


def test_the_reward_failure_rule_is_strictly_more_than_the_fraction():
    """`guards.too_many_reward_failures`, the one rule explorl train, TRL's and verl's trainers stop by: at the
    default 0.5, 8 failures of 16 samples train on, 9 stop; at 1.0 nothing stops; at 0 one failure stops."""
    from explorl.config import load_config
    from explorl.train.guards import too_many_reward_failures

    cfg = load_config(None, [])
    assert cfg.task.max_reward_failure_frac == 0.5
    assert not too_many_reward_failures(8, 16, cfg) and too_many_reward_failures(9, 16, cfg)
    assert not too_many_reward_failures(16, 16, load_config(None, ["task.max_reward_failure_frac=1"]))
    zero = load_config(None, ["task.max_reward_failure_frac=0"])
    assert too_many_reward_failures(1, 16, zero) and not too_many_reward_failures(0, 16, zero)


def test_a_stops_checkpoint_never_takes_a_scheduled_ones_place(tmp_path):
    from explorl.runs.checkpoints import save_checkpoint

    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)

    def saved(step: int, keep: int, every: int) -> list[int]:
        save_checkpoint(tmp_path, step, model, optimizer, scheduler, {"step": step}, keep, every)
        return [int(p.name[len("step_"):]) for p in sorted((tmp_path / "checkpoints").iterdir())]

    # save_every 500, keep 4; the run is stopped at 742 and 1258 and resumed: each stop's checkpoint stays while it
    # is the newest (a resume needs it) and goes with the next one, so 500, 1000 and 1500 all stay
    assert saved(500, 4, 500) == [500]
    assert saved(742, 4, 500) == [500, 742]
    assert saved(1000, 4, 500) == [500, 1000]
    assert saved(1258, 4, 500) == [500, 1000, 1258]
    assert saved(1500, 4, 500) == [500, 1000, 1500]
    # keep 2 counts the scheduled ones, the newest included
    assert saved(2000, 2, 500) == [1500, 2000]
    # without a schedule (every 0) the newest `keep` stay, whatever their steps
    assert saved(2001, 2, 0) == [2000, 2001]


def test_a_resume_with_a_changed_learning_rate_trains_at_the_new_rate(tiny_model_dir, tmp_path):
    """explorl's loop restores AdamW's moments and the schedule's position from the checkpoint, but its lr from
    config.yaml: torch's `load_state_dict` alone would keep the old run's base rate."""
    run = train(_cfg(tiny_model_dir, tmp_path / "run", "run.steps=2", "run.save_every=1", "optim.warmup_steps=0",
                     "optim.min_lr_ratio=0.5"), progress=False)
    resumed = load_config(run / "config.yaml", ["run.steps=3", "optim.lr=2e-4"])
    train(resumed, resume=run, progress=False)
    lr = {r["step"]: r["optim/lr"] for r in (json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines())
          if "optim/lr" in r}
    # no warm-up, 3 updates in all: after update 3 the cosine has reached its floor, min_lr_ratio x lr =
    # 0.5 x 2e-4 = 1e-4 (the old base rate would give 0.5 x 1e-3 = 5e-4)
    assert lr[3] == pytest.approx(1e-4, rel=1e-9)
