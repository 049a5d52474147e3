"""Every recipe in configs/recipes validates and runs end to end (a short smoke run on a tiny random model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from explorl.algos.registry import names
from explorl.commands import main
from explorl.config import load_config
from explorl.train.loop import train

RECIPES = sorted((Path(__file__).resolve().parents[1] / "configs" / "recipes").glob("*.yaml"))
REQUIRED = {"grpo", "dr_grpo", "dapo", "entropy_reg", "clip_cov", "kl_cov", "forking_tokens", "e3", "e3_ts",
            "e3_ts_an", "erpo", "cw_grpo", "ead", "ead_tis", "still_ppl", "still_position"}

# keys that show the method actually ran (beyond the keys every step logs)
EXPECTED_KEYS = {
    "dapo": {"rollouts/dapo_rounds", "rollouts/dapo_kept_frac"},
    "e3": {"temperature/tau", "temperature/h_target"},
    "e3_ts": {"temperature/tau", "temperature/h_init"},
    "e3_ts_an": {"temperature/tau", "temperature/clamped"},
    "ead": {"temperature/ead_d"},
    "ead_tis": {"temperature/ead_d", "is/weight_mean", "is/truncated_frac"},
    "clip_cov": {"loss/clip_cov_frac"},
    "kl_cov": {"loss/kl_cov_frac"},
    "erpo": {"kl/mean"},
    "entropy_reg": {"loss/entropy"},
    "adaptive_entropy": {"algo/entropy_coef"},
    "prorl_reset": {"kl/mean", "ref/reset"},
    "outcome_bonus": {"outcome/bonus_mean", "outcome/new_frac"},
    "fr3e": {"fr3e/anchors_per_prompt", "fr3e/value_mean", "fr3e/alpha_mean"},
    "adaptive_temperature": {"temperature/adaptive_factor_min", "temperature/adaptive_factor_max", "is/weight_mean"},
    "simko": {"loss/simko_gate_frac", "loss/simko_neg_scaled_frac"},
}


def test_every_required_recipe_exists():
    assert REQUIRED <= {p.stem for p in RECIPES}


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_recipe_dry_run_is_accepted(recipe, tmp_path, capsys):
    assert main(["train", str(recipe), "--dry-run", f"run.out_dir={tmp_path / 'x'}"]) == 0
    assert "config is valid" in capsys.readouterr().out
    assert not (tmp_path / "x").exists()


# the position shaper's window opens at step 100 in its recipe, ProRL's first reset comes at step 50: from the first
# step in these short runs
POSITION_NOW = {"still_position": ["algo.position.start=1"], "prorl_reset": ["algo.reference_reset.every=3"]}


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_recipe_runs_end_to_end(recipe, tiny_model_dir, tmp_path):
    cfg = load_config(recipe, [
        f"model.path={tiny_model_dir}", f"run.out_dir={tmp_path / 'run'}", "run.steps=3", "run.batch_size=3",
        "sampling.max_new_tokens=16", "task.train_size=6", "task.eval_size=3", "task.difficulties=[1]",
        "run.eval_n=2", "run.eval_k=[1,2]", "run.eval_every=0", "run.save_every=0",
        "task.reward=rewards_for_tests:contains_digit", *POSITION_NOW.get(recipe.stem, [])])
    run = train(cfg, progress=False)
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    missing = EXPECTED_KEYS.get(recipe.stem, set()) - set(steps[-1])
    assert not missing, f"{recipe.stem}: the method's metrics {missing} were not logged"
    assert all(r["loss/nonfinite"] == 0 for r in steps)
    assert (run / "final" / "config.json").exists()


def test_methods_compose_in_one_run(tiny_model_dir, tmp_path):
    """Sampler schedule, budget policy, estimator, a chain of shapers and loss options all at once."""
    cfg = load_config(RECIPES[0].parent / "ead_tis.yaml", [
        f"model.path={tiny_model_dir}", f"run.out_dir={tmp_path / 'run'}", "run.steps=3", "run.batch_size=3",
        "sampling.max_new_tokens=16", "task.train_size=6", "task.eval_size=3", "task.difficulties=[1]",
        "run.eval_n=2", "run.eval_k=[1]", "run.save_every=0", "task.reward=rewards_for_tests:contains_digit",
        "budget.policy=e3", "algo.advantage=erpo", "algo.shapers=[cw,ppl,position]", "algo.loss=clip_cov",
        "algo.token_filter=forking", "algo.reward_shapers=[dapo_overlong_filter]", "algo.kl_coef=0.01",
        "algo.entropy_coef=1e-3", "algo.micro_batch_size=5", "algo.mini_batches=2"])
    run = train(cfg, progress=False)
    last = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if "reward/mean" in x][-1]
    assert {"temperature/ead_d", "is/weight_mean", "loss/clip_cov_frac", "kl/mean", "loss/entropy"} <= set(last)
    assert last["tokens/masked_frac"] >= 0.5  # the forking filter keeps at most 20% of the tokens
    # the E3 curriculum widened the budget bounds after the first passes over the 6 prompts
    assert last["rollouts/total"] == 3 * 8


@pytest.mark.parametrize("overrides, message", [
    (["algo.importance_weights=tis"], "algo.importance_weights=tis"),  # no behaviour/policy mismatch to correct
    (["algo.shapers=[cw,cw]"], "twice"),
    (["algo.shapers=[cov]"], "valid: cw"),
    (["budget.policy=e3", "budget.e3.g_max_limit=6"], "g_max_limit"),
    (["algo.advantage=passk", "algo.passk.k=16"], "algo.passk.k"),
    (["algo.erpo.gamma=3"], "algo.erpo: options of the estimator 'erpo', which is not selected"),
])
def test_combinations_that_make_no_sense_are_refused(overrides, message):
    from explorl.config import ConfigError

    with pytest.raises(ConfigError, match=message):
        load_config(RECIPES[0].parent / "grpo.yaml", overrides)


def _documented_recipes() -> dict[str, dict[str, str]]:
    """The rows of docs/methods.md §10's recipe table, by recipe name: {column: cell}."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "methods.md").read_text()
    block = doc.split("<!-- recipes:begin -->")[1].split("<!-- recipes:end -->")[0].strip().splitlines()
    header = [c.strip() for c in block[0].strip("|").split("|")]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in block[2:]]
    return {row[0].strip("`"): dict(zip(header, row)) for row in rows}


