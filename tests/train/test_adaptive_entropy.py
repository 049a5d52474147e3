"""Skywork-OR1's adaptive entropy coefficient (explorl.train.adaptive_entropy): the rule by hand, the loop's use of
it, its metric, and a resumed run equal to an unbroken one."""

from __future__ import annotations

import json

import pytest
import torch

from explorl.config import AlgoConfig, ConfigError, load_config
from explorl.config.schema import EntropyControlConfig
from explorl.train.adaptive_entropy import EntropyCoefficient
from explorl.train.loop import train
from run_helpers import train_killed_at


def _controller(alpha0=0.0, **options):
    return EntropyCoefficient(AlgoConfig(entropy_coef=alpha0,
                                         entropy_control=EntropyControlConfig(enabled=True, **options)))


def test_coefficient_follows_the_target_by_hand():
    # target 0.2, delta 0.005, bounds [0, 0.012]; c_k = alpha_k * 1[e_k <= 0.2], then alpha moves by delta
    c = _controller(target=0.2, delta=0.005, coef_min=0.0, coef_max=0.012)
    entropies = [0.1, 0.1, 0.3, 0.1, 0.1, 0.2, 0.5]
    applied = [c.step(e) for e in entropies]
    # alpha: 0 -> .005 -> .010 -> .005 -> .010 -> .012 (capped) -> .012 (e == target counts as below) -> .007
    assert applied == pytest.approx([0.0, 0.005, 0.0, 0.005, 0.010, 0.012, 0.0])
    assert c.alpha == pytest.approx(0.007)


def test_coefficient_is_clipped_below_and_starts_at_entropy_coef():
    c = _controller(alpha0=0.003, target=0.2, delta=0.005, coef_min=0.001)
    assert c.step(0.9) == 0.0  # above the target: no bonus this step
    assert c.alpha == pytest.approx(0.001)  # 0.003 - 0.005 clipped at coef_min
    assert c.step(0.1) == pytest.approx(0.001)
    assert c.alpha == pytest.approx(0.006)


def test_fixed_coefficient_is_untouched_and_state_round_trips():
    algo = AlgoConfig(entropy_coef=0.01)
    fixed = EntropyCoefficient(algo)
    assert [fixed.step(e) for e in (0.0, 9.0)] == [0.01, 0.01] and fixed.algo_for(algo, 0.01) is algo
    c = _controller(target=1.0, delta=0.25)
    c.step(0.5)
    c.step(0.5)
    other = _controller(target=1.0, delta=0.25)
    other.load_state_dict(c.state_dict())
    assert other.alpha == 0.5 and other.step(0.5) == 0.5
    replaced = other.algo_for(AlgoConfig(), 0.75)
    assert replaced.entropy_coef == 0.75 and replaced.advantage == AlgoConfig().advantage


@pytest.mark.parametrize("override, field", [
    (["algo.entropy_control.delta=0"], "algo.entropy_control.delta"),
    (["algo.entropy_control.target=-1"], "algo.entropy_control.target"),
    (["algo.entropy_control.coef_min=0.5", "algo.entropy_control.coef_max=0.1"], "algo.entropy_control.coef_min"),
    (["algo.entropy_coef=2"], "algo.entropy_coef"),
    (["algo.entropy_control.nope=1"], "nope"),
])
def test_bad_settings_are_refused_by_field(override, field):
    with pytest.raises((ConfigError, ValueError), match=field.replace(".", r"\.")):
        load_config(None, ["algo.entropy_control.enabled=true", *override])


def _cfg(model_dir, out_dir, *extra):
    return load_config(None, [
        f"model.path={model_dir}", f"run.out_dir={out_dir}", "run.steps=4", "run.batch_size=3",
        "sampling.group_size=4", "sampling.max_new_tokens=12", "task.eval_size=4", "task.train_size=64",
        "task.difficulties=[1]", "run.eval_n=2", "run.eval_k=[1,2]", "optim.lr=1e-3", "run.save_every=2",
        "run.log_samples=1", "task.reward=rewards_for_tests:contains_digit", *extra])


ADAPTIVE = ["algo.entropy_control.enabled=true", "algo.entropy_control.target=50",
            "algo.entropy_control.delta=0.05"]


def _steps(run_dir):
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in records if "reward/mean" in r]


def test_the_loop_applies_and_logs_the_coefficient(tiny_model_dir, tmp_path):
    # entropy is far below the target 50 nats: alpha_k = 0.05 k, applied from step 2 on (alpha_0 = 0)
    steps = _steps(train(_cfg(tiny_model_dir, tmp_path / "run", *ADAPTIVE), progress=False))
    assert [r["algo/entropy_coef"] for r in steps] == pytest.approx([0.0, 0.05, 0.10, 0.15])
    assert "loss/entropy" in steps[1]  # the bonus is in the update once its coefficient is non-zero
    plain = _steps(train(_cfg(tiny_model_dir, tmp_path / "plain"), progress=False))
    assert all("algo/entropy_coef" not in r for r in plain)


def test_resume_reaches_the_same_run(tiny_model_dir, tmp_path, monkeypatch):
    full = train(_cfg(tiny_model_dir, tmp_path / "full", *ADAPTIVE), progress=False)
    train_killed_at(monkeypatch, _cfg(tiny_model_dir, tmp_path / "killed", *ADAPTIVE), 3)  # after step 2's checkpoint
    state = torch.load(tmp_path / "killed" / "checkpoints" / "step_0000002" / "trainer_state.pt", weights_only=True)
    assert state["entropy_coef"]["alpha"] == pytest.approx(0.10)
    resumed = train(load_config(tmp_path / "killed" / "config.yaml"), resume=tmp_path / "killed", progress=False)
    assert _steps(full) == _steps(resumed)
