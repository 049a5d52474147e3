"""Checking a config against the registry: method names, each selected method's options, cross-field rules.

This module sits above both the schema (`explorl.config.schema`, which imports nothing of explorl's methods) and
the registry (`explorl.algos.registry`, the bottom of the import graph); it imports the modules that fill the
registry when `validate` runs. `validate` runs one check per section (`_check_sampling`, `_check_algo`, ...), each
raising ConfigError with the field's dotted name and the fix. The pieces it stands on: `explorl.config.selection`
(the selected entries and their options), `explorl.config.held_out` (the tasks of the held-out sets and of `explorl
eval`), `explorl.config.fields` (the reference table).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from pathlib import Path
from typing import Any

from explorl.algos.registry import SECTIONS, SELECTED_BY, Entry, entries, lookup, names  # noqa: F401
from explorl.config.fields import _reference, reference  # noqa: F401
from explorl.config.schema import short_repr
from explorl.config.held_out import EVAL_KEYS_RESERVED, command_task, eval_set_task, held_out_task  # noqa: F401
from explorl.config.layers import read_layers
from explorl.config.loading import _located, config_from_layers
from explorl.config.schema import (Config, ConfigError, LoraConfig, ModelConfig, OptimConfig, RftConfig,
                                   SamplingConfig, SftConfig, TaskConfig)
from explorl.config.selection import (CHOICES, _check_choices, _registered, _stray_options_message,  # noqa: F401
                                      fill_registry, import_plugins, resolve_options, selected_entries,
                                      use_python_path)


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read a YAML config (optional), apply overrides, build and validate the typed `Config`.

    A YAML file may name `base: other.yaml` (relative to itself) to inherit from another config. A key the schema
    does not have is refused, in a run directory's config.yaml as anywhere. Paths are absolute: a file's relative
    to it, the command line's and `run.out_dir`'s default (`runs/default`) to the working directory.
    """
    layers = read_layers(path, overrides)
    cfg = config_from_layers(layers)
    cfg.run.out_dir = os.path.normpath(Path.cwd() / Path(cfg.run.out_dir).expanduser())  # still relative: the default
    try:
        _check_choices(cfg)
    except ConfigError as e:  # a value the schema cannot check when loading: say where it was written, as loading does
        raise ConfigError(_located(str(e), layers)) from None
    validate(cfg)
    return cfg


DEVICES = "auto, cpu, cuda, cuda:N"
ROW_TASKS = ("file", "hf")
"""Tasks whose prompt template may name any column of a data row (`task.prompt_template`)."""

SEED_MAX = 2**63 - 2
"""The largest seed: torch's generators take 64-bit seeds, and the loop seeds one with `run.seed + 1`."""


def valid_device(device: str) -> bool:
    """Whether `device` is one of DEVICES (`model.device`, the commands' `--device`)."""
    return device in ("auto", "cpu") or device.startswith("cuda")


def _need(cond: bool, msg: str) -> None:
    """ConfigError(`msg`) unless `cond`."""
    if not cond:
        raise ConfigError(msg)


def validate(cfg: Config) -> None:
    """Cross-field checks; raises ConfigError naming the field and the fix.

    Names are checked against the registry (after importing `run.plugins`), each selected entry's options are
    built from the section's raw `options` (`resolve_options`), and each chosen entry may carry its own
    `check(cfg) -> message or None` (registered with `register(..., check=fn)`).
    """
    fill_registry()
    use_python_path(cfg.run.python_path)
    import_plugins(cfg.run.plugins)
    chosen = _chosen_entries(cfg)
    resolve_options(cfg)
    _check_choices(cfg)
    _validate_finite(cfg, "", _need)  # every number, the methods' options too: inf is never a setting
    _check_sampling(cfg.sampling)
    _check_algo(cfg)
    _check_optim(cfg.optim)
    _check_run(cfg)
    _check_model(cfg.model)
    _check_task(cfg.task)
    _check_engine(cfg)
    for entry in chosen:
        message = entry.check(cfg) if entry.check is not None else None
        _need(message is None, message or "")
    _check_rft(cfg.rft)
    _check_sft(cfg.sft)
    _check_lora(cfg.model.lora)


