"""A run directory's config.yaml written by an earlier version keeps loading (`explorl.config.recorded`): its switches
become their selections, its flat option keys move under the selected entries' names (the recorded defaults of the
methods it does not select are dropped), with one warning; the same keys stay refused in a user's YAML and on the
command line, naming their new form."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import yaml

from explorl.config import MOVED_KEYS, ConfigError, dump_yaml, load_config
from explorl.config.recorded import RecordedConfigWarning, is_recorded_config, is_run_dir

# the algo fields of the previous version (c8c068e's schema: EAD's TIS and DAPO's overlong shaping as core fields),
# with its defaults, where its config.yaml wrote them: after token_filter, and around kl_clamp
PREVIOUS_TIS = {"tis": False, "tis_cap": 2.0, "tis_level": "token"}
PREVIOUS_OVERLONG = {"overlong": "none", "overlong_buffer": None, "overlong_penalty": 1.0}
OLD_NAME = {new: old for old, new in MOVED_KEYS.items()}


def previous_form(text: str, *, flat: bool = False, **algo: object) -> str:
    """A config.yaml of today (`dump_yaml`) as the previous version wrote it: no `algo.importance_weights` and
    `algo.reward_shapers`, the TIS and overlong fields in the algo section (`algo` changes their values); with
    `flat`, every method's options as the flat keys of the versions before (`algo.erpo.gamma` -> `algo.erpo_gamma`)."""
    data = yaml.safe_load(text)
    old_algo: dict = {}
    for key, value in data["algo"].items():
        if key in ("importance_weights", "reward_shapers", "tis", "dapo_overlong"):
            continue
        old_algo[key] = value
        if key == "token_filter":
            old_algo.update({k: algo.pop(k, v) for k, v in PREVIOUS_TIS.items()})
        if key == "kl_clamp":
            old_algo.update({k: algo.pop(k, v) for k, v in PREVIOUS_OVERLONG.items()})
    data["algo"] = {**old_algo, **algo}
    for name in ("algo", "sampling", "budget") if flat else ():
        section = data[name]
        for entry in [k for k, v in section.items() if isinstance(v, dict)]:
            for field_name, value in section.pop(entry).items():
                section[OLD_NAME[f"{name}.{entry}.{field_name}"].split(".", 1)[1]] = value
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=120)


def run_dir(root: Path, text: str, name: str = "run") -> Path:
    """A run directory holding `text` as its config.yaml beside a metrics.jsonl; returns the config.yaml's path."""
    run = root / name
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("")
    (run / "config.yaml").write_text(text)
    return run / "config.yaml"


def load_recorded(path: Path, overrides: list[str] | tuple[str, ...] = ()):
    with pytest.warns(RecordedConfigWarning, match="written by an earlier version of explorl") as caught:
        cfg = load_config(path, overrides)
    assert len([w for w in caught if w.category is RecordedConfigWarning]) == 1
    return cfg, str(caught[0].message)


def test_the_previous_version_loads_to_the_same_config(tmp_path):
    today = load_config(None, [f"run.out_dir={tmp_path / 'run'}"])
    text = previous_form(dump_yaml(today), erpo_gamma=2.0)  # and an earlier flat key of a method not selected
    assert "tis_cap: 2.0" in text and "overlong: none" in text and "importance_weights" not in text
    cfg, message = load_recorded(run_dir(tmp_path, text))
    assert cfg == today
    assert cfg.algo.importance_weights == "none" and cfg.algo.reward_shapers == [] and "tis" not in cfg.algo.options
    assert "algo.tis=false -> algo.importance_weights=none" in message
    assert "algo.overlong=none -> algo.reward_shapers=[]" in message
    assert "dropped" in message and "algo.tis_cap" in message and "algo.erpo_gamma" in message
    assert "\n" not in message


