"""`model.lm_head_fp32`: ScaleRL's float32 output layer (TRL's `cast_lm_head_to_fp32`) in a bfloat16 model."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from explorl.config import LoraConfig, ModelConfig, load_config
from explorl.models import load_policy, make_reference, tiny_qwen2
from explorl.models.embedded import TinyQwen2Sizes
from explorl.rollout.logprobs import LogprobOptions, response_logprobs
from explorl.rollout.sampler import Sampler

SIZES = TinyQwen2Sizes(hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64)


@pytest.fixture(scope="module")
def untied_dir(tmp_path_factory, char_tokenizer):
    """A tiny Qwen2 whose output layer is its own matrix (the embedded default ties it), with a wide head so its
    logits span several units (bfloat16's rounding of them is then visible)."""
    path = tmp_path_factory.mktemp("untied")
    model = tiny_qwen2(len(char_tokenizer), SIZES, pad_token_id=char_tokenizer.pad_token_id,
                       eos_token_id=char_tokenizer.eos_token_id, seed=3, tie_word_embeddings=False)
    with torch.no_grad():
        torch.nn.init.normal_(model.lm_head.weight, std=0.5, generator=torch.Generator().manual_seed(0))
    model.save_pretrained(path)
    char_tokenizer.save_pretrained(path)
    return path


def _load(path, **model):
    return load_policy(ModelConfig(path=str(path), device="cpu", dtype="bfloat16", **model))[0]


def _batch(tok):
    prompt = torch.tensor([tok.encode("12+3=", add_special_tokens=False)] * 2)
    response = torch.tensor([tok.encode("15 ok", add_special_tokens=False), tok.encode("16 no", add_special_tokens=False)])
    return prompt, torch.ones_like(prompt), response, torch.ones(response.shape)


def test_the_head_is_float32_and_its_logits_a_float32_product(untied_dir, char_tokenizer):
    model = _load(untied_dir, lm_head_fp32=True)
    assert model.lm_head.weight.dtype == torch.float32
    assert all(p.dtype == torch.bfloat16 for n, p in model.named_parameters() if not n.startswith("lm_head"))
    ids = torch.tensor([char_tokenizer.encode("12+3=15", add_special_tokens=False)])
    with torch.no_grad():
        logits = model(ids).logits
        hidden = model.model(ids).last_hidden_state  # bfloat16, as the head receives it
    assert hidden.dtype == torch.bfloat16 and logits.dtype == torch.float32
    # the head's product of the bfloat16 states, in float32: exactly F.linear of their float32 copy
    assert torch.equal(logits, F.linear(hidden.float(), model.lm_head.weight))
    # against the plain bfloat16 head on the same states, whose product is rounded to bfloat16's 8 bits
    plain = _load(untied_dir)
    with torch.no_grad():
        rounded = F.linear(hidden, plain.lm_head.weight).float()
    assert (logits - rounded).abs().max() > 1e-3


def test_training_log_probs_take_the_float32_head(untied_dir, char_tokenizer):
    # explorl's training forward applies the head block by block (`_block_stats`); with the float32 head the
    # log-probs are those of log_softmax(W32 h) for the decoder's bfloat16 states h
    model = _load(untied_dir, lm_head_fp32=True)
    prompt, prompt_mask, response, response_mask = _batch(char_tokenizer)
    with torch.no_grad():
        lp, _ = response_logprobs(model, prompt, prompt_mask, response, response_mask,
                                  options=LogprobOptions(with_entropy=False))
        hidden = model.model(torch.cat([prompt, response], 1)).last_hidden_state[:, prompt.shape[1] - 1:-1]
    want = torch.log_softmax(F.linear(hidden.float(), model.lm_head.weight), -1)
    want = want.gather(-1, response[..., None]).squeeze(-1)
    assert torch.allclose(lp, want, atol=1e-5)
    # the reference is a frozen copy: its head is float32 and takes bfloat16 states through the same hook
    ref = make_reference(model)
    with torch.no_grad():
        ref_lp, _ = response_logprobs(ref, prompt, prompt_mask, response, response_mask,
                                      options=LogprobOptions(with_entropy=False))
    assert ref.lm_head.weight.dtype == torch.float32 and torch.equal(ref_lp, lp)


@pytest.mark.parametrize("fast_path", [True, False], ids=["fused", "generic"])
def test_the_sampler_draws_from_the_float32_head(untied_dir, char_tokenizer, fast_path):
    # both decoders run with a float32 head in a bfloat16 model, and the behaviour log-probs they return are the
    # training forward's up to the decoders' own bfloat16 arithmetic (a cache, another attention kernel)
    model = _load(untied_dir, lm_head_fp32=True)
    sampler = Sampler(model, char_tokenizer.eos_token_id, char_tokenizer.pad_token_id, 8, fast_path=fast_path)
    assert sampler.fused == fast_path
    prompts = [char_tokenizer.encode("12+3=", add_special_tokens=False)] * 3
    out = sampler.sample_fixed(prompts, 2, 1.0, torch.Generator().manual_seed(0))
    assert out.behavior_logprobs.dtype == torch.float32
    with torch.no_grad():
        lp, _ = response_logprobs(model, out.prompt_ids, out.prompt_mask, out.response_ids, out.mask,
                                  options=LogprobOptions(with_entropy=False))
    gap = ((lp - out.behavior_logprobs).abs() * out.mask).max()
    assert 0 <= float(gap) < 0.1


def test_a_tied_head_or_a_lora_targeted_head_is_refused_by_name(untied_dir, tiny_model_dir):
    with pytest.raises(ValueError, match=r"model\.lm_head_fp32: .*ties its output layer"):
        _load(tiny_model_dir, lm_head_fp32=True)  # the embedded default's architecture ties it
    lora = LoraConfig(enabled=True, target_modules=["q_proj", "lm_head"])
    with pytest.raises(ValueError, match=r"model\.lm_head_fp32: .*LoRA target"):
        _load(untied_dir, lm_head_fp32=True, lora=lora)
    assert load_config(None, []).model.lm_head_fp32 is False  # explorl's default: the model's dtype throughout


def test_a_bfloat16_run_trains_its_float32_head(untied_dir, tmp_path):
    from explorl.train.loop import train

    cfg = load_config(None, [
        f"model.path={untied_dir}", "model.dtype=bfloat16", "model.device=cpu", "model.lm_head_fp32=true",
        "model.compile=false", f"run.out_dir={tmp_path / 'run'}", "run.steps=2", "run.batch_size=2",
        "sampling.group_size=4", "sampling.max_new_tokens=8", "task.eval_size=2", "task.train_size=16",
        "task.difficulties=[1]", "run.eval_n=2", "run.eval_k=[1]", "optim.lr=1e-2", "run.save_every=0",
        "task.reward=rewards_for_tests:contains_digit"])
    from safetensors.torch import load_file

    run = train(cfg, progress=False)
    before = load_file(str(untied_dir / "model.safetensors"))["lm_head.weight"]
    after = load_file(str(run / "final" / "model.safetensors"))
    # the exported head is the float32 matrix the optimizer updated; the decoder's weights stay bfloat16
    assert after["lm_head.weight"].dtype == torch.float32 and not torch.equal(after["lm_head.weight"], before)
    assert after["model.norm.weight"].dtype == torch.bfloat16
