"""One precedence for every setting (`explorl.config.layers.read_layers`): the command line > the file > its
`methods:` > its `base:` > the defaults; a user's explicit key settles a conflict between two methods."""

from __future__ import annotations

from pathlib import Path

import pytest

from explorl.algos.registry import names
from explorl.config import ConfigError, load_config

E3_AGG = "seq-mean-token-mean-per-question"  # src/explorl/methods/e3.yaml's algo.loss_agg
# e3 and clip_cov disagree on four keys (their method files): the objective, both clip bounds and the budget policy
SETTLE = "algo: {loss_agg: token-mean, eps_low: 0.2, eps_high: 0.28}\nbudget: {policy: e3}\n"


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_two_methods_that_disagree_are_refused_naming_every_key(tmp_path):
    both = write(tmp_path / "both.yaml", "methods: [e3, clip_cov]\n")
    with pytest.raises(ConfigError) as e:
        load_config(both)
    msg = str(e.value)
    for key in ("algo.loss_agg", "algo.eps_low", "algo.eps_high", "budget.policy"):
        assert f"both set {key}" in msg, msg
    assert "set algo.loss_agg, algo.eps_low, algo.eps_high, budget.policy in both.yaml" in msg
    assert "command line" in msg


ESTIMATORS = {name: name for name in names("estimator")}
"""The method layers that are advantage estimators (a layer named as a registered estimator), and the estimator each
selects: its own; every other layer leaves algo.advantage alone (its papers used GRPO's, the default)."""


def test_only_an_estimators_layer_sets_the_advantage():
    """Issue 56: EAD's layer pinned algo.advantage: grpo, so EAD with another estimator needed a tie-break; a layer
    that is not an estimator sets no estimator, and composes with any without one."""
    from explorl.config.layers import METHODS_DIR, method_names

    import yaml

    for name in method_names():
        algo = yaml.safe_load((METHODS_DIR / f"{name}.yaml").read_text()).get("algo") or {}
        assert algo.get("advantage") == ESTIMATORS.get(name), name
    assert load_config(None, ["algo.loss_agg=token-mean"]).algo.advantage == "grpo"  # the default they rely on


def test_ead_composes_with_another_estimator_without_a_tie_break(tmp_path):
    # a layer of one's own that picks an estimator alone (the shipped estimators' layers also bring their papers'
    # clip bounds, which differ from EAD's: those are a real choice, named as a conflict)
    write(tmp_path / "rloo_like.yaml", "algo: {advantage: dr_grpo}\n")
    cfg = load_config(write(tmp_path / "ead_mine.yaml", "methods: [ead_tis, rloo_like.yaml]\n"))
    assert (cfg.algo.advantage, cfg.sampling.schedule, cfg.algo.importance_weights) == ("dr_grpo", "ead", "tis")
    assert load_config(write(tmp_path / "ead.yaml", "methods: [ead]\n")).algo.advantage == "grpo"


def test_your_key_in_the_file_settles_a_methods_conflict(tmp_path):
    both = write(tmp_path / "both.yaml", "methods: [e3, clip_cov]\n" + SETTLE)
    cfg = load_config(both)
    assert (cfg.algo.loss_agg, cfg.algo.eps_low, cfg.algo.eps_high) == ("token-mean", 0.2, 0.28)
    assert cfg.budget.policy == "e3"
    # what the methods agree on, or only one sets, comes through: clip_cov's loss and updates, e3's schedule
    assert cfg.algo.loss == "clip_cov" and cfg.algo.mini_batches == 8 and cfg.sampling.schedule == "e3"
    # clip_cov's options for DAPO's budget went with its choice of budget.policy (they would be refused otherwise)
    assert "dapo" not in cfg.budget.options


def test_the_command_line_settles_a_methods_conflict(tmp_path):
    both = write(tmp_path / "both.yaml", "methods: [e3, clip_cov]\n")
    cfg = load_config(both, ["algo.loss_agg=seq-mean-token-mean", "algo.eps_low=0.2", "algo.eps_high=0.2",
                             "budget.policy=dapo"])
    assert cfg.algo.loss_agg == "seq-mean-token-mean" and cfg.budget.policy == "dapo"
    assert cfg.budget.options["dapo"].max_rounds == 9  # clip_cov's choice won, so its options stay
    # one key left unsettled is still refused, and only it is named
    with pytest.raises(ConfigError) as e:
        load_config(both, ["algo.loss_agg=token-mean", "algo.eps_low=0.2", "algo.eps_high=0.2"])
    assert "both set budget.policy" in str(e.value) and "algo.loss_agg" not in str(e.value)


