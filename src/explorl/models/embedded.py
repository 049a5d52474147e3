"""The shipped models: the character-level tokenizer and tiny Qwen2 architecture of the embedded default, and the
directories the two shipped models lie in (`model.path: embedded`, `model.path: embedded:testbed`)."""

from __future__ import annotations

import os
import string
from dataclasses import dataclass
from pathlib import Path

import torch

CHAR_SPECIALS = ["<pad>", "<eos>"]
# printable ASCII plus newline: enough for arithmetic, LaTeX-style \boxed{} answers and plain English
CHAR_ALPHABET = sorted(set(string.printable[:95]) | {"\n"})

# the shipped weights lie in the package directory (src/explorl), one level above this module
EMBEDDED_PACKAGE_DIR = Path(__file__).parent.parent / "embedded"

EMBEDDED_TESTBED_DIR = Path(__file__).parent.parent / "embedded_testbed"
"""`model.path: embedded:testbed`: a second shipped model, bootstrapped like the default but with a rare fraction of
longer chains, so it has thin support out of distribution (its README.md and bootstrap.json say the mixture)."""


def embedded_dir() -> Path:
    """The embedded default model: the directory shipped inside the package (`explorl/embedded/`: weights,
    tokenizer, `bootstrap.json`), so it is one model on every machine. `EXPLORL_EMBEDDED` names another directory,
    e.g. one regenerated with `explorl bootstrap --out DIR`."""
    return Path(os.environ.get("EXPLORL_EMBEDDED") or EMBEDDED_PACKAGE_DIR)


def build_char_tokenizer():
    """A character-level tokenizer (one token per character) that saves and loads as a normal HF tokenizer."""
    # transformers' tokenizer classes: ~0.4 s at import that `import explorl.models` skips
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(CHAR_SPECIALS + CHAR_ALPHABET)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                   clean_up_tokenization_spaces=False, padding_side="left")


@dataclass(frozen=True)
class TinyQwen2Sizes:
    """The sizes of a tiny Qwen2 model (`tiny_qwen2`); the defaults are the embedded default's."""

    hidden: int = 128
    """The width of the hidden states (`hidden_size`)."""
    layers: int = 4
    """Decoder layers (`num_hidden_layers`)."""
    heads: int = 4
    """Attention heads (`num_attention_heads`)."""
    kv_heads: int = 2
    """Key-value heads (`num_key_value_heads`; grouped-query attention below `heads`)."""
    intermediate: int = 384
    """The width of the MLP (`intermediate_size`)."""
    max_positions: int = 512
    """The longest sequence (`max_position_embeddings`)."""


def tiny_qwen2(vocab_size: int, sizes: TinyQwen2Sizes = TinyQwen2Sizes(), *, pad_token_id: int = 0,
               eos_token_id: int = 1, seed: int = 0, tie_word_embeddings: bool = True):
    """A small Qwen2-architecture causal LM of `sizes`, randomly initialised (deterministic for `seed`); its output
    layer shares the input embeddings' matrix unless `tie_word_embeddings` is False (the embedded default ties)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM  # ~1.5 s at import, paid only to build the tiny model

    cfg = Qwen2Config(vocab_size=vocab_size, hidden_size=sizes.hidden, intermediate_size=sizes.intermediate,
                      num_hidden_layers=sizes.layers, num_attention_heads=sizes.heads,
                      num_key_value_heads=sizes.kv_heads, max_position_embeddings=sizes.max_positions,
                      tie_word_embeddings=tie_word_embeddings, pad_token_id=pad_token_id, eos_token_id=eos_token_id, bos_token_id=None)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(cfg)
    model.generation_config.pad_token_id = pad_token_id
    return model