def _chosen_entries(cfg: Config) -> list[Entry]:
    """The registry entries the config names directly (estimator, shapers, reward shapers, loss, token filter,
    importance weights, temperature schedule, budget policy, task): ConfigError for a name not registered or a list
    that names an entry twice."""
    a = cfg.algo
    chosen = [_registered("estimator", a.advantage, "algo.advantage")]
    chosen += [_registered("shaper", x, f"algo.shapers[{i}]") for i, x in enumerate(a.shapers)]
    _need(len(set(a.shapers)) == len(a.shapers), f"algo.shapers: {short_repr(a.shapers)} names a shaper twice")
    chosen += [_registered("reward_shaper", x, f"algo.reward_shapers[{i}]") for i, x in enumerate(a.reward_shapers)]
    _need(len(set(a.reward_shapers)) == len(a.reward_shapers),
          f"algo.reward_shapers: {short_repr(a.reward_shapers)} names a reward shaper twice")
    chosen += [_registered("policy_loss", a.loss, "algo.loss"),
               _registered("token_filter", a.token_filter, "algo.token_filter"),
               _registered("importance_weights", a.importance_weights, "algo.importance_weights")]
    schedule = _registered("temperature_schedule", cfg.sampling.schedule, "sampling.schedule")
    return chosen + [schedule, _registered("budget_policy", cfg.budget.policy, "budget.policy"),
                     _registered("task", cfg.task.name, "task.name")]


def _check_sampling(s: SamplingConfig) -> None:
    _need(s.group_size >= 1, "sampling.group_size: must be >= 1")
    _need(s.temperature > 0, "sampling.temperature: must be > 0 (use a small value such as 1e-3 for near-greedy)")
    _need(0 < s.top_p <= 1, "sampling.top_p: must be in (0, 1]")
    _need(s.max_new_tokens >= 1, "sampling.max_new_tokens: must be >= 1")


def _check_algo(cfg: Config) -> None:
    """The algorithm's core fields, and the mini-batches against the responses of a step (`run.batch_size` prompts
    times `sampling.group_size`)."""
    a, r = cfg.algo, cfg.run
    _need(0 <= a.eps_low <= 1, "algo.eps_low: must be in [0, 1] (1: the ratio is never clipped from below, as the "
                               "Clip-Cov authors run it)")
    _need(a.eps_high >= 0, "algo.eps_high: must be >= 0")
    _need(a.kl_coef >= 0, "algo.kl_coef: must be >= 0")
    _need(a.kl_coef > 0 or not a.kl_importance_weighted,
          "algo.kl_importance_weighted=true weights the KL term by the ratio, and algo.kl_coef=0 keeps no KL term; set "
          "algo.kl_coef > 0 or algo.kl_importance_weighted=false")
    _need(a.kl_coef > 0 or a.kl_tokens == "all",
          f"algo.kl_tokens={a.kl_tokens} chooses the tokens of the KL term, and algo.kl_coef=0 keeps no KL term; set "
          f"algo.kl_coef > 0 or algo.kl_tokens=all")
    _need(a.kl_clamp is None or a.kl_clamp > 0,
          f"algo.kl_clamp: must be > 0 (verl's low_var_kl uses 10) or null for no clamp, got {a.kl_clamp}")
    _need(a.epochs >= 1, "algo.epochs: must be >= 1")
    _need(a.mini_batches >= 1, "algo.mini_batches: must be >= 1")
    _need(a.micro_batch_size >= 0, "algo.micro_batch_size: must be >= 0 (0 = split by algo.length_buckets)")
    _need(a.length_buckets >= 1, "algo.length_buckets: must be >= 1 (1 = the whole mini-batch in one forward)")
    _need(a.adv_eps >= 0, f"algo.adv_eps: must be >= 0, got {a.adv_eps}")
    _check_adaptive_entropy(a)
    _check_reference_reset(cfg)
    _need(r.batch_size >= 1, f"run.batch_size: must be >= 1 (prompts per step), got {r.batch_size}")
    _need(a.mini_batches <= r.batch_size * cfg.sampling.group_size,
          f"algo.mini_batches: {a.mini_batches} mini-batches need at least that many responses; "
          f"run.batch_size * sampling.group_size = {r.batch_size * cfg.sampling.group_size}")


