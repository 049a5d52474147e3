"""Refactoring guard: short fixed-seed runs of seven recipes give exactly the metrics recorded before the method
logic moved out of trainer.py (issue 17).

`tests/data/golden_metrics.json` was written by this file on the code before the move
(`EXPLORL_UPDATE_GOLDEN=1 pytest tests/test_golden.py`). Every step record is compared key by key with `==` (the
wall-clock `perf/*` keys aside): floats must be bit-identical, not close. Bit-identity across machines is not
promised by torch (SIMD width changes rounding), so the file names the platform it was recorded on and the test
runs only on that platform; elsewhere it skips and says how to re-record on main before a refactor.
Keys added by later work (`temperature/at_min_frac`, issue 16; `eval/worst@k`, `eval/format_rate`, issue 14) were
appended by replaying the recorded configs, with every value recorded before checked equal.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

import pytest
import torch

from explorl.config import load_config
from explorl.trainer import train

GOLDEN = Path(__file__).parent / "data" / "golden_metrics.json"
RECIPES_DIR = Path(__file__).resolve().parents[1] / "configs" / "recipes"
GOLDEN_RECIPES = ["grpo", "erpo", "e3", "ead_tis", "cw_grpo", "dapo", "passk"]
# and two runs that reach the options no recipe above uses
COMPOSED = {
    "composed": ("ead_tis", ["budget.policy=e3", "algo.advantage=erpo", "algo.shapers=[cw,ppl,position]",
                             "algo.loss=clip_cov", "algo.token_filter=forking", "algo.overlong=mask",
                             "algo.kl_coef=0.01", "algo.entropy_coef=1e-3", "algo.micro_batch_size=5",
                             "algo.mini_batches=2", "algo.epochs=2"]),
    "kl_cov_entropy_adv": ("kl_cov", ["algo.shapers=[entropy_adv,cw_group]", "algo.overlong=penalty",
                                      "algo.overlong_buffer=4", "algo.loss_agg=seq-mean-token-mean"]),
}
# small enough for seconds per run; eval mid-run and a checkpoint exercise the rest of the loop
OVERRIDES = ["run.steps=4", "run.batch_size=3", "sampling.max_new_tokens=16", "task.train_size=6",
             "task.eval_size=3", "task.difficulties=[1]", "run.eval_n=2", "run.eval_k=[1,2]", "run.eval_every=2",
             "run.save_every=2", "run.threads=1", "task.reward=rewards_for_tests:contains_digit",
             "algo.position_start=1"]


def platform_key() -> str:
    return f"{platform.machine()}|torch {torch.__version__}|{torch.backends.cpu.get_cpu_capability()}"


def recipe_config(recipe: str, extra: list[str]) -> dict:
    """The resolved config of a golden run as a dict (the run directory and model are filled in per test)."""
    from explorl.config import to_dict

    return to_dict(load_config(RECIPES_DIR / f"{recipe}.yaml", [*OVERRIDES, *extra]))


def run_metrics(config: dict, model_dir: Path, out: Path) -> list[dict]:
    from explorl.config import Config, from_dict, validate

    data = json.loads(json.dumps(config))
    data["model"]["path"], data["run"]["out_dir"] = str(model_dir), str(out)
    cfg = from_dict(Config, data)
    validate(cfg)
    run = train(cfg, progress=False)
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in records]


def test_golden_runs_are_unchanged(tiny_model_dir, tmp_path):
    """The recorded configs are replayed (not the recipe files, which may change on purpose); fields added to the
    config since the recording take their defaults, which must leave behaviour as it was."""
    update = os.environ.get("EXPLORL_UPDATE_GOLDEN") == "1"
    if update:
        runs = {**{name: (name, []) for name in GOLDEN_RECIPES}, **COMPOSED}
        configs = {name: recipe_config(recipe, extra) for name, (recipe, extra) in runs.items()}
    else:
        configs = json.loads(GOLDEN.read_text())["configs"]
    got = {name: run_metrics(config, tiny_model_dir, tmp_path / name) for name, config in configs.items()}
    if update:
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps({"platform": platform_key(), "configs": configs, "runs": got}, indent=1) + "\n")
    recorded = json.loads(GOLDEN.read_text())
    if recorded["platform"] != platform_key():
        pytest.skip(f"golden metrics were recorded on {recorded['platform']}, this is {platform_key()}; "
                    "re-record on main before a refactor with EXPLORL_UPDATE_GOLDEN=1")
    assert set(recorded["runs"]) == set(configs) == set(GOLDEN_RECIPES) | set(COMPOSED)
    for name in configs:
        want, have = recorded["runs"][name], got[name]
        assert len(have) == len(want), f"{name}: {len(have)} records, golden has {len(want)}"
        for w, h in zip(want, have):
            assert set(h) == set(w), f"{name} step {w['step']}: keys differ: {set(h) ^ set(w)}"
            diff = {k: (w[k], h[k]) for k in w if w[k] != h[k]}
            assert not diff, f"{name} step {w['step']}: metrics changed (golden, now): {diff}"