def test_a_file_that_takes_the_conflicting_one_as_base_settles_it(tmp_path):
    write(tmp_path / "both.yaml", "methods: [e3, clip_cov]\n")
    mine = write(tmp_path / "mine.yaml", "base: both.yaml\n" + SETTLE)
    assert load_config(mine).algo.loss_agg == "token-mean"


def test_the_precedence_command_line_file_methods_base_defaults(tmp_path):
    # each layer sets lr (or not) so that the value shows which one won
    write(tmp_path / "base.yaml", "algo: {loss_agg: seq-mean-token-mean, kl_coef: 0.01}\noptim: {lr: 1.0e-3}\n"
                                  "run: {steps: 7}\n")
    write(tmp_path / "m.yaml", "algo: {loss_agg: seq-mean-token-sum-norm, kl_coef: 0.02}\noptim: {lr: 2.0e-3}\n")
    mine = write(tmp_path / "mine.yaml", "base: base.yaml\nmethods: [m.yaml]\noptim: {lr: 3.0e-3}\n")
    cfg = load_config(mine)
    assert cfg.run.steps == 7  # the base over the defaults (run.steps defaults to 100)
    assert cfg.algo.loss_agg == "seq-mean-token-sum-norm" and cfg.algo.kl_coef == 0.02  # methods over the base
    assert cfg.optim.lr == 3e-3  # the file over its methods
    assert load_config(mine, ["optim.lr=4e-3"]).optim.lr == 4e-3  # the command line over the file
    assert load_config(mine, ["algo.kl_coef=0"]).algo.kl_coef == 0.0


def test_a_base_set_key_loses_to_a_method_the_file_names_and_the_file_wins_over_both(tmp_path):
    """The issue's case: a base sets `algo.loss_agg: token-mean` and the file names `methods: [e3]`; E3's value is
    used (methods are above the base, as the recipes need: `base: quickstart.yaml` + `methods: [e3]`), and setting it
    in the file itself keeps token-mean."""
    write(tmp_path / "base.yaml", "algo: {loss_agg: token-mean}\n")
    mine = write(tmp_path / "mine.yaml", "base: base.yaml\nmethods: [e3]\n")
    assert load_config(mine).algo.loss_agg == E3_AGG
    write(mine, "base: base.yaml\nmethods: [e3]\nalgo: {loss_agg: token-mean}\n")
    assert load_config(mine).algo.loss_agg == "token-mean"


def test_a_methods_named_in_a_base_lose_to_the_bases_own_keys(tmp_path):
    write(tmp_path / "base.yaml", "methods: [e3]\nalgo: {loss_agg: token-mean}\n")
    mine = write(tmp_path / "mine.yaml", "base: base.yaml\n")
    cfg = load_config(mine)
    assert cfg.algo.loss_agg == "token-mean" and cfg.sampling.schedule == "e3"


def test_layers_are_named_lowest_first(tmp_path, monkeypatch):
    from explorl.config.layers import read_layers

    monkeypatch.chdir(tmp_path)
    write(tmp_path / "base.yaml", "run: {steps: 7}\n")
    mine = write(tmp_path / "mine.yaml", "base: base.yaml\nmethods: [e3]\n")
    layers = read_layers(mine, ["run.seed=3"])
    names = [layer.source for layer in layers]
    assert names[0] == "base: base.yaml" and names[-2:] == ["mine.yaml", "command line"]
    assert names[1].startswith("methods: e3 (") and names[1].endswith("e3.yaml)")
    assert [layer.method for layer in layers] == [False, True, False, False]
    assert layers[-1].sets("run.seed") and not layers[-1].sets("run.steps")


def test_a_type_error_or_unknown_key_in_a_file_names_its_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "base.yaml", "run:\n  seed: 3\n  steps: many\n")
    with pytest.raises(ConfigError, match=r"^base\.yaml:3: run\.steps: expected an integer, got 'many'$"):
        load_config(tmp_path / "base.yaml")
    mine = write(tmp_path / "mine.yaml", "base: base.yaml\nrun: {steps: 4}\nalgo:\n  eps_lo: 0.1\n")
    with pytest.raises(ConfigError, match=r"^mine\.yaml:4: unknown key 'algo\.eps_lo'\. Did you mean 'algo\.eps_low'"):
        load_config(mine)
    # set on the command line: no file to point at
    with pytest.raises(ConfigError, match=r"^run\.steps: expected an integer, got 'x'$"):
        load_config(tmp_path / "base.yaml", ["run.steps=x"])