def _check_adaptive_entropy(a) -> None:
    """Skywork-OR1's adaptive entropy coefficient: bounds ordered, the initial coefficient within them."""
    e = a.entropy_control
    if not e.enabled:
        return
    _need(e.target >= 0, f"algo.entropy_control.target: must be >= 0 (nats), got {e.target}")
    _need(e.delta > 0, f"algo.entropy_control.delta: must be > 0, got {e.delta}")
    _need(0 <= e.coef_min <= e.coef_max, f"algo.entropy_control.coef_min: must be in [0, coef_max], got "
                                         f"{e.coef_min} (coef_max {e.coef_max})")
    _need(e.coef_min <= a.entropy_coef <= e.coef_max,
          f"algo.entropy_coef: the initial adaptive coefficient must lie in [algo.entropy_control.coef_min, "
          f"coef_max] = [{e.coef_min}, {e.coef_max}], got {a.entropy_coef}")


def _check_reference_reset(cfg: Config) -> None:
    """ProRL's reference reset: a non-negative period, and only with the KL term's full-copy reference."""
    every = cfg.algo.reference_reset.every
    _need(every >= 0, f"algo.reference_reset.every: must be >= 0 (0 = never), got {every}")
    if every == 0:
        return
    _need(cfg.algo.kl_coef > 0,
          f"algo.reference_reset.every={every}: ProRL resets the reference of the KL term, and algo.kl_coef="
          f"{cfg.algo.kl_coef} keeps none; set algo.kl_coef > 0 or algo.reference_reset.every=0")
    _need(not cfg.model.lora.enabled,
          f"algo.reference_reset.every={every}: with model.lora the reference is the base model with the adapters "
          f"off, which a reset cannot copy the policy into; train without LoRA or set algo.reference_reset.every=0")


def _check_optim(o: OptimConfig) -> None:
    _need(o.lr > 0, "optim.lr: must be > 0")
    _need(0 <= o.min_lr_ratio <= 1, "optim.min_lr_ratio: must be in [0, 1]")
    _need(o.warmup_steps >= 0, "optim.warmup_steps: must be >= 0")
    _need(o.grad_clip >= 0, "optim.grad_clip: must be >= 0 (0 = off)")
    _need(o.weight_decay >= 0, f"optim.weight_decay: must be >= 0, got {o.weight_decay}")
    _need(0 <= o.beta1 < 1, f"optim.beta1: must be in [0, 1), got {o.beta1}")
    _need(0 <= o.beta2 < 1, f"optim.beta2: must be in [0, 1), got {o.beta2}")


