"""The `explorl` command in-process (`explorl.commands.main`) plus one real subprocess of the console script:
dry runs, errors that name the field, `config` listings, and `eval` on a tiny random model built here."""

from __future__ import annotations

import io
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from explorl import commands
from explorl.evaluation.settings import inference_schedule
from explorl.rollout.temperature_schedules import PromptTemperature
from explorl.config import dump_yaml, load_config, reference

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"


@pytest.fixture
def out(monkeypatch):
    """Capture what the CLI prints to its rich console; call the fixture's value to read it."""
    buf = io.StringIO()
    monkeypatch.setattr(commands.common, "console", Console(file=buf, width=1000, color_system=None, highlight=False))
    return buf.getvalue


@pytest.fixture
def no_work(monkeypatch):
    """Fail the test if the CLI gets as far as loading a model or training."""
    import explorl.models
    import explorl.models.run_outputs
    import explorl.train.loop

    def boom(*a, **k):
        raise AssertionError("the CLI started real work")

    monkeypatch.setattr(explorl.train.loop, "train", boom)
    # where the commands look it up (the package) and where `load_run_output` does
    for where in (explorl.models, explorl.models.run_outputs):
        monkeypatch.setattr(where, "load_policy", boom)


def make_tiny_model(path: Path) -> Path:
    """A randomly initialised 2-layer Qwen2 with the character tokenizer, saved as a normal HF directory."""
    from explorl.models import TinyQwen2Sizes, build_char_tokenizer, tiny_qwen2

    tok = build_char_tokenizer()
    model = tiny_qwen2(len(tok), TinyQwen2Sizes(hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64),
                       pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


# ----------------------------------------------------------------------------------------------------------------
# train


def test_train_dry_run_prints_a_summary_of_the_config_and_creates_nothing(tmp_path, out, no_work):
    run_dir = tmp_path / "x"
    rc = commands.main(["train", str(QUICKSTART), f"run.out_dir={run_dir}", "sampling.temperature=0.7", "--dry-run"])
    text = out()
    assert rc == 0, text
    assert "config is valid" in text
    assert not run_dir.exists()
    # each non-default key with its source, not the ~150 lines of the whole config (no unrelated sft:/rft: sections)
    summary = text[:text.index("config is valid")]
    assert re.search(r"sampling\.temperature +\= 0\.7  <- command line", summary), summary
    assert "run.steps" in summary and "configs/quickstart.yaml" in summary
    assert "sft:" not in summary and "rft." not in summary
    assert len(summary.splitlines()) < 30, summary
    assert f"explorl config {QUICKSTART}" in " ".join(summary.split()) and "--resolved" in summary


def test_train_overrides_after_options(tmp_path, out, no_work):
    rc = commands.main(["train", str(QUICKSTART), "--dry-run", "run.steps=7", f"run.out_dir={tmp_path / 'x'}"])
    assert rc == 0, out()
    assert re.search(r"run\.steps +\= 7  <- command line", out()), out()
    assert not (tmp_path / "x").exists()


def test_train_unknown_argument_is_rejected(capsys):
    with pytest.raises(SystemExit) as e:
        commands.main(["train", str(QUICKSTART), "--dry-run", "--bogus"])
    assert e.value.code == 2
    assert "--bogus" in capsys.readouterr().err


def test_train_typo_names_field_and_suggests(out, no_work):
    rc = commands.main(["train", str(QUICKSTART), "sampling.temprature=1", "--dry-run"])
    text = out()
    assert rc == 2
    assert "sampling.temprature" in text
    assert "Did you mean 'sampling.temperature'" in text
    assert "resolved config" not in text


def test_train_invalid_value_fails_before_work(out, no_work):
    # no --dry-run: validation must still stop it before the trainer is reached
    rc = commands.main(["train", str(QUICKSTART), "run.eval_k=[1,16]"])
    assert rc == 2
    assert "run.eval_k" in out() and "eval_n" in out()


def test_train_resume_nonexistent(out, no_work):
    rc = commands.main(["train", "--resume", "/nonexistent/run"])
    text = out()
    assert rc == 2
    assert "--resume" in text and "/nonexistent/run" in text and "config.yaml" in text


def test_train_without_config(out, no_work):
    rc = commands.main(["train"])
    text = out()
    assert rc == 2
    assert "CONFIG" in text and "--resume" in text


def test_train_missing_config_file(tmp_path, out, no_work):
    rc = commands.main(["train", str(tmp_path / "missing.yaml"), "--dry-run"])
    assert rc == 2
    assert "missing.yaml" in out() and "does not exist" in out()


def test_train_resume_dry_run_applies_overrides(tmp_path, out, no_work):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(dump_yaml(load_config(QUICKSTART, [f"run.out_dir={run}"])))
    (run / "metrics.jsonl").write_text("")  # a run explorl made (the dry run checks it, as the real run does)
    # argparse puts the first override in the CONFIG slot; it must still be applied
    rc = commands.main(["train", "--resume", str(run), "run.steps=123", "sampling.top_p=0.9", "--dry-run"])
    text = out()
    assert rc == 0, text
    assert re.search(r"run\.steps +\= 123  <- command line \(over .*config\.yaml: 200\)", text), text
    assert re.search(r"sampling\.top_p +\= 0\.9  <- command line", text), text


def test_train_resume_with_config_is_rejected(tmp_path, out, no_work):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(dump_yaml(load_config(None)))
    rc = commands.main(["train", str(QUICKSTART), "--resume", str(run), "--dry-run"])
    assert rc == 2
    assert "not both" in out()


# ----------------------------------------------------------------------------------------------------------------
# config


def test_config_lists_every_field(out):
    assert commands.main(["config"]) == 0
    text = out()
    for name, tp, default, doc in reference():
        assert name in text, name
    assert "grpo" in text and "dr_grpo" in text  # the registered advantage estimators
    assert "methods (layers for `methods: [...]`" in text and "e3_ts_an" in text and "kl_cov" in text


def test_config_markdown_lists_every_field(capsys):
    assert commands.main(["config", "--markdown"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| field | type | default | meaning |"
    rows = [line for line in lines[2:] if line.startswith("| `")]
    assert len(rows) == len(reference())
    for (name, _, _, doc), row in zip(reference(), rows):
        assert row.startswith(f"| `{name}` |")
        assert len(re.findall(r"(?<!\\)\|", row)) == 5, row  # a `|` in a type or docstring must not split cells
        assert doc.split()[0].replace("|", "/") in row


# ----------------------------------------------------------------------------------------------------------------
# eval


def test_eval_k_larger_than_n_fails_before_loading(no_work):
    with pytest.raises(SystemExit) as e:
        commands.main(["eval", "--model", "/nonexistent", "--k", "1,32", "--n", "16"])
    msg = str(e.value.code)
    assert "k=32" in msg and "--n=16" in msg


@pytest.mark.parametrize("k", ["1,x", "0,1", ","])
def test_eval_bad_k(k, no_work):
    with pytest.raises(SystemExit) as e:
        commands.main(["eval", "--k", k, "--n", "4"])
    assert "--k" in str(e.value.code)


def test_console_script_eval_k_larger_than_n():
    """The installed `explorl` entry point runs and fails clearly (exit != 0, message on stderr)."""
    exe = Path(sys.executable).with_name("explorl")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "explorl"]
    res = subprocess.run([*cmd, "eval", "--model", "/nonexistent", "--k", "1,32", "--n", "16"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert res.returncode != 0
    assert "k=32" in res.stderr and "--n=16" in res.stderr
    assert "Traceback" not in res.stderr and "config.json" not in res.stderr


def test_eval_tiny_model_writes_json(tmp_path, out):
    model_dir = make_tiny_model(tmp_path / "model")
    dest = tmp_path / "tmp" / "eval.json"
    per_problem = tmp_path / "per_problem.jsonl"
    rc = commands.main(["eval", "--model", str(model_dir), "--task", "arith", "--n", "2", "--k", "1,2", "--limit", "4",
                   "--max-new-tokens", "8", "--device", "cpu", "--task-opt", "train_size=8",
                   "--task-opt", "eval_size=8", "--out", str(dest), "--per-problem", str(per_problem)])
    assert rc == 0, out()
    result = json.loads(dest.read_text())
    for key in ("pass@1", "pass@2", "maj@2", "avg@2", "entropy", "length"):
        assert key in result, key
    for key in ("pass@1", "pass@2", "maj@2", "avg@2"):
        assert 0.0 <= result[key] <= 1.0
    assert result["pass@1"] <= result["pass@2"] + 1e-9
    assert result["problems"] == 4 and result["n"] == 2
    assert result["entropy"] > 0 and 0 < result["length"] <= 8
    rows = [json.loads(line) for line in per_problem.read_text().splitlines()]
    assert len(rows) == 4 and all(len(r["correct"]) == 2 for r in rows)
    assert "pass@2" in out()  # the table


def test_eval_missing_model_dir(tmp_path, out):
    rc = commands.main(["eval", "--model", str(tmp_path / "nomodel"), "--n", "2", "--k", "1", "--device", "cpu"])
    assert rc == 2
    # issue 41: a directory that is not there is said to be missing, not to lack a config.json
    text = " ".join(out().split())
    assert f"the directory {tmp_path / 'nomodel'} does not exist ({tmp_path} does)" in text, text
    (tmp_path / "empty").mkdir()  # there, but not a model: what it lacks
    assert commands.main(["eval", "--model", str(tmp_path / "empty"), "--n", "2", "--k", "1", "--device", "cpu"]) == 2
    assert "no config.json" in out()


def test_eval_bad_task_opt_names_field(tmp_path, out, no_work):
    rc = commands.main(["eval", "--model", str(tmp_path), "--n", "2", "--k", "1", "--task-opt", "prompt_feild=q"])
    assert rc == 2
    assert "task.prompt_feild" in out() and "task.prompt_field" in out()


def test_train_dry_run_never_crops_the_summary(monkeypatch, tmp_path, no_work):
    """On a narrow terminal (or a pipe: 80 columns) a long line of the summary is printed whole, not cut off."""
    buf = io.StringIO()
    monkeypatch.setattr(commands.common, "console", Console(file=buf, width=60, color_system=None, highlight=False))
    recipe = QUICKSTART.parent / "recipes" / "clip_cov.yaml"
    assert commands.main(["train", str(recipe), "--dry-run", f"run.out_dir={tmp_path / 'x'}"]) == 0
    text = buf.getvalue()
    assert "up to 9 extra sampling rounds per step (budget.policy=dapo, dynamic sampling" in text, text
    assert "8 optimizer updates per rollout batch" in text


def test_config_file_resolved_prints_the_whole_config(tmp_path, capsys):
    """`explorl config FILE --resolved`: the whole resolved config as YAML, as a run writes it to config.yaml."""
    assert commands.main(["config", str(QUICKSTART), "sampling.temperature=0.7", "--resolved"]) == 0
    data = yaml.safe_load(capsys.readouterr().out)
    assert data == yaml.safe_load(dump_yaml(load_config(QUICKSTART, ["sampling.temperature=0.7"])))
    for name, *_ in reference():  # every core field, and the options of the quickstart's methods (its PPO loss)
        if name.count(".") == 1 or name.startswith("algo.ppo."):
            section, *rest = name.split(".")
            assert rest[0] in data[section], name


def test_config_file_explain_names_each_source_and_the_costs(tmp_path, out, monkeypatch):
    """The issue's user: `methods: [e3, clip_cov]` with the keys they disagree on set in the file."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.yaml").write_text("methods: [e3, clip_cov]\nalgo: {loss_agg: seq-mean-token-mean-per-question,"
                                        " eps_low: 0.2, eps_high: 0.28}\nbudget: {policy: e3}\n")
    assert commands.main(["config", "mine.yaml", "--explain", "optim.lr=2e-5"]) == 0
    text = out()
    lines = {line.split("=")[0].strip(): line for line in text.splitlines() if " = " in line}
    assert re.search(r"= seq-mean-token-mean-per-question  <- mine\.yaml \(over methods: clip_cov \(.*\): "
                     r"token-mean\)$",
                     lines["algo.loss_agg"]), lines["algo.loss_agg"]
    assert re.search(r"= clip_cov  <- methods: clip_cov \(.*src/explorl/methods/clip_cov\.yaml\)$", lines["algo.loss"])
    assert re.search(r"= 0\.28  <- mine\.yaml \(over methods: clip_cov .*: 1\.0; methods: e3 .*: 0\.2\)$",
                     lines["algo.eps_high"]), lines["algo.eps_high"]
    assert lines["optim.lr"].endswith("= 2e-05  <- command line")
    assert "sampling.group_size" not in lines  # at its default
    assert "8 optimizer updates per rollout batch (algo.epochs=1 x algo.mini_batches=8)" in text
    assert "rollouts per prompt vary with difficulty (budget.policy=e3): from 4 to 12" in text
    assert "extra sampling rounds" not in text  # budget.policy is e3 here: no DAPO dynamic sampling


def test_config_explain_of_a_method_with_a_reference_says_so(out):
    assert commands.main(["config", str(QUICKSTART.parent / "recipes" / "erpo.yaml")]) == 0
    assert "a frozen reference model (algo.kl_coef=0.001)" in out()
    assert commands.main(["config", str(QUICKSTART)]) == 0
    assert "cost per step: one sampling round, one update, no reference model" in out()


# ----------------------------------------------------------------------------------------------------------------
# --dry-run checks what the run reads (issue 10, item 7), before any real run too


@pytest.fixture
def no_weights(monkeypatch, no_work):
    """`no_work`, and fail the test if any weights are loaded (from_pretrained of a model)."""
    import explorl.models
    import explorl.models.loading
    from transformers import AutoModelForCausalLM

    def boom(*a, **k):
        raise AssertionError("weights were loaded")

    # where the commands look it up (the package) and where `load_policy` does
    for where in (explorl.models, explorl.models.loading):
        monkeypatch.setattr(where, "load_causal_lm", boom)
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", boom)


def _file_task_args(tmp_path, tiny_model_dir, *extra):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"question": f"{i}+1", "answer": i + 1}) + "\n" for i in range(10)))
    return ["train", str(QUICKSTART), f"run.out_dir={tmp_path / 'run'}", f"model.path={tiny_model_dir}",
            "task.name=file", f"task.path={data}", "task.prompt_field=question", "task.eval_size=2", *extra]


def test_dry_run_of_a_complete_config_lists_what_it_checked(tmp_path, tiny_model_dir, out, no_weights):
    rc = commands.main(_file_task_args(tmp_path, tiny_model_dir, "task.reward=rewards_for_tests:has_equals",
                                       "--dry-run"))
    text = out()
    assert rc == 0, text
    checks = text[text.index("config is valid"):]
    assert f"model.path: {tiny_model_dir} (Hugging Face model, qwen2)" in checks
    assert (f"task: file {tmp_path / 'train.jsonl'}: 10 rows, every one parses with fields 'question' and 'answer'; "
            f"held out: its last 2 rows") in checks
    # called on the first row's answer (1) with "The answer is \\boxed{1}." (the rows have no worked solution)
    # called on every training row here (8 of 10; up to 8 spread over the rows), as training calls it
    assert ("task.reward[0]: rewards_for_tests:has_equals returned 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0 on 8 sample "
            "completions (rows train.jsonl:1, train.jsonl:2,") in checks
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("overrides, expected", [
    (lambda t: ["model.path=" + str(t / "no_model")], ["model.path", "no_model", "does not exist"]),
    (lambda t: ["task.path=" + str(t / "missing.jsonl")], ["task.path", "missing.jsonl", "does not exist"]),
    (lambda t: ["task.prompt_field=problem"], ["train.jsonl:1", "missing field 'problem'", "task.prompt_field"]),
    (lambda t: ["task.eval_size=10"], ["task.eval_size", "10 rows", "task.eval_path"]),
    (lambda t: ["task.reward=no_such_module_xyz:score"], ["task.reward", "no_such_module_xyz"]),
    (lambda t: ["task.reward=json:__doc__"], ["task.reward", "json:__doc__", "not callable"]),
    (lambda t: ["model.lora.enabled=true", "model.lora.target_modules=[query]"],
     ["model.lora.target_modules", "query"]),
    (lambda t: ["run.plugins=[no_such_plugin_xyz]"], ["run.plugins[0]", "no_such_plugin_xyz"]),
])
def test_dry_run_fails_on_what_the_real_run_would_fail_on(tmp_path, tiny_model_dir, out, no_weights, overrides,
                                                          expected):
    rc = commands.main([*_file_task_args(tmp_path, tiny_model_dir), *overrides(tmp_path), "--dry-run"])
    text = out()
    assert rc == 2, text
    assert "config is valid" not in text
    for part in expected:
        assert part in text, (part, text)


def test_real_run_is_checked_before_work_starts(tmp_path, tiny_model_dir, out, no_work):
    rc = commands.main(_file_task_args(tmp_path, tiny_model_dir, f"task.path={tmp_path / 'missing.jsonl'}"))
    assert rc == 2  # no_work: the trainer was never called
    assert "task.path" in out() and "does not exist" in out()


def test_dry_run_refuses_an_out_dir_that_holds_a_run(tmp_path, tiny_model_dir, out, no_weights):
    """As the real run does, with its message and exit code (issue 56: the dry run warned and exited 0)."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("run: {seed: 1}\n")
    (tmp_path / "run" / "metrics.jsonl").write_text("")
    rc = commands.main([*_file_task_args(tmp_path, tiny_model_dir), "--dry-run"])
    text = " ".join(out().split())
    assert rc == 2, text
    assert f"run directory {tmp_path / 'run'} already holds a run" in text and "explorl train --resume" in text


def test_dry_run_of_an_adapter_checks_its_base(tmp_path, tiny_model_dir, out, no_weights):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(tmp_path / "gone")}))
    (adapter / "adapter_model.safetensors").write_bytes(b"")
    rc = commands.main([*_file_task_args(tmp_path, tiny_model_dir), f"model.path={adapter}", "--dry-run"])
    assert rc == 2
    assert "base_model_name_or_path" in out() and str(tmp_path / "gone") in out()


def _config_file(tmp_path, tiny_model_dir, data, task=None, run=None) -> Path:
    """cfg.yaml in tmp_path: the tiny model, the `file` task on `data` (fields question/answer), a run directory."""
    cfg = {"model": {"path": str(tiny_model_dir)},
           "task": {"name": "file", "path": str(data), "prompt_field": "question", "eval_size": 2, **(task or {})},
           "run": {"out_dir": str(tmp_path / "run"), **(run or {})}}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _question_rows(n, without_answer=()):
    """`n` rows {"question", "answer"}; the 1-based rows in `without_answer` lack the answer."""
    return [{"question": f"{i}+1"} if i + 1 in without_answer else {"question": f"{i}+1", "answer": i + 1}
            for i in range(n)]


def test_dry_run_reads_every_row_and_names_the_bad_line(tmp_path, tiny_model_dir, out, no_weights):
    from explorl.tasks import load_task

    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _question_rows(40, without_answer={20})))
    config = _config_file(tmp_path, tiny_model_dir, data)
    expected = f"{data}:20: missing field 'answer' (task.answer_field='answer'); fields present: question"
    rc = commands.main(["train", str(config), "--dry-run"])
    text = out()
    assert rc == 2 and "config is valid" not in text, text
    assert f"error: {expected}" in text
    assert not (tmp_path / "run").exists()
    # a real run stops at the same check, before any work (no_work), and the task's own load says the same
    rc = commands.main(["train", str(config)])
    assert rc == 2 and out().count(f"error: {expected}") == 2
    with pytest.raises(ValueError) as e:
        load_task(load_config(config).task)
    assert str(e.value) == expected