def test_flat_options_of_earlier_versions_move_under_the_selected_entries(tmp_path):
    """Every method's options flat (`algo.erpo_gamma`, `sampling.adaptive_base`, `budget.g_step`): those of the
    selected entries move under their names, including the schedule that the adaptive schedule's options select
    (`sampling.adaptive.base: e3`) and the options `cw_group` reads (`cw`'s); the others' are dropped."""
    today = load_config(None, ["algo.advantage=erpo", "algo.erpo.gamma=7", "algo.shapers=[cw_group]",
                               "algo.cw.bandwidth=0.5", "sampling.schedule=adaptive", "sampling.adaptive.base=e3",
                               "sampling.e3.eta=0.8", "budget.policy=e3", "budget.e3.g_step=2",
                               f"run.out_dir={tmp_path / 'run'}"])
    text = previous_form(dump_yaml(today), flat=True, clip_cov_ratio=0.0002)
    data = yaml.safe_load(text)
    assert data["algo"]["erpo_gamma"] == 7.0 and data["sampling"]["adaptive_base"] == "e3"
    assert data["budget"]["g_step"] == 2 and "erpo" not in data["algo"] and "e3" not in data["sampling"]
    data["sampling"]["ead_tau_max"] = 1.5  # a schedule it does not select
    cfg, message = load_recorded(run_dir(tmp_path, yaml.safe_dump(data, sort_keys=False)))
    assert cfg == today
    assert "algo.erpo_gamma -> algo.erpo.gamma" in message and "sampling.e3_eta -> sampling.e3.eta" in message
    assert "algo.cw_bandwidth -> algo.cw.bandwidth" in message and "budget.g_step -> budget.e3.g_step" in message
    assert "sampling.ead_tau_max" in message or "more" in message


def test_switches_on_become_their_selections_with_their_options(tmp_path):
    base = load_config(None, ["sampling.schedule=ead", f"run.out_dir={tmp_path / 'run'}"])
    text = previous_form(dump_yaml(base), tis=True, tis_cap=3, overlong="penalty", overlong_buffer=8,
                         overlong_penalty=0.5)
    cfg, message = load_recorded(run_dir(tmp_path, text))
    assert cfg.algo.importance_weights == "tis" and cfg.algo.options["tis"].cap == 3.0
    assert cfg.algo.options["tis"].level == "token"
    assert cfg.algo.reward_shapers == ["dapo_overlong"]
    assert (cfg.algo.options["dapo_overlong"].buffer, cfg.algo.options["dapo_overlong"].penalty) == (8, 0.5)
    assert "algo.tis=true -> algo.importance_weights=tis" in message and "algo.tis_cap -> algo.tis.cap" in message
    assert "dropped" not in message
    assert cfg == load_config(None, ["sampling.schedule=ead", "algo.importance_weights=tis", "algo.tis.cap=3",
                                     "algo.reward_shapers=[dapo_overlong]", "algo.dapo_overlong.buffer=8",
                                     "algo.dapo_overlong.penalty=0.5", f"run.out_dir={tmp_path / 'run'}"])
    mask = previous_form(dump_yaml(base), overlong="mask", overlong_buffer=8)
    cfg, message = load_recorded(run_dir(tmp_path, mask, "mask"))
    assert cfg.algo.reward_shapers == ["dapo_overlong_filter"] and "dapo_overlong" not in cfg.algo.options
    assert "algo.overlong_buffer" in message


@pytest.mark.parametrize("where", ["no run beside it", "another file name in a run directory"])
def test_the_same_file_outside_a_run_directory_is_refused_naming_the_new_key(tmp_path, where):
    text = previous_form(dump_yaml(load_config(None, [f"run.out_dir={tmp_path / 'run'}"])))
    if where == "no run beside it":
        path = tmp_path / "config.yaml"
        path.write_text(text)
    else:
        path = run_dir(tmp_path, dump_yaml(load_config())).parent / "mine.yaml"
        path.write_text(text)
    assert not is_recorded_config(path)
    with pytest.raises(ConfigError, match=r"'algo.tis' is now the selection of a method: write "
                                          r"algo.importance_weights=none"):
        load_config(path)
    (path.parent / "flat.yaml").write_text(text.replace("  tis: false\n", ""))
    with pytest.raises(ConfigError, match=r"'algo.tis_cap' is now 'algo.tis.cap'"):
        load_config(path.parent / "flat.yaml")


