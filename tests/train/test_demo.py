"""The main job's plumbing on a tiny random model: base eval, training, eval after, summary.json."""

import io
import json

import pytest

from rich.console import Console

from explorl.train.demo import DEFAULT_CONFIG, run_demo


def test_demo_writes_the_before_after_summary(tiny_model_dir, tmp_path):
    out = tmp_path / "demo"
    console = Console(file=io.StringIO(), width=200)
    summary = run_demo(str(DEFAULT_CONFIG), [
        f"model.path={tiny_model_dir}", f"run.out_dir={out}", "run.steps=2", "run.batch_size=2",
        "sampling.group_size=2", "sampling.max_new_tokens=8", "task.eval_size=4", "task.train_size=16",
        "run.eval_n=8", "run.eval_every=0"], console=console)
    written = json.loads((out / "summary.json").read_text())
    for side in ("base", "trained"):
        assert {"pass@1", "pass@8", "entropy"} <= set(written[side])
        assert 0.0 <= written[side]["pass@1"] <= written[side]["pass@8"] <= 1.0
    assert written["base"] == summary["base"]
    text = console.file.getvalue()
    assert "base" in text and "trained" in text and "pass@8" in text


DEMO_ARGS = ["run.steps=2", "run.batch_size=2", "sampling.group_size=2", "sampling.max_new_tokens=8",
             "task.eval_size=4", "task.train_size=16", "run.eval_n=8", "run.eval_every=0", "run.save_every=1"]


def test_a_demo_run_again_continues_an_interrupted_one_and_replaces_a_finished_one_saying_so(tiny_model_dir,
                                                                                            tmp_path, monkeypatch):
    """Issue 41: Ctrl-C then `make demo` again continued nothing (the directory was deleted without a word) and the
    hint named `explorl train --resume`, which never writes the summary."""
    import shutil

    import explorl.models
    import explorl.train.demo
    import explorl.train.loop

    out = tmp_path / "demo"
    args = [f"model.path={tiny_model_dir}", f"run.out_dir={out}", *DEMO_ARGS]
    real_train = explorl.train.loop.train

    def stopped_after_step_1(cfg, **kw):
        """As if Ctrl-C stopped training after step 1: its checkpoint written, nothing after it, KeyboardInterrupt."""
        real_train(cfg, **kw)
        for name in ("checkpoints/step_0000002", "final"):
            shutil.rmtree(out / name)
        (out / "eval.json").unlink()
        raise KeyboardInterrupt

    monkeypatch.setattr(explorl.train.demo, "train", stopped_after_step_1)
    with pytest.raises(KeyboardInterrupt):
        run_demo(str(DEFAULT_CONFIG), args, console=Console(file=io.StringIO()))
    base = json.loads((out / "demo.json").read_text())["base"]
    monkeypatch.setattr(explorl.train.demo, "train", real_train)
    calls = []  # the demo loads the base model for its evaluation (the trainer loads its own way)
    real_load = explorl.models.load_policy
    monkeypatch.setattr(explorl.train.demo, "load_policy", lambda *a, **k: calls.append(1) or real_load(*a, **k))
    console = Console(file=io.StringIO(), width=300)
    again = run_demo(str(DEFAULT_CONFIG), args, console=console)
    text = console.file.getvalue()
    assert "continuing the interrupted demo" in text and "from step_0000001" in text, text
    assert calls == [] and again["base"] == {k: base[k] for k in again["base"]}  # the base evaluation kept
    assert (out / "summary.json").exists() and json.loads((out / "eval.json").read_text())["step"] == 2
    # finished: run again, it says what it deletes and starts afresh (the base evaluated again)
    console = Console(file=io.StringIO(), width=300)
    run_demo(str(DEFAULT_CONFIG), args, console=console)
    text = console.file.getvalue()
    assert f"{out} holds a finished demo: deleting it (its checkpoints, metrics, samples, final model and summary)" \
        in text and calls == [1]


def test_the_demo_never_deletes_a_directory_that_is_not_a_demos(tiny_model_dir, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "precious.txt").write_text("x")
    with pytest.raises(FileExistsError, match="holds no demo.json: not a finished or interrupted demo"):
        run_demo(str(DEFAULT_CONFIG), [f"model.path={tiny_model_dir}", f"run.out_dir={out}", *DEMO_ARGS],
                 console=Console(file=io.StringIO()))
    assert (out / "precious.txt").exists()


def test_ctrl_c_in_the_demo_names_the_demos_own_command(monkeypatch, tmp_path):
    import explorl.commands.common as common
    import explorl.train.demo
    from explorl import commands

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(explorl.train.demo, "run_demo", interrupted)
    buf = io.StringIO()
    monkeypatch.setattr(common, "console", Console(file=buf, width=300))
    assert commands.main(["demo", str(DEFAULT_CONFIG), f"run.out_dir={tmp_path / 'd'}"]) == 130
    text = buf.getvalue()
    assert "run `make demo` (or the same `explorl demo` command) again: it continues from the last checkpoint" in text
    assert str(tmp_path / "d") in text
