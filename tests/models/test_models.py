"""Model loading, the character tokenizer, LoRA and the reference policy."""

from __future__ import annotations

import pytest
import torch

from explorl.config import LoraConfig, ModelConfig
from explorl.models import (build_char_tokenizer, load_policy, load_tokenizer, make_reference, reference_mode,
                            resolve_device, resolve_dtype, resolve_model_path)
from explorl.rollout.logprobs import LogprobOptions, response_logprobs


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


def test_a_missing_embedded_default_fails_without_training(tmp_path, monkeypatch):
    monkeypatch.setenv("EXPLORL_EMBEDDED", str(tmp_path / "elsewhere"))
    with pytest.raises(FileNotFoundError, match="EXPLORL_EMBEDDED.*explorl bootstrap --out"):
        resolve_model_path("embedded")
    assert not (tmp_path / "elsewhere").exists()  # nothing was built or even started


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without a GPU")
def test_cuda_request_without_gpu_is_a_clear_error():
    with pytest.raises(RuntimeError, match="model.device"):
        resolve_device("cuda")


def _logprobs(model, gen):
    prompt = torch.randint(3, 90, (2, 4), generator=gen)
    resp = torch.randint(3, 90, (2, 5), generator=gen)
    mask = torch.ones(2, 5)
    lp, _ = response_logprobs(model, prompt, torch.ones_like(prompt), resp, mask, 1.0,
                              options=LogprobOptions(with_entropy=False))
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


# ----------------------------------------------------------------------------------------------------------------
# LoRA adapter directories load wherever a model path is accepted (issue 10, item 4)


def _save_adapter(base_dir, dest, *, with_tokenizer: bool):
    """A peft LoRA adapter on `base_dir` with non-zero weights, saved to `dest`; returns its logits on fixed ids."""
    from peft import LoraConfig as PeftLoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(str(base_dir)),
                           PeftLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(len(n)))
    model.save_pretrained(str(dest))
    if with_tokenizer:
        build_char_tokenizer().save_pretrained(str(dest))
    reloaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(base_dir)), str(dest)).eval()
    return _fixed_logits(reloaded)


def _fixed_logits(model):
    with torch.no_grad():
        return model(input_ids=torch.tensor([[7, 30, 41, 12, 9]])).logits.float()


@pytest.mark.parametrize("with_tokenizer", [True, False])
def test_load_policy_merges_an_adapter_directory_into_its_base(tiny_model_dir, tmp_path, with_tokenizer):
    want = _save_adapter(tiny_model_dir, tmp_path / "adapter", with_tokenizer=with_tokenizer)
    assert not (tmp_path / "adapter" / "config.json").exists()
    assert resolve_model_path(str(tmp_path / "adapter")) == tmp_path / "adapter"
    model, tok, _ = load_policy(ModelConfig(path=str(tmp_path / "adapter"), device="cpu"))
    assert not hasattr(model, "peft_config")  # merged: a plain model, on the fused sampling path
    base, _, _ = load_policy(ModelConfig(path=str(tiny_model_dir), device="cpu"))
    assert not torch.allclose(_fixed_logits(base), want, atol=1e-3)
    assert torch.allclose(_fixed_logits(model), want, atol=1e-5)
    assert tok.encode("1 + 2\n", add_special_tokens=False) == build_char_tokenizer().encode("1 + 2\n",
                                                                                            add_special_tokens=False)


def test_adapter_with_lora_enabled_trains_new_adapters_on_the_merge(tiny_model_dir, tmp_path):
    want = _save_adapter(tiny_model_dir, tmp_path / "adapter", with_tokenizer=True)
    cfg = ModelConfig(path=str(tmp_path / "adapter"), device="cpu", lora=LoraConfig(enabled=True, rank=2))
    model, _, _ = load_policy(cfg)
    with reference_mode(model, make_reference(model)) as ref:
        assert torch.allclose(_fixed_logits(ref), want, atol=1e-5)  # the reference is the merged adapter


def test_adapter_base_relative_to_the_adapter_and_a_missing_base(tiny_model_dir, tmp_path):
    import json
    import shutil

    shutil.copytree(tiny_model_dir, tmp_path / "models" / "base")
    want = _save_adapter(tmp_path / "models" / "base", tmp_path / "models" / "adapter", with_tokenizer=False)
    config_file = tmp_path / "models" / "adapter" / "adapter_config.json"
    data = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**data, "base_model_name_or_path": "../base"}))  # as moved with its base
    model, _, _ = load_policy(ModelConfig(path=str(tmp_path / "models" / "adapter"), device="cpu"))
    assert torch.allclose(_fixed_logits(model), want, atol=1e-5)
    config_file.write_text(json.dumps({**data, "base_model_name_or_path": "Qwen/Qwen2.5-0.5B"}))
    with pytest.raises(FileNotFoundError, match=r"base model 'Qwen/Qwen2.5-0.5B' \(adapter_config.json: "
                                                r"base_model_name_or_path\) is not a local model directory"):
        load_policy(ModelConfig(path=str(tmp_path / "models" / "adapter"), device="cpu"))


def test_device_error_is_a_config_error():
    from explorl.config import ConfigError
    from explorl.models import DeviceError

    assert issubclass(DeviceError, ConfigError) and issubclass(DeviceError, RuntimeError)
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="model.device='cuda:1'"):
            resolve_device("cuda:1")