def test_dry_run_names_the_bad_row_of_a_parquet_file(tmp_path, tiny_model_dir, out, no_weights):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = _question_rows(40)
    rows[19]["answer"] = None  # row 20 has no answer (Parquet: null)
    data = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), data)
    rc = commands.main(["train", str(_config_file(tmp_path, tiny_model_dir, data)), "--dry-run"])
    text = out()
    assert rc == 2 and "config is valid" not in text, text
    assert (f"error: {data}: row 20 (index 19): field 'answer' (task.answer_field) must be a string or a number, got "
            f"null (the row has no value there)") in text


def test_dry_run_reads_every_row_of_the_eval_files(tmp_path, tiny_model_dir, out, no_weights):
    data, held_out, extra = tmp_path / "train.jsonl", tmp_path / "test.jsonl", tmp_path / "extra.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _question_rows(10)))
    held_out.write_text("".join(json.dumps(r) + "\n" for r in _question_rows(30, without_answer={25})))
    rc = commands.main(["train", str(_config_file(tmp_path, tiny_model_dir, data, {"eval_path": str(held_out)})),
                   "--dry-run"])
    assert rc == 2 and f"error: {held_out}:25: missing field 'answer'" in out()
    extra.write_text("".join(json.dumps(r) + "\n" for r in _question_rows(30, without_answer={21})))
    config = _config_file(tmp_path, tiny_model_dir, data, run={"eval_sets": {"extra": {"path": str(extra)}}})
    rc = commands.main(["train", str(config), "--dry-run"])
    text = out()
    assert rc == 2, text
    assert (f"error: run.eval_sets.extra: {extra}:21: missing field 'answer' (task.answer_field='answer'); fields "
            f"present: question") in text
    extra.write_text("".join(json.dumps(r) + "\n" for r in _question_rows(30)))
    rc = commands.main(["train", str(config), "--dry-run"])
    text = out()
    assert rc == 0, text
    assert f"run.eval_sets.extra: file {extra}: 30 rows, every one parses" in text


