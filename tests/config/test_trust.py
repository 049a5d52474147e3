"""What a run directory's config.yaml may not do alone (`explorl.config.trust`): the settings that name code, found
as data; the resume rule (an override that sets the key) and the evaluation rule (the code the flags name); and
`run.out_dir`, relative to the config file that sets it like every other path (issue 56)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from explorl.config import ConfigError, dump_yaml, load_config
from explorl.config.recorded import recorded_model
from explorl.config.trust import (CodeTrust, RecordedCodeError, code_references, command_trust, recorded_code,
                                  refuse_recorded_code, refuse_resumed_code)

ROOT = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, **sections) -> Path:
    """A run directory whose config.yaml is the defaults with `sections` ({"run": {...}, "task": {...}}) over them."""
    run = tmp_path / "run"
    run.mkdir(parents=True)
    data = yaml.safe_load(dump_yaml(load_config(None, [f"run.out_dir={run}"])))
    for name, fields in sections.items():
        data[name].update(fields)
    (run / "config.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    (run / "metrics.jsonl").write_text("")
    return run


def test_the_settings_that_name_code_are_found_and_explorls_own_rewards_are_not_code(tmp_path):
    data = {"run": {"plugins": ["evilplug"], "python_path": [str(tmp_path)],
                    "eval_sets": {"ood": {"reward": "evilreward:ood"}, "plain": {"difficulties": [8]}}},
            "task": {"reward": ["math", "chain", "evilreward:score"]}}
    refs = {r.key: r for r in code_references(data)}
    assert set(refs) == {"run.plugins", "run.python_path", "task.reward", "run.eval_sets.ood.reward"}
    assert refs["run.plugins"].names == ("evilplug",)
    assert refs["run.python_path"].names == (os.path.realpath(tmp_path),)
    assert refs["task.reward"].names == ("evilreward:score",)  # math and chain are explorl's own checkers
    assert refs["task.reward"].override == "task.reward=[math, chain, 'evilreward:score']"
    assert code_references({"task": {"reward": "math,exact"}, "run": {"plugins": [], "python_path": []}}) == []
    assert code_references(yaml.safe_load(dump_yaml(load_config(None)))) == []  # the defaults name no code


def test_a_resume_takes_the_code_only_from_overrides_that_set_its_keys(tmp_path):
    run = _run(tmp_path, run={"plugins": ["evilplug"], "python_path": [str(tmp_path / "run")]},
               task={"reward": "evilreward:score"})
    with pytest.raises(RecordedCodeError) as caught:
        refuse_resumed_code(run, ["run.steps=3"], f"explorl train --resume {run}")
    said = str(caught.value)
    for part in ("run.plugins: [evilplug]", f"run.python_path: [{tmp_path / 'run'}]", "task.reward: evilreward:score",
                 "not trusted to run code", "model.trust_remote_code",
                 f"explorl train --resume {run} run.steps=3 'run.plugins=[evilplug]' "
                 f"'run.python_path=[{tmp_path / 'run'}]' task.reward=evilreward:score"):
        assert part in said, (part, said)
    assert [r.key for r in caught.value.refs] == ["run.plugins", "run.python_path", "task.reward"]
    # only what is not said again is named; an override that replaces the value settles the key too
    with pytest.raises(RecordedCodeError) as caught:
        refuse_resumed_code(run, ["run.plugins=[evilplug]", "task.reward=math"], "explorl train --resume RUN")
    assert [r.key for r in caught.value.refs] == ["run.python_path"]
    refuse_resumed_code(run, ["run.plugins=[evilplug]", f"run.python_path=[{tmp_path / 'run'}]",
                              "task.reward=evilreward:score"], "explorl train --resume RUN")


def test_an_evaluation_trusts_the_code_its_flags_name(tmp_path):
    run = _run(tmp_path, run={"plugins": ["evilplug"], "python_path": [str(tmp_path / "run")],
                              "eval_sets": {"ood": {"reward": "evilreward:ood"}}},
               task={"reward": "evilreward:score"})
    path = run / "config.yaml"
    flags = ("--plugin", "--python-path", "--task-opt", "--eval-set", "--config")
    with pytest.raises(RecordedCodeError) as caught:
        command_trust("eval", flags).refuse_untrusted(path)
    said = " ".join(str(caught.value).split())
    assert (f"add to the command: --plugin evilplug --python-path {tmp_path / 'run'} --task-opt "
            f"reward=evilreward:score") in said, said
    assert "--eval-set NAME=MAPPING" in said and "--config FILE" in said
    trusted = command_trust("eval", flags, plugins=["evilplug"], python_path=[str(run)],
                            task_opts={"reward": "evilreward:score"})
    with pytest.raises(RecordedCodeError) as caught:  # the held-out set's own reward is not named yet
        trusted.refuse_untrusted(path)
    assert [r.key for r in caught.value.refs] == ["run.eval_sets.ood.reward"]
    command_trust("eval", flags, plugins=["evilplug"], python_path=[str(run)],
                  task_opts={"reward": "[evilreward:score, evilreward:ood]"}).refuse_untrusted(path)
    # --eval-set: the run's own sets are not read
    command_trust("eval", flags, plugins=["evilplug"], python_path=[str(run)], task_opts={"reward": "math"},
                  unread={"run.eval_sets"}).refuse_untrusted(path)
    # a command without the flags says which command has them
    with pytest.raises(RecordedCodeError, match="explorl probe has no flag to trust them; `explorl eval --model` has"):
        command_trust("probe", ("--task-opt",), unread={"run.eval_sets"}).refuse_untrusted(path)


def test_replacing_the_reward_settles_it_unless_a_held_out_set_still_takes_it(tmp_path):
    run = _run(tmp_path, task={"reward": "evilreward:score"})
    command_trust("eval", ("--task-opt",), task_opts={"reward": "math"}).refuse_untrusted(run / "config.yaml")
    other = _run(tmp_path / "b", task={"reward": "evilreward:score"}, run={"eval_sets": {"ood": {"difficulties": [8]}}})
    with pytest.raises(RecordedCodeError, match="task.reward: evilreward:score"):
        command_trust("eval", ("--task-opt",), task_opts={"reward": "math"}).refuse_untrusted(other / "config.yaml")


def test_the_engines_launchers_hold_a_runs_config_yaml_to_the_resume_rule(tmp_path):
    """`python examples/trl/train.py RUN/config.yaml` (and verl's launcher): a run's file, not a user's own."""
    run = _run(tmp_path, run={"plugins": ["evilplug"]})
    said = r"python examples/trl/train.py \S+config.yaml 'run.plugins=\[evilplug\]'"
    with pytest.raises(RecordedCodeError, match=said):
        refuse_recorded_code(run / "config.yaml", [], f"python examples/trl/train.py {run / 'config.yaml'}")
    refuse_recorded_code(run / "config.yaml", ["run.plugins=[evilplug]"], "python examples/trl/train.py RUN")
    mine = tmp_path / "mine.yaml"
    mine.write_text("run: {plugins: [myplug]}\n")
    refuse_recorded_code(mine, [], "python examples/trl/train.py mine.yaml")  # the user's own file names its code


def test_the_code_a_run_names_is_read_as_loading_reads_it(tmp_path):
    """A `base:` or `methods:` file beside config.yaml, and the run's own directory that loading puts on
    `run.python_path` for the modules a file names without one: all of it counts as the run's code."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("")
    (run / "evil.yaml").write_text("run: {plugins: [evilplug]}\n")
    (run / "config.yaml").write_text("base: evil.yaml\nrun: {steps: 3}\n")
    assert {r.key: r.names for r in recorded_code(run / "config.yaml")} == {
        "run.plugins": ("evilplug",), "run.python_path": (os.path.realpath(run),)}
    (run / "config.yaml").write_text("methods: [evil.yaml]\ntask: {reward: evilreward:score}\n")
    assert {r.key for r in recorded_code(run / "config.yaml")} == {"run.plugins", "run.python_path", "task.reward"}
    with pytest.raises(RecordedCodeError) as caught:
        refuse_resumed_code(run, ["run.plugins=[evilplug]", "task.reward=evilreward:score"], "explorl train --resume R")
    assert [r.key for r in caught.value.refs] == ["run.python_path"]  # the directory it would search first


def test_a_config_naming_no_code_or_unreadable_is_not_refused_here(tmp_path):
    run = _run(tmp_path)
    CodeTrust().refuse_untrusted(run / "config.yaml")
    (run / "config.yaml").write_text("run: [not, a, mapping\n")
    assert recorded_code(run / "config.yaml") == []  # loading it names the problem
    refuse_resumed_code(run, ["not an override"], "explorl train --resume RUN")  # the same


def test_the_model_of_a_run_is_read_without_its_code(tmp_path):
    run = _run(tmp_path, run={"plugins": ["no_such_plugin_xyz"]}, model={"path": "embedded", "fingerprint": "ab12"})
    model = recorded_model(run / "config.yaml")
    assert model.path == "embedded" and model.fingerprint == "ab12"
    with pytest.raises(ConfigError, match="no_such_plugin_xyz"):  # loading the whole config would import it
        load_config(run / "config.yaml")


# ----------------------------------------------------------------------------------------------------------------
# run.out_dir: relative to the config file that sets it


def test_out_dir_is_relative_to_the_file_that_sets_it_and_recorded_resolved(tmp_path, monkeypatch):
    conf = tmp_path / "proj" / "configs"
    conf.mkdir(parents=True)
    (conf / "base.yaml").write_text("run: {out_dir: ../runs/base, steps: 3}\n")
    (conf / "mine.yaml").write_text("base: base.yaml\nrun: {out_dir: runs/mine}\n")
    (conf / "inherits.yaml").write_text("base: base.yaml\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert load_config(conf / "mine.yaml").run.out_dir == str(conf / "runs" / "mine")
    assert load_config(conf / "inherits.yaml").run.out_dir == str(tmp_path / "proj" / "runs" / "base")  # no `..`
    # the command line's: relative to the working directory, as every path given there; the default likewise
    assert load_config(conf / "mine.yaml", ["run.out_dir=here"]).run.out_dir == str(elsewhere / "here")
    assert load_config(None).run.out_dir == str(elsewhere / "runs" / "default")
    assert load_config(None, ["run.out_dir=~/x"]).run.out_dir == str(Path.home() / "x")
    recorded = yaml.safe_load(dump_yaml(load_config(conf / "mine.yaml")))
    assert recorded["run"]["out_dir"] == str(conf / "runs" / "mine")


def test_the_shipped_configs_write_under_the_repositorys_runs(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # from any working directory
    assert load_config(ROOT / "configs" / "quickstart.yaml").run.out_dir == str(ROOT / "runs" / "demo")
    assert load_config(ROOT / "configs" / "recipes" / "grpo.yaml").run.out_dir == str(ROOT / "runs" / "grpo")
    assert load_config(ROOT / "configs" / "sft.yaml").run.out_dir == str(ROOT / "runs" / "sft")
    for path in (ROOT / "configs").rglob("*.yaml"):
        out = Path(load_config(path).run.out_dir)
        assert out.parent == ROOT / "runs" or out == tmp_path / "runs" / "default", path  # none: the default
