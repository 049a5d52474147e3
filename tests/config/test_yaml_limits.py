"""Reading a config file someone else wrote is bounded (issue 56, item 6): a file over 1 MiB, nesting past 64 levels,
aliases that expand to more than 100,000 values, or an alias inside its own anchor are refused with a ConfigError
naming the file and the limit, before YAML composes or builds anything; an error quotes a value at most 200
characters long; a JSONL line of nested brackets is a damaged line, not a RecursionError."""

from __future__ import annotations

import time

import pytest

from explorl.config import ConfigError, load_config
from explorl.config.files import MAX_CONFIG_BYTES, MAX_CONFIG_DEPTH, MAX_CONFIG_VALUES
from explorl.config.schema import SHOWN_CHARS, short_repr


def _alias_bomb(levels: int = 9) -> str:
    """The "billion laughs" under `run.eval_sets`: level k is ten aliases of level k - 1, so 10**levels values."""
    lines = ["run:", "  eval_sets:", "    l0: &l0 [x, x, x, x, x, x, x, x, x, x]"]
    for k in range(1, levels):
        lines.append(f"    l{k}: &l{k} [" + ", ".join([f"*l{k - 1}"] * 10) + "]")
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_at_once_with_a_short_message(tmp_path):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(_alias_bomb())  # 10**9 values once expanded; today's main hangs on it
    start = time.monotonic()
    with pytest.raises(ConfigError) as e:
        load_config(bomb)
    assert time.monotonic() - start < 2
    message = str(e.value)
    assert str(bomb) in message and f"{MAX_CONFIG_VALUES:,} values" in message and "alias" in message
    assert len(message) < 500, message  # nothing of the expanded value is printed


def test_a_50_mb_file_is_refused_by_its_size_before_it_is_parsed(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("run:\n  out_dir: " + "a" * (50 * 2**20) + "\n")
    start = time.monotonic()
    with pytest.raises(ConfigError, match=r"52,428,\d+ bytes, more than a config file may be \(1,048,576 bytes"):
        load_config(big)
    assert time.monotonic() - start < 2
    assert MAX_CONFIG_BYTES == 2**20


@pytest.mark.parametrize("text", ["a: " + "[" * 100_000 + "]" * 100_000 + "\n",
                                  "".join(" " * i + f"k{i}:\n" for i in range(300)) + " " * 300 + "v: 1\n"],
                         ids=["flow", "block"])
def test_deep_nesting_is_refused_without_a_recursion_error(tmp_path, text):
    deep = tmp_path / "deep.yaml"
    deep.write_text(text)
    with pytest.raises(ConfigError, match=rf"{deep}: nested more than {MAX_CONFIG_DEPTH} levels deep \(line \d+\)"):
        load_config(deep)


def test_an_alias_inside_its_own_anchor_is_refused(tmp_path):
    loop = tmp_path / "loop.yaml"
    loop.write_text("run: &r {eval_sets: *r}\n")  # PyYAML builds a dict that contains itself
    with pytest.raises(ConfigError, match=r"alias \*r is used inside its own anchor &r"):
        load_config(loop)


def test_ordinary_anchors_merges_and_errors_still_read_as_before(tmp_path):
    ok = tmp_path / "ok.yaml"
    ok.write_text("run: {steps: &n 2, save_every: *n, batch_size: 2}\noptim: {<<: {warmup_steps: 3}, lr: 0.1}\n")
    cfg = load_config(ok)
    assert cfg.optim.warmup_steps == 3 and cfg.run.steps == 2 and cfg.run.save_every == 2
    dup = tmp_path / "dup.yaml"
    dup.write_text("run:\n  steps: 1\n  steps: 2\n")
    with pytest.raises(ConfigError, match=r"run.steps: written twice .* \(lines 2 and 3\)"):
        load_config(dup)
    bad = tmp_path / "bad.yaml"
    bad.write_text("run: [1, 2\n")
    with pytest.raises(ConfigError, match=rf"(?s){bad}: not valid YAML: .*in \"{bad}\", line 1"):
        load_config(bad)


def test_a_quoted_value_is_cut_to_200_characters():
    assert short_repr("abc") == "'abc'"
    long = short_repr("x" * 10_000)
    assert len(long) < SHOWN_CHARS + 30 and long.endswith("... (10002 characters)")
    with pytest.raises(ConfigError) as e:
        load_config(None, ["model.device=" + "x" * 10_000])
    assert "model.device: 'xxx" in str(e.value) and len(str(e.value)) < 400
    with pytest.raises(ConfigError) as e:
        load_config(None, ["task.answer_pattern=(" + "a" * 10_000])
    assert "is not a regular expression" in str(e.value) and len(str(e.value)) < 500


def test_a_jsonl_line_of_nested_brackets_is_a_damaged_line(tmp_path):
    from explorl.runs.jsonl import read_jsonl

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1}\n' + "[" * 100_000 + "]" * 100_000 + '\n{"step": 2}\n')
    with pytest.raises(ValueError, match=rf"{metrics}:2: not a JSON record .*damaged"):
        read_jsonl(metrics)


def test_a_long_value_is_quoted_short_wherever_a_config_error_names_it(tmp_path):
    """Issue 56 item 6: an error message printed the whole value (a megabyte of YAML was a megabyte of message);
    every message that quotes a value cuts it to SHOWN_CHARS (type errors, choices, a method's options, a base)."""
    from explorl.config import ConfigError, load_config

    huge = "x" * 500_000
    for override in (f"run.steps={huge}", f"sampling.schedule={huge}", f"task.chat_template={huge}"):
        with pytest.raises(ConfigError) as e:
            load_config(None, [override])
        said = str(e.value)
        assert len(said) < 2 * SHOWN_CHARS + 400 and "(500002 characters)" in said, override.split("=")[0]
    config = tmp_path / "c.yaml"
    config.write_text(f"base: [{huge}]\n")
    with pytest.raises(ConfigError) as e:
        load_config(config)
    assert len(str(e.value)) < 2 * SHOWN_CHARS + 400