def test_dry_run_calls_each_reward_on_a_sample(tmp_path, tiny_model_dir, out, no_weights):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _question_rows(10)))
    rewards = ["math", "rewards_for_tests:contains_digit", "rewards_for_tests:digit_share"]
    rc = commands.main(["train", str(_config_file(tmp_path, tiny_model_dir, data, {"reward": rewards})), "--dry-run"])
    text = out()
    assert rc == 0, text
    sample = "The answer is \\boxed{1}."  # each row's answer, boxed (the rows have no worked solution); all 24 long
    on = f"on 8 sample completions (rows {', '.join(f'train.jsonl:{i}' for i in range(1, 9))})"
    assert f"task.reward[0]: math (explorl.rewards:math_check) returned {', '.join(['1.0'] * 8)} {on}" in text
    assert f"task.reward[1]: rewards_for_tests:contains_digit returned {', '.join(['1.0'] * 8)} {on}" in text
    share = ", ".join([repr(1 / len(sample))] * 8)
    assert f"task.reward[2]: rewards_for_tests:digit_share returned {share} {on}" in text
    # a worked solution is the sample completion when the rows have one: its box (7) is not the answer (1)
    data.write_text("".join(json.dumps({**r, "solution": "\\boxed{7}"}) + "\n" for r in _question_rows(10)))
    rc = commands.main(["train", str(_config_file(tmp_path, tiny_model_dir, data, {"reward": "exact"})), "--dry-run"])
    assert rc == 0
    # ... so exact scores 0 on every row but row 7, whose answer is 7
    assert "task.reward[0]: exact (explorl.rewards:exact_reward) returned 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0 on 8" \
        in out()
    # the arith task's own reward (auto), on its first problem's worked solution
    rc = commands.main(["train", str(QUICKSTART), f"run.out_dir={tmp_path / 'q'}", "--dry-run"])
    assert rc == 0
    assert f"task.reward[0]: auto (explorl.rewards:int_reward) returned {', '.join(['1.0'] * 8)} on 8 sample " \
        "completions (rows " in out()


