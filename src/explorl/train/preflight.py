"""The checks before a run: everything a run reads before its first step (the device, the model directory, the
task's data, the rewards, the trackers, the output directory), checked without loading weights or training.
`explorl train` calls `check_run_inputs` before every run and for `--dry-run`; so do `explorl sft` and `explorl rft`.
"""

from __future__ import annotations

import importlib.util  # `importlib.util.find_spec` looked up at call time: tests replace it
from pathlib import Path
from typing import NamedTuple

import torch

import explorl.models.devices as devices
import explorl.rewards  # looked up at call time: tests replace `explorl.rewards.check_rewards`
from explorl.algos.registry import lookup
from explorl.config import Config, ConfigError, ModelConfig, eval_set_task
from explorl.config.validation import small_training_set
from explorl.models.fingerprint import weights_fingerprint
from explorl.models.loading import check_lora_targets, load_tokenizer
from explorl.models.paths import adapter_base, has_tokenizer, is_adapter_dir, resolve_model_path
from explorl.rollout.engines.vllm import check_model_head_size, vllm_missing  # the CPU backend's head sizes
from explorl.runs.lock import check_out_dir, refuse_if_locked
from explorl.runs.tracking import check_installed
from explorl.tasks import answer_pattern_warning
from explorl.tasks.base import spread
from explorl.tasks.chat import prompt_text, resolve_chat_template
from explorl.tasks.rows import count_rows
from explorl.train.resume_checks import check_resume

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
ADAPTER_WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")

PROMPT_BATCH = 512
"""Prompts per tokenizer call in `check_prompts` (a fast tokenizer encodes a batch at once, in Rust)."""

Lines = list[tuple[str, str]]
"""(what, result) lines for the dry run to print; a result starting with `warning:` is not an error."""


def check_model_dir(cfg: ModelConfig) -> str:
    """Check `model.path` without loading weights: a model directory (config.json that transformers reads, weight
    files, a tokenizer) or a LoRA adapter with such a base, and `model.lora.target_modules` against the
    architecture (built on the meta device). Returns a one-line description; raises naming `model.path`."""
    from transformers import AutoConfig, AutoModelForCausalLM  # auto classes: ~0.3 s at import

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
    if not (has_tokenizer(path) or has_tokenizer(model_dir)):
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


def check_run_inputs(cfg: Config, *, resume: str | Path | None = None, command: str = "train") -> Lines:
    """Everything a run reads before its first step, checked without loading weights or training: the device,
    `model.path` (`check_model_dir`), the task's data (the `file` task: files exist, every row of `task.path` and
    `task.eval_path` parses with the configured fields, streamed, and the split leaves training rows; other tasks
    are built), the data of the `file` sets of `run.eval_sets` likewise, every `task.reward` entry (called on up to
    8 training problems spread over the data with sample completions, as training calls it, refused when more than
    `task.max_reward_failure_frac` of them fail: `rewards.check_rewards`) and
    `run.plugins` (imported by `load_config`'s validation), and the run directory: a new `run.out_dir` as training
    takes it, or the run `resume` continues (`resume_checks.check_resume`); `command` names the resume command.

    Returns (what, result) lines for the dry run to print; a result starting with `warning:` is not an error.
    Raises ConfigError, FileNotFoundError or ValueError naming the field and the fix. `explorl train` calls it
    before every run, with and without `--dry-run`.
    """
    lines = [("model.device", str(devices.resolve_device(cfg.model.device)))]
    lines.append(("model.path", check_model_dir(cfg.model)))
    lines += _check_sampling_engine(cfg)
    task_lines, problems, default_reward, splits = _check_task(cfg)
    lines += task_lines
    lines += _check_eval_sets(cfg)
    if not problems:
        raise ValueError(f"task: {cfg.task.name} gives no training problem")
    lines.append(("prompts", _check_run_prompts(cfg, splits)))
    lines += _check_rewards(cfg, problems, default_reward)
    if (unread := answer_pattern_warning(cfg.task, problems)) is not None:
        lines.append(("task.answer_pattern", f"warning: {unread}"))
    if cfg.run.plugins:
        lines.append(("run.plugins", f"{', '.join(cfg.run.plugins)} imported"))
    lines += _check_trackers(cfg)
    lines += _check_out_dir(cfg, resume, command)
    return lines


