"""`explorl bootstrap`: the model it writes loads through the ordinary HF path, is deterministic for a seed and
records its fingerprint; the shipped embedded default is never retrained on use (tests/models/test_fingerprint.py)."""

import json

import pytest
import torch
from safetensors.torch import load_file

from explorl.finetune.bootstrap import BootstrapConfig, bootstrap
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


def test_a_mixture_replaces_a_rare_fraction_of_the_data_with_held_out_free_problems():
    from explorl.finetune.bootstrap import training_problems
    from explorl.tasks.arith import arith_task

    cfg = BootstrapConfig(**{**SMALL, "rare_fraction": 0.1, "rare_difficulties": [8, 9], "rare_operands": [1, 30]})
    train, held_out = training_problems(cfg)
    rare = [p for p in train if p.meta["difficulty"] >= 8]
    # 0.1 x 200 = 20 rare problems; the other 180 are the default's first 180 (the same generator, fewer draws)
    assert len(train) == 200 and len(rare) == 20
    default_train, default_held_out = training_problems(BootstrapConfig(**SMALL))
    assert [p.prompt for p in train[:180]] == [p.prompt for p in default_train[:180]]
    assert [p.prompt for p in held_out] == [p.prompt for p in default_held_out]
    assert all(p.meta["difficulty"] <= 5 for p in train[:180])
    operands = [int(x) for p in rare for x in p.prompt[:-3].replace("-", "+").split("+")]
    assert max(operands) <= 30 and max(operands) > 20  # 20 problems of 9-10 operands in 1-30: some above 20
    # an evaluation of the rare region (the same levels and operands, eval_size <= the bootstrap's) scores none of them
    _, region_eval = arith_task([8, 9], 64, cfg.eval_size, cfg.data_seed, (1, 30))
    assert not {p.prompt for p in rare} & {p.prompt for p in region_eval}
    assert training_problems(BootstrapConfig(**SMALL))[0] == arith_task([1, 2, 3, 4, 5], 200, 8, 1234)[0]


def test_a_mixture_is_recorded_and_checked(tmp_path):
    out = bootstrap(tmp_path / "m", BootstrapConfig(**{**SMALL, "max_steps": 2, "eval_every": 2,
                                                       "rare_fraction": 0.05, "note": "why"}))
    info = json.loads((out / "bootstrap.json").read_text())
    assert info["mixture"] == {"main": {"difficulties": [1, 2, 3, 4, 5], "operands": [1, 20], "problems": 190},
                               "rare": {"difficulties": [8, 9], "operands": [1, 20], "problems": 10,
                                        "fraction": 0.05}}
    assert info["note"] == "why" and info["config"]["rare_fraction"] == 0.05
    plain = bootstrap(tmp_path / "p", BootstrapConfig(**{**SMALL, "max_steps": 2, "eval_every": 2}))
    assert "mixture" not in json.loads((plain / "bootstrap.json").read_text())  # none without rare problems
    for bad, field_name in [({"rare_fraction": 1.0}, "rare_fraction"), ({"rare_difficulties": [13]},
                            "rare_difficulties"), ({"rare_operands": [5, 2]}, "rare_operands")]:
        with pytest.raises(ValueError, match=f"bootstrap.{field_name}"):
            bootstrap(tmp_path / "bad", BootstrapConfig(**{**SMALL, **bad}))
        assert not (tmp_path / "bad").exists()  # refused before any work
