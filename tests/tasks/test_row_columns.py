"""Rewards get the row: every column of a dataset row reaches the reward functions as a keyword argument (TRL's
convention), in explorl's loop, TRL's TaskReward and verl's reward function; prompt templates may use any column;
the checks before a run call the reward on rows spread over the data under the run's own failure threshold."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from explorl.config import TaskConfig, load_config
from explorl.tasks import load_task
from explorl.tasks.base import spread
from explorl.tasks.files import fill_template, spread_problems, to_problem

QUICKSTART = Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml"


def write_rows(path: Path, n: int, **extra) -> Path:
    """`n` rows with a question, an answer and columns of the user's own: `context`, `weight` (0.25), `flag`."""
    rows = [{"problem": f"{i}+{i}", "answer": str(2 * i), "context": f"ctx{i}", "weight": 0.25, "flag": False,
             **{k: v(i) for k, v in extra.items()}} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_every_column_but_the_positional_ones_is_in_the_problems_meta(tmp_path):
    row = {"problem": "1+1", "answer": "2", "context": "c", "weight": 0.5, "completion": "x", "tags": ["a"]}
    p = to_problem(row, "d.jsonl:1", "d.jsonl:1", TaskConfig(name="file", path="d.jsonl"))
    # `answer` and `completion` are the reward's positional parameters: not passed twice
    assert p.meta == {"problem": "1+1", "context": "c", "weight": 0.5, "tags": ["a"], "id": "d.jsonl:1"}
    own_id = to_problem({**row, "id": 7}, "d.jsonl:1", "d.jsonl:1", TaskConfig(name="file", path="d.jsonl"))
    assert own_id.meta["id"] == 7  # the row's own id column is what the reward gets


def test_templates_fill_any_column_and_question_still_works():
    row = {"problem": "What is {x}?", "context": "Ctx with {braces}", "n": 3, "tags": ["a", "b"]}
    template = "{context}\n{question} ({n} tries, {tags}) {unknown} \\boxed{}"
    assert fill_template(template, "What is {x}?", row) == \
        'Ctx with {braces}\nWhat is {x}? (3 tries, ["a", "b"]) {unknown} \\boxed{}'
    assert fill_template("{problem}!", row["problem"], row) == "What is {x}?!"  # the column by its own name
    cfg = TaskConfig(name="file", path="d.jsonl", prompt_template="C: {context}\nQ: {question}")
    assert to_problem({"problem": "1+1", "answer": 2, "context": "sum"}, "w", "i", cfg).prompt == "C: sum\nQ: 1+1"


def test_a_reward_reads_the_rows_columns_in_explorls_runner(tmp_path):
    data = write_rows(tmp_path / "d.jsonl", 6)
    for reward in ("row_rewards:weight_column", "row_rewards:batched_weight"):
        cfg = load_config(None, ["task.name=file", f"task.path={data}", "task.eval_size=2", f"task.reward={reward}"])
        task = load_task(cfg.task)
        runner = task.reward_runner(timeout_s=5.0, workers=1)
        result = runner(["a", "b"], [p.answer for p in task.train[:2]], [p.meta for p in task.train[:2]])
        assert result.rewards == [0.25, 0.25] and not result.failures, result.failures


def test_a_training_step_of_explorls_loop_scores_with_the_columns(tiny_model_dir, tmp_path):
    from explorl.train.loop import train

    data = write_rows(tmp_path / "d.jsonl", 12)
    cfg = load_config(QUICKSTART, [
        f"model.path={tiny_model_dir}", f"run.out_dir={tmp_path / 'run'}", "task.name=file", f"task.path={data}",
        "task.eval_size=2", "task.reward=row_rewards:weight_column", "run.steps=1", "run.batch_size=2",
        "sampling.group_size=2", "sampling.max_new_tokens=4", "run.eval_n=1", "run.eval_k=[1]", "run.eval_every=0",
        "run.save_every=0", "run.threads=1", "task.chat_template=off"])
    run = train(cfg, progress=False)
    (record,) = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if '"reward/mean"' in x]
    assert record["reward/mean"] == 0.25 and record["reward/errors"] == 0  # every sample scored its row's weight


def test_trls_task_reward_passes_the_columns(tmp_path):
    pytest.importorskip("trl")
    from explorl.integrations.trl import TaskReward

    data = write_rows(tmp_path / "d.jsonl", 6)
    cfg = load_config(None, ["task.name=file", f"task.path={data}", "task.eval_size=2",
                             "task.reward=row_rewards:weight_column"])
    task = load_task(cfg.task)
    reward = TaskReward(task, 5.0, 1)
    rows = [{"answer": p.answer, "meta": json.dumps(p.meta)} for p in task.train[:3]]  # examples/trl/train.py's
    got = reward(["p"] * 3, ["x"] * 3, answer=[r["answer"] for r in rows], meta=[r["meta"] for r in rows])
    assert got == [0.25] * 3


