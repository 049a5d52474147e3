"""Loading policies and references; the character-level tokenizer and tiny Qwen2 model of the embedded default.

Any Hugging Face causal LM directory loads through `load_policy` (`AutoModelForCausalLM`, `AutoTokenizer`).
With LoRA the reference policy is the same module with its adapters disabled (`reference_logprobs` handles
both cases), so a reference never costs a second copy of the weights.
"""

from __future__ import annotations

import contextlib
import copy
import os
import string
from pathlib import Path
from typing import Iterator

import torch

from explorl.config import ModelConfig

CHAR_SPECIALS = ["<pad>", "<eos>"]
# printable ASCII plus newline: enough for arithmetic, LaTeX-style \boxed{} answers and plain English
CHAR_ALPHABET = sorted(set(string.printable[:95]) | {"\n"})


def resolve_device(spec: str = "auto") -> torch.device:
    """`auto` picks cuda when present, else cpu; an explicit cuda request without a GPU fails clearly."""
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if spec.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"model.device={spec!r} but no CUDA device is available; use model.device=cpu or auto")
    return torch.device(spec)


def resolve_dtype(spec: str, device: torch.device) -> torch.dtype:
    """`auto`: bfloat16 on GPUs that support it, float32 elsewhere (CPU bf16 matmuls are slow and imprecise)."""
    if spec == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[spec]


def build_char_tokenizer():
    """A character-level tokenizer (one token per character) that saves and loads as a normal HF tokenizer."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(CHAR_SPECIALS + CHAR_ALPHABET)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                   clean_up_tokenization_spaces=False, padding_side="left")


def tiny_qwen2(vocab_size: int, *, hidden: int = 128, layers: int = 4, heads: int = 4, kv_heads: int = 2,
               intermediate: int = 384, max_positions: int = 512, pad_token_id: int = 0, eos_token_id: int = 1,
               seed: int = 0):
    """A small Qwen2-architecture causal LM, randomly initialised (deterministic for `seed`)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=intermediate,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                      max_position_embeddings=max_positions, tie_word_embeddings=True,
                      pad_token_id=pad_token_id, eos_token_id=eos_token_id, bos_token_id=None)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(cfg)
    model.generation_config.pad_token_id = pad_token_id
    return model


def embedded_dir() -> Path:
    """Where `explorl bootstrap` caches the embedded default model (`EXPLORL_HOME` overrides ~/.cache/explorl)."""
    home = os.environ.get("EXPLORL_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "explorl")
    return Path(home) / "embedded-v1"


def resolve_model_path(path: str) -> Path:
    """`embedded` names the cached tiny default; anything else must be a local directory.

    Loading never trains: a missing embedded default is an error, built explicitly by `explorl bootstrap` or
    `explorl.bootstrap.ensure_embedded()` (which the entry points call before loading).
    """
    if path == "embedded":
        target = embedded_dir()
        if not (target / "config.json").exists():
            raise FileNotFoundError(
                f"model.path='embedded': the embedded default is not built yet (nothing at {target}). Build it "
                f"with `explorl bootstrap`, or `explorl.bootstrap.ensure_embedded()` from Python.")
        return target
    p = Path(path).expanduser()
    if not (p / "config.json").exists():
        raise FileNotFoundError(
            f"model.path={path!r}: no config.json there. Give a local Hugging Face model directory "
            f"(hub downloads are not attempted), or `embedded` for the built-in default.")
    return p


GENERIC_TOKENIZER_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


def load_tokenizer(path: str | Path):
    """The directory's tokenizer, left-padding, with a pad token.

    A directory that declares a generic fast tokenizer (`tokenizer.json` is the whole definition, as for the
    embedded character tokenizer) is loaded as exactly that: transformers 5's `AutoTokenizer` would otherwise
    substitute the model type's own class (Qwen2's byte-level BPE pre-tokenizer) and silently drop characters.
    """
    import json

    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    config_file = Path(path) / "tokenizer_config.json"
    declared = json.loads(config_file.read_text()).get("tokenizer_class") if config_file.exists() else None
    if declared in GENERIC_TOKENIZER_CLASSES and (Path(path) / "tokenizer.json").exists():
        tok = PreTrainedTokenizerFast.from_pretrained(str(path))
    else:
        tok = AutoTokenizer.from_pretrained(str(path))
    tok.padding_side = "left"
    if tok.pad_token_id is None:  # many base models ship without one; EOS is the usual stand-in
        tok.pad_token = tok.eos_token
    if tok.eos_token_id is None:
        raise ValueError(f"tokenizer at {path} defines no EOS token; responses could never end")
    return tok


def load_policy(cfg: ModelConfig):
    """Load (model, tokenizer, device) for training: weights in `cfg.dtype` on `cfg.device`, LoRA if enabled."""
    from transformers import AutoModelForCausalLM

    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    path = resolve_model_path(cfg.path)
    tok = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, attn_implementation=cfg.attn_implementation)
    model.to(device)
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    if cfg.lora.enabled:
        from peft import LoraConfig as PeftLoraConfig, get_peft_model

        names = {n.split(".")[-1] for n, _ in model.named_modules()}
        missing = [m for m in cfg.lora.target_modules if m not in names]
        if missing:
            raise ValueError(f"model.lora.target_modules: {missing} not found in the model; "
                             f"linear layers present include: {sorted(n for n in names if 'proj' in n)[:12]}")
        peft_cfg = PeftLoraConfig(r=cfg.lora.rank, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
                                  target_modules=list(cfg.lora.target_modules), task_type="CAUSAL_LM")
        model = get_peft_model(model, peft_cfg)
    return model, tok, device


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
