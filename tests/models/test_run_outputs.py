"""A run's outputs after training (issue 10, items 3, 4 and 9): `explorl eval` on RUN, RUN/final or a checkpoint
evaluates as the run did (task, template, length limit, held-out split; flags override), LoRA runs' adapter-only
`final/` loads merged into its base, `explorl export --merge` writes a standard Hugging Face directory, and eval
results are named after the run and never overwrite each other."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
import torch
from rich.console import Console

from explorl import commands
from explorl.config import ModelConfig, dump_yaml, load_config
from explorl.models import find_run_output, load_policy, load_run_output, load_tokenizer

TRAIN_ROWS = [{"q": f"{i}+1", "a": str(i + 1)} for i in range(12)]
TEST_ROWS = [{"q": f"{i}+2", "a": str(i + 2)} for i in range(5)]
TEMPLATE = "Q: {question} A="


TRUSTED = ["--task-opt", "reward=rewards_for_tests:contains_digit"]
"""The runs here score with the suite's own reward; `explorl eval` of a run runs its code only when named again
(issue 56), as a user who trusts it would."""


@pytest.fixture
def out(monkeypatch):
    """Capture what the CLI prints; call the fixture's value to read it."""
    buf = io.StringIO()
    monkeypatch.setattr(commands.common, "console", Console(file=buf, width=200, color_system=None, highlight=False))
    return buf.getvalue


def _write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def lora_run(tiny_model_dir, tmp_path_factory):
    """A real two-step LoRA run of the `file` task with a prompt template and a short length limit; its final/ holds
    only the adapter. Learning rate high enough that the adapters move away from their zero start."""
    from explorl.train.loop import train

    root = tmp_path_factory.mktemp("lora_run")
    train_file = _write_jsonl(root / "train.jsonl", TRAIN_ROWS)
    _write_jsonl(root / "test.jsonl", TEST_ROWS)
    cfg = load_config(None, [
        f"model.path={tiny_model_dir}", "model.lora.enabled=true", "model.lora.rank=4", "model.lora.alpha=8",
        "task.name=file", f"task.path={train_file}", "task.eval_size=3", "task.prompt_field=q",
        "task.answer_field=a", f"task.prompt_template={TEMPLATE}", "task.reward=rewards_for_tests:contains_digit",
        "sampling.group_size=4", "sampling.max_new_tokens=6", "run.steps=2", "run.batch_size=3",
        "run.save_every=1", "run.eval_n=2", "run.eval_k=[1]", "optim.lr=0.05", "run.log_samples=0",
        f"run.out_dir={root / 'lorarun'}"])
    return train(cfg, progress=False)


def _logits(model, ids=(5, 17, 40, 33, 12)):
    with torch.no_grad():
        return model(input_ids=torch.tensor([list(ids)])).logits[0].float()