@pytest.mark.parametrize("reward, extra, expected", [
    ("broken_rewards:divides_by_zero", [],
     [("task.reward[0]: broken_rewards:divides_by_zero raised ZeroDivisionError('division by zero') when called as "
       "training calls it (fn(completion, answer, **meta)) on 8 of 8 sample rows, more than "
       "task.max_reward_failure_frac=0.5; first on train.jsonl:1 (completion 'The answer is \\\\boxed{1}.', answer "
       "'1')"), "Traceback (most recent call last)", "in divides_by_zero",
      "return len(completion) / 0", "ZeroDivisionError: division by zero"]),
    ("broken_rewards:returns_none", [],
     ["task.reward[0]: broken_rewards:returns_none returned a value that is not a score on 8 of 8 sample rows",
      "NoneType: returned None, not a finite number (a reward must be a float)"]),
    ("broken_rewards:one_argument", [],
     ["task.reward[0]: broken_rewards:one_argument raised TypeError", "Traceback (most recent call last)",
      "TypeError: one_argument() got an unexpected keyword argument 'question'"]),  # every column is passed
    ("[rewards_for_tests:contains_digit, broken_rewards:batched_raises]", [],
     ["task.reward[1]: broken_rewards:batched_raises raised RuntimeError('cannot score 8 completions')",
      "(fn(completions, answers, **meta), batched)", "in batched_raises"]),
    ("broken_rewards:hangs", ["task.reward_timeout_s=0.5"],
     ["task.reward[0]: broken_rewards:hangs timed out after 0.5 s (task.reward_timeout_s) on 8 of 8 sample rows",
      "raise task.reward_timeout_s"]),
])
def test_dry_run_fails_on_a_reward_that_fails_on_a_sample(tmp_path, tiny_model_dir, out, no_weights, reward, extra,
                                                          expected):
    rc = commands.main(_file_task_args(tmp_path, tiny_model_dir, f"task.reward={reward}", *extra, "--dry-run"))
    text = out()
    assert rc == 2 and "config is valid" not in text, text
    for part in expected:
        assert part in text, (part, text)
    assert not (tmp_path / "run").exists()


