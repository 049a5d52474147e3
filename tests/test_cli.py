"""The `explorl` command in-process (`explorl.cli.main`) plus one real subprocess of the console script:
dry runs, errors that name the field, `config` listings, and `eval` on a tiny random model built here."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from rich.console import Console

import explorl.cli as cli
from explorl.config import dump_yaml, load_config, reference

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"


@pytest.fixture
def out(monkeypatch):
    """Capture what the CLI prints to its rich console; call the fixture's value to read it."""
    buf = io.StringIO()
    monkeypatch.setattr(cli, "console", Console(file=buf, width=1000, color_system=None, highlight=False))
    return buf.getvalue


@pytest.fixture
def no_work(monkeypatch):
    """Fail the test if the CLI gets as far as loading a model or training."""
    import explorl.models
    import explorl.trainer

    def boom(*a, **k):
        raise AssertionError("the CLI started real work")

    monkeypatch.setattr(explorl.trainer, "train", boom)
    monkeypatch.setattr(explorl.models, "load_policy", boom)


def make_tiny_model(path: Path) -> Path:
    """A randomly initialised 2-layer Qwen2 with the character tokenizer, saved as a normal HF directory."""
    from explorl.models import build_char_tokenizer, tiny_qwen2

    tok = build_char_tokenizer()
    model = tiny_qwen2(len(tok), hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64,
                       pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


# ----------------------------------------------------------------------------------------------------------------
# train


def test_train_dry_run_prints_config_and_creates_nothing(tmp_path, out, no_work):
    run_dir = tmp_path / "x"
    rc = cli.main(["train", str(QUICKSTART), f"run.out_dir={run_dir}", "sampling.temperature=0.7", "--dry-run"])
    text = out()
    assert rc == 0, text
    assert "resolved config" in text and "config is valid" in text
    assert not run_dir.exists()
    # the printed YAML is the full resolved config
    printed = text[text.index("model:"):text.index("config is valid")]
    data = yaml.safe_load("\n".join(line.rstrip() for line in printed.splitlines()))
    assert data == yaml.safe_load(dump_yaml(load_config(QUICKSTART, [f"run.out_dir={run_dir}",
                                                                     "sampling.temperature=0.7"])))
    assert data["run"]["out_dir"] == str(run_dir) and data["sampling"]["temperature"] == 0.7


def test_train_overrides_after_options(tmp_path, out, no_work):
    rc = cli.main(["train", str(QUICKSTART), "--dry-run", "run.steps=7", f"run.out_dir={tmp_path / 'x'}"])
    assert rc == 0, out()
    assert "steps: 7" in out()
    assert not (tmp_path / "x").exists()


def test_train_unknown_argument_is_rejected(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["train", str(QUICKSTART), "--dry-run", "--bogus"])
    assert e.value.code == 2
    assert "--bogus" in capsys.readouterr().err


def test_train_typo_names_field_and_suggests(out, no_work):
    rc = cli.main(["train", str(QUICKSTART), "sampling.temprature=1", "--dry-run"])
    text = out()
    assert rc == 2
    assert "sampling.temprature" in text
    assert "Did you mean 'sampling.temperature'" in text
    assert "resolved config" not in text


def test_train_invalid_value_fails_before_work(out, no_work):
    # no --dry-run: validation must still stop it before the trainer is reached
    rc = cli.main(["train", str(QUICKSTART), "run.eval_k=[1,16]"])
    assert rc == 2
    assert "run.eval_k" in out() and "eval_n" in out()


def test_train_resume_nonexistent(out, no_work):
    rc = cli.main(["train", "--resume", "/nonexistent/run"])
    text = out()
    assert rc == 2
    assert "--resume" in text and "/nonexistent/run" in text and "config.yaml" in text


def test_train_without_config(out, no_work):
    rc = cli.main(["train"])
    text = out()
    assert rc == 2
    assert "CONFIG" in text and "--resume" in text


def test_train_missing_config_file(tmp_path, out, no_work):
    rc = cli.main(["train", str(tmp_path / "missing.yaml"), "--dry-run"])
    assert rc == 2
    assert "missing.yaml" in out() and "does not exist" in out()


def test_train_resume_dry_run_applies_overrides(tmp_path, out, no_work):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(dump_yaml(load_config(QUICKSTART, [f"run.out_dir={run}"])))
    # argparse puts the first override in the CONFIG slot; it must still be applied
    rc = cli.main(["train", "--resume", str(run), "run.steps=123", "sampling.top_p=0.9", "--dry-run"])
    text = out()
    assert rc == 0, text
    assert "steps: 123" in text and "top_p: 0.9" in text


def test_train_resume_with_config_is_rejected(tmp_path, out, no_work):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(dump_yaml(load_config(None)))
    rc = cli.main(["train", str(QUICKSTART), "--resume", str(run), "--dry-run"])
    assert rc == 2
    assert "not both" in out()


# ----------------------------------------------------------------------------------------------------------------
# config


def test_config_lists_every_field(out):
    assert cli.main(["config"]) == 0
    text = out()
    for name, tp, default, doc in reference():
        assert name in text, name
    assert "grpo" in text and "dr_grpo" in text  # the registered advantage estimators


def test_config_markdown_lists_every_field(capsys):
    assert cli.main(["config", "--markdown"]) == 0
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
        cli.main(["eval", "--model", "/nonexistent", "--k", "1,32", "--n", "16"])
    msg = str(e.value.code)
    assert "k=32" in msg and "--n=16" in msg


@pytest.mark.parametrize("k", ["1,x", "0,1", ","])
def test_eval_bad_k(k, no_work):
    with pytest.raises(SystemExit) as e:
        cli.main(["eval", "--k", k, "--n", "4"])
    assert "--k" in str(e.value.code)


def test_console_script_eval_k_larger_than_n():
    """The installed `explorl` entry point runs and fails clearly (exit != 0, message on stderr)."""
    exe = Path(sys.executable).with_name("explorl")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "explorl.cli"]
    res = subprocess.run([*cmd, "eval", "--model", "/nonexistent", "--k", "1,32", "--n", "16"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert res.returncode != 0
    assert "k=32" in res.stderr and "--n=16" in res.stderr
    assert "Traceback" not in res.stderr and "config.json" not in res.stderr


def test_eval_tiny_model_writes_json(tmp_path, out):
    model_dir = make_tiny_model(tmp_path / "model")
    dest = tmp_path / "tmp" / "eval.json"
    per_problem = tmp_path / "per_problem.jsonl"
    rc = cli.main(["eval", "--model", str(model_dir), "--task", "arith", "--n", "2", "--k", "1,2", "--limit", "4",
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
    rc = cli.main(["eval", "--model", str(tmp_path / "nomodel"), "--n", "2", "--k", "1", "--device", "cpu"])
    assert rc == 2
    assert "config.json" in out()


def test_eval_bad_task_opt_names_field(tmp_path, out, no_work):
    rc = cli.main(["eval", "--model", str(tmp_path), "--n", "2", "--k", "1", "--task-opt", "prompt_feild=q"])
    assert rc == 2
    assert "task.prompt_feild" in out() and "task.prompt_field" in out()


def test_train_dry_run_never_crops_the_config(monkeypatch, tmp_path, no_work):
    """On a narrow terminal (or a pipe: 80 columns) long YAML lines wrap instead of being cut off."""
    buf = io.StringIO()
    monkeypatch.setattr(cli, "console", Console(file=buf, width=60, color_system=None, highlight=False))
    assert cli.main(["train", str(QUICKSTART), "--dry-run"]) == 0
    text = buf.getvalue()
    for name, *_ in reference():
        assert name.split(".")[-1] + ":" in text, name
