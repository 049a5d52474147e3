"""Prompts the model cannot take are refused before any work (issue 56, item 5): an empty prompt (zero tokens after
the prompt format) and one whose tokens plus `sampling.max_new_tokens` exceed the model's context (the embedded
default's `max_position_embeddings`: 512), in the dry run, when a run starts and in `explorl eval`, naming the
split, the row, the length, the limit and the fixes; every prompt is tokenized, in batches."""

from __future__ import annotations

import json
import time

import pytest

from explorl import commands
from explorl.config import load_config
from explorl.train.preflight import PROMPT_BATCH, check_prompts, check_run_inputs, model_tokenizer

EMBEDDED_CONTEXT = 512  # max_position_embeddings of src/explorl/embedded/config.json


def _rows(path, n: int = 40, **special) -> str:
    """`n` question/answer rows written to `path`; `special` maps a row index to its question."""
    rows = [{"problem": special.get(f"r{i}", f"{i}+1"), "answer": str(i + 1)} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _cfg(tmp_path, *overrides):
    return load_config(None, ["run.steps=1", "run.batch_size=2", "sampling.group_size=2",
                              "sampling.max_new_tokens=16", f"run.out_dir={tmp_path / 'run'}", *overrides])


def test_the_embedded_context_is_512():
    _, hf_config = model_tokenizer(load_config(None).model)
    assert hf_config.max_position_embeddings == EMBEDDED_CONTEXT


def test_an_empty_prompt_is_refused_naming_the_split_row_and_fix(tmp_path):
    data = _rows(tmp_path / "train.jsonl", r5="")
    with pytest.raises(ValueError) as e:
        check_run_inputs(_cfg(tmp_path, "task.name=file", f"task.path={data}", "task.eval_size=8"))
    message = " ".join(str(e.value).split())
    assert message.startswith("task (training split) row 5 (id train.jsonl:6): the prompt is empty (0 tokens"), message
    assert "task.prompt_field" in message and "remove the row" in message
    assert not (tmp_path / "run").exists()


def test_a_prompt_longer_than_the_context_is_refused_with_its_length_and_the_limit(tmp_path):
    # 600 characters of the embedded character tokenizer: 600 tokens, over 512 on its own
    data = _rows(tmp_path / "train.jsonl", r7="1+" * 300)
    with pytest.raises(ValueError) as e:
        check_run_inputs(_cfg(tmp_path, "task.name=file", f"task.path={data}", "task.eval_size=8"))
    message = " ".join(str(e.value).split())
    assert "task (training split) row 7 (id train.jsonl:8): the prompt is 600 tokens" in message, message
    assert "sampling.max_new_tokens=16 that is 616, more than the model's context of 512 tokens" in message
    assert "max_position_embeddings in its config.json; 1 of 32 prompt(s)" in message
    assert "Shorten those prompts or remove their rows" in message and "longer context" in message


def test_a_prompt_that_fits_only_without_the_response_says_how_far_to_lower_it(tmp_path):
    # 500 tokens + 16 new tokens = 516 > 512; held out (the last 8 rows): the held-out split is named
    data = _rows(tmp_path / "train.jsonl", r37="1+" * 250)
    with pytest.raises(ValueError) as e:
        check_run_inputs(_cfg(tmp_path, "task.name=file", f"task.path={data}", "task.eval_size=8"))
    message = " ".join(str(e.value).split())
    assert "task (held-out split) row 5 (id train.jsonl:38): the prompt is 500 tokens" in message, message
    assert "lower sampling.max_new_tokens to at most 12" in message


def test_a_response_longer_than_the_context_is_refused(tmp_path):
    with pytest.raises(ValueError, match="sampling.max_new_tokens=512: a response that long leaves no room"):
        check_run_inputs(_cfg(tmp_path, "sampling.max_new_tokens=512", "task.train_size=64", "task.eval_size=8"))


def test_a_set_of_run_eval_sets_is_checked_and_named(tmp_path):
    held = _rows(tmp_path / "held.jsonl", n=4, r2="")
    cfg = _cfg(tmp_path, "task.train_size=64", "task.eval_size=8",
               f"run.eval_sets={{ood: {{name: file, path: {held}, eval_path: {held}}}}}")
    with pytest.raises(ValueError, match=r"run.eval_sets.ood row 2 \(id held.jsonl:3\): the prompt is empty"):
        check_run_inputs(cfg)


def test_the_dry_run_says_what_it_checked(tmp_path):
    lines = dict(check_run_inputs(_cfg(tmp_path, "task.train_size=64", "task.eval_size=8")))
    assert lines["prompts"].startswith("72 prompts, none empty, the longest ")
    assert lines["prompts"].endswith("with sampling.max_new_tokens=16 within the model's context of 512")


class _Counting:
    """A tokenizer that counts its batch calls."""

    def __init__(self, tok):
        self.tok, self.calls = tok, 0

    def __getattr__(self, name):
        return getattr(self.tok, name)

    def __call__(self, texts, **kw):
        self.calls += 1
        return self.tok(texts, **kw)


def test_thousands_of_prompts_are_tokenized_in_batches_and_fast():
    from explorl.tasks import load_task

    cfg = load_config(None)  # arith: 4096 training and 256 held-out problems
    task = load_task(cfg.task)
    tok, hf_config = model_tokenizer(cfg.model)
    counting = _Counting(tok)
    start = time.monotonic()
    line = check_prompts(counting, hf_config, [("train", task.train, cfg.task), ("eval", task.eval, cfg.task)], 64)
    assert time.monotonic() - start < 5
    assert line.startswith("4352 prompts, none empty")
    assert counting.calls == -(-4096 // PROMPT_BATCH) + 1


@pytest.fixture
def out(monkeypatch):
    import io

    from rich.console import Console

    buf = io.StringIO()
    monkeypatch.setattr(commands.common, "console", Console(file=buf, width=1000, color_system=None, highlight=False))
    return buf.getvalue


def test_eval_refuses_an_overlong_prompt_before_it_samples(tmp_path, out, monkeypatch):
    import explorl.evaluation.evaluate

    def boom(*a, **k):
        raise AssertionError("eval sampled")

    monkeypatch.setattr(explorl.evaluation.evaluate, "evaluate", boom)
    data = _rows(tmp_path / "test.jsonl", n=6, r3="1+" * 300)
    rc = commands.main(["eval", "--task", "file", "--task-opt", f"path={data}", "--n", "2", "--k", "1",
                        "--max-new-tokens", "8", "--device", "cpu", "--out", str(tmp_path / "e.json")])
    text = " ".join(out().split())
    assert rc == 2, text
    assert "the evaluated split row 3 (id test.jsonl:4): the prompt is 600 tokens; with --max-new-tokens=8" in text
    assert not (tmp_path / "e.json").exists()