def test_dry_run_warns_of_a_failing_reward_when_training_would_never_stop(tmp_path, tiny_model_dir, out, no_weights):
    # task.max_reward_failure_frac=1 tells training to score failures 0 and go on: the dry run says what failed,
    # with its traceback, as a warning, and does not refuse; below 1 it refuses (the test above)
    rc = commands.main(_file_task_args(tmp_path, tiny_model_dir, "task.reward=broken_rewards:divides_by_zero",
                                  "task.max_reward_failure_frac=1", "--dry-run"))
    text = out()
    assert rc == 0, text
    assert ("task.reward[0]: warning: broken_rewards:divides_by_zero failed on 8 of 8 sample rows (train.jsonl:1, "
            "train.jsonl:2,") in text
    assert "ZeroDivisionError: division by zero" in text and "training scores such samples 0" in text


# ----------------------------------------------------------------------------------------------------------------
# messages (issue 10, item 9)


def test_yaml_error_keeps_brackets_and_names_the_file(tmp_path, out, no_work):
    bad = tmp_path / "bad.yaml"
    bad.write_text("run:\n  plugins: [myplug, other]: 1\n")
    rc = commands.main(["train", str(bad), "--dry-run"])
    text = out()
    assert rc == 2
    assert "plugins: [myplug, other]: 1" in text  # not eaten as console markup
    assert f'in "{bad}", line 2, column 27' in text and "<unicode string>" not in text