def _code(x) -> str:
    return f"`{x}`"


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_recipe_matches_the_documented_table(recipe):
    """docs/methods.md §10 and the recipe files cannot drift apart: every column of the table is the recipe's."""
    doc = _documented_recipes()
    assert recipe.stem in doc, f"docs/methods.md §10 has no row for {recipe.stem}"
    row, cfg = doc[recipe.stem], load_config(recipe)
    a, s, b = cfg.algo, cfg.sampling, cfg.budget
    assert row["advantage"] == _code(a.advantage)
    assert row["shapers"] == (", ".join(map(_code, a.shapers)) or "-")
    assert row["loss"] == _code(a.loss) and row["loss_agg"] == _code(a.loss_agg)
    assert row["clip (eps_low/eps_high)"] == f"{a.eps_low:g}/{a.eps_high:g}"
    assert float(row["kl_coef"]) == a.kl_coef and float(row["entropy_coef"]) == a.entropy_coef
    assert int(row["group_size"]) == s.group_size
    assert row["schedule"] == _code(s.schedule) and row["budget"] == _code(b.policy)
    assert row["tis"] == (_code(a.options["tis"].level) if a.importance_weights == "tis" else "-")
    assert int(row["updates"]) == a.epochs * a.mini_batches  # policy updates per rollout batch


METHODS = sorted((Path(__file__).resolve().parents[1] / "src" / "explorl" / "methods").glob("*.yaml"))


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_recipe_header_names_its_method_and_its_changes(recipe):
    """A recipe is its method's layer (the paper's settings, whose header names the objective and the paper's
    section) at the embedded default's scale, whose changes its own header lists."""
    header = recipe.read_text().split("\nbase:")[0]
    assert "Changed for this model:" in header
    layer = yaml.safe_load(recipe.read_text())["methods"]
    # its own layer, then at most the estimator its paper used (a method layer sets no estimator unless it is one)
    assert layer[0] == recipe.stem and set(layer[1:]) <= set(names("estimator")), layer
    method = METHODS[[m.stem for m in METHODS].index(recipe.stem)].read_text()
    assert "Paper objective:" in method and "docs/methods.md §" in method


