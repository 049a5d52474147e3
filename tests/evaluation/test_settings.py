"""`explorl.evaluation.settings.resolve_eval_settings` without argparse: what `explorl eval` evaluates with and where
each value came from (a plain model: defaults; a run's output: its config.yaml; a given value: the flag named)."""

from __future__ import annotations

import shutil
from pathlib import Path

from explorl.config import ModelConfig, SamplingConfig, dump_yaml, load_config
from explorl.evaluation.settings import SamplingFlags, resolve_eval_settings
from explorl.models import load_policy
from explorl.rollout.temperature_schedules import PromptTemperature


def _full_model_run(root: Path, name: str, model_dir: Path) -> Path:
    """A finished run's layout around a copy of a full model (config.yaml, metrics.jsonl, final/), as in
    tests/models/test_run_outputs.py, with sampling settings apart from the defaults."""
    run = root / name
    run.mkdir(parents=True)
    shutil.copytree(model_dir, run / "final")
    cfg = load_config(None, [f"model.path={model_dir}", "task.eval_size=3", "task.train_size=4",
                             "task.difficulties=[1]", "task.prompt_template=Q: {question} A=",
                             "sampling.max_new_tokens=4", "sampling.top_p=0.9", "run.eval_temperature=0.7",
                             "sampling.fast_path=false", f"run.out_dir={run}"])
    (run / "config.yaml").write_text(dump_yaml(cfg))
    (run / "metrics.jsonl").write_text("")
    return run


def _rows(settings) -> dict[str, tuple]:
    return {name: (value, where) for name, value, where in settings.settings}


def test_a_plain_model_takes_the_defaults(tiny_model_dir):
    s = resolve_eval_settings(str(tiny_model_dir))
    rows = _rows(s)
    assert s.run is None and s.run_cfg is None
    assert rows["model"] == (str(tiny_model_dir), "--model")
    assert rows["task"] == ("arith", "default")
    assert rows["prompt template"] == ("{question}", "default")
    assert rows["max_new_tokens"] == (64, "default")
    assert rows["temperature"] == (1.0, "default")
    assert rows["top_p"] == (1.0, "default")
    assert rows["schedule"] == ("fixed", "default")
    assert rows["eval split"][1] == "default" and rows["eval split"][0].startswith(f"{len(s.task.eval)} held-out")
    assert (s.max_new_tokens, s.temperature, s.top_p) == (64, 1.0, 1.0)
    assert s.sampler_temperature == PromptTemperature(1.0) and s.sampling == SamplingConfig()
    assert s.problems == s.task.eval
    assert s.record()["max_new_tokens"] == {"value": 64, "from": "default"}


def test_a_run_directory_supplies_its_config(tiny_model_dir, tmp_path):
    run = _full_model_run(tmp_path, "grpo", tiny_model_dir)
    for model in (run, run / "final"):
        s = resolve_eval_settings(str(model))
        rows = _rows(s)
        assert s.run is not None and s.run.run_dir == run and s.run_cfg is not None
        assert rows["model"] == (str(run / "final"), f"final of the run {run}")
        assert rows["task"] == ("arith", "run config: task.name")
        assert rows["prompt template"] == ("Q: {question} A=", "run config: task.prompt_template")
        assert rows["eval split"] == ("3 held-out problems (task.eval_size=3, task.data_seed=1234)",
                                      "run config: task.path, task.eval_path, task.eval_size")
        assert rows["max_new_tokens"] == (4, "run config: sampling.max_new_tokens")
        assert rows["temperature"] == (0.7, "run config: run.eval_temperature")
        assert rows["top_p"] == (0.9, "run config: sampling.top_p")
        assert (s.max_new_tokens, s.temperature, s.top_p) == (4, 0.7, 0.9)
        assert len(s.problems) == 3 and s.task_cfg.prompt_template == "Q: {question} A="


def test_a_flag_overrides_the_run_and_is_named(tiny_model_dir, tmp_path):
    run = _full_model_run(tmp_path, "grpo", tiny_model_dir)
    s = resolve_eval_settings(str(run / "final"), "arith", {"eval_size": "2"},
                              flags=SamplingFlags(max_new_tokens=8, temperature=0.5), limit=1)
    rows = _rows(s)
    assert rows["max_new_tokens"] == (8, "--max-new-tokens")
    assert rows["temperature"] == (0.5, "--temperature")
    assert rows["top_p"] == (0.9, "run config: sampling.top_p")  # not given: still the run's
    assert rows["task"] == ("arith", "--task")
    assert rows["prompt template"] == ("Q: {question} A=", "run config: task.prompt_template")
    assert rows["eval split"] == ("2 held-out problems (task.eval_size=2, task.data_seed=1234); the first 1 of "
                                  "them (--limit)", "--task-opt eval_size")
    assert (s.max_new_tokens, s.temperature, s.top_p) == (8, 0.5, 0.9)
    assert len(s.task.eval) == 2 and len(s.problems) == 1
    # the evaluation's one sampler: the run's decoder choice, the resolved length limit and top-p
    model, tok, _ = load_policy(ModelConfig(path=str(tiny_model_dir)))
    sampler = s.sampler(model, tok)
    assert (sampler.max_new_tokens, sampler.top_p, sampler.fused, sampler.engine) == (8, 0.9, False, None)