def test_error_messages_are_printed_as_text_not_markup(tmp_path, out, no_work):
    rc = commands.main(["train", str(QUICKSTART), "task.name=file", f"task.path={tmp_path / '[bold]x.jsonl'}",
                   "--dry-run"])
    assert rc == 2
    assert "[bold]x.jsonl" in out()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the error raised without a GPU")
def test_train_cuda_without_a_gpu_is_one_line(tmp_path, out, no_work):
    rc = commands.main(["train", str(QUICKSTART), "model.device=cuda", f"run.out_dir={tmp_path / 'run'}"])
    text = out()
    assert rc == 2
    last = text.strip().splitlines()[-1]  # after the config's summary, one line
    assert last.startswith("config error: model.device='cuda' but no CUDA device is available"), text
    assert "Traceback" not in text and not (tmp_path / "run").exists()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the error raised without a GPU")
def test_eval_device_cuda_without_a_gpu_is_one_line(tiny_model_dir, tmp_path, monkeypatch, out):
    monkeypatch.chdir(tmp_path)
    rc = commands.main(["eval", "--model", str(tiny_model_dir), "--device", "cuda", "--n", "1", "--k", "1",
                   "--task-opt", "eval_size=2", "--task-opt", "train_size=2"])
    assert rc == 2
    assert "no CUDA device is available" in out() and "--device cpu" in out()


