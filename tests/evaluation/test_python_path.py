"""`explorl eval --python-path DIR`: a reward module of the user's own, outside the working directory, is found
(issue 41: `--task-opt reward=myrewards:score` could not import it, with no hint)."""

from __future__ import annotations

import io
import sys

from rich.console import Console

import explorl.commands.common as common
from explorl import commands
from explorl.rewards.sandbox import close_shared_pools


def test_eval_finds_a_reward_module_on_python_path(tiny_model_dir, tmp_path, monkeypatch):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "evalpath_rewards_xyz.py").write_text("def score(completion, answer, **meta):\n    return 1.0\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(elsewhere))])  # restored afterwards
    buf = io.StringIO()
    monkeypatch.setattr(common, "console", Console(file=buf, width=300))
    argv = ["eval", "--model", str(tiny_model_dir), "--task-opt", "reward=evalpath_rewards_xyz:score", "--n", "1",
            "--k", "1", "--limit", "2", "--max-new-tokens", "4", "--device", "cpu", "--out", str(tmp_path / "e.json")]
    close_shared_pools()  # no worker started with another sys.path
    try:
        assert commands.main(argv) == 2
        assert "cannot import module 'evalpath_rewards_xyz'" in buf.getvalue()
        assert "--python-path DIR" in " ".join(buf.getvalue().split())
        assert commands.main([*argv, "--python-path", str(mine)]) == 0, buf.getvalue()
    finally:
        close_shared_pools()
    assert str(mine) in sys.path