def _check_run(cfg: Config) -> None:
    """`run.*`: the schedule of steps, checkpoints and evaluations, each held-out set (`_check_eval_set`), the
    trackers."""
    r = cfg.run
    _need(r.steps >= 1, "run.steps: must be >= 1")
    _need(0 <= r.seed <= SEED_MAX, f"run.seed: must be in [0, {SEED_MAX}] (torch's generator seeds), got {r.seed}")
    _need(r.save_every >= 0, f"run.save_every: must be >= 0 (a checkpoint every this many steps; 0 = only at the "
                             f"end), got {r.save_every}")
    _need(r.keep_checkpoints >= 1, f"run.keep_checkpoints: must be >= 1 (the newest checkpoints kept; a resume needs "
                                   f"one), got {r.keep_checkpoints}")
    _need(r.eval_every >= 0, f"run.eval_every: must be >= 0 (0 = only at the end), got {r.eval_every}")
    _need(r.log_samples >= 0, f"run.log_samples: must be >= 0, got {r.log_samples}")
    _need(r.threads >= 0, f"run.threads: must be >= 0 (0 = torch's default), got {r.threads}")
    _need(r.max_nonfinite_steps >= 1, f"run.max_nonfinite_steps: must be >= 1, got {r.max_nonfinite_steps}")
    _need(r.eval_n >= 1, "run.eval_n: must be >= 1")
    _need(all(1 <= k <= r.eval_n for k in r.eval_k),
          f"run.eval_k: every k must be in [1, run.eval_n={r.eval_n}], got {short_repr(r.eval_k)}")
    _need(r.eval_temperature > 0, "run.eval_temperature: must be > 0")
    for set_name in r.eval_sets:
        _check_eval_set(cfg, set_name)
    bad = [x for x in r.report_to if x not in ("tensorboard", "wandb")]
    _need(not bad, f"run.report_to: unknown tracker(s) {short_repr(bad)}; valid: tensorboard, wandb")


def _check_eval_set(cfg: Config, set_name: str) -> None:
    """One held-out set of `run.eval_sets`: a usable name, its fields (unknown or ill-typed ones raise, naming
    `run.eval_sets.<name>.<field>`), then its task's own check."""
    _need(re.fullmatch(r"[A-Za-z0-9_.-]+", set_name) is not None and set_name not in EVAL_KEYS_RESERVED,
          f"run.eval_sets: {short_repr(set_name)} is not a usable name (letters, digits, '_', '-', '.'; not a metric "
          f"name such as pass@1)")
    set_task = eval_set_task(cfg, set_name)
    _validate_finite(set_task, f"run.eval_sets.{set_name}.", _need)
    check = _registered("task", set_task.name, f"run.eval_sets.{set_name}.name").check
    message = check(dataclasses.replace(cfg, task=set_task)) if check is not None else None
    _need(message is None, (message or "").replace("task.", f"run.eval_sets.{set_name}."))


def _check_model(m: ModelConfig) -> None:
    _need(m.dtype != "float16",
          "model.dtype: float16 weights cannot be trained (AdamW keeps its moments in the weights' dtype: squared "
          "gradients below ~2e-4 and its eps of 1e-8 round to 0 in float16, so the first step writes inf/NaN, on the "
          "CPU and on a GPU alike); use model.dtype=float32, or bfloat16 on a GPU that supports it (`auto` picks it)")
    _need(valid_device(m.device), f"model.device: {short_repr(m.device)} is not one of {DEVICES}")


def _check_task(t: TaskConfig) -> None:
    """`task.*`: sizes, seed, the rewards (`_validate_rewards`), the reward workers and the prompt template."""
    _need(t.train_size >= 1, f"task.train_size: must be >= 1, got {t.train_size}")
    _need(t.eval_size >= 1, f"task.eval_size: must be >= 1, got {t.eval_size}")
    _need(0 <= t.data_seed <= SEED_MAX, f"task.data_seed: must be in [0, {SEED_MAX}], got {t.data_seed}")
    _validate_rewards(t, _need)
    _need(t.reward_timeout_s > 0, "task.reward_timeout_s: must be > 0")
    _need(t.reward_workers >= 0, f"task.reward_workers: must be >= 0 (0 = one per CPU core), got {t.reward_workers}")
    _need(0 <= t.max_reward_failure_frac <= 1,
          f"task.max_reward_failure_frac: must be in [0, 1] (0.5: stop when most of a step's rewards fail; 1: never "
          f"stop), got {t.max_reward_failure_frac}")
    if t.name in ROW_TASKS:  # any column of a row may be used (`tasks.files.fill_template`)
        _need(re.search(r"\{[A-Za-z_][A-Za-z0-9_]*\}", t.prompt_template) is not None,
              "task.prompt_template: must contain a placeholder: {question} (the task.prompt_field column) or any "
              "column of the data by name, e.g. {problem}")
    else:
        _need("{question}" in t.prompt_template, f"task.prompt_template: must contain {{question}} (task {t.name} "
                                                 f"gives its problems' text only)")