def test_inference_time_ead_schedule_is_the_training_table_at_decay_d():
    """`explorl eval --schedule ead --schedule-opt d0=D` samples token t at EAD's tau_t with d = D (EAD section
    5.4): 1.0 for t < c = 10, then max(1 + 1.2 - exp(t / D), 0.1), times --temperature. The schedule's request
    (`PromptTemperature`) says it, as a training step's plan does."""
    from explorl.rollout import temperature as Tm

    assert inference_schedule(None, 0.7, 32) == PromptTemperature(0.7)  # the default schedule: --temperature
    assert inference_schedule("fixed", 0.7, 32) == PromptTemperature(0.7)
    ead = inference_schedule("ead", 0.5, 64, {"d0": 40.0})
    assert ead.temperature == 0.5 and ead.anneal["schedule"] == "ead" and ead.anneal["step"] == 0
    fn = ead.table(64)
    for t in (0, 9, 10, 20, 63):
        want = (1.0 if t < 10 else max(1 + 1.2 - math.exp(t / 40.0), 0.1)) * 0.5
        assert float(fn[t]) == pytest.approx(want, rel=1e-6), t
        assert float(fn[t]) == pytest.approx(float(Tm.ead(t, 0, Tm.EADOptions(d0=40.0))) * 0.5, rel=1e-6)
    rev = inference_schedule("revead", 1.0, 64, {"d0": 25.0}).table(64)  # RevEAD reads EAD's options
    assert float(rev[30]) == pytest.approx(min(0.1 + math.exp(30 / 25.0), 1.2))
    with pytest.raises(SystemExit, match="--schedule-opt.*sampling.ead.d0"):
        inference_schedule("ead", 1.0, 64, {"d0": 0.0})
    with pytest.raises(SystemExit, match="--schedule-opt.*sampling.ead.d00"):
        inference_schedule("ead", 1.0, 64, {"d00": 5})
    # a schedule that adapts during training has no inference-time meaning
    with pytest.raises(SystemExit, match="--schedule e3: not a schedule that samples without training.*ead"):
        inference_schedule("e3", 1.0, 64)


