"""Refactoring guard: short fixed-seed runs of seven recipes and two compositions give the metrics recorded before
the method logic moved out of trainer.py (issue 17).

`tests/data/golden_metrics.json` was written by this file (`EXPLORL_UPDATE_GOLDEN=1 pytest tests/train/test_golden.py`).
Every step record is compared key by key (the wall-clock `perf/*` keys aside): keys, integers (counts, lengths,
steps), strings and booleans exactly; floats within `tolerance(step)`, because bit-identity across machines is not
something torch promises: the CPU kernels (and their summation order) depend on the CPU model's vector width and on
the thread count, even where `torch.backends.cpu.get_cpu_capability()` names the same instruction set.

The recorded configs were rewritten once (2026-11-25) from the flat keys of earlier versions (`algo.erpo_gamma`) to
each method's own options (`algo.erpo.gamma`, only the selected methods'); the recorded metrics were then replayed
unchanged within the tolerances below. The same day correctness became the task's rule (`task.correct_by`: one
reward entry's own score above `task.correct_threshold`) instead of the shaped reward above 0.5: in the two runs with
DAPO's overlong penalty (`dapo`, `kl_cov_entropy_adv`) the correctness metrics (`reward/correct_frac`,
`reward/all_correct_frac`, `reward/all_wrong_frac`, `entropy/pos`, `entropy/neg`) were re-recorded, every other
value checked unchanged.

How the tolerances were chosen (2026-11-25): the recorded configs were replayed on an AMD EPYC with AVX2 (the file
was recorded on an AVX512 machine) at 1 and 2 threads, and with `ATEN_CPU_CAPABILITY=default` (no vectorisation)
at 1 and 2 threads: five kernel variants. No sampled token differed (every count and length equal). Floats differ
by up to 2.2e-7 relative in the plain runs, plus absolute differences up to 1.2e-7 on values that are zero up to
cancellation (a PPO KL of 1e-9 on the first update, a z-scored advantage mean): `DEFAULT_TOLERANCE` (1e-5 relative
+ 1e-6 absolute) is at least 7x that. ERPO z-scores differences between policy and reference log-probs that are
themselves rounding-sized after a few tiny updates, so its spread reaches 1.1e-5 relative (gradient norm, step 4):
1e-4 + 1e-5. The two compositions select tokens by rank (KL-Cov's top covariances, Clip-Cov's draw among candidates,
the forking tokens' entropy quantile), where a near-tie can go either way and change a gradient by 2.7e-3 relative
by step 4: 2e-2 + 1e-4. With these, the largest spread of any variant is 0.13 of its bound, while a changed method
fails: ERPO's gamma 5 -> 5.5 exceeds the bound 2.8x, its eta 0.2 -> 0.21 34x, its buckets 10 -> 9 26x
(`test_guard_catches_a_changed_method`). Keys, integers and strings never get a tolerance, and no platform skips.
`dapo_updates` (added 2026-11-25: 16 mini-batches, clip-higher acting at lr 0.01) spread by 3.2e-4 relative at most
(a PPO KL near 0, step 4) between AVX2 at 1 thread and no vectorisation at 2 threads: 2e-3 + 1e-5.
Keys added later (`loss/ratio_min`, `loss/kl_cov_penalty_share`, and the rollout/trainer mismatch `mismatch/*` of
issue 52) were appended by replaying the recorded configs, every value recorded before checked unchanged within
these tolerances.
The recorded configs were rewritten again (issue 40) when EAD's truncated importance sampling and DAPO's overlong
shaping became registry entries: `tis: true, tis_cap, tis_level` -> `importance_weights: tis` with `tis: {cap,
level}` (the level `token` where the recording predates it), `overlong: penalty | mask | none, overlong_buffer,
overlong_penalty` -> `reward_shapers: [dapo_overlong] | [dapo_overlong_filter] | []` with `dapo_overlong: {buffer,
penalty}` (only the selected methods' options); every recorded metric is unchanged.
The compiled training forward (`model.compile`, on by default since 2026-11-25) is one more kernel variant: replayed
with it, every run stays within the bounds above except `dapo_updates` (its PPO KL of -1e-3 at step 4, after 48
updates at lr 0.01, moved by 1.05e-2 relative: 3e-2 + 1e-5); `dapo` came to 0.8 of its bound (entropy/neg 7.8e-6
relative at step 3) and gets 1e-4 + 1e-5. Before that variant's padding-row fix (the embedding
row of the pad token took a gradient the model's `padding_idx` withholds) the guard failed `grpo`'s gradient norm
by 2% at step 1.
"""

from __future__ import annotations

import json
import math
import os
import platform
from pathlib import Path

import pytest
import torch