def _check_engine(cfg: Config) -> None:
    """The rollout engine: vLLM's engine syncs full weights (no LoRA) and takes a share of GPU memory."""
    s = cfg.sampling
    if s.engine == "vllm":
        _need(not cfg.model.lora.enabled,
              "sampling.engine=vllm: a LoRA policy (model.lora) cannot be synced to vLLM's engine; train without "
              "model.lora or use sampling.engine=explorl")
        _need(0 < s.vllm_memory <= 1, f"sampling.vllm_memory: must be in (0, 1], got {s.vllm_memory}")
        _need(not lookup("budget_policy", cfg.budget.policy).branches,
              f"sampling.engine=vllm: budget.policy={cfg.budget.policy} continues prefixes of its sampled responses "
              f"at their highest-entropy tokens, and the vLLM engine returns no token entropies; use "
              f"sampling.engine=explorl")


def _check_rft(f: RftConfig) -> None:
    bad = [x for x in f.strategies if x not in ("noisy", "entropy", "branching")]
    _need(not bad, f"rft.strategies: unknown {short_repr(bad)}; valid: noisy, entropy, branching")
    _need(not ("entropy" in f.strategies and "branching" in f.strategies),
          "rft.strategies: entropy and branching both rank the same samples; choose one")
    for name in ("iterations", "prompts", "samples_per_prompt", "epochs", "batch_size"):
        _need(getattr(f, name) >= 1, f"rft.{name}: must be >= 1, got {getattr(f, name)}")
    _need(0 < f.select_frac <= 1, f"rft.select_frac: must be in (0, 1], got {f.select_frac}")
    _need(0 <= f.noisy_frac <= 1, f"rft.noisy_frac: must be in [0, 1], got {f.noisy_frac}")
    _need(0 < f.branching_top_p <= 1, f"rft.branching_top_p: must be in (0, 1], got {f.branching_top_p}")
    _need(f.lr > 0, f"rft.lr: must be > 0, got {f.lr}")
    _need(f.select_count >= 0, f"rft.select_count: must be >= 0 (0 = no fixed count), got {f.select_count}")
    _need(0 < f.eval_top_p <= 1, f"rft.eval_top_p: must be in (0, 1] (1 = off; STILL uses 0.95), got "
                                 f"{f.eval_top_p}")


def _check_sft(sf: SftConfig) -> None:
    _need(sf.epochs >= 1, f"sft.epochs: must be >= 1, got {sf.epochs}")
    _need(sf.batch_size >= 1, f"sft.batch_size: must be >= 1, got {sf.batch_size}")
    _need(sf.micro_batch_size >= 0, f"sft.micro_batch_size: must be >= 0 (0 = the whole batch in one forward), got "
                                    f"{sf.micro_batch_size}")
    _need(sf.max_length >= 0, f"sft.max_length: must be >= 0 (0 = no limit), got {sf.max_length}")


def _check_lora(lo: LoraConfig) -> None:
    if lo.enabled:
        _need(lo.rank >= 1, "model.lora.rank: must be >= 1")
        _need(len(lo.target_modules) > 0, "model.lora.target_modules: name at least one module")
        _need(lo.alpha > 0, f"model.lora.alpha: must be > 0, got {lo.alpha}")
        _need(0 <= lo.dropout < 1, f"model.lora.dropout: must be in [0, 1), got {lo.dropout}")