def test_verls_reward_function_passes_the_columns(tmp_path):
    # reward.py imports nothing of verl; the package's __init__ registers with verl, which only .venv-verl has
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "src" / "explorl" / "integrations" / "verl" / "reward.py"
    spec = importlib.util.spec_from_file_location("explorl_verl_reward_alone", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    compute_score = module.compute_score

    data = write_rows(tmp_path / "d.jsonl", 6)
    config = tmp_path / "explorl.yaml"
    config.write_text(f"task: {{name: file, path: {data}, eval_size: 2, reward: 'row_rewards:weight_column'}}\n")
    task = load_task(load_config(config).task)
    p = task.train[1]
    extra_info = {"index": 1, "split": "train", "meta": json.dumps(p.meta, default=str)}  # launch.py's row
    assert compute_score("explorl", "x", p.answer, extra_info, explorl_config=str(config))["score"] == 0.25


def test_spread_takes_the_first_the_last_and_evenly_between():
    # n = 20, k = 8: round(i * 19 / 7) for i = 0..7 = 0, 2.71, 5.43, 8.14, 10.86, 13.57, 16.29, 19 -> rounded
    assert spread(list(range(20))) == [0, 3, 5, 8, 11, 14, 16, 19]
    assert spread([1, 2, 3]) == [1, 2, 3]


def test_the_preflight_rows_are_spread_over_the_training_rows(tmp_path):
    data = write_rows(tmp_path / "d.jsonl", 300)
    cfg = TaskConfig(name="file", path=str(data), eval_size=20)
    rows = [p.meta["id"] for p in spread_problems(cfg)]
    lines = [int(r.split(":")[1]) for r in rows]
    # 280 training rows (the last 20 held out): 8 spread over lines 1..280, kept in one pass of at most 32 rows
    assert len(lines) == 8 and lines[0] == 1 and lines == sorted(lines) and max(lines) <= 280
    assert max(lines) >= 250 and all(b - a >= 20 for a, b in zip(lines, lines[1:]))


def _dry_run_reward_lines(tmp_path, tiny_model_dir, data, *extra):
    from explorl.train.preflight import check_run_inputs

    cfg = load_config(None, [f"model.path={tiny_model_dir}", "task.name=file", f"task.path={data}",
                             "task.eval_size=2", "task.reward=row_rewards:fails_on_flagged_rows",
                             f"run.out_dir={tmp_path / 'run'}", *extra])
    return [r for what, r in check_run_inputs(cfg) if what.startswith("task.reward")]


def test_the_preflight_applies_the_runs_failure_threshold(tmp_path, tiny_model_dir):
    # the first row fails, the others not: 1 of 8 sample rows fails, under the default 0.5, so the run may start
    first_bad = write_rows(tmp_path / "first.jsonl", 30, flag=lambda i: i == 0)
    (line,) = _dry_run_reward_lines(tmp_path, tiny_model_dir, first_bad)
    assert line.startswith("warning: row_rewards:fails_on_flagged_rows failed on 1 of 8 sample rows (first.jsonl:1;")
    assert "KeyError" in line and "task.max_reward_failure_frac=0.5" in line
    # ... and with max_reward_failure_frac=0 the one failure is refused
    with pytest.raises(ValueError, match=r"raised KeyError\('flagged row'\).*on 1 of 8 sample rows, more than "
                                         r"task.max_reward_failure_frac=0; first on first.jsonl:1"):
        _dry_run_reward_lines(tmp_path, tiny_model_dir, first_bad, "task.max_reward_failure_frac=0")
    # rows after the first fail (the second half of the file): 4 or more of 8 sample rows, refused naming them
    late_bad = write_rows(tmp_path / "late.jsonl", 30, flag=lambda i: i >= 10)
    with pytest.raises(ValueError, match=r"on [5-8] of 8 sample rows, more than task.max_reward_failure_frac=0.5; "
                                         r"first on late.jsonl:1[1-9]"):
        _dry_run_reward_lines(tmp_path, tiny_model_dir, late_bad)
    (line,) = _dry_run_reward_lines(tmp_path, tiny_model_dir, late_bad, "task.max_reward_failure_frac=1")
    assert line.startswith("warning:")


def test_a_custom_reward_without_an_answer_pattern_is_warned_that_maj_reads_the_last_box(tmp_path, tiny_model_dir):
    from explorl.train.preflight import check_run_inputs

    data = write_rows(tmp_path / "d.jsonl", 6)
    base = [f"model.path={tiny_model_dir}", "task.name=file", f"task.path={data}", "task.eval_size=2",
            "task.reward=row_rewards:weight_column", f"run.out_dir={tmp_path / 'run'}"]
    lines = dict(check_run_inputs(load_config(None, base)))
    assert lines["task.answer_pattern"].startswith("warning: task.reward names your own row_rewards:weight_column")
    assert "last \\boxed{...}" in lines["task.answer_pattern"]
    assert "task.answer_pattern" not in dict(check_run_inputs(load_config(None, [*base, "task.answer_pattern=(.+)"])))
    assert "task.answer_pattern" not in dict(check_run_inputs(load_config(None, [*base[:-2], base[-1]])))  # math
    # issue 56: a reward of one's own that reads the last \boxed{} itself is not warned about
    reads_box = [*base[:4], "task.reward=row_rewards:boxed_times_weight", base[-1]]
    assert "task.answer_pattern" not in dict(check_run_inputs(load_config(None, reads_box)))


def test_a_template_of_other_columns_alone_is_accepted_and_one_without_placeholders_is_refused(tmp_path):
    from explorl.config import ConfigError, load_config

    data = tmp_path / "d.jsonl"
    data.write_text('{"question": "1+1", "answer": "2", "context": "add"}\n')
    cfg = load_config(None, ["task.name=file", f"task.path={data}", "task.prompt_template={context}: {problem}"])
    assert cfg.task.prompt_template == "{context}: {problem}"
    with pytest.raises(ConfigError, match="task.prompt_template: must contain a placeholder"):
        load_config(None, ["task.name=file", f"task.path={data}", "task.prompt_template=no placeholder here"])
    with pytest.raises(ConfigError, match="task.prompt_template: must contain \\{question\\}"):
        load_config(None, ["task.name=arith", "task.prompt_template={problem}"])
