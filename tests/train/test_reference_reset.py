"""ProRL's reference reset (explorl.train.reference_reset): the copy and the cleared AdamW state, the loop's resets,
the refusal without a KL term, and a run resumed across a reset equal to an unbroken one."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from explorl.config import ConfigError, load_config
from explorl.train.loop import train
from run_helpers import train_killed_at
from explorl.train.reference_reset import reset_reference


def _adamw_step(model, opt, x):
    opt.zero_grad()
    model(x).pow(2).sum().backward()
    opt.step()


def test_reset_copies_the_weights_and_clears_the_adamw_moments():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    ref = copy.deepcopy(model).requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    x = torch.randn(4, 3)
    for _ in range(3):
        _adamw_step(model, opt, x)
    assert not torch.equal(model.weight, ref.weight) and opt.state[model.weight]["exp_avg"].abs().sum() > 0
    reset_reference(model, ref, opt)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), ref.parameters()))
    assert len(opt.state) == 0
    # the next step is a newly built AdamW's first step from the same weights
    twin = copy.deepcopy(model)
    fresh = torch.optim.AdamW(twin.parameters(), lr=0.1)
    _adamw_step(model, opt, x)
    _adamw_step(twin, fresh, x)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), twin.parameters()))
    assert int(opt.state[model.weight]["step"]) == 1
    assert not torch.equal(model.weight, ref.weight)  # the copy is a copy, not shared storage


def test_reset_without_a_kl_term_is_refused():
    with pytest.raises(ConfigError, match=r"algo\.reference_reset\.every=2: .*algo\.kl_coef > 0"):
        load_config(None, ["algo.reference_reset.every=2"])
    with pytest.raises(ConfigError, match=r"algo\.reference_reset\.every: must be >= 0"):
        load_config(None, ["algo.reference_reset.every=-1", "algo.kl_coef=0.1"])
    with pytest.raises(ConfigError, match=r"model\.lora"):
        load_config(None, ["algo.reference_reset.every=2", "algo.kl_coef=0.1", "model.lora.enabled=true"])


def _cfg(model_dir, out_dir, *extra):
    return load_config(None, [
        f"model.path={model_dir}", f"run.out_dir={out_dir}", "run.steps=5", "run.batch_size=3",
        "sampling.group_size=4", "sampling.max_new_tokens=12", "task.eval_size=4", "task.train_size=64",
        "task.difficulties=[1]", "run.eval_n=2", "run.eval_k=[1,2]", "optim.lr=1e-2", "run.save_every=3",
        "run.log_samples=1", "task.reward=rewards_for_tests:contains_digit", "algo.kl_coef=0.5",
        "algo.reference_reset.every=2", *extra])


def _steps(run_dir):
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in records if "reward/mean" in r]


def _params(run_dir):
    from safetensors.torch import load_file  # only these tests read final/ back
    return load_file(str(run_dir / "final" / "model.safetensors"))


def test_resets_in_the_loop_and_a_run_resumed_across_one(tiny_model_dir, tmp_path, monkeypatch):
    full = train(_cfg(tiny_model_dir, tmp_path / "full"), progress=False)
    steps = _steps(full)
    assert [r.get("ref/reset") for r in steps] == [None, 1, None, 1, None]
    # pi_old of step 3 is the policy after step 2, which the reference became: the KL to it is zero
    assert steps[2]["kl/mean"] == pytest.approx(0.0, abs=1e-6) and steps[1]["kl/mean"] > 1e-6
    state = torch.load(full / "checkpoints" / "step_0000005" / "trainer_state.pt", weights_only=True)
    assert "reference" in state
    # mid-way through step 4, after the step-3 checkpoint (reference: the policy after step 2)
    train_killed_at(monkeypatch, _cfg(tiny_model_dir, tmp_path / "killed"), 4)
    resumed = train(load_config(tmp_path / "killed" / "config.yaml"), resume=tmp_path / "killed", progress=False)
    assert _steps(resumed) == steps
    pa, pb = _params(full), _params(resumed)
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
