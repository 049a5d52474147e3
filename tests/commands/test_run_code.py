"""A run directory from someone else (issue 56): the code its config.yaml names (a planted module imported through
`run.plugins` + `run.python_path`, a reward `module:function`) runs on `explorl train --resume RUN` and `explorl eval
--model RUN` only when the command names it too; a refused resume leaves the directory byte-identical; `--dry-run`
refuses what the real run refuses (a changed model's fingerprint, an out_dir explorl did not make), with the same
message and exit code; `explorl eval --config FILE` takes its settings from a file of the user's."""

from __future__ import annotations

import hashlib
import io
import shlex
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch
import yaml
from rich.console import Console
from safetensors.torch import save_file

from explorl import commands
from explorl.config import dump_yaml, load_config
from explorl.models import weights_fingerprint
from explorl.rewards.sandbox import close_shared_pools

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"
SMALL = ["task.train_size=8", "task.eval_size=2", "sampling.max_new_tokens=4", "run.eval_n=1", "run.eval_k=[1]"]


@pytest.fixture
def out(monkeypatch):
    """What the CLI prints, as one line of words (`out()`)."""
    buf = io.StringIO()
    monkeypatch.setattr(commands.common, "console", Console(file=buf, width=1000, color_system=None, highlight=False))
    return lambda: " ".join(buf.getvalue().split())


@pytest.fixture
def clean_imports(monkeypatch):
    """sys.path as it was after the test, and no reward worker started with a run's directory on it."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    close_shared_pools()
    yield
    close_shared_pools()


@pytest.fixture
def no_training(monkeypatch):
    """Fail the test if `explorl train` gets as far as training (or `explorl sft` as fine-tuning)."""
    import explorl.finetune.sft
    import explorl.train.loop

    def boom(*a, **k):
        raise AssertionError("the command started training")

    monkeypatch.setattr(explorl.train.loop, "train", boom)
    monkeypatch.setattr(explorl.finetune.sft, "run_sft", boom)


def _hashes(run: Path) -> dict[str, str]:
    """Every entry of `run`, with its bytes' hash (a directory: `dir`)."""
    return {str(p.relative_to(run)): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run.rglob("*"))}


