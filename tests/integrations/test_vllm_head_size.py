"""`sampling.engine: vllm` refuses, before the engine starts, a model whose attention head size vLLM's CPU backend
has no kernel for (issue 41: the embedded default, head size 16, died inside vLLM's engine process with
"Unsupported CPU attention configuration: head_dim=16"). Runs without vLLM installed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import Qwen2Config

from explorl.config import ConfigError
from explorl.rollout.engines.vllm import VLLM_CPU_HEAD_SIZES, VllmRollouts, check_head_size, head_size
from explorl.models import resolve_model_path

QUICKSTART = Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml"


def test_head_size_is_head_dim_or_hidden_over_heads():
    assert head_size(Qwen2Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2)) == 16  # 64 / 4
    assert head_size(Qwen2Config(hidden_size=64, num_attention_heads=2, num_key_value_heads=1)) == 32  # 64 / 2
    with_dim = Qwen2Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2)
    with_dim.head_dim = 128
    assert head_size(with_dim) == 128


def test_a_head_size_without_a_cpu_kernel_is_refused_naming_it_and_what_works():
    small = Qwen2Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2)
    with pytest.raises(ConfigError) as e:
        check_head_size(small, gpu=False, model="/models/tiny")
    msg = str(e.value)
    assert "model.path=/models/tiny has attention head size 16 (hidden_size 64 / 4 attention heads)" in msg
    assert "32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512" in msg
    assert "run on a GPU" in msg and "sampling.engine=explorl" in msg and "heads=2 kv_heads=1" in msg
    assert "16" in check_head_size(small, gpu=True)  # vLLM's GPU backends decide there
    for size in VLLM_CPU_HEAD_SIZES:
        config = Qwen2Config(hidden_size=size * 2, num_attention_heads=2, num_key_value_heads=1)
        assert f"head size {size}" in check_head_size(config, gpu=False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU backend's refusal")
def test_the_engine_refuses_the_embedded_model_before_importing_vllm():
    # without vLLM installed the import would fail next: a ConfigError means the check came first
    with pytest.raises(ConfigError, match="attention head size 16"):
        VllmRollouts(str(resolve_model_path("embedded")), dtype=torch.float32, max_model_len=128, seed=0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU backend's refusal")
def test_the_dry_run_refuses_the_embedded_model_with_the_vllm_engine(monkeypatch, tmp_path):
    import importlib.util
    import io

    from rich.console import Console

    import explorl.commands.common as common
    from explorl import commands

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real(name, *a))
    buf = io.StringIO()
    monkeypatch.setattr(common, "console", Console(file=buf, width=400))
    rc = commands.main(["train", str(QUICKSTART), "sampling.engine=vllm", f"run.out_dir={tmp_path / 'r'}", "--dry-run"])
    text = buf.getvalue()
    assert rc == 2 and "attention head size 16" in text and "Traceback" not in text, text
