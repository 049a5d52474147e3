"""`explorl bootstrap`: the model it writes loads through the ordinary HF path, is deterministic for a seed and
records its fingerprint; the shipped embedded default is never retrained on use (tests/test_fingerprint.py)."""

import json

import pytest
import torch
from safetensors.torch import load_file

from explorl.bootstrap import BootstrapConfig, bootstrap
from explorl.config import ModelConfig
from explorl.models import load_policy, weights_fingerprint

SMALL = dict(hidden=16, layers=1, heads=2, kv_heads=1, intermediate=32, train_size=200, eval_size=8,
             batch_size=8, max_steps=12, eval_every=6, warmup=2, max_new_tokens=16)


def test_bootstrap_saves_a_loadable_model_and_is_deterministic(tmp_path):
    a = bootstrap(tmp_path / "a", BootstrapConfig(**SMALL))
    b = bootstrap(tmp_path / "b", BootstrapConfig(**SMALL))
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    info = json.loads((a / "bootstrap.json").read_text())
    assert info["fingerprint"] == weights_fingerprint(a) == weights_fingerprint(b)
    assert info["steps"] == 12  # the target pass@1 (0.25) is out of reach in 12 steps: it ran to max_steps
    assert [h["step"] for h in info["history"]] == [6, 12]
    model, tok, _ = load_policy(ModelConfig(path=str(a)))
    assert model.config.model_type == "qwen2"
    assert tok.decode(tok.encode("3+4=?\n", add_special_tokens=False)) == "3+4=?\n"
    assert not list(tmp_path.glob("*.tmp*"))  # written atomically: no temporary directory left behind


def test_bootstrap_stops_at_the_target(tmp_path):
    # target 0.0 is reached at the first check, so training stops there
    out = bootstrap(tmp_path / "m", BootstrapConfig(**{**SMALL, "target_pass1": 0.0}))
    assert json.loads((out / "bootstrap.json").read_text())["steps"] == 6


def test_bootstrap_settings_from_the_command_line():
    from explorl.commands.bootstrap import bootstrap_config
    from explorl.config import ConfigError

    cfg = bootstrap_config(["heads=2", "kv_heads=1", "difficulties=[1, 2]"])
    assert (cfg.heads, cfg.kv_heads, cfg.difficulties, cfg.hidden) == (2, 1, [1, 2], BootstrapConfig().hidden)
    with pytest.raises(ConfigError, match="Did you mean 'bootstrap.heads'"):
        bootstrap_config(["head=2"])
    with pytest.raises(ConfigError, match="not key=value"):
        bootstrap_config(["heads"])