def _peft_reference(base_dir, adapter_dir):
    """The adapter applied by peft itself, unmerged: what a merged load must reproduce."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    return PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(base_dir)), str(adapter_dir)).eval()


def test_lora_final_holds_only_a_trained_adapter_and_loads_merged(lora_run, tiny_model_dir):
    final = lora_run / "final"
    assert (final / "adapter_config.json").exists() and not (final / "config.json").exists()
    model, tok, _ = load_policy(ModelConfig(path=str(final), device="cpu"))
    assert not hasattr(model, "peft_config")  # merged into a plain model
    want = _logits(_peft_reference(tiny_model_dir, final))
    base, _, _ = load_policy(ModelConfig(path=str(tiny_model_dir), device="cpu"))
    assert not torch.allclose(want, _logits(base), atol=1e-4), "the adapters did not move: the test would be vacuous"
    assert torch.allclose(_logits(model), want, atol=1e-5)
    assert tok.encode("Q: 1+1 A=", add_special_tokens=False) == load_tokenizer(tiny_model_dir).encode(
        "Q: 1+1 A=", add_special_tokens=False)


def test_run_outputs_are_found_from_the_run_final_and_checkpoints(lora_run):
    assert find_run_output(lora_run).model_dir == lora_run / "final"
    final = find_run_output(lora_run / "final")
    assert (final.kind, final.run_dir, final.label) == ("final", lora_run, "lorarun_final")
    ckpt = find_run_output(lora_run / "checkpoints" / "step_0000001")
    assert (ckpt.kind, ckpt.label) == ("checkpoint", "lorarun_step_1")
    assert find_run_output(lora_run.parent / "train.jsonl") is None  # anything else is not a run output


def test_checkpoint_loads_the_run_model_with_its_trained_weights(lora_run):
    run_cfg = load_config(lora_run / "config.yaml")
    at = {n: load_run_output(find_run_output(lora_run / "checkpoints" / f"step_000000{n}"), run_cfg, "cpu")[0]
          for n in (1, 2)}
    final, _, _ = load_policy(ModelConfig(path=str(lora_run / "final"), device="cpu"))
    assert not hasattr(at[2], "peft_config")
    assert torch.allclose(_logits(at[2]), _logits(final), atol=1e-5)  # the last checkpoint is the final policy
    assert not torch.allclose(_logits(at[1]), _logits(at[2]), atol=1e-5)  # step 1's weights, not step 2's


def test_eval_of_a_run_final_uses_the_run_template_length_and_split(lora_run, tmp_path, monkeypatch, out):
    monkeypatch.chdir(tmp_path)
    per_problem = tmp_path / "pp.jsonl"
    rc = commands.main(["eval", "--model", str(lora_run / "final"), "--n", "2", "--k", "1", "--device", "cpu",
                   "--per-problem", str(per_problem), *TRUSTED])
    assert rc == 0, out()
    result = json.loads((tmp_path / "runs" / "eval" / "lorarun_final-file.json").read_text())
    assert result["label"] == "lorarun_final" and result["task"] == "file"
    assert result["problems"] == 3 and 0 < result["length"] <= 6
    prompts = [json.loads(line)["prompt"] for line in per_problem.read_text().splitlines()]
    assert prompts == [TEMPLATE.replace("{question}", r["q"]) for r in TRAIN_ROWS[-3:]]  # the run's held-out rows
    settings = result["settings"]
    assert settings["prompt template"] == {"value": TEMPLATE, "from": "run config: task.prompt_template"}
    assert settings["max_new_tokens"] == {"value": 6, "from": "run config: sampling.max_new_tokens"}
    assert "last 3 rows" in settings["eval split"]["value"]
    assert result["run_config"] == str(lora_run / "config.yaml")
    assert result["reward_versions"] == {}  # the task's own checker, which has no versions
    text = out()
    assert "eval settings" in text and str(lora_run / "config.yaml") in text and "run.eval_temperature" in text


def test_eval_flags_override_the_run_and_a_test_file_is_evaluated_whole(lora_run, tmp_path, monkeypatch, out):
    monkeypatch.chdir(tmp_path)
    test_file = lora_run.parent / "test.jsonl"
    per_problem = tmp_path / "pp.jsonl"
    rc = commands.main(["eval", "--model", str(lora_run), "--n", "2", "--k", "1", "--device", "cpu",
                   "--task-opt", f"path={test_file}", "--max-new-tokens", "2", "--temperature", "0.5",
                   "--out", str(tmp_path / "o.json"), "--per-problem", str(per_problem), *TRUSTED])
    assert rc == 0, out()
    result = json.loads((tmp_path / "o.json").read_text())
    # all 5 rows although the run held out eval_size=3 (no "would leave none for training" error), run's template
    assert result["problems"] == 5 and result["length"] <= 2 and result["temperature"] == 0.5
    prompts = [json.loads(line)["prompt"] for line in per_problem.read_text().splitlines()]
    assert prompts == [TEMPLATE.replace("{question}", r["q"]) for r in TEST_ROWS]
    s = result["settings"]
    assert s["eval split"] == {"value": f"all 5 rows of {test_file}", "from": "--task-opt path"}
    assert s["max_new_tokens"] == {"value": 2, "from": "--max-new-tokens"}
    assert s["temperature"] == {"value": 0.5, "from": "--temperature"}
    assert s["prompt template"]["from"] == "run config: task.prompt_template"


def test_eval_of_a_test_file_without_a_run_uses_every_row(tiny_model_dir, lora_run, tmp_path, monkeypatch, out):
    monkeypatch.chdir(tmp_path)
    test_file = lora_run.parent / "test.jsonl"  # 5 rows, fewer than the default task.eval_size of 256
    rc = commands.main(["eval", "--model", str(tiny_model_dir), "--task", "file", "--task-opt", f"path={test_file}",
                   "--task-opt", "prompt_field=q", "--task-opt", "answer_field=a", "--n", "1", "--k", "1",
                   "--max-new-tokens", "3", "--device", "cpu", "--out", str(tmp_path / "o.json")])
    assert rc == 0, out()
    assert json.loads((tmp_path / "o.json").read_text())["problems"] == 5


def test_eval_of_a_checkpoint_is_named_after_run_and_step(lora_run, tmp_path, monkeypatch, out):
    monkeypatch.chdir(tmp_path)
    rc = commands.main(["eval", "--model", str(lora_run / "checkpoints" / "step_0000001"), "--n", "1", "--k", "1",
                   "--device", "cpu", *TRUSTED])
    assert rc == 0, out()
    result = json.loads((tmp_path / "runs" / "eval" / "lorarun_step_1-file.json").read_text())
    assert result["label"] == "lorarun_step_1" and result["problems"] == 3
    assert "lorarun_step_1" in out()  # the table row


def test_export_merge_writes_a_standard_model_directory(lora_run, tiny_model_dir, tmp_path, out):
    from transformers import AutoModelForCausalLM

    dest = tmp_path / "merged"
    assert commands.main(["export", str(lora_run), "--merge", "--out", str(dest)]) == 0, out()
    assert (dest / "config.json").exists() and not (dest / "adapter_config.json").exists()
    model = AutoModelForCausalLM.from_pretrained(str(dest)).eval()
    assert torch.allclose(_logits(model), _logits(_peft_reference(tiny_model_dir, lora_run / "final")), atol=1e-5)
    text = " 12+ 3=?\n\\boxed{15}"
    assert load_tokenizer(dest).encode(text, add_special_tokens=False) == load_tokenizer(tiny_model_dir).encode(
        text, add_special_tokens=False)
    # a checkpoint exports too, and the result is a model directory for every command
    ckpt_dest = tmp_path / "step1"
    assert commands.main(["export", str(lora_run / "checkpoints" / "step_0000001"), "--merge", "--out",
                     str(ckpt_dest)]) == 0, out()
    run_cfg = load_config(lora_run / "config.yaml")
    step1 = load_run_output(find_run_output(lora_run / "checkpoints" / "step_0000001"), run_cfg, "cpu")[0]
    exported, _, _ = load_policy(ModelConfig(path=str(ckpt_dest), device="cpu"))
    assert torch.allclose(_logits(exported), _logits(step1), atol=1e-5)


def test_export_refuses_without_merge_and_never_overwrites(lora_run, tmp_path, out):
    dest = tmp_path / "merged"
    assert commands.main(["export", str(lora_run / "final"), "--out", str(dest)]) == 2
    assert "--merge" in out() and not dest.exists()
    dest.mkdir()
    (dest / "keep.txt").write_text("mine")
    assert commands.main(["export", str(lora_run), "--merge", "--out", str(dest)]) == 2
    assert "not an empty directory" in out()
    assert [p.name for p in dest.iterdir()] == ["keep.txt"]


def _full_model_run(root: Path, name: str, model_dir: Path) -> Path:
    """A finished run's layout around a copy of a full model (config.yaml, metrics.jsonl, final/)."""
    run = root / name
    run.mkdir(parents=True)
    shutil.copytree(model_dir, run / "final")
    cfg = load_config(None, [f"model.path={model_dir}", "task.eval_size=2", "task.train_size=4",
                             "task.difficulties=[1]", "sampling.max_new_tokens=4", f"run.out_dir={run}"])
    (run / "config.yaml").write_text(dump_yaml(cfg))
    (run / "metrics.jsonl").write_text("")
    return run


