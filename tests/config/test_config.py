"""Typed config: defaults, YAML loading, key=value overrides, errors that name the field, `base:` inheritance,
one docstring per field, and YAML round-trips. All fast and pure (nothing is loaded or trained)."""

from __future__ import annotations

import dataclasses
import math
import typing
from pathlib import Path

import pytest
import yaml

from explorl.algos.losses import PpoOptions, TisOptions
from explorl.config import (
    AlgoConfig,
    SamplingConfig,
    to_dict,
    Config,
    ConfigError,
    LoraConfig,
    ModelConfig,
    dump_yaml,
    field_docs,
    from_dict,
    load_config,
    reference,
)

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"
ALL_CONFIGS = sorted((ROOT / "configs").rglob("*.yaml"))


def err(overrides=(), path=None) -> str:
    """The message of the ConfigError that loading raises."""
    with pytest.raises(ConfigError) as e:
        load_config(path, list(overrides))
    return str(e.value)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def leaves(d: dict, prefix: str = ""):
    for k, v in d.items():
        if isinstance(v, dict) and f"{prefix}{k}" not in MAPPING_FIELDS:
            yield from leaves(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


MAPPING_FIELDS = {"run.eval_sets"}
"""Fields whose value is a mapping (a leaf of the config, not a section)."""


def get(cfg, dotted: str):
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def dataclass_tree(cls=Config):
    """`cls` and every dataclass nested in it (sections and sub-sections)."""
    hints = typing.get_type_hints(cls)
    yield cls
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            yield from dataclass_tree(hints[f.name])


# ----------------------------------------------------------------------------------------------------------------
# loading


def test_defaults_load():
    cfg = load_config(None)
    assert cfg.algo.options == {"ppo": PpoOptions()}  # the selected loss's options, filled in with their defaults
    cfg.algo.options = {}
    assert cfg.run.out_dir == str(Path.cwd() / "runs" / "default")  # the default, recorded resolved
    cfg.run.out_dir = Config().run.out_dir
    assert cfg == Config()
    assert cfg.algo.advantage == "grpo"
    assert cfg.model.lora == LoraConfig()
    assert load_config() == load_config(None, [])


def test_quickstart_loads_and_matches_its_yaml():
    cfg = load_config(QUICKSTART)
    raw = yaml.safe_load(QUICKSTART.read_text())
    n = 0
    for name, value in leaves(raw):
        got = get(cfg, name)
        want = float(value) if isinstance(got, float) else value
        if name == "run.out_dir":  # a path: relative to the file
            want = str(ROOT / "runs" / "demo")
        assert got == want, name
        n += 1
    assert n >= 10
    # YAML 1.1 reads "5.0e-4" as a float but a bare "5e-4" as a string: either way lr must come out a float
    assert cfg.optim.lr == pytest.approx(float(raw["optim"]["lr"])) and isinstance(cfg.optim.lr, float)
    # fields the file does not name keep their defaults
    assert cfg.sampling.top_p == Config().sampling.top_p
    assert cfg.model.lora == LoraConfig()


@pytest.mark.parametrize("path", ALL_CONFIGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_config_is_valid(path):
    cfg = load_config(path)
    assert isinstance(cfg, Config)


# ----------------------------------------------------------------------------------------------------------------
# overrides


def test_overrides_typed():
    cfg = load_config(QUICKSTART, ["sampling.temperature=0.7", "run.eval_k=[1,2,4]", "optim.lr=1e-4",
                                   "model.lora.enabled=true", "run.steps=7", "model.path=/some/dir"])
    assert cfg.sampling.temperature == 0.7
    assert cfg.run.eval_k == [1, 2, 4]
    assert cfg.optim.lr == 1e-4 and isinstance(cfg.optim.lr, float)  # YAML 1.1 reads `1e-4` as a string
    assert cfg.model.lora.enabled is True
    assert cfg.run.steps == 7
    assert cfg.model.path == "/some/dir"
    # untouched fields keep the file's values
    assert cfg.run.batch_size == 32


def test_override_beats_yaml_and_last_override_wins():
    cfg = load_config(QUICKSTART, ["run.steps=3", "run.steps=5"])
    assert cfg.run.steps == 5


def test_integer_given_to_float_and_whole_float_to_int():
    cfg = load_config(None, ["sampling.temperature=1", "run.steps=10.0"])
    assert cfg.sampling.temperature == 1.0 and isinstance(cfg.sampling.temperature, float)
    assert cfg.run.steps == 10 and isinstance(cfg.run.steps, int)


def test_list_of_str_from_comma_string():
    cfg = load_config(None, ["model.lora.target_modules=q_proj, v_proj ,o_proj"])
    assert cfg.model.lora.target_modules == ["q_proj", "v_proj", "o_proj"]
    cfg = load_config(None, ["model.lora.target_modules=q_proj"])
    assert cfg.model.lora.target_modules == ["q_proj"]
    cfg = load_config(None, ["model.lora.target_modules=[gate_proj, up_proj]"])
    assert cfg.model.lora.target_modules == ["gate_proj", "up_proj"]


def test_list_of_int_from_comma_string_and_scalar():
    assert load_config(None, ["run.eval_k=1,2,4"]).run.eval_k == [1, 2, 4]
    assert load_config(None, ["run.eval_k=1, 8"]).run.eval_k == [1, 8]
    assert load_config(None, ["run.eval_k=4"]).run.eval_k == [4]
    assert load_config(None, ["task.difficulties=2,3"]).task.difficulties == [2, 3]
    msg = err(["run.eval_k=1,x"])
    assert "run.eval_k[1]" in msg and "integer" in msg


def test_backslash_n_typed_on_a_command_line_is_a_newline():
    """Issue 56: a shell passes `\\n` in `--task-opt 'prompt_template=Q: {question}\\nA:'` as a backslash and an n;
    a string field reads it (and `\\t`) as a newline (a tab), `\\\\` stays two backslashes, other escapes stay."""
    cfg = load_config(None, [r"task.prompt_template=Q: {question}\nA:\t", r"task.answer_pattern=\\boxed\{(\d+)\}\\n"])
    assert cfg.task.prompt_template == "Q: {question}\nA:\t"
    assert cfg.task.answer_pattern == r"\\boxed\{(\d+)\}\\n"  # nothing but the doubled backslashes to read
    # quoted, YAML reads the escapes itself, as before
    assert load_config(None, ['task.prompt_template="Q: {question}\\nA:"']).task.prompt_template == "Q: {question}\nA:"
    from explorl.config.held_out import command_task

    assert command_task(None, "arith", {"prompt_template": r"{question}\n="}).prompt_template == "{question}\n="


def test_string_fields_take_override_text_verbatim():
    # YAML would read these as a mapping, a comment or a boolean; a string field keeps the text as typed
    assert load_config(None, ["task.prompt_template={question}"]).task.prompt_template == "{question}"
    cfg = load_config(None, ["task.prompt_template=Q: {question}\nA: # step by step"])
    assert cfg.task.prompt_template == "Q: {question}\nA: # step by step"
    assert load_config(None, ["run.out_dir=runs/a: b"]).run.out_dir == str(Path.cwd() / "runs/a: b")
    assert load_config(None, ["model.path=123"]).model.path == str(Path.cwd() / "123")  # a path: made absolute
    assert load_config(None, ["model.attn_implementation=null"]).model.attn_implementation == "null"
    # a quoted value is unquoted
    assert load_config(None, ["run.out_dir='runs/x y'"]).run.out_dir == str(Path.cwd() / "runs/x y")
    assert load_config(None, ['run.out_dir="runs/z"']).run.out_dir == str(Path.cwd() / "runs/z")


def test_string_field_given_a_list_in_yaml(tmp_path):
    msg = err(path=write(tmp_path / "c.yaml", "model:\n  path: [a, b]\n"))
    assert msg.startswith(f"{tmp_path / 'c.yaml'}:2: model.path") and "string" in msg  # file:line of the key


def test_empty_override_value_is_empty_string():
    cfg = load_config(None, ["task.eval_path="])
    assert cfg.task.eval_path == ""


def test_value_may_contain_equals_sign():
    cfg = load_config(None, ["task.prompt_template=Q={question} A="])
    assert cfg.task.prompt_template == "Q={question} A="


# ----------------------------------------------------------------------------------------------------------------
# errors name the field and the valid choices


def test_unknown_top_level_section_lists_sections():
    msg = err(["trainer.steps=3"])
    assert "'trainer'" in msg
    for section in ("model", "task", "sampling", "algo", "optim", "run"):
        assert section in msg


def test_unknown_top_level_section_in_yaml(tmp_path):
    p = write(tmp_path / "c.yaml", "samplng:\n  temperature: 0.5\n")
    msg = err(path=p)
    assert "samplng" in msg and "Did you mean 'sampling'" in msg


def test_unknown_nested_key_did_you_mean():
    msg = err(["sampling.temprature=1"])
    assert "sampling.temprature" in msg
    assert "Did you mean 'sampling.temperature'" in msg
    assert "group_size" in msg and "top_p" in msg  # the valid keys of the section


def test_unknown_deeply_nested_key():
    msg = err(["model.lora.rnak=4"])
    assert "model.lora.rnak" in msg and "model.lora.rank" in msg


def test_unknown_key_without_close_match_still_lists_keys():
    msg = err(["algo.zzzzzz=1"])
    assert "algo.zzzzzz" in msg and "Did you mean" not in msg and "loss_agg" in msg


@pytest.mark.parametrize("override, field, words", [
    ("run.steps=abc", "run.steps", "integer"),
    ("run.steps=1.5", "run.steps", "integer"),
    ("run.steps=true", "run.steps", "integer"),  # a bool is not an int here
    ("sampling.group_size=false", "sampling.group_size", "integer"),
    ("sampling.temperature=hot", "sampling.temperature", "number"),
    ("sampling.temperature=true", "sampling.temperature", "number"),
    ("optim.lr=nan", "optim.lr", "number"),
    ("algo.entropy_coef=.nan", "algo.entropy_coef", "number"),
    ("model.lora.enabled=1", "model.lora.enabled", "true or false"),
    ("model.lora.enabled=maybe", "model.lora.enabled", "true or false"),
    ("run.eval_k={a: 1}", "run.eval_k", "list"),
])
def test_wrong_type_names_field(override, field, words):
    msg = err([override])
    assert msg.startswith(field) and words in msg


def test_literal_violation_lists_modes():
    msg = err(["algo.loss_agg=mean"])
    assert "algo.loss_agg" in msg and "'mean'" in msg
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        assert mode in msg
    msg = err(["model.dtype=fp8"])
    assert "model.dtype" in msg and "bfloat16" in msg


def test_unknown_advantage_lists_registered():
    from explorl.algos.registry import names

    msg = err(["algo.advantage=ppo"])
    assert "algo.advantage" in msg and "'ppo'" in msg
    assert {"grpo", "dr_grpo"} <= set(names("estimator"))
    for name in names("estimator"):
        assert name in msg


@pytest.mark.parametrize("overrides, field", [
    (["run.eval_k=[1,16]", "run.eval_n=8"], "run.eval_k"),
    (["run.eval_k=0"], "run.eval_k"),
    (["sampling.temperature=0"], "sampling.temperature"),
    (["sampling.temperature=-1"], "sampling.temperature"),
    (["sampling.top_p=1.5"], "sampling.top_p"),
    (["sampling.top_p=0"], "sampling.top_p"),
    (["task.name=file"], "task.path"),
    (["task.name=nosuchtask"], "task.name"),
    (["task.name=rg:"], "task.name"),
    (["task.prompt_template=Solve this"], "task.prompt_template"),
    (["task.difficulties=[0, 9]"], "task.difficulties"),
    (["task.reward=fuzzy"], "task.reward"),
    (["sampling.group_size=0"], "sampling.group_size"),
    (["optim.lr=0"], "optim.lr"),
    (["run.steps=0"], "run.steps"),
    (["algo.eps_low=1.5"], "algo.eps_low"),
    (["algo.mini_batches=9", "run.batch_size=2", "sampling.group_size=4"], "algo.mini_batches"),
    (["model.device=gpu"], "model.device"),
    (["model.lora.enabled=true", "model.lora.rank=0"], "model.lora.rank"),
    (["model.lora.enabled=true", "model.lora.target_modules=[]"], "model.lora.target_modules"),
])
def test_impossible_combinations(overrides, field):
    assert err(overrides).startswith(field)


@pytest.mark.parametrize("overrides, field, words", [
    (["algo.importance_weights=tis", "algo.tis.level=seq", "sampling.schedule=ead"], "algo.tis.level",
     "token, sequence"),
    (["algo.tis.level=response", "algo.importance_weights=tis", "sampling.schedule=ead"], "algo.tis.level", "sequence"),
    (["algo.importance_weights=tis", "algo.tis.cap=0.5", "sampling.schedule=ead"], "algo.tis.cap", ">= 1"),
    (["algo.tis.cap=3"], "algo.tis", "not selected (algo.importance_weights is 'none')"),
    (["algo.reward_shapers=[dapo_overlong]", "algo.dapo_overlong.penalty=-1"], "algo.dapo_overlong.penalty", ">= 0"),
    (["algo.reward_shapers=[dapo_overlong]", "algo.dapo_overlong.buffer=64"], "algo.dapo_overlong.buffer",
     "(0, sampling.max_new_tokens=64)"),
    (["algo.reward_shapers=[dapo_overlong_filter]", "algo.dapo_overlong.buffer=4"], "algo.dapo_overlong",
     "not selected (algo.reward_shapers is ['dapo_overlong_filter'])"),
    (["algo.reward_shapers=[dapo_overlong,dapo_overlong]"], "algo.reward_shapers", "twice"),
    (["algo.reward_shapers=[overlong]"], "algo.reward_shapers[0]", "valid: dapo_overlong, dapo_overlong_filter"),
    (["algo.importance_weights=is"], "algo.importance_weights", "valid: none, rollout_is, tis"),
    (["algo.ppo.dual_clip_c=1.0"], "algo.ppo.dual_clip_c", "> 1"),
    (["algo.ppo.dual_clip_c=0.5"], "algo.ppo.dual_clip_c", "> 1"),
    (["algo.ppo.dual_clip_c=-3"], "algo.ppo.dual_clip_c", "> 1"),
    (["algo.ppo.dual_clip_c=abc"], "algo.ppo.dual_clip_c", "number"),
    (["algo.ppo.dual_clip_c=3", "algo.loss=clip_cov"], "algo.ppo", "not selected (algo.loss is 'clip_cov')"),
    (["algo.ppo.dual_clip_c=3", "algo.loss=kl_cov"], "algo.ppo", "not selected (algo.loss is 'kl_cov')"),
    (["algo.kl_clamp=0"], "algo.kl_clamp", "> 0"),
    (["algo.kl_clamp=-10"], "algo.kl_clamp", "> 0"),
    (["algo.kl_clamp=.nan"], "algo.kl_clamp", "number"),
    (["algo.kl_importance_weighted=true"], "algo.kl_importance_weighted", "algo.kl_coef > 0"),
    (["algo.kl_tokens=line_starts"], "algo.kl_tokens", "algo.kl_coef > 0"),
    (["algo.kl_tokens=lines", "algo.kl_coef=0.1"], "algo.kl_tokens", "line_starts"),
])
def test_convention_options_validate(overrides, field, words):
    """The engines' conventions as options (docs/methods.md §6, §9): bad values name the field and the fix."""
    msg = err(overrides)
    assert msg.startswith(field) and words in msg


def test_convention_options_default_off_and_accept_good_values():
    from explorl.config import validate

    a = AlgoConfig()
    assert (TisOptions().level, PpoOptions().dual_clip_c, a.kl_clamp) == ("token", None, None)  # explorl's: off
    cfg = load_config(None, ["algo.importance_weights=tis", "sampling.schedule=ead", "algo.tis.level=sequence",
                             "algo.ppo.dual_clip_c=3", "algo.kl_clamp=10", "algo.kl_coef=0.01"])
    dual_clip_c = cfg.algo.options["ppo"].dual_clip_c
    assert cfg.algo.options["tis"].level == "sequence" and dual_clip_c == 3.0 and cfg.algo.kl_clamp == 10.0
    assert isinstance(dual_clip_c, float) and isinstance(cfg.algo.kl_clamp, float)
    assert load_config(None, ["algo.ppo.dual_clip_c=null", "algo.kl_clamp=null"]) == load_config(None)
    # a value set in code, past the YAML coercion, is still caught by validate
    bad = Config(sampling=SamplingConfig(schedule="ead"))
    bad.algo = dataclasses.replace(bad.algo, importance_weights="tis", options={"tis": TisOptions(level="seq")})
    with pytest.raises(ConfigError, match="^algo.tis.level"):
        validate(bad)
    bad.algo = dataclasses.replace(bad.algo, loss_agg="mean", options={})
    with pytest.raises(ConfigError, match="^algo.loss_agg: 'mean' is not a valid choice"):
        validate(bad)
    docs = field_docs(AlgoConfig)
    assert "clip_ratio_c" in field_docs(PpoOptions)["dual_clip_c"] and "low_var_kl" in docs["kl_clamp"]
    assert "B.2" in field_docs(TisOptions)["level"]


def test_tis_and_overlong_are_selected_with_their_options_under_their_names(tmp_path):
    cfg = load_config(None, ["algo.importance_weights=tis", "sampling.schedule=ead", "algo.tis.cap=3",
                             "algo.reward_shapers=[dapo_overlong]", "algo.dapo_overlong.buffer=8"])
    assert cfg.algo.options["tis"] == TisOptions(cap=3.0, level="token")
    assert (cfg.algo.options["dapo_overlong"].buffer, cfg.algo.options["dapo_overlong"].penalty) == (8, 1.0)
    # the YAML form, and the round trip of a run's config.yaml
    path = write(tmp_path / "m.yaml", "sampling: {schedule: ead}\nalgo:\n  importance_weights: tis\n"
                                      "  tis: {level: sequence}\n  reward_shapers: [dapo_overlong_filter]\n")
    loaded = load_config(path)
    assert loaded.algo.options["tis"] == TisOptions(cap=2.0, level="sequence")
    assert loaded.algo.reward_shapers == ["dapo_overlong_filter"] and "dapo_overlong" not in loaded.algo.options
    assert load_config(write(tmp_path / "again.yaml", dump_yaml(loaded))) == loaded
    # `algo.tis: null` drops the options (a layered recipe's), as for any method
    assert "tis" not in load_config(None, ["algo.tis.cap=3", "algo.tis=null"]).algo.options


def test_the_loss_agg_modes_have_one_source():
    """`explorl.algos.aggregation.LOSS_AGG_MODES` is the list: the config accepts exactly these (the schema, which
    imports nothing of explorl, types the field `str`; validation checks it), `explorl config` shows them as the
    field's type, the field's docstring names each, and `aggregate` computes each."""
    import torch

    from explorl.algos.aggregation import LOSS_AGG, LOSS_AGG_MODES, PER_QUESTION, aggregate
    from explorl.config.selection import CHOICES

    assert CHOICES["algo.loss_agg"] is LOSS_AGG_MODES and tuple(LOSS_AGG) == LOSS_AGG_MODES
    for mode in LOSS_AGG_MODES:
        assert load_config(None, [f"algo.loss_agg={mode}"]).algo.loss_agg == mode
        assert mode in " ".join(field_docs(AlgoConfig)["loss_agg"].split())
        mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
        assert torch.isfinite(aggregate(torch.ones(2, 2), mask, mode, max_response_len=2))
    msg = err(["algo.loss_agg=token-sum"])
    assert msg.startswith("algo.loss_agg: 'token-sum' is not a valid choice") and ", ".join(LOSS_AGG_MODES) in msg
    rows = {name: tp for name, tp, *_ in reference()}
    assert rows["algo.loss_agg"] == " | ".join(map(repr, LOSS_AGG_MODES))
    assert "E3 eq. 1" in LOSS_AGG[PER_QUESTION] and "E3 eq. 1" in field_docs(AlgoConfig)["loss_agg"]


def test_eval_k_message_names_eval_n():
    msg = err(["run.eval_k=1,16", "run.eval_n=8"])
    assert "run.eval_n=8" in msg and "16" in msg


def test_file_task_with_path_is_valid():
    cfg = load_config(None, ["task.name=file", "task.path=data.jsonl"])
    assert cfg.task.name == "file" and cfg.task.path == str(Path.cwd() / "data.jsonl")
    assert load_config(None, ["task.name=rg:chain_sum"]).task.name == "rg:chain_sum"


def test_section_given_a_scalar():
    msg = err(["sampling=3"])
    assert msg.startswith("sampling") and "mapping" in msg


def test_section_given_a_scalar_in_yaml(tmp_path):
    msg = err(path=write(tmp_path / "c.yaml", "model: embedded\n"))
    assert msg.startswith(f"{tmp_path / 'c.yaml'}:1: model") and "mapping" in msg


def test_empty_section_in_yaml_means_defaults(tmp_path):
    cfg = load_config(write(tmp_path / "c.yaml", "model:\n  lora:\nrun:\n"))
    assert cfg == load_config(None)


def test_override_through_a_scalar_is_an_error():
    msg = err(["sampling.temperature=1", "sampling.temperature.x=1"])
    assert "'temperature' is not a section" in msg


def test_override_without_equals():
    msg = err(["sampling.temperature"])
    assert "key.sub=value" in msg


def test_from_dict_rejects_non_mapping():
    with pytest.raises(ConfigError, match="model.lora: expected a mapping"):
        from_dict(LoraConfig, [1, 2], "model.lora.")
    assert from_dict(ModelConfig, None) == ModelConfig()


def test_malformed_yaml(tmp_path):
    p = write(tmp_path / "bad.yaml", "run:\n  steps: [1, 2\n")
    msg = err(path=p)
    assert str(p) in msg and "not valid YAML" in msg


def test_malformed_yaml_names_the_file_in_the_position_and_quotes_the_line(tmp_path):
    p = write(tmp_path / "sub" / "bad.yaml", "run:\n  plugins: [myplug, other]: 1\n")
    msg = err(path=p)
    assert f'in "{p}", line 2, column 27' in msg and "<unicode string>" not in msg
    assert "plugins: [myplug, other]: 1" in msg  # YAML's quote of the offending line, with its caret


def test_malformed_yaml_in_a_base_config_names_the_base(tmp_path):
    write(tmp_path / "base.yaml", "run: {steps: 3\n")
    msg = err(path=write(tmp_path / "child.yaml", "base: base.yaml\n"))
    assert f'in "{tmp_path / "base.yaml"}"' in msg


def test_yaml_top_level_not_a_mapping(tmp_path):
    p = write(tmp_path / "list.yaml", "- model\n- task\n")
    msg = err(path=p)
    assert str(p) in msg and "mapping" in msg


def test_empty_yaml_file_is_defaults(tmp_path):
    assert load_config(write(tmp_path / "empty.yaml", "")) == load_config(None)


def test_missing_file(tmp_path):
    p = tmp_path / "nope.yaml"
    msg = err(path=p)
    assert str(p) in msg and "does not exist" in msg


def test_wrong_type_in_yaml_names_field(tmp_path):
    msg = err(path=write(tmp_path / "c.yaml", "run:\n  steps: many\n"))
    assert msg.startswith(f"{tmp_path / 'c.yaml'}:2: run.steps") and "integer" in msg


def test_error_is_a_value_error():
    # callers that only know ValueError (the CLI's fallback) still catch config problems
    assert issubclass(ConfigError, ValueError)


# ----------------------------------------------------------------------------------------------------------------
# `base:` inheritance


def test_base_inheritance_nested_merge(tmp_path):
    write(tmp_path / "parent.yaml", """
sampling:
  group_size: 4
  temperature: 0.5
run:
  steps: 10
  eval_n: 4
  eval_k: [1, 4]
algo:
  advantage: dr_grpo
  loss_agg: seq-mean-token-sum-norm
""")
    child = write(tmp_path / "sub" / "child.yaml", """
base: ../parent.yaml
sampling:
  temperature: 0.9
run:
  eval_k: [1, 2]
""")
    cfg = load_config(child)
    assert cfg.sampling.temperature == 0.9  # child overrides parent
    assert cfg.sampling.group_size == 4  # sibling key of the parent survives (nested merge)
    assert cfg.run.steps == 10 and cfg.run.eval_n == 4
    assert cfg.run.eval_k == [1, 2]  # lists are replaced, not concatenated
    assert cfg.algo == AlgoConfig(advantage="dr_grpo", loss_agg="seq-mean-token-sum-norm",
                                  options={"ppo": PpoOptions()})  # the selected loss's options, at their defaults
    assert cfg.optim == Config().optim  # neither file names it
    # command-line overrides beat both files
    cfg = load_config(child, ["sampling.temperature=0.3", "sampling.group_size=2"])
    assert (cfg.sampling.temperature, cfg.sampling.group_size) == (0.3, 2)


def test_base_chain_of_three(tmp_path):
    write(tmp_path / "a.yaml", "run: {steps: 1, seed: 1, batch_size: 1}\n")
    write(tmp_path / "b.yaml", "base: a.yaml\nrun: {seed: 2, batch_size: 2}\n")
    c = write(tmp_path / "c.yaml", "base: b.yaml\nrun: {batch_size: 3}\n")
    r = load_config(c).run
    assert (r.steps, r.seed, r.batch_size) == (1, 2, 3)


def test_base_of_quickstart(tmp_path):
    child = write(tmp_path / "child.yaml", f"base: {QUICKSTART}\nsampling:\n  temperature: 0.6\n")
    cfg = load_config(child)
    want = load_config(QUICKSTART, ["sampling.temperature=0.6"])
    assert cfg == want


def test_base_cycle_fails(tmp_path):
    write(tmp_path / "a.yaml", "base: b.yaml\n")
    b = write(tmp_path / "b.yaml", "base: a.yaml\n")
    assert "base" in err(path=b)


def test_base_missing_file(tmp_path):
    c = write(tmp_path / "c.yaml", "base: nowhere.yaml\n")
    msg = err(path=c)
    assert "nowhere.yaml" in msg and "does not exist" in msg


def test_base_not_a_path(tmp_path):
    c = write(tmp_path / "c.yaml", "base: [a.yaml]\n")
    assert "base" in err(path=c)


def test_error_in_parent_names_field(tmp_path):
    write(tmp_path / "parent.yaml", "algo:\n  loss_agg: average\n")
    child = write(tmp_path / "child.yaml", "base: parent.yaml\n")
    assert err(path=child).startswith(f"{tmp_path / 'parent.yaml'}:2: algo.loss_agg")  # where the parent set it


# ----------------------------------------------------------------------------------------------------------------
# one docstring per field


def test_every_leaf_field_has_a_docstring():
    rows = reference()
    missing = [name for name, _, _, doc in rows if not doc.strip()]
    assert not missing, f"fields without a docstring: {missing}"
    # every leaf of Config appears once, and after them every registered method's options
    names = [name for name, *_ in rows]
    assert len(names) == len(set(names))
    core = {name for name, _ in leaves(to_dict(Config()))}
    assert set(names[:len(core)]) == core
    options = set(names[len(core):])
    assert {"algo.erpo.gamma", "algo.cw.bandwidth", "sampling.ead.tau_max", "budget.e3.g_step"} <= options
    assert not {"algo.cw_group.bandwidth", "sampling.revead.tau_max"} & options  # shared: listed under the owner


def test_every_section_field_has_a_docstring():
    seen = set()
    for cls in dataclass_tree():
        if cls in seen:
            continue
        seen.add(cls)
        docs = field_docs(cls)
        for f in dataclasses.fields(cls):
            assert docs.get(f.name, "").strip(), f"{cls.__name__}.{f.name} has no docstring"
    assert {Config, ModelConfig, LoraConfig, AlgoConfig} <= seen


def test_reference_rows_carry_type_and_default():
    rows = {name: (tp, default) for name, tp, default, _ in reference()}
    assert rows["algo.loss_agg"][0] == ("'token-mean' | 'seq-mean-token-mean' | 'seq-mean-token-sum-norm' | "
                                        "'seq-mean-token-mean-per-question'")
    assert rows["run.eval_k"] == ("list of int", "[1, 8]")
    assert rows["sampling.temperature"] == ("float", "1.0")
    assert rows["model.lora.enabled"] == ("bool", "False")


# ----------------------------------------------------------------------------------------------------------------
# dump_yaml round-trips


@pytest.mark.parametrize("overrides", [
    [],
    ["optim.lr=1e-4", "algo.adv_eps=1e-8", "sampling.temperature=0.7", "run.eval_k=1,2,4"],
    ["model.lora.enabled=true", "model.lora.target_modules=q_proj,v_proj", "task.name=file",
     "task.path=data/train.jsonl", "task.prompt_template=Question: {question}\nAnswer:",
     "algo.loss_agg=seq-mean-token-sum-norm", "algo.advantage=dr_grpo", "task.reward=mypkg.rewards:score"],
    ["model.path=123", "run.out_dir=runs/a: b # c", "task.prompt_template='{question}' \"quoted\""],
])
@pytest.mark.parametrize("base", [None, QUICKSTART])
def test_dump_yaml_round_trips(tmp_path, base, overrides):
    cfg = load_config(base, overrides)
    p = write(tmp_path / "dumped.yaml", dump_yaml(cfg))
    again = load_config(p)
    assert again == cfg
    assert dump_yaml(again) == dump_yaml(cfg)  # a fixed point


def test_dump_is_complete(tmp_path):
    data = yaml.safe_load(dump_yaml(load_config(QUICKSTART)))
    # every core field, and the options of every selected method (the quickstart's PPO loss) with their defaults
    core = {name for name, *_ in reference()
            if name.count(".") == 1
            or name.startswith(("model.lora.", "algo.entropy_control.", "algo.reference_reset."))}
    selected = {name for name, *_ in reference() if name.startswith("algo.ppo.")}
    assert {name for name, _ in leaves(data)} == core | selected
    assert data["algo"]["ppo"] == {"dual_clip_c": None}
    cfg = load_config(QUICKSTART, ["algo.advantage=erpo", "sampling.schedule=ead", "budget.policy=e3"])
    data = yaml.safe_load(dump_yaml(cfg))
    assert data["algo"]["erpo"]["gamma"] == 5.0 and data["sampling"]["ead"]["tau_max"] == 1.2
    assert data["budget"]["e3"]["g_min_limit"] is None and "e3" not in data["sampling"]
    want = float(yaml.safe_load(QUICKSTART.read_text())["optim"]["lr"])
    assert isinstance(data["optim"]["lr"], float) and math.isclose(data["optim"]["lr"], want)


def test_example_inherits_from_quickstart():
    example = ROOT / "configs" / "examples" / "quickstart_dr_grpo.yaml"
    want = load_config(QUICKSTART, ["algo.advantage=dr_grpo", "algo.loss_agg=seq-mean-token-sum-norm",
                                    f"run.out_dir={ROOT / 'runs' / 'demo-dr-grpo'}"])  # the file's: relative to it
    assert load_config(example) == want


def test_string_choices_on_the_command_line_are_taken_as_written():
    # YAML 1.1 reads `on` / `off` as true / false; a field whose choices are strings takes the text as written
    assert load_config(None, ["task.chat_template=off"]).task.chat_template == "off"
    assert load_config(None, ["task.chat_template=on"]).task.chat_template == "on"
    with pytest.raises(ConfigError, match="task.chat_template: 'maybe' is not a valid choice"):
        load_config(None, ["task.chat_template=maybe"])


# ----------------------------------------------------------------------------------------------------------------
# every method owns its options (docs/methods.md, "Where a default lives")


def test_the_core_sections_hold_only_what_every_method_shares():
    from explorl.algos.registry import SECTIONS, entries
    from explorl.config import BudgetConfig, SamplingConfig
    from explorl.config.selection import fill_registry

    fill_registry()
    methods = {name for kind in SECTIONS for name in entries(kind)} - {"none"}
    fields = {cls: [f.name for f in dataclasses.fields(cls) if f.name != "options"]
              for cls in (AlgoConfig, SamplingConfig, BudgetConfig)}
    assert len(fields[AlgoConfig]) <= 25
    named = [f"{cls.__name__}.{f}" for cls, names in fields.items() for f in names
             if any(f == m or f.startswith(m + "_") for m in methods)]
    assert not named, f"fields named after a method (they belong in its options): {named}"


def test_a_methods_option_is_set_and_refused_by_its_full_key():
    cfg = load_config(None, ["algo.advantage=erpo", "algo.erpo.gamma=5"])
    assert cfg.algo.options["erpo"].gamma == 5.0 and isinstance(cfg.algo.options["erpo"].gamma, float)
    assert "did you mean 'algo.erpo.gamma'" in err(["algo.advantage=erpo", "algo.erpo.gama=5"]).lower()
    assert err(["algo.advantage=erpo", "algo.erpo.gamma=high"]).startswith("algo.erpo.gamma: expected a number")
    # options of a method that is not selected say so, with the way out on the command line
    msg = err(["algo.erpo.gamma=5"])
    assert "algo.erpo: options of the estimator 'erpo', which is not selected" in msg and "algo.erpo=null" in msg
    assert load_config(None, ["algo.erpo.gamma=5", "algo.erpo=null"]).algo.options == {"ppo": PpoOptions()}
    # YAML: the same keys, and a method's options alone in a layered file
    assert load_config(None, ["algo.advantage=erpo", "algo.erpo={gamma: 3, eta: 0.5}"]).algo.options["erpo"].eta == 0.5


def test_a_methods_options_go_with_its_choice_but_yours_are_kept_and_checked(tmp_path):
    # the e3_ts_an method brings sampling.e3 with `schedule: e3`: choosing another schedule above it drops them
    e3 = Path(__file__).resolve().parents[2] / "configs" / "recipes" / "e3_ts_an.yaml"
    assert load_config(e3, ["sampling.schedule=fixed"]).sampling.options == {}
    assert load_config(e3, ["sampling.schedule=fixed", "sampling.e3=null"]).sampling.options == {}
    # options you set yourself for an entry you did not select are still refused, naming the key
    msg = err(["sampling.schedule=fixed", "sampling.e3.eta=0.5"], path=e3)
    assert msg.startswith("sampling.e3: options of the temperature schedule 'e3', which is not selected")


def test_paths_and_modules_resolve_relative_to_the_config_file(tmp_path, monkeypatch):
    """`cd /tmp && explorl train /path/to/my_run.yaml`: the data, the model and the reward/plugin modules named in a
    file are found next to that file, from any working directory; a base's paths relative to the base; overrides
    relative to the working directory; config.yaml records them resolved."""
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    (project / "data" / "train.jsonl").write_text('{"problem": "1+1", "answer": "2"}\n' * 4)
    (project / "myrewards_rel.py").write_text("def digits(completion, answer, **meta):\n    return 1.0\n")
    (project / "recipes").mkdir()
    (project / "recipes" / "base.yaml").write_text("task: {name: file, path: ../data/train.jsonl, eval_size: 1}\n")
    (project / "my_run.yaml").write_text("base: recipes/base.yaml\nmodel: {path: models/mine}\n"
                                         "task: {reward: 'myrewards_rel:digits', eval_path: data/train.jsonl}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cfg = load_config(project / "my_run.yaml", ["task.system_prompt=x"])
    assert cfg.task.path == str(project / "recipes" / ".." / "data" / "train.jsonl")  # relative to base.yaml
    assert Path(cfg.task.path).resolve() == (project / "data" / "train.jsonl").resolve()
    assert cfg.task.eval_path == str(project / "data" / "train.jsonl")  # relative to my_run.yaml
    assert cfg.model.path == str(project / "models" / "mine")
    assert cfg.run.python_path == [str(project)]
    from explorl.tasks import load_task

    assert load_task(cfg.task).reward_fn.__module__ == "myrewards_rel"  # imported from next to the config
    # the recorded config reads back the same, from anywhere; an override's path is relative to the cwd
    again = load_config(write(tmp_path / "dumped" / "config.yaml", dump_yaml(cfg)))
    assert again == cfg
    assert load_config(None, ["task.name=file", "task.path=d.jsonl"]).task.path == str(elsewhere / "d.jsonl")
    assert load_config(None, ["model.path=embedded"]).model.path == "embedded"