from explorl.config import load_config
from explorl.train.loop import train

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden_metrics.json"
RECIPES_DIR = Path(__file__).resolve().parents[2] / "configs" / "recipes"
GOLDEN_RECIPES = ["grpo", "erpo", "e3", "ead_tis", "cw_grpo", "dapo", "passk"]
# and two runs that reach the options no recipe above uses
COMPOSED = {
    "composed": ("ead_tis", ["budget.policy=e3", "algo.advantage=erpo", "algo.shapers=[cw,ppl,position]",
                             "algo.loss=clip_cov", "algo.token_filter=forking",
                             "algo.reward_shapers=[dapo_overlong_filter]", "algo.kl_coef=0.01",
                             "algo.entropy_coef=1e-3", "algo.micro_batch_size=5", "algo.mini_batches=2",
                             "algo.epochs=2", "algo.position.start=1"]),
    "kl_cov_entropy_adv": ("kl_cov", ["algo.shapers=[entropy_adv,cw_group]", "algo.reward_shapers=[dapo_overlong]",
                                      "algo.dapo_overlong.buffer=4", "algo.loss_agg=seq-mean-token-mean"]),
    # DAPO's 16 updates per rollout batch with clip-higher acting: lr 0.01 moves the policy far enough within a batch
    # that ratios leave [0.8, 1.28] (loss/clip_frac_high 0.11 and clip_frac_low 0.02 at step 1)
    "dapo_updates": ("dapo", ["optim.lr=0.01", "optim.warmup_steps=0"]),
}
# small enough for seconds per run; eval mid-run and a checkpoint exercise the rest of the loop
OVERRIDES = ["run.steps=4", "run.batch_size=3", "sampling.max_new_tokens=16", "task.train_size=6",
             "task.eval_size=3", "task.difficulties=[1]", "run.eval_n=2", "run.eval_k=[1,2]", "run.eval_every=2",
             "run.save_every=2", "run.threads=1", "task.reward=rewards_for_tests:contains_digit"]


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


@pytest.fixture(autouse=True)
def fresh_compile_caches():
    """Each replay starts from empty torch.compile caches, as a new process does. The fused forward is compiled once
    per model object (its guards are on the parameters), so after enough earlier tests in the same process it hits
    dynamo's recompile limit (8) and later calls run eagerly: pi_old's forward and the update's then come from
    different kernels, which ERPO's z-scores of near-zero log-prob differences amplify (seen: ERPO's step-1 loss/pg
    2% off when tests/algos, tests/rollout and tests/runs ran first)."""
    torch._dynamo.reset()
    yield


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
    assert set(recorded["runs"]) == set(configs) == set(GOLDEN_RECIPES) | set(COMPOSED)
    for name in configs:
        assert_same_run(name, recorded["runs"][name], got[name])


# (relative, absolute) float tolerance per golden run: see the module docstring for the measurements behind them
TOLERANCE = {"erpo": (1e-4, 1e-5), "composed": (2e-2, 1e-4), "kl_cov_entropy_adv": (2e-2, 1e-4),
             "dapo_updates": (3e-2, 1e-5), "dapo": (1e-4, 1e-5)}
DEFAULT_TOLERANCE = (1e-5, 1e-6)


def tolerance(run: str) -> tuple[float, float]:
    return TOLERANCE.get(run, DEFAULT_TOLERANCE)


def differences(want, have, rtol: float, atol: float, path: str = "") -> list[str]:
    """Where `have` differs from `want`: floats beyond `atol + rtol * max(|want|, |have|)`, anything else at all."""
    if isinstance(want, float) and isinstance(have, (float, int)) and not isinstance(have, bool):
        ok = math.isclose(want, have, rel_tol=rtol, abs_tol=atol) or (math.isnan(want) and math.isnan(have))
        return [] if ok else [f"{path}: {want!r} -> {have!r}"]
    if isinstance(want, list) and isinstance(have, list) and len(want) == len(have):
        return [d for i, (w, h) in enumerate(zip(want, have)) for d in differences(w, h, rtol, atol, f"{path}[{i}]")]
    if isinstance(want, dict) and isinstance(have, dict) and set(want) == set(have):
        return [d for k in want for d in differences(want[k], have[k], rtol, atol, f"{path}.{k}")]
    return [] if (type(want) is type(have) and want == have) else [f"{path}: {want!r} -> {have!r}"]


def assert_same_run(name: str, want: list[dict], have: list[dict]) -> None:
    assert len(have) == len(want), f"{name}: {len(have)} records, golden has {len(want)}"
    for w, h in zip(want, have):
        assert set(h) == set(w), f"{name} step {w['step']}: keys differ: {set(h) ^ set(w)}"
        diff = differences(w, h, *tolerance(name))
        assert not diff, f"{name} step {w['step']}: metrics changed (golden -> now): {diff[:6]}"


@pytest.mark.parametrize("key,value", [("gamma", 5.5), ("eta", 0.21)])
def test_guard_catches_a_changed_method(tiny_model_dir, tmp_path, key, value):
    """A small change to one method's arithmetic (ERPO's gate sharpness or its progress weight) fails the guard,
    so the tolerance above does not hide a refactoring mistake. Step 1 cannot show it: the policy still equals the
    reference there, so ERPO's progress term is zero and the advantage is GRPO's."""
    golden = json.loads(GOLDEN.read_text())
    config = json.loads(json.dumps(golden["configs"]["erpo"]))
    assert config["algo"]["erpo"][key] != value
    config["algo"]["erpo"][key] = value
    have = run_metrics(config, tiny_model_dir, tmp_path / "mutated")
    with pytest.raises(AssertionError, match="metrics changed"):
        assert_same_run("erpo", golden["runs"]["erpo"], have)
