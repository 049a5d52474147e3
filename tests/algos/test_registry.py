"""The one registry: every kind, duplicate names refused, what entries record, defaults living once (in the config),
and a method added from a user's own module and selected by name in YAML (the example of docs/add-a-method.md)."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import pytest
import torch
import yaml

from explorl.algos import advantages as A
from explorl.algos import losses as L
from explorl.algos.batch import RolloutBatch
from explorl.algos.registry import ENTRY_TYPES, KINDS, AlgoEntry, PolicyLossEntry, entries, get, lookup, names, register
from explorl.config import AlgoConfig, Config, ConfigError, TaskConfig, load_config

ROOT = Path(__file__).resolve().parents[2]
ADD_A_METHOD = (ROOT / "docs" / "add-a-method.md").read_text()


def test_every_kind_has_its_builtin_entries():
    import explorl.config  # noqa: F401  (validation imports the modules that register)
    import explorl.rollout.controllers  # noqa: F401
    import explorl.tasks  # noqa: F401

    want = {
        "estimator": {"grpo", "dr_grpo", "erpo", "passk", "rloo", "reinforce_plus_plus",
                      "reinforce_plus_plus_baseline", "opo", "gpg", "gdpo", "optimal_token_baseline"},
        "shaper": {"cw", "cw_group", "ppl", "position", "entropy_adv"},
        "policy_loss": {"ppo", "clip_cov", "kl_cov"},
        "token_filter": {"none", "forking"},
        "reward_shaper": {"dapo_overlong", "dapo_overlong_filter"},
        "importance_weights": {"none", "tis"},
        "aggregation": {"token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm",
                        "seq-mean-token-mean-per-question"},
        "temperature_schedule": {"fixed", "e3", "ead", "revead", "adaptive"},
        "budget_policy": {"uniform", "e3", "dapo"},
        "task": {"arith", "file", "rg"},
    }
    assert set(want) == set(KINDS)
    for kind, expected in want.items():
        assert expected <= set(entries(kind)), kind


def test_a_name_is_registered_once_per_kind():
    with pytest.raises(ValueError, match="registered twice"):
        register("estimator", "grpo")(lambda batch, cfg: None)
    with pytest.raises(ValueError, match="unknown registry kind"):
        register("estimators", "x")


def test_a_misspelled_field_names_the_valid_ones_of_its_kind():
    """Each kind declares its fields (`ENTRY_TYPES`): a keyword it does not declare is refused, naming those it
    does; a capability of another kind is no field of this one."""
    with pytest.raises(TypeError, match=r"unknown field 'rowwize' of PolicyLossEntry; valid for policy_loss: "
                                        r".*rowwise, needs_generator"):
        register("policy_loss", "_typo_test", rowwize=True)
    with pytest.raises(TypeError, match=r"unknown field 'per_token' of EstimatorEntry; valid for estimator: "
                                        r".*needs_ref"):
        register("estimator", "_typo_test", per_token=lambda t, step: 1.0)
    with pytest.raises(ValueError, match="rowwise must be True or False"):
        register("policy_loss", "_typo_test", rowwise="yes")
    assert "_typo_test" not in entries("policy_loss") and "_typo_test" not in entries("estimator")
    assert set(ENTRY_TYPES) == set(KINDS)
    for kind, entry in ((k, e) for k in KINDS for e in entries(k).values()):
        assert type(entry) is ENTRY_TYPES[kind], (kind, entry.name)


def test_unknown_names_fail_listing_the_valid_ones():
    with pytest.raises(KeyError, match="valid: dr_grpo, erpo, gdpo, gpg, grpo, grpo_passk, maxrl, nsr, opo, "
                                       "optimal_token_baseline, passk, psr, qae, reinforce_plus_plus, "
                                       "reinforce_plus_plus_baseline, remax, rl_zvp, rloo, tir_optimal_token_baseline, "
                                       "w_reinforce"):
        lookup("estimator", "grpoo")
    with pytest.raises(KeyError, match="rg:<argument>"):
        lookup("task", "rg")  # the reasoning-gym entry needs its dataset name
    assert lookup("task", "rg:chain_sum").name == "rg"
    with pytest.raises(ConfigError, match=r"algo.loss: unknown policy loss 'ppo2'; valid: bypass_mode, cispo, clip_cov, dppo_kl, "
                                          r"dppo_tv, dro, geo_mean, gpg, gspo, kl_cov, luspo, ppo, sapo, simko, vespo"):
        load_config(None, ["algo.loss=ppo2"])
    with pytest.raises(ConfigError, match=r"sampling.schedule: .*valid: adaptive, e3, ead, fixed, revead.*run.plugins"):
        load_config(None, ["sampling.schedule=e4"])
    with pytest.raises(ConfigError, match=r"algo.shapers\[1\]: unknown shaper 'cov'"):
        load_config(None, ["algo.shapers=[cw,cov]"])


def _config_has(kind: str, field_name: str) -> bool:
    if kind == "task":
        return field_name in {f.name for f in dataclasses.fields(TaskConfig)}
    if kind in ("temperature_schedule", "budget_policy"):
        node = Config()
        for part in field_name.split("."):
            if not hasattr(node, part):
                return False
            node = getattr(node, part)
        return True
    return field_name in {f.name for f in dataclasses.fields(AlgoConfig)}


def test_every_field_an_entry_reads_exists_in_the_config():
    import explorl.rollout.controllers  # noqa: F401
    import explorl.tasks  # noqa: F401

    checked = 0
    for kind in KINDS:
        for name, entry in entries(kind).items():
            for field_name in entry.reads:
                assert _config_has(kind, field_name), f"{kind} {name} reads {field_name!r}, not a config field"
                checked += 1
    assert checked > 15


def test_every_option_has_a_docstring_and_a_default():
    """An entry's options are configured like the core sections: one docstring and one default per field."""
    from explorl.config import field_docs
    from explorl.config.validation import fill_registry

    fill_registry()
    classes = {e.options for kind in KINDS for e in entries(kind).values() if e.options is not None}
    assert len(classes) >= 14
    for cls in classes:
        docs = field_docs(cls)
        for f in dataclasses.fields(cls):
            assert docs.get(f.name, "").strip(), f"{cls.__name__}.{f.name} has no docstring"
        cls()  # every field has a default