def _check_sampling_engine(cfg: Config) -> Lines:
    """`sampling.engine=vllm`: vLLM is installed and takes the model's head size; nothing to check otherwise."""
    if cfg.sampling.engine != "vllm":
        return []
    model_dir = str(resolve_model_path(cfg.model.path))
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(f"sampling.engine=vllm: {vllm_missing(model_dir)}")
    found = check_model_head_size(model_dir, gpu=torch.cuda.is_available())
    return [("sampling.engine", f"vllm (installed); {found}")]


def _check_task(cfg: Config) -> tuple[Lines, list, object, tuple | None]:
    """The task's lines, up to 8 training problems spread over the data, the task's default reward (for the
    reward check) and its (train, eval) problems when it was built (else None). A task registered with a
    `preflight` check is checked without being built (the `file` task: every row, streamed); any other is built.
    A training set too small for the batch gets a warning."""
    entry = lookup("task", cfg.task.name)
    check = entry.preflight
    built = splits = None  # training problems counted by building the task; the built (train, eval)
    if check is not None:
        lines = [("task", check(cfg.task))]
        sample = entry.preflight_sample
        if sample is not None:
            problems, default = sample(cfg.task)
            problems = problems if isinstance(problems, list) else [problems]  # a plugin's: one problem
        else:
            train, eval_, default, _ = entry.fn(cfg.task)
            problems = spread(train)
            splits = (train, eval_)
    else:
        train, eval_, default, _ = entry.fn(cfg.task)
        splits = (train, eval_)
        lines = [("task", f"{cfg.task.name}: {len(train)} training and {len(eval_)} held-out problems")]
        problems = spread(train)
        built = len(train)
    small = small_training_set(cfg, _training_problems(cfg, built))
    if small:
        lines.append(("run.batch_size", f"warning: {small}"))
    return lines, problems, default, splits


def _check_run_prompts(cfg: Config, splits: tuple | None) -> str:
    """`check_prompts` on every prompt the run will sample from: the task's training and held-out splits (`splits`,
    or the task built here when its own check read it without building it) and the sets of `run.eval_sets`."""
    train, eval_ = splits if splits is not None else lookup("task", cfg.task.name).fn(cfg.task)[:2]
    given = [("task (training split)", train, cfg.task), ("task (held-out split)", eval_, cfg.task)]
    for name in cfg.run.eval_sets:
        set_cfg = eval_set_task(cfg, name)
        given.append((f"run.eval_sets.{name}", lookup("task", set_cfg.name).fn(set_cfg)[1], set_cfg))
    tok, hf_config = model_tokenizer(cfg.model)
    return check_prompts(tok, hf_config, given, cfg.sampling.max_new_tokens, engine=cfg.sampling.engine)


def check_eval_prompts(tok, hf_config, s, extra_sets: dict, limit: int = 0) -> str:
    """`explorl eval`, before it samples: `check_prompts` on the evaluated split (`s`, the resolved
    `evaluation.settings.EvalSettings`) and on each extra held-out set (name -> its task settings; the first
    `limit` problems when `limit`, as evaluated)."""
    given = [("the evaluated split", s.problems, s.task_cfg)]
    for name, set_cfg in extra_sets.items():
        problems = lookup("task", set_cfg.name).fn(set_cfg)[1]
        given.append((f"eval set {name}", problems[:limit] if limit else problems, set_cfg))
    return check_prompts(tok, hf_config, given, s.max_new_tokens, setting="--max-new-tokens")


def model_tokenizer(cfg: ModelConfig):
    """(tokenizer, transformers config) of `model.path` as loading finds them (a LoRA adapter's own tokenizer when
    it has one, else its base model's), without the weights."""
    from transformers import AutoConfig  # auto classes: ~0.3 s at import

    path = resolve_model_path(cfg.path)
    model_dir = adapter_base(path) if is_adapter_dir(path) else path
    tok = load_tokenizer(path if has_tokenizer(path) else model_dir, cfg.trust_remote_code)
    return tok, AutoConfig.from_pretrained(str(model_dir), trust_remote_code=cfg.trust_remote_code)


