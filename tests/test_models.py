"""Model loading, the character tokenizer, LoRA and the reference policy."""

from __future__ import annotations

import pytest
import torch

from explorl.config import LoraConfig, ModelConfig
from explorl.models import (build_char_tokenizer, load_policy, load_tokenizer, make_reference, reference_mode,
                            resolve_device, resolve_dtype, resolve_model_path)
from explorl.rollout.logprobs import response_logprobs


def test_char_tokenizer_round_trips_beside_a_qwen2_config(tiny_model_dir):
    # tiny_model_dir holds a qwen2 config.json: transformers 5's AutoTokenizer would swap in Qwen2's byte-level
    # pre-tokenizer and drop spaces and newlines; load_tokenizer must keep the saved character tokenizer.
    tok = build_char_tokenizer()
    loaded = load_tokenizer(tiny_model_dir)
    text = " 12+ 3=?\n\\boxed{15} Hello, world!\n"
    ids = loaded.encode(text, add_special_tokens=False)
    assert len(ids) == len(text)  # one token per character
    assert ids == tok.encode(text, add_special_tokens=False)
    assert loaded.decode(ids) == text
    assert loaded.eos_token_id == tok.eos_token_id and loaded.pad_token_id == tok.pad_token_id
    assert loaded.padding_side == "left"


def test_load_policy_on_cpu_with_dtype(tiny_model_dir):
    model, tok, device = load_policy(ModelConfig(path=str(tiny_model_dir), device="cpu", dtype="bfloat16"))
    assert device.type == "cpu"
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32


def test_missing_model_directory_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="model.path"):
        resolve_model_path(str(tmp_path / "nope"))


def test_loading_a_missing_embedded_default_fails_without_training(tmp_path, monkeypatch):
    monkeypatch.setenv("EXPLORL_HOME", str(tmp_path / "home"))
    with pytest.raises(FileNotFoundError, match="explorl bootstrap"):
        resolve_model_path("embedded")
    assert not (tmp_path / "home").exists()  # nothing was built or even started


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without a GPU")
def test_cuda_request_without_gpu_is_a_clear_error():
    with pytest.raises(RuntimeError, match="model.device"):
        resolve_device("cuda")


def _logprobs(model, gen):
    prompt = torch.randint(3, 90, (2, 4), generator=gen)
    resp = torch.randint(3, 90, (2, 5), generator=gen)
    mask = torch.ones(2, 5)
    lp, _ = response_logprobs(model, prompt, torch.ones_like(prompt), resp, mask, 1.0, with_entropy=False)
    return lp


def test_lora_reference_is_the_base_model_with_adapters_disabled(tiny_model_dir):
    base, _, _ = load_policy(ModelConfig(path=str(tiny_model_dir)))
    cfg = ModelConfig(path=str(tiny_model_dir), lora=LoraConfig(enabled=True, rank=4, alpha=8.0))
    model, _, _ = load_policy(cfg)
    assert make_reference(model) is None  # no second copy of the weights
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    with torch.no_grad():  # move the adapters away from their zero initialisation
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.add_(0.5)
    base_lp = _logprobs(base, torch.Generator().manual_seed(0))
    policy_lp = _logprobs(model, torch.Generator().manual_seed(0))
    with reference_mode(model, None) as ref:
        ref_lp = _logprobs(ref, torch.Generator().manual_seed(0))
    assert torch.allclose(ref_lp, base_lp, atol=1e-5)
    assert not torch.allclose(policy_lp, base_lp, atol=1e-3)
    assert any(p.requires_grad for p in model.parameters())  # adapters are back on after the context


def test_full_model_reference_is_a_frozen_copy(tiny_model_dir):
    model, _, _ = load_policy(ModelConfig(path=str(tiny_model_dir)))
    ref = make_reference(model)
    assert ref is not model and not any(p.requires_grad for p in ref.parameters())
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    assert not torch.equal(next(model.parameters()), next(ref.parameters()))


def test_unknown_lora_target_module_names_the_field(tiny_model_dir):
    cfg = ModelConfig(path=str(tiny_model_dir), lora=LoraConfig(enabled=True, target_modules=["query"]))
    with pytest.raises(ValueError, match="model.lora.target_modules"):
        load_policy(cfg)