def test_two_runs_final_are_named_apart_and_never_overwritten(tiny_model_dir, tmp_path, monkeypatch, out):
    monkeypatch.chdir(tmp_path)
    runs = [_full_model_run(tmp_path / "runs", name, tiny_model_dir) for name in ("grpo-a", "grpo-b")]
    for run in runs:
        argv = ["eval", "--model", str(run / "final"), "--n", "1", "--k", "1", "--device", "cpu"]
        assert commands.main(argv) == 0, out()
    written = sorted(p.name for p in (tmp_path / "runs" / "eval").iterdir())
    assert written == ["grpo-a_final-arith.json", "grpo-b_final-arith.json"]
    first = (tmp_path / "runs" / "eval" / "grpo-a_final-arith.json").read_text()
    assert json.loads(first)["label"] == "grpo-a_final"
    # the same model again: a new file beside the first, which is left as it was, and the console says so
    assert commands.main(["eval", "--model", str(runs[0] / "final"), "--n", "1", "--k", "1", "--device", "cpu",
                     "--seed", "3"]) == 0, out()
    assert (tmp_path / "runs" / "eval" / "grpo-a_final-arith.json").read_text() == first
    assert json.loads((tmp_path / "runs" / "eval" / "grpo-a_final-arith-2.json").read_text())["label"] == \
        "grpo-a_final"
    assert "grpo-a_final-arith-2.json instead" in out()