def context_length(hf_config, engine: str = "explorl") -> tuple[int | None, str]:
    """(the model's context in tokens, where it comes from): `max_position_embeddings` of its config (GPT-2's
    `n_positions`); a config that names none has no limit here, except under `sampling.engine=vllm`, whose engine
    is built with 4096 then (`train.loop.rollout_engine`)."""
    for name in ("max_position_embeddings", "n_positions"):
        value = getattr(hf_config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value, f"{name} in its config.json"
    return (4096, "sampling.engine=vllm's default max_model_len") if engine == "vllm" else (None, "")


def prompt_lengths(tok, problems: list, task_cfg) -> list[int]:
    """The token count of each problem's prompt exactly as sampling encodes it (`tasks.chat.prompt_encoder`: the
    chat template or the prompt format, no special tokens added), `PROMPT_BATCH` prompts per tokenizer call."""
    chat = resolve_chat_template(task_cfg.chat_template, tok)
    lengths: list[int] = []
    for start in range(0, len(problems), PROMPT_BATCH):
        texts = [prompt_text(p, tok, chat=chat, system_prompt=task_cfg.system_prompt)
                 for p in problems[start:start + PROMPT_BATCH]]
        lengths += [len(ids) for ids in tok(texts, add_special_tokens=False, verbose=False)["input_ids"]]
    return lengths


def check_prompts(tok, hf_config, splits: list[tuple[str, list, object]], max_new_tokens: int, *,
                  engine: str = "explorl", setting: str = "sampling.max_new_tokens") -> str:
    """Every prompt of `splits` ((what they are, problems, the task settings that format them)) tokenized as
    sampling will: ValueError naming the split, the row and the fixes for an empty prompt (zero tokens: nothing to
    sample from) or one whose tokens plus `max_new_tokens` (the `setting` that gives it) exceed the model's context
    (`context_length`: sampling would run past the positions the model has, or allocate for a prompt it cannot
    take). Returns the dry run's line. `explorl train`, `sft` and `rft` call it through `check_run_inputs`;
    `explorl eval` before it samples."""
    room = _Room(*context_length(hf_config, engine), max_new_tokens, setting)
    if room.limit is not None and max_new_tokens >= room.limit:
        raise ValueError(f"{setting}={max_new_tokens}: a response that long leaves no room for a prompt in the "
                         f"model's context of {room.limit} tokens ({room.source}); lower it well below "
                         f"{room.limit}, or use a model with a longer context")
    counted, longest = 0, 0
    for label, problems, task_cfg in splits:
        try:
            lengths = prompt_lengths(tok, problems, task_cfg)
        except ValueError as e:  # chat messages with the chat template off, a template that refuses them, ...
            raise ValueError(f"{label}: {e}") from None
        _refuse_bad_prompts(label, problems, lengths, task_cfg, room)
        counted, longest = counted + len(lengths), max([longest, *lengths])
    fits = (f"; with {setting}={max_new_tokens} within the model's context of {room.limit}" if room.limit
            else " (the model's config names no context length)")
    return f"{counted} prompts, none empty, the longest {longest} tokens{fits}"


class _Room(NamedTuple):
    """What a prompt must fit in: the model's context (`context_length`) less the response's tokens."""

    limit: int | None
    source: str
    new_tokens: int
    setting: str


def _row(label: str, problems: list, i: int) -> str:
    """`LABEL row I (id ID)`: a prompt's split, its index in the split from 0, and its id when it has one."""
    given = problems[i].meta.get("id") if isinstance(problems[i].meta, dict) else None
    return f"{label} row {i}" + (f" (id {given})" if given is not None else "")


def _refuse_bad_prompts(label: str, problems: list, lengths: list[int], task_cfg, room: _Room) -> None:
    """ValueError at the first empty prompt of a split, else at its longest prompt that leaves no `room`."""
    empty = [i for i, n in enumerate(lengths) if n == 0]
    if empty:
        raise ValueError(
            f"{_row(label, problems, empty[0])}: the prompt is empty (0 tokens after the prompt format), so there "
            f"is nothing to sample from ({len(empty)} such row(s) in it). Give the row a question (its "
            f"{task_cfg.prompt_field!r} field, task.prompt_field), set task.prompt_template or task.system_prompt, "
            f"or remove the row")
    limit, new = room.limit, room.new_tokens
    over = [i for i, n in enumerate(lengths) if limit is not None and n + new > limit]
    if over:
        worst = max(over, key=lengths.__getitem__)
        n = lengths[worst]
        lower = f", lower {room.setting} to at most {limit - n}" if limit - n > 0 else ""
        raise ValueError(
            f"{_row(label, problems, worst)}: the prompt is {n} tokens; with {room.setting}={new} that is "
            f"{n + new}, more than the model's context of {limit} tokens ({room.source}; {len(over)} of "
            f"{len(lengths)} prompt(s) of {label} are over it). Shorten those prompts or remove their rows "
            f"(explorl has no option that drops them){lower}, or use a model with a longer context")


def _training_problems(cfg: Config, built: int | None) -> int:
    """How many training problems the run will have: `built` when the task was built, else (a `file` task checked
    row by row) its rows as `load_file_task` splits them, without decoding them."""
    if built is not None:
        return built
    if cfg.task.name != "file":
        return cfg.task.train_size
    rows = count_rows(cfg.task.path)
    return min(cfg.task.train_size, rows if cfg.task.eval_path else max(rows - cfg.task.eval_size, 0))


def _check_eval_sets(cfg: Config) -> Lines:
    """The held-out sets of `run.eval_sets` with a check of their own (the `file` ones: every row); an error names
    the set it is about."""
    lines = []
    for name in cfg.run.eval_sets:
        set_cfg = eval_set_task(cfg, name)
        set_check = lookup("task", set_cfg.name).preflight
        if set_check is not None:
            try:
                lines.append((f"run.eval_sets.{name}", set_check(set_cfg)))
            except ValueError as e:  # the message names task.path / task.eval_path: say which set's
                kind = ConfigError if isinstance(e, ConfigError) else ValueError
                raise kind(f"run.eval_sets.{name}: {e}") from None
    return lines


def _check_rewards(cfg: Config, problems: list, default_reward) -> Lines:
    """Every `task.reward` entry called as training calls it, on up to 8 training problems spread over the data,
    under the run's own failure threshold (`task.max_reward_failure_frac`)."""
    completions = [p.solution or f"The answer is \\boxed{{{p.answer}}}." for p in problems]
    try:
        limits = explorl.rewards.RewardLimits(timeout_s=cfg.task.reward_timeout_s, workers=cfg.task.reward_workers,
                                              max_failure_frac=cfg.task.max_reward_failure_frac)
        return explorl.rewards.check_rewards(cfg.task.reward, default_reward, [p.answer for p in problems], completions,
                                             [p.meta for p in problems], limits=limits)
    except ValueError as e:
        if isinstance(e, ConfigError) or cfg.task.max_reward_failure_frac < 1:
            raise
        # the user asked training never to stop on failing rewards: the failure is reported, not refused
        return [("task.reward", f"warning: {e} (task.max_reward_failure_frac=1: training scores such samples 0, "
                                f"counts them and goes on)")]


def _check_trackers(cfg: Config) -> Lines:
    """`run.report_to`: the experiment trackers' packages are installed."""
    if not cfg.run.report_to:
        return []
    try:
        check_installed(cfg.run.report_to)
    except ImportError as e:
        raise ConfigError(str(e)) from None
    return [("run.report_to", f"{', '.join(cfg.run.report_to)} installed")]


def _check_out_dir(cfg: Config, resume: str | Path | None, command: str = "train") -> Lines:
    """The run directory, refused as training refuses it (the same error): a new `run.out_dir` that holds a run or
    is a directory explorl did not make (`lock.check_out_dir`), or with `resume` the run to continue
    (`resume_checks.check_resume`)."""
    if resume is not None:
        return check_resume(cfg, resume, command)
    out = Path(cfg.run.out_dir)
    refuse_if_locked(out)  # a run in progress is named as such
    check_out_dir(out, f"explorl {command} --resume")
    return [("run.out_dir", f"{out}: " + ("new" if not out.exists() else "an empty directory or a run explorl "
                                                                         "made that logged no step"))]