def _keyword_defaults(fn) -> dict:
    return {k: p.default for k, p in inspect.signature(fn).parameters.items() if p.default is not inspect._empty}


def test_the_public_functions_defaults_are_the_configs():
    """The pure functions keep the papers' defaults in their signatures (the public API); the config (the core
    sections and each method's options dataclass) is where a run's defaults live. They must agree, or a library
    user and a config user would train different methods."""
    def values(options, *fields: str) -> dict:  # keyword -> the options' default, for keywords named as fields
        return {f: getattr(options, f) for f in fields}

    cfg = AlgoConfig()
    pairs = [(A.erpo, {"options": A.ErpoOptions()})]
    clip = {"eps_low": cfg.eps_low, "eps_high": cfg.eps_high}  # the registered losses pass the core clip range
    pairs += [(L.policy_loss, {**clip, "dual_clip_c": L.PpoOptions().dual_clip_c}),
              (L.clip_cov_loss, {"clip_range": (cfg.eps_low, cfg.eps_high), "options": L.ClipCovOptions()}),
              (L.kl_cov_loss, {"k_percent": L.KlCovOptions().k_percent, "kl_coef": L.KlCovOptions().coef})]
    pairs += [(A.ppl_shaped, values(A.PplOptions(), "alpha", "iqr_filter", "clamp")),
              (A.position_shaped, values(A.PositionOptions(), "gamma", "m", "d", "n", "cap_frac")),
              *((fn, values(A.CwOptions(), "bandwidth"))
                for fn in (A.cov_weights, A.cov_weighted, A.cov_weights_grouped, A.cov_weights_balanced)),
              (A.entropy_shaped, values(A.EntropyAdvOptions(), "alpha", "kappa")),
              (A.grpo, {"eps": cfg.adv_eps}),
              (L.forking_mask, values(L.ForkingOptions(), "top_frac")),
              (L.tis_weights, {"cap": L.TisOptions().cap, "level": L.TisOptions().level}),
              (L.overlong_penalty, values(L.OverlongOptions(), "penalty"))]
    compared = 0
    for fn, expected in pairs:
        defaults = _keyword_defaults(fn)
        for keyword, value in expected.items():
            assert defaults[keyword] == value, (fn.__name__, keyword)
            compared += 1
    assert compared >= 20


def test_the_adapters_read_no_default_of_their_own():
    """No `getattr(cfg, name, default)` in the algorithms: a missing field is an error, not a second default."""
    for path in (ROOT / "src" / "explorl" / "algos").glob("*.py"):
        assert not re.search(r"getattr\(cfg, \"\w+\", ", path.read_text()), path.name


def test_what_entries_record():
    assert lookup("estimator", "erpo").needs_ref and lookup("estimator", "erpo").needs_old_logprobs
    assert not lookup("estimator", "grpo").needs_ref and not lookup("estimator", "grpo").needs_old_logprobs
    assert lookup("shaper", "cw").needs_old_logprobs and not lookup("shaper", "position").needs_old_logprobs
    assert lookup("temperature_schedule", "e3").behavior_is_policy
    assert not lookup("temperature_schedule", "ead").behavior_is_policy
    assert lookup("policy_loss", "clip_cov").needs_generator and not lookup("policy_loss", "ppo").needs_generator
    assert lookup("policy_loss", "ppo").rowwise and not lookup("policy_loss", "clip_cov").rowwise
    assert isinstance(lookup("policy_loss", "kl_cov"), PolicyLossEntry)
    assert lookup("policy_loss", "kl_cov").options is L.KlCovOptions
    assert lookup("policy_loss", "kl_cov").formula == (L.kl_cov_loss,)  # the maths; `fn` adapts the config to it
    assert lookup("aggregation", "seq-mean-token-mean-per-question").per_question
    assert lookup("shaper", "cw_group").options_from == "cw" and lookup("shaper", "cw_group").options is None
    assert lookup("temperature_schedule", "revead").options_owner == "ead"
    # a user entry that says nothing is assumed to read pi_old: the one-update shortcut is then off (safe)
    assert AlgoEntry.__dataclass_fields__["needs_old_logprobs"].default is True


