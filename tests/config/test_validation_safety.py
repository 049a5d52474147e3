"""Issue 39 item 7: every number is checked for finiteness and range with the error naming that field, a YAML key
written twice is refused with both lines, and a training set smaller than a batch is warned about (dry run and
start); a property test over overrides: every refusal names the field, and nothing is written before validation
passes."""

from __future__ import annotations

import functools
import io
import math
import re
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console

from explorl import commands
from explorl.config import ConfigError, load_config, reference


def err(overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    return str(e.value)


@pytest.mark.parametrize("overrides, field", [
    (["optim.lr=inf"], "optim.lr"),  # the issue: passed --dry-run (nan was refused)
    (["optim.lr=.inf"], "optim.lr"),
    (["task.reward_timeout_s=inf"], "task.reward_timeout_s"),
    (["algo.kl_clamp=inf"], "algo.kl_clamp"),
    (["algo.eps_high=inf"], "algo.eps_high"),
    (["task.reward_weights=[1, -inf]"], "task.reward_weights[1]"),
    (["algo.advantage=erpo", "algo.erpo.eta=inf"], "algo.erpo.eta"),  # a method's options too
    (["run.batch_size=-1"], "run.batch_size"),  # the issue: blamed on algo.mini_batches
    (["run.batch_size=0"], "run.batch_size"),
    (["run.save_every=-1"], "run.save_every"),
    (["run.keep_checkpoints=0"], "run.keep_checkpoints"),
    (["run.eval_every=-2"], "run.eval_every"),
    (["run.log_samples=-1"], "run.log_samples"),
    (["run.max_nonfinite_steps=0"], "run.max_nonfinite_steps"),
    (["run.seed=-1"], "run.seed"),
    (["task.eval_size=0"], "task.eval_size"),
    (["optim.beta2=1"], "optim.beta2"),
    (["optim.weight_decay=-0.1"], "optim.weight_decay"),
    (["algo.adv_eps=-1e-6"], "algo.adv_eps"),
    (["rft.epochs=0"], "rft.epochs"),
    (["rft.lr=0"], "rft.lr"),
    (["model.lora.enabled=true", "model.lora.dropout=1"], "model.lora.dropout"),
])
def test_each_number_is_checked_and_the_error_names_it(overrides, field):
    assert err(overrides).startswith(f"{field}:")


def test_a_yaml_key_written_twice_is_refused_with_both_lines(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("run:\n  steps: 3\n  batch_size: 4\noptim: {lr: 1.0e-4}\nrun:\n  seed: 2\n")
    with pytest.raises(ConfigError, match=r"^run: written twice in .*c.yaml \(lines 1 and 5\)"):
        load_config(config)
    config.write_text("run:\n  steps: 3\n  seed: 1\n  steps: 30\n")
    with pytest.raises(ConfigError, match=r"^run.steps: written twice in .*c.yaml \(lines 2 and 4\)"):
        load_config(config)
    # a merge's keys may be overridden: that is what YAML merges are for
    config.write_text("defaults: &d {lr: 1.0e-4, grad_clip: 0.5}\noptim: {<<: *d, lr: 2.0e-4}\n")
    with pytest.raises(ConfigError, match="unknown key 'defaults'"):  # (no such section) but no duplicate refused
        load_config(config)


def _console():
    buf = io.StringIO()
    return Console(file=buf, width=400, force_terminal=False), buf


def test_a_training_set_smaller_than_a_batch_is_warned_about_in_the_dry_run_and_at_the_start(tiny_model_dir,
                                                                                           tmp_path, monkeypatch):
    config = tmp_path / "c.yaml"
    config.write_text(f"model: {{path: {tiny_model_dir}}}\n")
    small = [f"run.out_dir={tmp_path / 'run'}", "task.train_size=1", "run.batch_size=8", "run.steps=1",
             "sampling.group_size=2", "sampling.max_new_tokens=4", "task.eval_size=2", "run.eval_n=1",
             "run.eval_k=[1]", "task.reward=rewards_for_tests:contains_digit", "task.difficulties=[1]"]
    console, buf = _console()
    monkeypatch.setattr(commands.common, "console", console)
    assert commands.main(["train", str(config), *small, "--dry-run"]) == 0
    said = " ".join(buf.getvalue().split())
    assert "run.batch_size: warning: run.batch_size=8 is larger than the training split (1 problem)" in said, said
    assert not (tmp_path / "run").exists()
    from explorl.train.loop import train

    console, buf = _console()
    train(load_config(config, small), console=console, progress=False)
    said = " ".join(buf.getvalue().split())
    assert "warning: run.batch_size=8 is larger than the training split (1 problem): every step repeats each " \
           "prompt about 8 times" in said, said


# ----------------------------------------------------------------------------------- the property over overrides


NUMERIC = [name for name, kind, *_ in reference() if kind in ("int", "float", "int or null", "float or null")]
"""Every numeric field, the methods' options included (`explorl config` lists them)."""


def _selecting(field: str) -> list[str]:
    """The overrides that select the method whose option `field` is (none for a core field), and a behaviour policy
    other than the optimised one for importance weights (which are refused where every weight would be 1)."""
    from explorl.algos.registry import SECTIONS, SELECTED_BY, entries

    section, *rest = field.split(".")
    if len(rest) < 2:
        return []
    for kind, sec in SECTIONS.items():
        entry = entries(kind).get(rest[0]) if sec == section else None
        if entry is not None:
            if kind in ("shaper", "reward_shaper"):
                return [f"{SELECTED_BY[kind]}=[{rest[0]}]"]
            return [f"{SELECTED_BY[kind]}={rest[0]}"] + (["sampling.schedule=ead"] if kind == "importance_weights"
                                                          else [])
    return []


@functools.lru_cache(maxsize=None)
def _refused_alone(selecting: tuple[str, ...]) -> bool:
    """Whether selecting the method at its defaults is refused already (a method the engines cannot run yet,
    refused by name whatever its options): its options' refusals cannot be told apart from it."""
    try:
        load_config(None, list(selecting))
    except ConfigError:
        return True
    return False


VALUES = st.one_of(
    st.sampled_from(["inf", "-inf", ".inf", "nan", "0", "-1", "1", "2", "0.5", "1e300", "-1e-9", "abc", "[]",
                     "null", "1000000000000000000000"]),
    st.integers(min_value=-10**6, max_value=10**6).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)

# a single override refused for another field's sake: the check that relates them is the other field's, and its
# message names the overridden one (e.g. run.eval_n=1 leaves the default run.eval_k = [1, 8] out of range)
RELATED = {"run.eval_n": ("run.eval_k",), "sampling.group_size": ("algo.mini_batches",),
           "sampling.max_new_tokens": ("algo.dapo_overlong.buffer",)}


class _Reached(Exception):
    """The command got past validation (to the checks of its inputs)."""


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(NUMERIC), value=VALUES)
def test_every_refusal_names_the_field_and_nothing_is_written_first(field, value):
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as mp:
        tmp = Path(tmp)
        config = tmp / "c.yaml"
        config.write_text("run: {steps: 2}\n")
        out_dir = tmp / "run"
        console, buf = _console()
        mp.setattr(commands.common, "console", console)
        import explorl.train.preflight

        def reached(*args, **kwargs):  # past validation: nothing may be written yet
            assert sorted(p.name for p in tmp.iterdir()) == ["c.yaml"]
            raise _Reached

        mp.setattr(explorl.train.preflight, "check_run_inputs", reached)
        override = f"{field}={value}"
        if _refused_alone(tuple(_selecting(field))):
            return
        try:
            rc = commands.main(["train", str(config), *_selecting(field), override, f"run.out_dir={out_dir}"])
        except _Reached:
            rc = None
        assert sorted(p.name for p in tmp.iterdir()) == ["c.yaml"]  # validation writes nothing, pass or fail
        try:
            number = float(value)
        except ValueError:
            number = 0.0
        if not math.isfinite(number) and value not in ("1e300",):
            assert rc == 2, f"{override} was accepted"  # no setting means infinity
        if rc is None:
            return
        said = " ".join(buf.getvalue().split())
        assert rc == 2 and said.startswith("config error: "), said
        message = said[len("config error: "):]
        blamed = re.match(r"[A-Za-z_][\w.]*", message)
        owner, leaf = field.rsplit(".", 1)
        named = re.search(rf"\b{re.escape(field)}\b", message) or (  # a method's check may name `owner` once
            message.startswith(owner) and re.search(rf"\b{re.escape(leaf)}\b", message))
        assert blamed is not None and named, f"{override} was refused without naming {field}: {message}"
        if not _selecting(field):  # a core field's own check blames it first (a method's check may name several)
            assert blamed.group() == field or (blamed.group() in RELATED.get(field, ())), \
                f"{override} was refused naming {blamed.group()!r}: {message}"
