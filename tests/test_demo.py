"""The main job's plumbing on a tiny random model: base eval, training, eval after, summary.json."""

import io
import json

from rich.console import Console

from explorl.demo import DEFAULT_CONFIG, run_demo


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
