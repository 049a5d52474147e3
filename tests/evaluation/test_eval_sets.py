"""Several held-out sets: `run.eval_sets` during training and `explorl eval --eval-set` (issue: evaluate any
checkpoint on several sets, each reported on its own)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from explorl.config import ConfigError, eval_set_task, load_config

BASE = ["task.difficulties=[1]", "task.train_size=64", "task.eval_size=4"]


TRUSTED = ["--task-opt", "reward=rewards_for_tests:contains_digit"]
"""The runs here score with the suite's own reward; `explorl eval` of a run runs its code only when named again
(issue 56), as a user who trusts it would."""


def test_eval_sets_layer_over_the_task_and_are_validated_by_name():
    cfg = load_config(None, [*BASE, "run.eval_sets={hard: {difficulties: [9]}, all: {name: file, path: x.jsonl}}"])
    hard = eval_set_task(cfg, "hard")
    assert hard.difficulties == [9] and hard.train_size == 64 and hard.eval_size == 4  # the rest is the task's
    # a file named alone: every row is held out (its path made absolute, from the working directory)
    assert eval_set_task(cfg, "all").eval_path == str(Path.cwd() / "x.jsonl")
    with pytest.raises(ConfigError, match=r"run\.eval_sets\.hard\.difficultiez.*difficulties"):
        load_config(None, ["run.eval_sets={hard: {difficultiez: [9]}}"])
    with pytest.raises(ConfigError, match=r"run\.eval_sets\.hard\.difficulties: levels"):
        load_config(None, ["run.eval_sets={hard: {difficulties: [13]}}"])
    with pytest.raises(ConfigError, match=r"run\.eval_sets: 'pass@1' is not a usable name"):
        load_config(None, ["run.eval_sets={pass@1: {}}"])
    with pytest.raises(ConfigError, match=r"run\.eval_sets: expected a mapping"):
        load_config(None, ["run.eval_sets=[hard]"])


def test_training_reports_each_set_on_its_own(tiny_model_dir, tmp_path):
    from explorl.train.loop import train

    cfg = load_config(None, [
        f"model.path={tiny_model_dir}", f"run.out_dir={tmp_path / 'run'}", "run.steps=2", "run.batch_size=2",
        "sampling.group_size=2", "sampling.max_new_tokens=8", *BASE, "run.eval_n=2", "run.eval_k=[1,2]",
        "run.eval_every=1", "task.reward=rewards_for_tests:contains_digit",
        "run.eval_sets={hard: {difficulties: [3], eval_size: 3}}"])
    run = train(cfg, progress=False)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if "eval/pass@1" in r]
    assert len(evals) == 2  # step 1 (eval_every) and the final evaluation
    for r in evals:
        for key in ("eval/hard/pass@1", "eval/hard/pass@2", "eval/hard/maj@2", "eval/hard/entropy"):
            assert key in r and r[key] == r[key], key
        assert r["eval/hard/problems"] == 3 and r["eval/problems"] == 4  # each set on its own problems
    final = json.loads((run / "eval.json").read_text())
    assert "hard/pass@1" in json.dumps(final)
    # `explorl eval` of the run's output evaluates the run's own sets too
    from explorl import commands

    out = tmp_path / "eval.json"
    assert commands.main(["eval", "--model", str(run / "final"), "--n", "2", "--k", "1,2", "--out", str(out),
                          *TRUSTED]) == 0
    assert json.loads(out.read_text())["sets"]["hard"]["problems"] == 3


def test_eval_command_takes_several_sets(tiny_model_dir, tmp_path, capsys):
    from explorl import commands

    out = tmp_path / "eval.json"
    rc = commands.main(["eval", "--model", str(tiny_model_dir), "--task", "arith", "--n", "2", "--k", "1,2",
                   "--max-new-tokens", "8", "--device", "cpu", "--task-opt", "difficulties=[1]", "--task-opt",
                   "train_size=8", "--task-opt", "eval_size=4", "--eval-set", "hard={difficulties: [3], eval_size: 3}",
                   "--eval-set", "two={eval_size: 2}", "--out", str(out)])
    assert rc == 0
    summary = json.loads(out.read_text())
    assert summary["problems"] == 4 and summary["sets"]["hard"]["problems"] == 3
    assert summary["sets"]["two"]["problems"] == 2 and 0 <= summary["sets"]["hard"]["pass@2"] <= 1
    assert "on hard" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="NAME="):  # refused before any model loads
        commands.main(["eval", "--model", str(tmp_path / "none"), "--n", "1", "--k", "1", "--eval-set", "bad"])


def test_sft_reports_the_eval_sets_as_train_does(tiny_model_dir, tmp_path):
    """`explorl sft` evaluates through the same held-out evaluator as `explorl train` (`held_out_evaluator`)."""
    import io

    from rich.console import Console

    from explorl.finetune.sft import run_sft

    cfg = load_config(None, [
        f"model.path={tiny_model_dir}", f"run.out_dir={tmp_path / 'sft'}", *BASE, "sampling.max_new_tokens=8",
        "run.eval_n=2", "run.eval_k=[1,2]", "sft.epochs=1", "sft.batch_size=32",
        "run.eval_sets={hard: {difficulties: [3], eval_size: 3}}"])
    run = run_sft(cfg, console=Console(file=io.StringIO()))
    final = json.loads((run / "eval.json").read_text())
    assert final["problems"] == 4 and final["hard/problems"] == 3