def _run(tmp_path: Path, model_dir: Path, *overrides: str, code: bool = False, final: bool = False) -> Path:
    """A run explorl made (config.yaml with the model's fingerprint, metrics.jsonl, an empty .lock, a checkpoint
    directory), on the quickstart's arith task made small. With `code`, `evilplug_*.py` and `evilreward_*.py`
    planted in it, each writing a marker file when imported (`tmp_path/plugin_ran`, `tmp_path/reward_ran`), and
    named by its config.yaml (run.plugins + run.python_path, task.reward); with `final`, the model as its final/."""
    run = tmp_path / "run"
    run.mkdir()
    cfg = load_config(QUICKSTART, [f"model.path={model_dir}", f"run.out_dir={run}", *SMALL, *overrides])
    cfg.model.fingerprint = weights_fingerprint(model_dir)
    data = yaml.safe_load(dump_yaml(cfg))
    if code:
        tag = uuid.uuid4().hex[:8]  # a module name of its own: an import in another test is not this one's
        (run / f"evilplug_{tag}.py").write_text(f"open({str(tmp_path / 'plugin_ran')!r}, 'w').write('ran')\n")
        (run / f"evilreward_{tag}.py").write_text(f"open({str(tmp_path / 'reward_ran')!r}, 'w').write('ran')\n"
                                                  f"def score(completion, answer, **meta):\n    return 1.0\n")
        data["run"].update(plugins=[f"evilplug_{tag}"], python_path=[str(run)])
        data["task"]["reward"] = f"evilreward_{tag}:score"
    (run / "config.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    (run / "metrics.jsonl").write_text("")
    (run / ".lock").write_text("")
    ckpt = run / "checkpoints" / "step_0000002"
    ckpt.mkdir(parents=True)
    # whole files (the checks before a resume read their headers), never loaded by these tests
    save_file({"x": torch.zeros(1)}, str(ckpt / "trainable.safetensors"))
    torch.save({"optimizer": {}, "scheduler": {}}, ckpt / "trainer_state.pt")
    if final:
        shutil.copytree(model_dir, run / "final")
    return run


def _ran(tmp_path: Path) -> set[str]:
    return {m for m in ("plugin_ran", "reward_ran") if (tmp_path / m).exists()}


def _error(text: str) -> str:
    """The error the CLI printed (from `error:` or `config error:` on)."""
    return text[text.index("error: ") + len("error: "):]


# ----------------------------------------------------------------------------------------------------------------
# the code a run names


@pytest.mark.parametrize("command", ["train", "sft"])
def test_a_resume_refuses_the_code_its_run_names_before_importing_or_writing(command, tmp_path, tiny_model_dir, out,
                                                                             clean_imports, no_training):
    run = _run(tmp_path, tiny_model_dir, code=True)
    before = _hashes(run)
    for dry in ([], ["--dry-run"]):
        assert commands.main([command, "--resume", str(run), "run.steps=3", *dry]) == 2
        said = out()
        assert "names code to run: run.plugins: [evilplug_" in said and "task.reward: evilreward_" in said, said
        assert f"run.python_path: [{run}]" in said and "not trusted to run code" in said
        assert f"repeat them on the command line: explorl {command} --resume {run} run.steps=3 " in said
    assert _ran(tmp_path) == set()  # neither module was imported
    assert _hashes(run) == before


def test_a_resume_that_repeats_the_code_on_the_command_line_runs_it(tmp_path, tiny_model_dir, out, clean_imports,
                                                                    no_training):
    run = _run(tmp_path, tiny_model_dir, code=True)
    assert commands.main(["train", "--resume", str(run)]) == 2
    said = out()
    line = shlex.split(said[said.index("repeat them on the command line: ") + 33:])
    assert line[:4] == ["explorl", "train", "--resume", str(run)] and len(line) == 7, line  # the three settings
    assert commands.main([*line[1:], "--dry-run"]) == 0, out()
    assert _ran(tmp_path) == {"plugin_ran", "reward_ran"}  # imported: the dry run checks the plugin and the reward


def test_a_base_file_beside_the_run_cannot_turn_remote_code_on(tmp_path, out, no_training):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("")
    (run / "remote.yaml").write_text("model: {path: embedded, trust_remote_code: true}\n")
    (run / "config.yaml").write_text("base: remote.yaml\n")
    assert commands.main(["train", "--resume", str(run), "--dry-run"]) == 2
    assert "Add model.trust_remote_code=true to the command" in out()


def test_explorls_own_rewards_are_not_code_of_the_run(tmp_path, tiny_model_dir, out, no_training):
    run = _run(tmp_path, tiny_model_dir, "task.reward=[math, chain]")
    assert commands.main(["train", "--resume", str(run), "--dry-run"]) == 0, out()


def test_eval_of_a_run_runs_its_code_only_when_the_flags_name_it(tmp_path, tiny_model_dir, out, clean_imports):
    run = _run(tmp_path, tiny_model_dir, code=True, final=True)
    argv = ["eval", "--model", str(run), "--n", "1", "--k", "1", "--limit", "2", "--device", "cpu",
            "--out", str(tmp_path / "e.json")]
    assert commands.main(argv) == 2
    said = out()
    assert _ran(tmp_path) == set() and not (tmp_path / "e.json").exists()
    flags = said[said.index("add to the command: ") + 20:said.index("; or evaluate with")]
    assert flags.startswith("--plugin evilplug_") and f"--python-path {run} --task-opt reward=evilreward_" in flags
    assert commands.main([*argv, *shlex.split(flags)]) == 0, out()
    assert _ran(tmp_path) == {"plugin_ran", "reward_ran"} and (tmp_path / "e.json").exists()


@pytest.mark.parametrize("command", ["probe", "frontier", "config"])
def test_the_other_commands_that_read_a_run_refuse_its_code_too(command, tmp_path, tiny_model_dir, out,
                                                                 clean_imports):
    run = _run(tmp_path, tiny_model_dir, code=True, final=True)
    argv = {"probe": ["probe", "position", "--model", str(run), "--out", str(tmp_path / "p.json")],
            "frontier": ["frontier", str(run / "final"), "--out", str(tmp_path / "f")],
            "config": ["config", str(run / "config.yaml"), "--explain"]}[command]
    assert commands.main(argv) == 2
    assert "names code to run" in out() and _ran(tmp_path) == set()
    if command != "config":  # they read rewards of yours (--task-opt), not plugins: `eval` is named for those
        assert f"explorl {command} has no flag to trust them; `explorl eval --model` has" in out()


def test_eval_with_a_config_of_ones_own_reads_only_the_model_of_the_run(tmp_path, tiny_model_dir, out, clean_imports):
    from explorl.evaluation.settings import resolve_eval_settings

    run = _run(tmp_path, tiny_model_dir, code=True, final=True)
    mine = tmp_path / "mine.yaml"
    mine.write_text("task: {name: arith, eval_size: 3, prompt_template: 'Q: {question} A='}\n"
                    "sampling: {max_new_tokens: 5, top_p: 0.9}\nrun: {eval_temperature: 0.7}\n")
    for model in (str(tiny_model_dir), str(run / "final")):
        s = resolve_eval_settings(model, config=mine)
        rows = {name: (value, where) for name, value, where in s.settings}
        assert rows["prompt template"] == ("Q: {question} A=", "--config: task.prompt_template")
        assert rows["max_new_tokens"] == (5, "--config: sampling.max_new_tokens")
        assert (s.temperature, s.top_p, len(s.problems), s.config_path) == (0.7, 0.9, 3, mine)
    assert s.run is not None and s.run_cfg.model.fingerprint == weights_fingerprint(tiny_model_dir)
    assert _ran(tmp_path) == set()  # the run's config.yaml gave the model only: its code was never imported
    rc = commands.main(["eval", "--model", str(tiny_model_dir), "--config", str(mine), "--n", "1", "--k", "1",
                        "--device", "cpu", "--out", str(tmp_path / "e.json")])
    assert rc == 0 and f"eval settings (config: {mine}; flags override it)" in out()


# ----------------------------------------------------------------------------------------------------------------
# a refused resume writes nothing; the dry run refuses what the real run refuses


def _other_model(tmp_path: Path) -> Path:
    """Another tiny Qwen2 (seed 1): the same architecture, other weights."""
    from explorl.models import TinyQwen2Sizes, build_char_tokenizer, tiny_qwen2

    tok = build_char_tokenizer()
    model = tiny_qwen2(len(tok), TinyQwen2Sizes(hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64), seed=1,
                       pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    model.save_pretrained(tmp_path / "other")
    tok.save_pretrained(tmp_path / "other")
    return tmp_path / "other"


def _locked_by_another_process(run: Path):
    """A process holding RUN/.lock (with its pid, host and start time in it, as a run writes them)."""
    code = ("import fcntl, json, os, socket, sys, time\n"
            f"fd = os.open({str(run / '.lock')!r}, os.O_RDWR)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "os.write(fd, json.dumps({'pid': os.getpid(), 'host': socket.gethostname(), 'started': 'now'}).encode())\n"
            "print('locked', flush=True)\ntime.sleep(120)\n")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    return holder


@pytest.mark.parametrize("case", ["model changed", "locked", "lora changed", "code"])
def test_a_refused_resume_leaves_the_run_directory_byte_identical(case, tmp_path, tiny_model_dir, out, clean_imports,
                                                                  no_training):
    lora = ["model.lora.enabled=true", "model.lora.target_modules=[q_proj, v_proj]", "model.lora.rank=4"]
    run = _run(tmp_path, tiny_model_dir, *(lora if case == "lora changed" else []), code=case == "code")
    extra = {"model changed": [f"model.path={_other_model(tmp_path)}"], "lora changed": ["model.lora.rank=8"]}
    holder = _locked_by_another_process(run) if case == "locked" else None
    try:
        before = _hashes(run)
        assert commands.main(["train", "--resume", str(run), *extra.get(case, [])]) == 2
        real = _error(out())
        assert _hashes(run) == before, case  # config.yaml, config_history.jsonl and .lock untouched
        expected = {"model changed": "model.fingerprint: the config was made with the weights",
                    "locked": f"{run} is in use by another explorl run (pid {holder.pid if holder else ''} on host",
                    "lora changed": "model.lora.rank 4 -> 8: ", "code": "names code to run"}[case]
        assert expected in real, real
        # the dry run: the same refusal, the same exit code
        assert commands.main(["train", "--resume", str(run), *extra.get(case, []), "--dry-run"]) == 2
        assert out().count(real) == 2, out()
        assert _hashes(run) == before
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()
    assert not (run / "config_history.jsonl").exists() and _ran(tmp_path) == set()


def test_a_dry_run_into_a_directory_explorl_did_not_make_fails_as_the_run_would(out, no_training):
    theirs = ROOT / "src" / "explorl"  # the issue's: the package's own source directory
    for dry in (["--dry-run"], []):
        assert commands.main(["train", str(QUICKSTART), f"run.out_dir={theirs}", *dry]) == 2
        assert f"run.out_dir {theirs} is a directory explorl did not make (it holds __init__.py" in out()