def small_training_set(cfg: Config, train_problems: int) -> str | None:
    """A warning (None when all is well) when the training split has fewer problems than `run.batch_size`: each
    step's batch then holds the same prompts several times, as separate groups. Shown by the dry run and when a run
    starts; not an error (a tiny set can be a deliberate overfitting check)."""
    b = cfg.run.batch_size
    if train_problems >= b:
        return None
    plural = "s" if train_problems != 1 else ""
    return (f"run.batch_size={b} is larger than the training split ({train_problems} problem{plural}): every step "
            f"repeats each prompt about {b / max(train_problems, 1):.0f} times in its batch, as separate groups; "
            f"lower run.batch_size or give more training data (task.train_size, task.path)")


def _validate_finite(section: Any, prefix: str, need) -> None:
    """Every float of a config section (nested sections and the methods' typed options included, lists item by
    item) is a finite number: ConfigError naming the first that is not. YAML's `.inf` and `inf` on the command
    line parse as floats; no setting means infinity (each says what turns it off)."""
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        name = f"{prefix}{f.name}"
        if f.name == "options" and isinstance(value, dict):
            for key, options in value.items():
                if dataclasses.is_dataclass(options):
                    _validate_finite(options, f"{prefix}{key}.", need)
        elif dataclasses.is_dataclass(value):
            _validate_finite(value, f"{name}.", need)
        elif isinstance(value, float):
            need(math.isfinite(value), f"{name}: must be a finite number, got {value}")
        elif isinstance(value, list):
            for i, item in enumerate(value):
                need(not isinstance(item, float) or math.isfinite(item),
                     f"{name}[{i}]: must be a finite number, got {item}")


def _validate_rewards(t: TaskConfig, need) -> None:
    """`task.reward` entries and `task.reward_weights` (see `validate`)."""
    # here, not at the top: `import explorl.config` loads no reward module
    from explorl.rewards import BUILTIN_REWARDS, reward_entries, reward_metric_name

    builtin = ", ".join(BUILTIN_REWARDS)
    entries = reward_entries(t.reward)
    need(len(entries) > 0, f"task.reward: name at least one reward function ({builtin} or module:function)")
    for i, e in enumerate(entries):
        where = "task.reward" if len(entries) == 1 else f"task.reward[{i}]"
        need(e in BUILTIN_REWARDS or ":" in e, f"{where}: {short_repr(e)}; valid: {builtin}, or module:function")
    names = [reward_metric_name(e) for e in entries]
    twice = sorted({x for x in names if names.count(x) > 1})
    need(not twice, f"task.reward: {short_repr(entries)} names {', '.join(twice)} more than once; list each function once (its "
                    f"weight in task.reward_weights can be any number)")
    if t.correct_by:
        need(t.correct_by in entries or t.correct_by in names,
             f"task.correct_by: {short_repr(t.correct_by)} is not one of the task.reward entries {short_repr(entries)}; name the entry that "
             f"decides correctness (as written, or its metric name {short_repr(names)}), or leave it empty for the first")
    need(math.isfinite(t.correct_threshold), f"task.correct_threshold: must be a finite number, got "
                                             f"{t.correct_threshold}")
    if t.answer_pattern:
        try:
            groups = re.compile(t.answer_pattern).groups
        except re.error as e:
            raise ConfigError(f"task.answer_pattern: {short_repr(t.answer_pattern)} is not a regular expression ({e})") from None
        need(groups >= 1, f"task.answer_pattern: {short_repr(t.answer_pattern)} needs a group around the answer, e.g. "
                          f"'Answer: *(-?[0-9]+)'")
    w = t.reward_weights
    if w is not None:
        need(len(w) == len(entries),
             f"task.reward_weights: {len(w)} weight(s) for {len(entries)} reward function(s) in task.reward "
             f"{short_repr(entries)}; give one weight per entry, in order, or null for all 1")
        need(all(math.isfinite(x) for x in w), f"task.reward_weights: every weight must be a finite number, got {short_repr(w)}")
        need(any(x != 0 for x in w), "task.reward_weights: all weights are 0, so every reward would be 0 and nothing "
                                     "would be learned; give at least one function a nonzero weight")