def test_an_entrys_check_runs_at_validation():
    with pytest.raises(ConfigError, match="algo.passk.k"):
        load_config(None, ["algo.advantage=passk", "algo.passk.k=9"])
    with pytest.raises(ConfigError, match="task.difficulties"):
        load_config(None, ["task.difficulties=[13]"])
    with pytest.raises(ConfigError, match="sampling.ead.tau_min"):
        load_config(None, ["sampling.schedule=revead", "sampling.ead.tau_min=0"])


# ----------------------------------------------------------------------------------------------------------------
# a method from the user's own module


def _readme_plugin() -> str:
    block = ADD_A_METHOD.split("<!-- add-a-method:begin -->")[1].split("<!-- add-a-method:end -->")[0]
    return block.split("```python\n")[1].split("```")[0]


def test_readme_example_is_the_shipped_example():
    assert _readme_plugin() in (ROOT / "configs" / "examples" / "plugins" / "rloo.py").read_text()


def test_a_users_estimator_is_selected_by_name_in_yaml(tmp_path, monkeypatch, tiny_model_dir):
    """The docs' RLOO (docs/add-a-method.md), written next to a config as a user would, named in `run.plugins` and
    `algo.advantage`."""
    from explorl.train.loop import train

    module = "rloo" if "my_rloo" not in names("estimator") else None  # registered once per process
    if module is None:
        pytest.skip("my_rloo already registered by another test in this process")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rloo.py").write_text(_readme_plugin())
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "run.yaml").write_text("run: {plugins: [rloo]}\nalgo:\n  advantage: my_rloo\n"
                                       "  my_rloo: {normalize: true}\n")
    with pytest.raises(ConfigError, match="algo.advantage: unknown estimator 'my_rloo'"):
        load_config(tmp_path / "run.yaml", ["run.plugins=[]"])  # without the plugin the name is unknown
    cfg = load_config(tmp_path / "run.yaml", [
        f"model.path={tiny_model_dir}", f"run.out_dir={tmp_path / 'out'}", "run.steps=2", "run.batch_size=2",
        "sampling.group_size=4", "sampling.max_new_tokens=8", "task.train_size=4", "task.eval_size=2",
        "task.difficulties=[1]", "run.eval_n=1", "run.eval_k=[1]", "run.save_every=0",
        "task.reward=rewards_for_tests:contains_digit"])
    assert cfg.algo.advantage == "my_rloo" and cfg.algo.options["my_rloo"].normalize is True  # set from YAML
    with pytest.raises(ConfigError, match=r"algo.my_rloo.normalise'. Did you mean 'algo.my_rloo.normalize'"):
        load_config(tmp_path / "run.yaml", ["algo.my_rloo.normalise=true"])
    # group of 3 with rewards 1, 0, 0: 1 - 0 = 1; 0 - (1 + 0) / 2 = -0.5 (twice); a group of one gets 0
    batch = RolloutBatch(mask=torch.ones(4, 2), rewards=torch.tensor([1.0, 0.0, 0.0, 1.0]),
                         group=torch.tensor([7, 7, 7, 2]))
    plain = type(cfg.algo.options["my_rloo"])(normalize=False)
    assert torch.equal(get("estimator", "my_rloo")(batch, cfg.algo, options=plain),
                       torch.tensor([[1.0, 1.0], [-0.5, -0.5], [-0.5, -0.5], [0.0, 0.0]]))
    # normalize: the group's unbiased std of (1, 0, 0) is sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = sqrt(1/3) = 0.57735,
    # so 1 / 0.57735 = 1.73205 and -0.5 / 0.57735 = -0.86603; the group of one stays 0
    got = lookup("estimator", "my_rloo").bind(cfg.algo)(batch, cfg.algo)
    torch.testing.assert_close(got, torch.tensor([[1.73205, 1.73205], [-0.86603, -0.86603], [-0.86603, -0.86603],
                                                  [0.0, 0.0]]), atol=1e-5, rtol=0)
    run = train(cfg, progress=False)
    assert (run / "final" / "config.json").exists()
    assert yaml.safe_load((run / "config.yaml").read_text())["run"]["plugins"] == ["rloo"]  # resume re-imports it


def test_a_plugin_that_does_not_import_is_named_in_the_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "broken_plugin.py").write_text("raise RuntimeError('boom')\n")
    with pytest.raises(ConfigError, match=r"run.plugins\[0\]: cannot import 'broken_plugin': RuntimeError: boom"):
        load_config(None, ["run.plugins=[broken_plugin]"])
    with pytest.raises(ConfigError, match=r"run.plugins\[0\]: cannot import 'no_such_module_xyz'"):
        load_config(None, ["run.plugins=[no_such_module_xyz]"])
