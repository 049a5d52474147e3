"""One embedded model on every machine, and fingerprints that keep results of two models apart: the shipped weights,
`weights_fingerprint`, runs that record it (config.yaml, eval.json), a resume that refuses a changed model, and
evaluations that refuse to be paired across base models."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file

import explorl.finetune.bootstrap
from explorl import commands
from explorl.config import ConfigError, ModelConfig, load_config
from explorl.evaluation.evaluate import MixedModelsError, check_same_base
from explorl.models import (EMBEDDED_PACKAGE_DIR, TinyQwen2Sizes, build_char_tokenizer, embedded_dir, load_policy,
                            tiny_qwen2, weights_fingerprint)
from explorl.train.loop import train

# The shipped model's fingerprint: sha256 of explorl/embedded/model.safetensors (name and bytes), first 16 hex digits.
# It changes only when the shipped weights are regenerated (`explorl bootstrap --out src/explorl/embedded --force`),
# and then every recorded result made with the old one stops pairing with new ones: update README and RESULTS too.
SHIPPED_FINGERPRINT = "7523a82d260ba825"

SMALL_RUN = ["run.steps=2", "run.batch_size=2", "sampling.group_size=2", "sampling.max_new_tokens=8",
             "task.train_size=4", "task.eval_size=2", "task.difficulties=[1]", "run.eval_n=2", "run.eval_k=[1,2]",
             "run.save_every=1", "run.threads=1", "task.reward=rewards_for_tests:contains_digit"]


TRUSTED = ["--task-opt", "reward=rewards_for_tests:contains_digit"]
"""The runs here score with the suite's own reward; `explorl eval` of a run runs its code only when named again
(issue 56), as a user who trusts it would."""


def test_the_embedded_default_ships_with_the_package_and_loads_without_training(monkeypatch):
    monkeypatch.delenv("EXPLORL_EMBEDDED", raising=False)
    monkeypatch.setattr(explorl.finetune.bootstrap, "bootstrap", lambda *a, **k: pytest.fail("loading trained a model"))
    assert embedded_dir() == EMBEDDED_PACKAGE_DIR
    info = json.loads((EMBEDDED_PACKAGE_DIR / "bootstrap.json").read_text())
    assert weights_fingerprint("embedded") == info["fingerprint"] == SHIPPED_FINGERPRINT
    model, tok, _ = load_policy(ModelConfig(path="embedded", device="cpu"))
    assert model.config.model_type == "qwen2" and sum(p.numel() for p in model.parameters()) == info["parameters"]
    assert tok.decode(tok.encode("12+3=?", add_special_tokens=False)) == "12+3=?"


def _model_dir(path: Path, seed: int) -> Path:
    tok = build_char_tokenizer()
    tiny_qwen2(len(tok), TinyQwen2Sizes(hidden=16, layers=1, heads=2, kv_heads=1, intermediate=32),
               pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, seed=seed).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_fingerprint_follows_the_weights_not_the_directory(tmp_path):
    a = _model_dir(tmp_path / "a", seed=0)
    copy = Path(shutil.copytree(a, tmp_path / "copy"))
    other = _model_dir(tmp_path / "other", seed=1)
    assert weights_fingerprint(a) == weights_fingerprint(copy) != weights_fingerprint(other)
    assert len(weights_fingerprint(a)) == 16 and int(weights_fingerprint(a), 16) >= 0
    # the same tensors saved again: the same bytes, the same fingerprint (save_pretrained is deterministic)
    again = _model_dir(tmp_path / "again", seed=0)
    assert load_file(str(again / "model.safetensors")).keys() == load_file(str(a / "model.safetensors")).keys()
    assert weights_fingerprint(again) == weights_fingerprint(a)


def test_pairing_refuses_different_base_models_and_warns_on_unrecorded_ones():
    with pytest.raises(MixedModelsError, match="a: 1111.*b: 2222"):
        check_same_base({"a": {"base_fingerprint": "1111"}, "b": {"base_fingerprint": "2222"}})
    assert check_same_base({"a": {"base_fingerprint": "1111"}, "b": {"base_fingerprint": "1111"}}) == []
    assert check_same_base({"a": {}, "b": {}}) == []  # nothing recorded on either side: nothing to compare
    (warning,) = check_same_base({"old": {}, "new": {"base_fingerprint": "1111"}})
    assert "old" in warning and "1111" in warning


@pytest.fixture
def out(monkeypatch):
    lines: list[str] = []
    monkeypatch.setattr(commands.common.console, "print", lambda *a, **k: lines.append(" ".join(str(x) for x in a)))
    return lambda: " ".join(" ".join(lines).split())


def test_runs_record_their_model_and_refuse_to_resume_or_pair_across_models(tmp_path, monkeypatch, out):
    monkeypatch.chdir(tmp_path)
    models = {"a": _model_dir(tmp_path / "model_a", seed=0), "b": _model_dir(tmp_path / "model_b", seed=1)}
    runs = {}
    for name, model in models.items():
        cfg = load_config(None, [*SMALL_RUN, f"model.path={model}", f"run.out_dir={tmp_path / name}"])
        runs[name] = train(cfg, progress=False)
        recorded = load_config(runs[name] / "config.yaml")
        assert recorded.model.fingerprint == weights_fingerprint(model)
        assert json.loads((runs[name] / "eval.json").read_text())["base_fingerprint"] == weights_fingerprint(model)

    # an evaluation record says which weights it measured and which base they came from
    records = {}
    for name, run in runs.items():
        records[name] = tmp_path / f"{name}.json"
        assert commands.main(["eval", "--model", str(run / "final"), "--n", "2", "--k", "1", "--curve", "--device",
                              "cpu", "--out", str(records[name]), *TRUSTED]) == 0, out()
        record = json.loads(records[name].read_text())
        assert record["base_fingerprint"] == weights_fingerprint(models[name])
        assert record["model_fingerprint"] == weights_fingerprint(run / "final") != record["base_fingerprint"]
    base_record = tmp_path / "base_a.json"
    assert commands.main(["eval", "--model", str(models["a"]), "--n", "2", "--k", "1", "--curve", "--device", "cpu",
                     "--task-opt", "difficulties=[1]", "--task-opt", "eval_size=2", "--task-opt", "train_size=4",
                     "--out", str(base_record)]) == 0, out()

    # the base model against its own run pairs; two runs of two base models refuse, naming both fingerprints
    assert commands.main(["curves", str(base_record), str(records["a"]), "--out", str(tmp_path / "ok.png")]) == 0, out()
    assert commands.main(["curves", str(records["a"]), str(records["b"]), "--out", str(tmp_path / "no.png")]) != 0
    said = out()
    assert "different base models" in said and weights_fingerprint(models["b"]) in said

    # the model under a run changed: resuming (here from its last checkpoint) is refused before any work
    shutil.rmtree(models["a"])
    _model_dir(models["a"], seed=2)
    (runs["a"] / "eval.json").unlink()  # make the run look unfinished, so that resume has work to do
    with pytest.raises(ConfigError, match="model.fingerprint"):
        train(load_config(runs["a"] / "config.yaml"), resume=runs["a"], progress=False)
