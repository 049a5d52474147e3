"""Shared fixtures: the character tokenizer and tiny randomly initialised causal LMs (CPU, milliseconds to build).

Devices: the suite compares CPU float values, so on a machine with CUDA every test not marked `gpu` still runs on
the CPU: `model.device: auto` resolves to `cpu` in this process, and the processes a test starts (torchrun, a
second `explorl`) see no GPU (`CUDA_VISIBLE_DEVICES` empty; a two-process TRL test then uses gloo on the CPU). Tests
marked `gpu` (`tests/test_gpu.py`) run on CUDA in bfloat16 and are skipped, with the reason, where there is none.

`tiny_model` and `tiny_llama` are built fresh for every test (a few ms each), so a test may train or edit them
freely; `tiny_model_dir` is a session-wide saved copy of the same tiny Qwen2 (weights and tokenizer), loadable
with `AutoModelForCausalLM` / `AutoTokenizer` or as `model.path` in a config. Treat that directory as read-only.
"""

from __future__ import annotations

import os

import pytest
import torch

from explorl.models import TinyQwen2Sizes, build_char_tokenizer, tiny_qwen2

def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device (torch.cuda.is_available() is False); `make test-gpu` on a "
                                   "machine with one runs these")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


_FAILURE_LOG = os.environ.get("EXPLORL_FAILURE_LOG")  # bench/gpu_lent.sh: failures kept even if the run is cut


def pytest_runtest_logreport(report):
    """With `EXPLORL_FAILURE_LOG=FILE`, append each failure (test id, phase, the error's last 4,000 characters) the
    moment it happens: a suite stopped by a time limit (a lent GPU's) prints no summary, and this file is what is
    left of it. Under xdist only the controller writes (workers' reports reach it too)."""
    if not _FAILURE_LOG or not report.failed or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    with open(_FAILURE_LOG, "a", encoding="utf-8") as f:
        f.write(f"=== {report.nodeid} ({report.when})\n{report.longreprtext[-4000:]}\n")


_PIN_TO_CPU = [True]  # whether the test being set up runs on the CPU (not marked `gpu`)
_VISIBLE = os.environ.get("CUDA_VISIBLE_DEVICES")


def pytest_configure(config):
    """`model.device: auto` resolves through the pin below for the whole session (module-scoped fixtures included,
    which pytest sets up before any function-scoped fixture of their first test: a function-scoped pin came too
    late for them, and on a GPU machine they trained on CUDA in bfloat16)."""
    import explorl.models.devices as devices  # where every load looks `resolve_device` up

    resolve = devices.resolve_device

    def pinned(spec: str = "auto"):
        return resolve("cpu" if spec == "auto" and _PIN_TO_CPU[0] else spec)

    devices.resolve_device = pinned


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Before any fixture of `item` (module-scoped ones included): pin to the CPU unless it is marked `gpu`, in this
    process and in the processes it starts."""
    gpu = item.get_closest_marker("gpu") is not None
    _PIN_TO_CPU[0] = not gpu
    if gpu:
        if _VISIBLE is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = _VISIBLE
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""


TINY = TinyQwen2Sizes(hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64)


def _tiny_qwen2(tok):
    model = tiny_qwen2(len(tok), TINY, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, seed=0)
    return model.eval()


def _tiny_llama(tok):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=256,
                      attention_bias=False, mlp_bias=False, tie_word_embeddings=False,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        model = LlamaForCausalLM(cfg)
        # Llama's default init (std 0.02) gives nearly uniform next-token distributions on a model this small;
        # a wider output layer makes them peaked enough that greedy/top-p tests are not decided by float noise
        torch.nn.init.normal_(model.lm_head.weight, std=0.3)
    return model.eval()


@pytest.fixture(scope="session")
def char_tokenizer():
    """The embedded default's character-level tokenizer (pad 0, eos 1, 98 tokens)."""
    return build_char_tokenizer()


@pytest.fixture
def tiny_model(char_tokenizer):
    """A 2-layer Qwen2 (hidden 32, 4 heads, 2 KV heads) for the char tokenizer, eval mode, seed 0."""
    return _tiny_qwen2(char_tokenizer)


@pytest.fixture
def tiny_llama(char_tokenizer):
    """A 2-layer Llama (no biases, untied head) for the char tokenizer, eval mode: a second fused-path family."""
    return _tiny_llama(char_tokenizer)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, char_tokenizer):
    """A directory holding `tiny_model`'s weights and the char tokenizer (save_pretrained), e.g. for model.path."""
    path = tmp_path_factory.mktemp("tiny_model")
    _tiny_qwen2(char_tokenizer).save_pretrained(path)
    char_tokenizer.save_pretrained(path)
    return path
