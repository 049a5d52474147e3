"""Loading policies and references: a Hugging Face causal LM directory, or a LoRA adapter merged into its base, with
its tokenizer; the frozen reference policy (with LoRA, the same module with its adapters disabled, so a reference
never costs a second copy of the weights). Loading never trains a model."""

from __future__ import annotations

import contextlib
import copy
import json
import warnings
from pathlib import Path
from typing import Iterator

import explorl.models.devices as devices
from explorl.config import ModelConfig
from explorl.models.paths import adapter_base, has_tokenizer, is_adapter_dir, resolve_model_path


def load_causal_lm(path: str | Path, dtype, attn_implementation: str = "sdpa", trust_remote_code: bool = False):
    """(model, tokenizer) of a model directory, or of a LoRA adapter directory merged into its base model (the
    tokenizer from the adapter directory when it holds one, else from the base). `dtype`: a torch dtype or "auto"
    (the dtype recorded in the model's config.json). `trust_remote_code`: `model.trust_remote_code`."""
    from transformers import AutoModelForCausalLM  # the auto classes: ~0.3 s that the CLI pays only to load a model

    path = Path(path)
    if not is_adapter_dir(path):
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, attn_implementation=attn_implementation,
                                                     trust_remote_code=trust_remote_code)
        return model, load_tokenizer(path, trust_remote_code)
    from peft import PeftModel  # peft: ~2 s at import, paid only with LoRA

    base = adapter_base(path)
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=dtype, attn_implementation=attn_implementation,
                                                 trust_remote_code=trust_remote_code)
    with warnings.catch_warnings():  # peft calls a transformers property deprecated in v5: noise for the user
        warnings.simplefilter("ignore", FutureWarning)
        model = PeftModel.from_pretrained(model, str(path)).merge_and_unload()
    return model, load_tokenizer(path if has_tokenizer(path) else base, trust_remote_code)


GENERIC_TOKENIZER_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


def load_tokenizer(path: str | Path, trust_remote_code: bool = False):
    """The directory's tokenizer, left-padding, with a pad token.

    A directory that declares a generic fast tokenizer (`tokenizer.json` is the whole definition, as for the
    embedded character tokenizer) is loaded as exactly that: transformers 5's `AutoTokenizer` would otherwise
    substitute the model type's own class (Qwen2's byte-level BPE pre-tokenizer) and silently drop characters.
    """
    # transformers' tokenizer classes: ~0.4 s at import that `import explorl.models` skips
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    config_file = Path(path) / "tokenizer_config.json"
    declared = json.loads(config_file.read_text()).get("tokenizer_class") if config_file.exists() else None
    if declared in GENERIC_TOKENIZER_CLASSES and (Path(path) / "tokenizer.json").exists():
        tok = PreTrainedTokenizerFast.from_pretrained(str(path))
    else:
        tok = AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    tok.padding_side = "left"
    if tok.pad_token_id is None:  # many base models ship without one; EOS is the usual stand-in
        tok.pad_token = tok.eos_token
    if tok.eos_token_id is None:
        raise ValueError(f"tokenizer at {path} defines no EOS token; responses could never end")
    return tok


def load_policy(cfg: ModelConfig):
    """Load (model, tokenizer, device) for training: weights in `cfg.dtype` on `cfg.device`, LoRA if enabled.

    `cfg.path` may be a LoRA adapter directory (such as `final/` of a LoRA run): the adapter is merged into its
    base model, so the result is a plain model (with `cfg.lora.enabled`, new adapters go on top of the merge).
    """
    device = devices.resolve_device(cfg.device)  # looked up at call time: the suite pins `auto` there
    dtype = devices.resolve_dtype(cfg.dtype, device)
    path = resolve_model_path(cfg.path)
    model, tok = load_causal_lm(path, dtype, cfg.attn_implementation, cfg.trust_remote_code)
    model.to(device)
    if cfg.lm_head_fp32:
        lm_head_to_float32(model, cfg.lora.target_modules if cfg.lora.enabled else ())
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    if cfg.lora.enabled:
        from peft import LoraConfig as PeftLoraConfig, get_peft_model  # peft: ~2 s at import, paid only with LoRA

        check_lora_targets(model, cfg.lora.target_modules)
        peft_cfg = PeftLoraConfig(r=cfg.lora.rank, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
                                  target_modules=list(cfg.lora.target_modules), task_type="CAUSAL_LM")
        with warnings.catch_warnings():  # peft reads a transformers property deprecated in v5: noise for the user
            warnings.simplefilter("ignore", FutureWarning)
            model = get_peft_model(model, peft_cfg)
    return model, tok, device


def lm_head_to_float32(model, lora_targets=()) -> None:
    """ScaleRL's float32 output layer (`model.lm_head_fp32`; TRL's `cast_lm_head_to_fp32`): the head's weights become
    float32 and a forward pre-hook casts its input to them, so the logits are a float32 product wherever the model's
    own forward runs; explorl's fused forwards cast the final hidden state to the head's dtype themselves. ValueError
    naming the field when the head is tied to the input embeddings (casting the shared matrix would change the
    embedding's dtype too) or is a LoRA target."""
    head = model.get_output_embeddings()
    if getattr(model.config, "tie_word_embeddings", False) or head.weight is model.get_input_embeddings().weight:
        raise ValueError("model.lm_head_fp32: the model ties its output layer to its input embeddings "
                         "(tie_word_embeddings), so the head cannot be float32 alone; set model.lm_head_fp32=false")
    if any(name in ("lm_head", "embed_out", "output") for name in lora_targets):
        raise ValueError(f"model.lm_head_fp32: the output layer is a LoRA target (model.lora.target_modules="
                         f"{list(lora_targets)}); remove it from the targets or set model.lm_head_fp32=false")
    head.float()
    head.register_forward_pre_hook(_input_to_weight_dtype)


def _input_to_weight_dtype(module, args):
    """Forward pre-hook: the layer's input cast to its weight's dtype (the float32 head takes bfloat16 states)."""
    return (args[0].to(module.weight.dtype), *args[1:])


def check_lora_targets(model, target_modules) -> None:
    """ValueError naming `model.lora.target_modules` when a target is not a module name of `model`."""
    names = {n.split(".")[-1] for n, _ in model.named_modules()}
    missing = [m for m in target_modules if m not in names]
    if missing:
        raise ValueError(f"model.lora.target_modules: {missing} not found in the model; "
                         f"linear layers present include: {sorted(n for n in names if 'proj' in n)[:12]}")


def is_peft(model) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "peft_config")


def make_reference(model):
    """The frozen reference policy: None for LoRA models (adapters are disabled instead), else a frozen copy."""
    if is_peft(model):
        return None
    ref = copy.deepcopy(model)
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


@contextlib.contextmanager
def reference_mode(model, ref) -> Iterator[object]:
    """Yield the module that computes reference log-probs: `ref`, or `model` with its LoRA adapters disabled."""
    if ref is not None:
        yield ref
    else:
        with model.disable_adapter():
            yield model


def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


# ----------------------------------------------------------------------------------------------------------------
# a run's outputs: RUN/final (a full model, or a LoRA adapter) and RUN/checkpoints/step_N (trainable weights)
