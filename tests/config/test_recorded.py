"""A run directory's config.yaml (`explorl.config.recorded`): recognised by one rule, read back as it was written,
and, there being one config version, a key today's schema does not have refused as in a user's YAML."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from explorl.config import ConfigError, dump_yaml, load_config
from explorl.config.recorded import is_recorded_config, is_run_dir


def run_dir(root: Path, text: str, name: str = "run") -> Path:
    """A run directory holding `text` as its config.yaml beside a metrics.jsonl; returns the config.yaml's path."""
    run = root / name
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("")
    (run / "config.yaml").write_text(text)
    return run / "config.yaml"


def test_a_recorded_config_loads_to_the_same_config_without_a_word(tmp_path):
    cfg = load_config(None, ["algo.importance_weights=tis", "sampling.schedule=ead", f"run.out_dir={tmp_path / 'r'}"])
    path = run_dir(tmp_path, dump_yaml(cfg))
    assert is_run_dir(path.parent) and is_recorded_config(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_config(path) == cfg


@pytest.mark.parametrize("key, value", [("tis", "true"), ("tis_cap", "2.0"), ("erpo_gamma", "5.0")])
def test_a_key_the_schema_does_not_have_is_refused_in_a_run_directory_as_anywhere(tmp_path, key, value):
    """Keys of no version of today's schema (`algo.tis: true`, `algo.tis_cap`, `algo.erpo_gamma`): nothing is
    translated, the run's config.yaml gets the error a user's YAML gets, with the file and line."""
    text = dump_yaml(load_config(None, [f"run.out_dir={tmp_path / 'r'}"]))
    text = text.replace("algo:\n", f"algo:\n  {key}: {value}\n", 1)
    path = run_dir(tmp_path, text)
    mine = tmp_path / "mine.yaml"
    mine.write_text(text)
    line = text.splitlines().index(f"  {key}: {value}") + 1
    said = []
    for file in (path, mine):
        with pytest.raises(ConfigError) as caught:
            load_config(file)
        where, message = str(caught.value).split(": ", 1)
        assert where.endswith(f"{file.name}:{line}") and message.startswith(f"unknown key 'algo.{key}'."), caught.value
        said.append(message)
    assert said[0] == said[1]


def test_run_directories_are_recognised_by_one_rule(tmp_path):
    # `explorl eval RUN` (explorl.models.run_outputs) finds a run directory by the rule `is_recorded_config` uses
    import explorl.models.run_outputs

    assert explorl.models.run_outputs.is_run_dir is is_run_dir
    for layout in ([], ["metrics.jsonl"], ["final/"], ["checkpoints/"], ["other.txt"]):
        run = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        run.mkdir()
        (run / "config.yaml").write_text("{}\n")
        for name in layout:
            (run / name.rstrip("/")).mkdir() if name.endswith("/") else (run / name).write_text("")
        assert is_run_dir(run) == (bool(layout) and layout != ["other.txt"])
