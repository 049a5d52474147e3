"""Engines ask the registry what a method can do: the adapters, the vLLM processor and the CLI name no
method, and a per-token schedule registered in a user's own module (`tests/schedule_for_tests.py`) runs in explorl's
loop, through the vLLM processor's arithmetic and in TRL without a change to `integrations/`."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest
import torch

from explorl.algos.registry import SECTIONS, BudgetPolicyEntry, TemperatureScheduleEntry, entries, lookup, register
from explorl.config import load_config
from explorl.config.selection import fill_registry
from explorl.integrations.vllm import check_anneal_args, per_token_schedules, token_factors
from explorl.rollout import temperature as Tm
from explorl.rollout.schedule import ScheduleDriver
from explorl.train.loop import train

SRC = Path(__file__).resolve().parents[2] / "src" / "explorl"
# files where an engine or the command line meets the methods: they must ask the registry, not name a method
ASKING = [*sorted((SRC / "integrations").rglob("*.py")), *sorted((SRC / "commands").glob("*.py")),
          SRC / "evaluation" / "settings.py"]
# strings that equal a method's name but name something else: `explorl probe position` is a probe (EAD's
# entropy by position), not the position shaper
NOT_METHODS = {("commands/probe.py", "position"), ("commands/probe_runs.py", "position")}
# an engine's spellings of the methods' options, keyed by method (STYLE 15: they live in the engine's integration)
SPELLINGS = {"integrations/verl/loss_fields.py", "integrations/trl/loss_fields.py"}


def _strings(path: Path) -> list[tuple[int, str]]:
    """The string constants of a module with their lines, docstrings left out."""
    tree = ast.parse(path.read_text())
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.body
                  and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings]


def test_integrations_and_the_cli_name_no_method():
    fill_registry()
    methods = {name for kind in SECTIONS for name in entries(kind)}
    assert {"erpo", "ead", "e3", "dapo", "clip_cov", "fixed", "uniform"} <= methods
    found = []
    for path in ASKING:
        if not path.exists():
            continue
        rel = str(path.relative_to(SRC))
        if rel in SPELLINGS:
            continue
        found += [f"{rel}:{line}: {value!r}" for line, value in _strings(path)
                  if value in methods and (rel, value) not in NOT_METHODS]
    assert not found, "ask the registry (the entry's fields, its options) instead of naming methods:\n" + \
        "\n".join(found)


def test_the_builtin_entries_declare_what_engines_need():
    fill_registry()
    schedule, budget = (lambda n: lookup("temperature_schedule", n)), (lambda n: lookup("budget_policy", n))
    assert schedule("fixed").static and not schedule("e3").static
    assert schedule("ead").per_token is Tm.ead and schedule("revead").per_token is Tm.revead
    assert schedule("fixed").per_token is None
    assert schedule("adaptive").per_prompt_temperature and not schedule("ead").per_prompt_temperature
    assert budget("uniform").static and budget("e3").per_prompt_budget and budget("dapo").resamples
    assert not budget("e3").resamples
    assert budget("dapo").drops_uniform_groups and not budget("e3").drops_uniform_groups
    assert budget("fr3e").branches and not budget("dapo").branches and not budget("uniform").branches
    # each capability is a typed field of its kind's entry, a misspelling an error at registration
    assert set(TemperatureScheduleEntry.__dataclass_fields__) >= {"static", "per_token", "per_prompt_temperature"}
    assert set(BudgetPolicyEntry.__dataclass_fields__) >= {"static", "per_prompt_budget", "resamples",
                                                           "drops_uniform_groups", "branches"}
    with pytest.raises(TypeError, match="valid for temperature_schedule: .*per_token"):
        register("temperature_schedule", "_typo", per_tokens=Tm.ead)


@pytest.fixture
def user_schedule(monkeypatch):
    """The user's module on the path, as `run.plugins` imports it (from the working directory)."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1]))
    import schedule_for_tests  # noqa: F401  (registers `test_warm_start`)

    return sys.modules["schedule_for_tests"]


def test_a_users_per_token_schedule_reaches_the_vllm_processor(user_schedule):
    assert per_token_schedules()["test_warm_start"] is user_schedule.warm_start
    cfg = load_config(None, ["run.plugins=[schedule_for_tests]", "sampling.schedule=test_warm_start",
                             "sampling.test_warm_start.hot=3.0", "sampling.temperature=0.9",
                             "sampling.max_new_tokens=12"])
    schedule = ScheduleDriver(cfg, vocab_size=98, num_prompts=4).schedule
    sampler, train_temperature, _ = schedule.at(0)
    (prompt,) = schedule.per_prompt(0, sampler, [2])
    args = check_anneal_args(prompt.anneal)
    assert args == {"schedule": "test_warm_start", "step": 0, "hot": 3.0, "until": 8}
    # the processor divides by factor(t) at the request temperature T: T * factor(t) is the sampler's table, by
    # hand 0.9 * max(3 - 2 t / 8, 1) = 2.7, 2.475, ..., 0.9 from t = 8
    factors = token_factors([args] * 12, list(range(12)))
    table = torch.tensor([sampler(t) for t in range(12)])
    torch.testing.assert_close(prompt.temperature * factors, table, rtol=1e-6, atol=0)
    assert table[0].item() == pytest.approx(2.7) and table[1].item() == pytest.approx(2.475)
    assert table[8:].tolist() == pytest.approx([0.9] * 4) and train_temperature == 0.9
    with pytest.raises(ValueError, match="valid: schedule, step, hot, until"):
        check_anneal_args({**args, "tau_max": 1.0})


def test_a_users_per_token_schedule_trains_in_explorls_loop(user_schedule, tiny_model_dir, tmp_path):
    cfg = load_config(None, [
        f"model.path={tiny_model_dir}", f"run.out_dir={tmp_path / 'run'}", "run.plugins=[schedule_for_tests]",
        "sampling.schedule=test_warm_start", "sampling.test_warm_start.until=4", "algo.importance_weights=tis",
        "run.steps=2", "run.batch_size=2", "sampling.group_size=2", "sampling.max_new_tokens=8", "task.train_size=4",
        "task.eval_size=2", "task.difficulties=[1]", "run.eval_n=1", "run.eval_k=[1]", "run.save_every=0",
        "task.reward=rewards_for_tests:contains_digit"])
    run = train(cfg, progress=False)
    steps = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if "reward/mean" in x]
    assert len(steps) == 2 and {"is/weight_mean", "is/truncated_frac"} <= set(steps[-1])
    saved = load_config(run / "config.yaml")  # the run's config records the schedule's options
    assert saved.sampling.options["test_warm_start"] == user_schedule.WarmStartOptions(until=4)
