"""The second shipped model, `model.path: embedded:testbed` (issue 43): it loads from the package without training,
its weights are the ones its bootstrap.json records, and its mixture keeps the rare problems out of the testbed's
training split."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

import explorl.finetune.bootstrap
from explorl.config import ConfigError, ModelConfig, load_config
from explorl.models import (EMBEDDED_PACKAGE_DIR, EMBEDDED_TESTBED_DIR, check_fingerprint, find_run_output,
                            load_policy, resolve_model_path, weights_fingerprint)

# sha256 of explorl/embedded_testbed/model.safetensors (name and bytes), first 16 hex digits; it changes only when the
# shipped testbed weights are regenerated, and then every result recorded on the old ones stops pairing with new ones
TESTBED_FINGERPRINT = "18aefc80b41271d3"
TESTBED_SETTINGS = Path(__file__).resolve().parents[2] / "configs" / "testbed" / "testbed.yaml"


def test_the_testbed_model_ships_with_the_package_and_loads_without_training(monkeypatch):
    monkeypatch.setenv("EXPLORL_EMBEDDED", "/nonexistent")  # names another default; the testbed model is not affected
    monkeypatch.setattr(explorl.finetune.bootstrap, "bootstrap", lambda *a, **k: pytest.fail("loading trained a model"))
    assert resolve_model_path("embedded:testbed") == EMBEDDED_TESTBED_DIR
    info = json.loads((EMBEDDED_TESTBED_DIR / "bootstrap.json").read_text())
    assert weights_fingerprint("embedded:testbed") == info["fingerprint"] == TESTBED_FINGERPRINT
    model, tok, _ = load_policy(ModelConfig(path="embedded:testbed", device="cpu"))
    assert model.config.model_type == "qwen2" and sum(p.numel() for p in model.parameters()) == info["parameters"]
    assert tok.decode(tok.encode("12+3=?\n", add_special_tokens=False)) == "12+3=?\n"


def test_it_is_another_model_than_the_default_and_a_run_records_which():
    default = json.loads((EMBEDDED_PACKAGE_DIR / "bootstrap.json").read_text())["fingerprint"]
    assert weights_fingerprint("embedded:testbed") != default
    assert check_fingerprint(ModelConfig(path="embedded:testbed", fingerprint=TESTBED_FINGERPRINT)) == \
        TESTBED_FINGERPRINT
    with pytest.raises(ConfigError, match="model.fingerprint"):  # a run made on the default, resumed on this one
        check_fingerprint(ModelConfig(path="embedded:testbed", fingerprint=default))


def test_the_name_is_not_read_as_a_directory():
    assert load_config(None, ["model.path=embedded:testbed"]).model.path == "embedded:testbed"
    assert find_run_output("embedded:testbed") is None


def test_its_rare_problems_lie_outside_the_testbed_training_split():
    info = json.loads((EMBEDDED_TESTBED_DIR / "bootstrap.json").read_text())
    trained_by_rl = yaml.safe_load(TESTBED_SETTINGS.read_text())["task"]["difficulties"]
    rare, main = info["mixture"]["rare"], info["mixture"]["main"]
    assert not set(rare["difficulties"]) & set(trained_by_rl) and max(trained_by_rl) < min(rare["difficulties"])
    assert 0 < rare["fraction"] <= 0.1 and rare["problems"] + main["problems"] == info["config"]["train_size"]
    assert info["note"]  # why the model exists, in its own record
