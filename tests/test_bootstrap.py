"""The embedded default's bootstrap: loadable through the ordinary HF path, deterministic for a seed, built only
through `ensure_embedded`."""

import json

import torch
from safetensors.torch import load_file

import explorl.bootstrap
from explorl.bootstrap import BootstrapConfig, bootstrap, ensure_embedded
from explorl.config import ModelConfig
from explorl.models import embedded_dir, load_policy

SMALL = dict(hidden=16, layers=1, heads=2, kv_heads=1, intermediate=32, train_size=200, eval_size=8,
             batch_size=8, max_steps=12, eval_every=6, warmup=2, max_new_tokens=16)


def test_bootstrap_saves_a_loadable_model_and_is_deterministic(tmp_path):
    a = bootstrap(tmp_path / "a", BootstrapConfig(**SMALL))
    b = bootstrap(tmp_path / "b", BootstrapConfig(**SMALL))
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    info = json.loads((a / "bootstrap.json").read_text())
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


def _record_bootstraps(monkeypatch) -> list:
    """Replace `bootstrap` (minutes of training) by a recorder of its targets."""
    calls = []
    monkeypatch.setattr(explorl.bootstrap, "bootstrap", lambda target, **kw: calls.append(target))
    return calls


def test_ensure_embedded_leaves_other_paths_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("EXPLORL_HOME", str(tmp_path / "home"))
    calls = _record_bootstraps(monkeypatch)
    assert ensure_embedded(str(tmp_path / "my-model")) == str(tmp_path / "my-model")
    assert calls == [] and not (tmp_path / "home").exists()


def test_ensure_embedded_builds_only_a_missing_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EXPLORL_HOME", str(tmp_path / "home"))
    calls = _record_bootstraps(monkeypatch)
    assert ensure_embedded() == "embedded"
    assert calls == [embedded_dir()]
    embedded_dir().mkdir(parents=True)
    (embedded_dir() / "config.json").write_text("{}")
    assert ensure_embedded("embedded") == "embedded"
    assert len(calls) == 1  # cached: not built again