def test_eval_with_an_inference_schedule_records_it(tmp_path, out):
    model_dir = make_tiny_model(tmp_path / "model")
    dest = tmp_path / "ead.json"
    rc = commands.main(["eval", "--model", str(model_dir), "--task", "arith", "--n", "4", "--k", "1,2,4",
                        "--limit", "3", "--max-new-tokens", "16", "--device", "cpu", "--task-opt", "train_size=8",
                        "--task-opt", "eval_size=8", "--schedule", "ead", "--schedule-opt", "d0=10", "--analyze",
                        "--out", str(dest)])
    assert rc == 0, out()
    result = json.loads(dest.read_text())
    assert result["schedule"] == "ead" and result["schedule_options"] == {"d0": 10}
    assert result["settings"]["schedule"] == {"value": "ead, d0 = 10", "from": "--schedule"}
    assert {"maj@1", "maj@2", "maj@4", "pass@4"} <= set(result)  # maj@N and pass@N against N
    assert result["branching"] >= 1.0  # branching factor under the per-token temperatures


def test_python_dash_m_and_version():
    from explorl import __version__

    res = subprocess.run([sys.executable, "-m", "explorl", "--version"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == f"explorl {__version__}"
    res = subprocess.run([sys.executable, "-m", "explorl", "train", "--help"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0 and "--dry-run" in res.stdout


def test_an_evaluation_whose_rewards_fail_says_so_and_fails_when_most_do(tmp_path, out):
    model_dir = make_tiny_model(tmp_path / "model")
    base = ["eval", "--model", str(model_dir), "--task", "arith", "--n", "2", "--k", "1", "--limit", "3",
            "--max-new-tokens", "8", "--device", "cpu", "--task-opt", "train_size=8", "--task-opt", "eval_size=8"]
    rc = commands.main([*base, "--task-opt", "reward=broken_rewards:divides_by_zero",
                        "--out", str(tmp_path / "a.json")])
    said = out()
    assert rc == 1, said
    assert "most reward calls failed: 6 of 6 reward calls failed" in said and "ZeroDivisionError" in said
    assert "'broken_rewards:divides_by_zero' (from --task-opt reward)" in said
    assert json.loads((tmp_path / "a.json").read_text())["errors"] == 6  # the record is still written
    # one function of two failing on every sample: half the calls, a warning, exit 0
    rc = commands.main([*base, "--task-opt", "reward=[rewards_for_tests:contains_digit,broken_rewards:divides_by_zero]",
                   "--out", str(tmp_path / "b.json")])
    assert rc == 0 and "warning: 6 of 12 reward calls failed" in out()