def test_the_command_line_keeps_the_refusal(tmp_path):
    path = run_dir(tmp_path, previous_form(dump_yaml(load_config())))
    with pytest.warns(RecordedConfigWarning), pytest.raises(ConfigError, match=r"'algo.tis_cap' is now 'algo.tis.cap'"):
        load_config(path, ["algo.tis_cap=3"])
    with pytest.warns(RecordedConfigWarning), pytest.raises(ConfigError, match="algo.importance_weights=tis"):
        load_config(path, ["algo.tis=true"])


def test_a_recorded_config_of_today_loads_without_a_word(tmp_path):
    path = run_dir(tmp_path, dump_yaml(load_config(None, ["algo.importance_weights=tis", "sampling.schedule=ead"])))
    assert is_run_dir(path.parent) and is_recorded_config(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RecordedConfigWarning)
        assert load_config(path).algo.importance_weights == "tis"


def test_run_directories_are_recognised_by_one_rule(tmp_path):
    # `explorl eval RUN` (explorl.models.run_outputs) finds a run directory by the rule that upgrades its config
    import explorl.models.run_outputs

    assert explorl.models.run_outputs.is_run_dir is is_run_dir
    for layout in ([], ["metrics.jsonl"], ["final/"], ["checkpoints/"], ["other.txt"]):
        run = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        run.mkdir()
        (run / "config.yaml").write_text("{}\n")
        for name in layout:
            (run / name.rstrip("/")).mkdir() if name.endswith("/") else (run / name).write_text("")
        assert is_run_dir(run) == (bool(layout) and layout != ["other.txt"])


def test_explorl_eval_of_a_run_recorded_by_the_previous_version(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """A tiny run trained here, its config.yaml then rewritten as the previous version wrote it: `explorl eval RUN`
    evaluates it as the run did, as it would the same run recorded today."""
    from explorl import commands
    from explorl.train.loop import train

    run = train(load_config(None, [
        f"model.path={tiny_model_dir}", "model.compile=false", "sampling.compile=false", "task.train_size=4",
        "task.eval_size=2", "task.difficulties=[1]", "sampling.group_size=2", "sampling.max_new_tokens=4",
        "run.steps=1", "run.batch_size=2", "run.eval_n=1", "run.eval_k=[1]", "run.log_samples=0",
        f"run.out_dir={tmp_path / 'tiny'}"]), progress=False)
    previous = previous_form((run / "config.yaml").read_text(), erpo_gamma=5.0)
    (run / "config.yaml").write_text(previous)
    monkeypatch.chdir(tmp_path)
    with pytest.warns(RecordedConfigWarning):
        rc = commands.main(["eval", "--model", str(run), "--n", "1", "--k", "1", "--device", "cpu"])
    assert rc == 0, capsys.readouterr()
    (result,) = (tmp_path / "runs" / "eval").iterdir()
    assert json.loads(result.read_text())["label"].startswith("tiny")
    assert (run / "config.yaml").read_text() == previous  # evaluating reads the file, never rewrites it


def test_explain_names_the_recorded_file_as_the_source_of_a_translated_selection(tmp_path):
    from explorl.config.explain import explain

    base = load_config(None, ["sampling.schedule=ead", f"run.out_dir={tmp_path / 'run'}"])
    path = run_dir(tmp_path, previous_form(dump_yaml(base), tis=True, tis_cap=3))
    with pytest.warns(RecordedConfigWarning):
        explained = explain(path)
    sources = {s.key: s for s in explained.settings}
    assert sources["algo.importance_weights"].value == "tis"
    assert sources["algo.importance_weights"].source.endswith("config.yaml")
    assert sources["algo.tis.cap"].value == 3.0


def test_a_switch_value_no_version_wrote_is_refused_as_in_a_users_file(tmp_path):
    text = previous_form(dump_yaml(load_config()), overlong="truncate")
    with pytest.warns(RecordedConfigWarning), \
            pytest.raises(ConfigError, match=r"'algo.overlong' is now the selection of a method: write "
                                             r"algo.reward_shapers=\[dapo_overlong\] for algo.overlong=penalty"):
        load_config(run_dir(tmp_path, text))
