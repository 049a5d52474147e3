"""Issue 39 item 1 (second half): a model directory's own Python code runs only when the config says so
(`model.trust_remote_code`, default false), in explorl's loading and in the verl integration (which passed
`trust_remote_code=True` unconditionally); a run directory alone is never trusted with it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from explorl.config import ConfigError, ModelConfig, load_config


@pytest.fixture
def code_model(tmp_path):
    """A model directory whose config and tokenizer name Python files of its own (`auto_map`); importing them
    leaves the file `ran` beside it."""
    model = tmp_path / "remote"
    model.mkdir()
    marker = tmp_path / "ran"
    code = f"open({str(marker)!r}, 'w').close()\n"
    (model / "configuration_evil.py").write_text(code + textwrap.dedent("""
        from transformers import PretrainedConfig
        class EvilConfig(PretrainedConfig):
            model_type = "evil"
    """))
    (model / "tokenization_evil.py").write_text(code + textwrap.dedent("""
        from transformers import PreTrainedTokenizerFast
        class EvilTokenizer(PreTrainedTokenizerFast):
            pass
    """))
    (model / "config.json").write_text(json.dumps({"model_type": "evil", "auto_map": {
        "AutoConfig": "configuration_evil.EvilConfig"}}))
    (model / "tokenizer_config.json").write_text(json.dumps({"auto_map": {
        "AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}}))
    (model / "model.safetensors").write_bytes(b"")
    return model, marker


def _verl_launch_module(monkeypatch):
    """explorl's verl launcher, loaded from its file: the package `explorl.integrations.verl` imports verl itself
    (installed in `.venv-verl` only), the launcher's conversions do not."""
    import importlib.util

    import explorl.integrations

    path = Path(explorl.integrations.__file__).parent / "verl" / "launch.py"
    spec = importlib.util.spec_from_file_location("explorl_verl_launch_alone", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_verl_tokenizer_runs_no_model_code_unless_asked(code_model, monkeypatch):
    verl_tokenizer = _verl_launch_module(monkeypatch).verl_tokenizer
    model, marker = code_model
    with pytest.raises(ValueError, match="trust_remote_code"):
        verl_tokenizer(model)
    assert not marker.exists()


def test_explorls_own_loading_runs_model_code_only_with_model_trust_remote_code(code_model, tmp_path):
    from explorl.train.preflight import check_model_dir

    model, marker = code_model
    assert load_config(None, []).model.trust_remote_code is False
    with pytest.raises(ConfigError, match=f"model.path='{model}': transformers cannot read"):
        check_model_dir(ModelConfig(path=str(model)))
    assert not marker.exists()
    # with the setting the directory's code does run (in a child, so its module cache stays in tmp_path)
    code = ("from explorl.train.preflight import check_model_dir; from explorl.config import ModelConfig\n"
            f"try: check_model_dir(ModelConfig(path={str(model)!r}, trust_remote_code=True))\n"
            "except Exception: pass\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300,
                   env={**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules")})
    assert marker.exists()


def test_a_run_directory_alone_does_not_turn_remote_code_on(tmp_path, capsys):
    from explorl import commands
    from explorl.commands.common import _refuse_remote_code_from_run

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("model: {path: embedded, trust_remote_code: true}\n")
    assert commands.main(["train", "--resume", str(run), "--dry-run"]) == 2
    said = " ".join(capsys.readouterr().out.split())
    assert "model.trust_remote_code: " in said and "Add model.trust_remote_code=true to the command" in said, said
    _refuse_remote_code_from_run(run, ["model.trust_remote_code=true"])  # said again on the command line: allowed


def test_evaluating_or_exporting_a_run_never_follows_its_trust_remote_code(monkeypatch, tmp_path):
    import explorl.models as models
    import explorl.models.run_outputs
    from explorl.config import Config

    seen = []  # replaced where load_run_output looks it up
    monkeypatch.setattr(explorl.models.run_outputs, "load_policy",
                        lambda cfg: seen.append(cfg) or ("model", "tok", "cpu"))
    cfg = Config()
    cfg.model.trust_remote_code = True  # what a downloaded run's config.yaml may say
    out = models.RunOutput(kind="final", run_dir=tmp_path, model_dir=tmp_path / "final")
    models.load_run_output(out, cfg)
    assert seen and seen[0].trust_remote_code is False


def test_no_engine_is_told_to_trust_remote_code_by_a_constant():
    """Every `trust_remote_code=` explorl passes comes from the config (the verl integration passed `True`)."""
    import ast

    import explorl

    constant = []
    for path in Path(explorl.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.keyword) and node.arg == "trust_remote_code" and \
                    isinstance(node.value, ast.Constant) and node.value.value is True:
                constant.append(f"{path.name}:{node.value.lineno}")
    assert constant == []
