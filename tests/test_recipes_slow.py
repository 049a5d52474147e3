"""Every recipe on the embedded default itself (bootstrapped on first use: a few minutes), a few steps each."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from explorl.config import load_config
from explorl.train.loop import train

RECIPES = sorted((Path(__file__).resolve().parents[1] / "configs" / "recipes").glob("*.yaml"))
POSITION_NOW = {"still_position": ["algo.position.start=1"]}  # its window opens at step 100 in the recipe


@pytest.mark.slow
@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_recipe_on_the_embedded_default(recipe, tmp_path):
    cfg = load_config(recipe, [f"run.out_dir={tmp_path / 'run'}", "run.steps=4", "run.batch_size=8",
                               "task.eval_size=16", "run.eval_every=0", "run.save_every=0",
                               "task.train_size=16", *POSITION_NOW.get(recipe.stem, [])])
    run = train(cfg, progress=False)
    steps = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if "reward/mean" in x]
    assert len(steps) == 4 and all(r["loss/nonfinite"] == 0 for r in steps)
    assert any(r["reward/mean"] > 0 for r in steps)  # the bootstrapped model solves some problems
    evaluation = json.loads((run / "eval.json").read_text())
    assert 0.0 <= evaluation["pass@1"] <= 1.0