@pytest.mark.parametrize("method", METHODS, ids=lambda p: p.stem)
def test_a_method_layer_holds_its_method_and_nothing_of_a_models_scale(method):
    """Only what the paper fixes for the method: algo, the sampling schedule and its options, the budget policy,
    and an optimizer setting the paper fixes (weight decay); never a model, task, lr, warm-up, length or run."""
    data = yaml.safe_load(method.read_text())
    assert set(data) <= {"algo", "sampling", "budget", "optim"}, set(data)
    assert set(data.get("optim", {})) <= {"weight_decay"}
    assert not {"group_size", "max_new_tokens"} & set(data.get("sampling", {}))


def test_a_method_layered_over_your_own_config_keeps_your_scale(tmp_path):
    """`methods: [e3]` over a user's config brings E3 (its schedule, annealing, budget policy and objective) and
    nothing of the embedded model's scale: the user's lr, warm-up, model and length stay theirs."""
    mine = tmp_path / "mine.yaml"
    mine.write_text("methods: [e3]\nmodel: {path: embedded}\noptim: {lr: 1.0e-6}\n"
                    "sampling: {max_new_tokens: 1024, group_size: 8}\nalgo: {eps_high: 0.25}\n")
    cfg = load_config(mine)
    assert cfg.optim.lr == 1e-6 and cfg.optim.warmup_steps == 0 and cfg.sampling.max_new_tokens == 1024
    assert cfg.sampling.schedule == "e3" and cfg.sampling.options["e3"].anneal is True
    assert cfg.budget.policy == "e3" and cfg.algo.loss_agg == "seq-mean-token-mean-per-question"
    assert cfg.algo.eps_high == 0.25  # the file's own keys win over its methods'
    # the same method from the recipe: the recipe adds the embedded model's scale on top of the same layer
    recipe = load_config(RECIPES[0].parent / "e3.yaml")
    assert recipe.optim.lr == 5e-4 and recipe.sampling.options == cfg.sampling.options


def test_methods_that_disagree_are_refused_and_unknown_ones_named(tmp_path):
    from explorl.config import ConfigError

    both = tmp_path / "both.yaml"
    both.write_text("methods: [ead, e3_ts]\n")
    with pytest.raises(ConfigError, match=r"methods 'ead' and 'e3_ts' both set algo.loss_agg .*to choose"):
        load_config(both)
    composed = tmp_path / "composed.yaml"  # methods that touch different keys compose (EAD's TIS + forking)
    composed.write_text("methods: [ead_tis]\nalgo: {token_filter: forking}\n")
    assert load_config(composed).algo.token_filter == "forking"
    typo = tmp_path / "typo.yaml"
    typo.write_text("methods: [erp]\n")
    with pytest.raises(ConfigError, match=r"'erp' is not a method layer. Did you mean 'erpo'"):
        load_config(typo)


@pytest.mark.parametrize("name, agg, kl, extra", [
    ("cw_grpo", "seq-mean-token-mean", 0.0, {"shapers": ["cw_group"]}),  # CW-GRPO section 2.3, per-group normaliser
    ("e3", "seq-mean-token-mean-per-question", 0.0, {}),  # E3 eq. 1 with dynamic budgets
    ("e3_ts", "seq-mean-token-mean", 0.0, {}),  # eq. 1 with equal groups
    ("e3_ts_an", "seq-mean-token-mean", 0.0, {}),
    ("erpo", "token-mean", 0.001, {}),  # ERPO eq. 5 and App. A
    ("ead", "token-mean", 0.0, {"eps_high": 0.28, "reward_shapers": []}),  # EAD section 5.1: DAPO's objective
    ("ead_tis", "token-mean", 0.0, {"eps_high": 0.28, "reward_shapers": [], "importance_weights": "tis"}),
])
def test_the_recipes_issue_16_named_are_their_papers(name, agg, kl, extra):
    cfg = load_config(RECIPES[0].parent / f"{name}.yaml")
    assert cfg.algo.loss_agg == agg and cfg.algo.kl_coef == kl
    for field_name, value in extra.items():
        assert getattr(cfg.algo, field_name) == value, field_name
    if name.startswith("ead"):
        assert cfg.budget.policy == "uniform"  # dynamic sampling off
