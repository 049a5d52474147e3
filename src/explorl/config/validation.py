"""Checking a config against the registry: method names, each selected method's options, cross-field rules.

This module sits above both the schema (`explorl.config.schema`, which imports nothing of explorl's methods) and
the registry (`explorl.algos.registry`, the bottom of the import graph); it imports the modules that fill the
registry when `validate` runs.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from pathlib import Path
from typing import Any, Mapping

from explorl.algos.aggregation import LOSS_AGG_MODES
from explorl.algos.registry import SECTIONS, SELECTED_BY, Entry, entries, lookup, names
from explorl.config.loading import (_hints, _located, _type_name, apply_override, from_dict, read_config, read_layers,
                                    to_dict)
from explorl.config.schema import Config, ConfigError, TaskConfig, field_docs

CHOICES: dict[str, tuple[str, ...]] = {"algo.loss_agg": LOSS_AGG_MODES}
"""Core fields whose valid values the algorithms define (their one source): the schema types them `str` (it imports
nothing of explorl), `validate` refuses any other value and `reference` shows them as the field's type."""


def use_python_path(dirs: list[str]) -> None:
    """Put `run.python_path` at the front of sys.path (once each), so plugins and reward modules next to the config
    are found first; worker processes inherit it."""
    import sys

    for d in reversed(dirs):
        if d not in sys.path:
            sys.path.insert(0, d)


def import_plugins(modules: list[str]) -> None:
    """Import `run.plugins` (after `use_python_path`; the working directory is searched too, as for
    `task.reward: module:function`)."""
    import importlib
    import os
    import sys

    if modules and "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    for i, name in enumerate(modules):
        try:
            importlib.import_module(name)
        except Exception as e:  # the module's own error, named with the field
            raise ConfigError(f"run.plugins[{i}]: cannot import {name!r}: {type(e).__name__}: {e}") from None


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read a YAML config (optional), apply overrides, build and validate the typed `Config`.

    A YAML file may name `base: other.yaml` (relative to itself) to inherit from another config.
    """
    cfg = read_config(path, overrides)
    try:
        _check_choices(cfg)
    except ConfigError as e:  # a value the schema cannot check when loading: say where it was written, as loading does
        raise ConfigError(_located(str(e), read_layers(path, overrides))) from None
    validate(cfg)
    return cfg


def _check_choices(cfg: Config) -> None:
    """ConfigError naming the first field of `CHOICES` whose value is not one of its choices."""
    for key, choices in CHOICES.items():
        value = _get(cfg, key)
        if value not in choices:
            raise ConfigError(f"{key}: {value!r} is not a valid choice; valid choices: {', '.join(choices)}")


def fill_registry() -> None:
    """Import the modules that register explorl's own entries (estimators, losses, schedules, budgets, tasks)."""
    import explorl.algos  # noqa: F401
    import explorl.rollout.controllers  # noqa: F401
    import explorl.tasks  # noqa: F401


def _registered(kind: str, name: str, field_name: str) -> Entry:
    """The registry entry `name` of `kind`, or ConfigError naming `field_name` and the valid names."""
    try:
        return lookup(kind, name)
    except KeyError:
        raise ConfigError(f"{field_name}: unknown {kind.replace('_', ' ')} {name!r}; valid: {', '.join(names(kind))}"
                          f" (your own: register it in a module named in run.plugins)") from None


EVAL_KEYS_RESERVED = ("entropy", "length", "errors", "timeouts", "format_rate", "problems", "n")


def held_out_task(base: TaskConfig, fields: Mapping[str, Any], prefix: str) -> TaskConfig:
    """Task settings `fields` over `base`, each checked (errors name `prefix` + the field). A `file` task named by
    `path` alone is held out from that file: `eval_path` = `path` (its first `eval_size` rows)."""
    task = from_dict(TaskConfig, {**to_dict(base), **fields}, prefix)
    if task.name == "file" and "path" in fields and "eval_path" not in fields:
        task.eval_path = task.path
    return task


def eval_set_task(cfg: "Config", name: str) -> "TaskConfig":
    """The task of held-out set `name` of `run.eval_sets`: its settings layered over `cfg.task` (`held_out_task`)."""
    return held_out_task(cfg.task, cfg.run.eval_sets[name], f"run.eval_sets.{name}.")


def command_task(run_cfg: "Config | None", name: str | None, opts: Mapping[str, str]) -> TaskConfig:
    """The task `explorl eval` and `explorl probe` use: an evaluated run's own `task` section when there is a run and
    `name` is None or its task's name, else task `name` (default `arith`) with its defaults; `opts` (`field=value`
    text, as `--task-opt` gives it) on top. A `file` named by `path` alone is evaluated on all of its rows (unless
    `eval_size` is given)."""
    if run_cfg is not None and name in (None, run_cfg.task.name):
        base = run_cfg.task
    else:
        base = from_dict(TaskConfig, {"name": name or "arith"}, "task.")
    data: dict = {"task": {}}
    for k, v in opts.items():
        apply_override(data, f"task.{k}={v}")
    task = held_out_task(base, data["task"], "task.")
    if task.name == "file" and "path" in opts and "eval_path" not in opts and "eval_size" not in opts:
        from explorl.tasks.files import count_rows

        task.eval_size = max(count_rows(task.eval_path, "--task-opt path"), 1)
    return task


DEVICES = "auto, cpu, cuda, cuda:N"
ROW_TASKS = ("file", "hf")
"""Tasks whose prompt template may name any column of a data row (`task.prompt_template`)."""


def valid_device(device: str) -> bool:
    """Whether `device` is one of DEVICES (`model.device`, the commands' `--device`)."""
    return device in ("auto", "cpu") or device.startswith("cuda")


def validate(cfg: Config) -> None:
    """Cross-field checks; raises ConfigError naming the field and the fix.

    Names are checked against the registry (after importing `run.plugins`), each selected entry's options are
    built from the section's raw `options` (`resolve_options`), and each chosen entry may carry its own
    `check(cfg) -> message or None` (registered with `register(..., check=fn)`).
    """
    fill_registry()

    def need(cond: bool, msg: str) -> None:
        if not cond:
            raise ConfigError(msg)

    s, a, o, r, t, b = cfg.sampling, cfg.algo, cfg.optim, cfg.run, cfg.task, cfg.budget
    use_python_path(r.python_path)
    import_plugins(r.plugins)
    chosen = [_registered("estimator", a.advantage, "algo.advantage")]
    chosen += [_registered("shaper", x, f"algo.shapers[{i}]") for i, x in enumerate(a.shapers)]
    need(len(set(a.shapers)) == len(a.shapers), f"algo.shapers: {a.shapers} names a shaper twice")
    chosen += [_registered("reward_shaper", x, f"algo.reward_shapers[{i}]") for i, x in enumerate(a.reward_shapers)]
    need(len(set(a.reward_shapers)) == len(a.reward_shapers),
         f"algo.reward_shapers: {a.reward_shapers} names a reward shaper twice")
    chosen += [_registered("policy_loss", a.loss, "algo.loss"),
               _registered("token_filter", a.token_filter, "algo.token_filter"),
               _registered("importance_weights", a.importance_weights, "algo.importance_weights")]
    schedule = _registered("temperature_schedule", s.schedule, "sampling.schedule")
    chosen += [schedule, _registered("budget_policy", b.policy, "budget.policy"),
               _registered("task", t.name, "task.name")]
    resolve_options(cfg)
    _check_choices(cfg)
    _validate_finite(cfg, "", need)  # every number, the methods' options too: inf is never a setting
    need(s.group_size >= 1, "sampling.group_size: must be >= 1")
    need(s.temperature > 0, "sampling.temperature: must be > 0 (use a small value such as 1e-3 for near-greedy)")
    need(0 < s.top_p <= 1, "sampling.top_p: must be in (0, 1]")
    need(s.max_new_tokens >= 1, "sampling.max_new_tokens: must be >= 1")
    need(0 <= a.eps_low <= 1, "algo.eps_low: must be in [0, 1] (1: the ratio is never clipped from below, as the "
                              "Clip-Cov authors run it)")
    need(a.eps_high >= 0, "algo.eps_high: must be >= 0")
    need(a.kl_coef >= 0, "algo.kl_coef: must be >= 0")
    need(a.kl_clamp is None or a.kl_clamp > 0,
         f"algo.kl_clamp: must be > 0 (verl's low_var_kl uses 10) or null for no clamp, got {a.kl_clamp}")
    need(a.epochs >= 1, "algo.epochs: must be >= 1")
    need(a.mini_batches >= 1, "algo.mini_batches: must be >= 1")
    need(a.micro_batch_size >= 0, "algo.micro_batch_size: must be >= 0 (0 = split by algo.length_buckets)")
    need(a.length_buckets >= 1, "algo.length_buckets: must be >= 1 (1 = the whole mini-batch in one forward)")
    need(a.adv_eps >= 0, f"algo.adv_eps: must be >= 0, got {a.adv_eps}")
    need(r.batch_size >= 1, f"run.batch_size: must be >= 1 (prompts per step), got {r.batch_size}")
    need(a.mini_batches <= r.batch_size * s.group_size,
         f"algo.mini_batches: {a.mini_batches} mini-batches need at least that many responses; "
         f"run.batch_size * sampling.group_size = {r.batch_size * s.group_size}")
    need(o.lr > 0, "optim.lr: must be > 0")
    need(0 <= o.min_lr_ratio <= 1, "optim.min_lr_ratio: must be in [0, 1]")
    need(o.warmup_steps >= 0, "optim.warmup_steps: must be >= 0")
    need(o.grad_clip >= 0, "optim.grad_clip: must be >= 0 (0 = off)")
    need(o.weight_decay >= 0, f"optim.weight_decay: must be >= 0, got {o.weight_decay}")
    need(0 <= o.beta1 < 1, f"optim.beta1: must be in [0, 1), got {o.beta1}")
    need(0 <= o.beta2 < 1, f"optim.beta2: must be in [0, 1), got {o.beta2}")
    need(r.steps >= 1, "run.steps: must be >= 1")
    need(0 <= r.seed <= SEED_MAX, f"run.seed: must be in [0, {SEED_MAX}] (torch's generator seeds), got {r.seed}")
    need(r.save_every >= 0, f"run.save_every: must be >= 0 (a checkpoint every this many steps; 0 = only at the "
                            f"end), got {r.save_every}")
    need(r.keep_checkpoints >= 1, f"run.keep_checkpoints: must be >= 1 (the newest checkpoints kept; a resume needs "
                                  f"one), got {r.keep_checkpoints}")
    need(r.eval_every >= 0, f"run.eval_every: must be >= 0 (0 = only at the end), got {r.eval_every}")
    need(r.log_samples >= 0, f"run.log_samples: must be >= 0, got {r.log_samples}")
    need(r.threads >= 0, f"run.threads: must be >= 0 (0 = torch's default), got {r.threads}")
    need(r.max_nonfinite_steps >= 1, f"run.max_nonfinite_steps: must be >= 1, got {r.max_nonfinite_steps}")
    need(r.eval_n >= 1, "run.eval_n: must be >= 1")
    need(all(1 <= k <= r.eval_n for k in r.eval_k),
         f"run.eval_k: every k must be in [1, run.eval_n={r.eval_n}], got {r.eval_k}")
    need(r.eval_temperature > 0, "run.eval_temperature: must be > 0")
    for set_name in r.eval_sets:
        need(re.fullmatch(r"[A-Za-z0-9_.-]+", set_name) is not None and set_name not in EVAL_KEYS_RESERVED,
             f"run.eval_sets: {set_name!r} is not a usable name (letters, digits, '_', '-', '.'; not a metric "
             f"name such as pass@1)")
        # unknown or ill-typed fields raise, naming run.eval_sets.<name>.<field>; then the task's own check
        set_task = eval_set_task(cfg, set_name)
        _validate_finite(set_task, f"run.eval_sets.{set_name}.", need)
        check = _registered("task", set_task.name, f"run.eval_sets.{set_name}.name").extra.get("check")
        message = check(dataclasses.replace(cfg, task=set_task)) if check is not None else None
        need(message is None, (message or "").replace("task.", f"run.eval_sets.{set_name}."))
    bad = [x for x in r.report_to if x not in ("tensorboard", "wandb")]
    need(not bad, f"run.report_to: unknown tracker(s) {bad}; valid: tensorboard, wandb")
    need(cfg.model.dtype != "float16",
         "model.dtype: float16 weights cannot be trained (AdamW keeps its moments in the weights' dtype: squared "
         "gradients below ~2e-4 and its eps of 1e-8 round to 0 in float16, so the first step writes inf/NaN, on the "
         "CPU and on a GPU alike); use model.dtype=float32, or bfloat16 on a GPU that supports it (`auto` picks it)")
    need(valid_device(cfg.model.device), f"model.device: {cfg.model.device!r} is not one of {DEVICES}")
    need(t.train_size >= 1, f"task.train_size: must be >= 1, got {t.train_size}")
    need(t.eval_size >= 1, f"task.eval_size: must be >= 1, got {t.eval_size}")
    need(0 <= t.data_seed <= SEED_MAX, f"task.data_seed: must be in [0, {SEED_MAX}], got {t.data_seed}")
    _validate_rewards(t, need)
    need(t.reward_timeout_s > 0, "task.reward_timeout_s: must be > 0")
    need(t.reward_workers >= 0, f"task.reward_workers: must be >= 0 (0 = one per CPU core), got {t.reward_workers}")
    need(0 <= t.max_reward_failure_frac <= 1,
         f"task.max_reward_failure_frac: must be in [0, 1] (0.5: stop when most of a step's rewards fail; 1: never "
         f"stop), got {t.max_reward_failure_frac}")
    if t.name in ROW_TASKS:  # any column of a row may be used (`tasks.files.fill_template`)
        need(re.search(r"\{[A-Za-z_][A-Za-z0-9_]*\}", t.prompt_template) is not None,
             "task.prompt_template: must contain a placeholder: {question} (the task.prompt_field column) or any "
             "column of the data by name, e.g. {problem}")
    else:
        need("{question}" in t.prompt_template, f"task.prompt_template: must contain {{question}} (task {t.name} "
                                                f"gives its problems' text only)")
    if s.engine == "vllm":
        need(not cfg.model.lora.enabled,
             "sampling.engine=vllm: a LoRA policy (model.lora) cannot be synced to vLLM's engine; train without "
             "model.lora or use sampling.engine=explorl")
        need(0 < s.vllm_memory <= 1, f"sampling.vllm_memory: must be in (0, 1], got {s.vllm_memory}")
    for entry in chosen:
        check = entry.extra.get("check")
        message = check(cfg) if check is not None else None
        need(message is None, message or "")
    f = cfg.rft
    bad = [x for x in f.strategies if x not in ("noisy", "entropy", "branching")]
    need(not bad, f"rft.strategies: unknown {bad}; valid: noisy, entropy, branching")
    need(not ("entropy" in f.strategies and "branching" in f.strategies),
         "rft.strategies: entropy and branching both rank the same samples; choose one")
    for name in ("iterations", "prompts", "samples_per_prompt", "epochs", "batch_size"):
        need(getattr(f, name) >= 1, f"rft.{name}: must be >= 1, got {getattr(f, name)}")
    need(0 < f.select_frac <= 1, f"rft.select_frac: must be in (0, 1], got {f.select_frac}")
    need(0 <= f.noisy_frac <= 1, f"rft.noisy_frac: must be in [0, 1], got {f.noisy_frac}")
    need(0 < f.branching_top_p <= 1, f"rft.branching_top_p: must be in (0, 1], got {f.branching_top_p}")
    need(f.lr > 0, f"rft.lr: must be > 0, got {f.lr}")
    need(f.select_count >= 0, f"rft.select_count: must be >= 0 (0 = no fixed count), got {f.select_count}")
    sf = cfg.sft
    need(sf.epochs >= 1, f"sft.epochs: must be >= 1, got {sf.epochs}")
    need(sf.batch_size >= 1, f"sft.batch_size: must be >= 1, got {sf.batch_size}")
    need(sf.micro_batch_size >= 0, f"sft.micro_batch_size: must be >= 0 (0 = the whole batch in one forward), got "
                                   f"{sf.micro_batch_size}")
    need(sf.max_length >= 0, f"sft.max_length: must be >= 0 (0 = no limit), got {sf.max_length}")
    need(0 < f.eval_top_p <= 1, f"rft.eval_top_p: must be in (0, 1] (1 = off; STILL uses 0.95), got "
                                f"{f.eval_top_p}")
    lo = cfg.model.lora
    if lo.enabled:
        need(lo.rank >= 1, "model.lora.rank: must be >= 1")
        need(len(lo.target_modules) > 0, "model.lora.target_modules: name at least one module")
        need(lo.alpha > 0, f"model.lora.alpha: must be > 0, got {lo.alpha}")
        need(0 <= lo.dropout < 1, f"model.lora.dropout: must be in [0, 1), got {lo.dropout}")


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


SEED_MAX = 2**63 - 2
"""The largest seed: torch's generators take 64-bit seeds, and the loop seeds one with `run.seed + 1`."""


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
    from explorl.rewards import BUILTIN_REWARDS, reward_entries, reward_metric_name

    builtin = ", ".join(BUILTIN_REWARDS)
    entries = reward_entries(t.reward)
    need(len(entries) > 0, f"task.reward: name at least one reward function ({builtin} or module:function)")
    for i, e in enumerate(entries):
        where = "task.reward" if len(entries) == 1 else f"task.reward[{i}]"
        need(e in BUILTIN_REWARDS or ":" in e, f"{where}: {e!r}; valid: {builtin}, or module:function")
    names = [reward_metric_name(e) for e in entries]
    twice = sorted({x for x in names if names.count(x) > 1})
    need(not twice, f"task.reward: {entries} names {', '.join(twice)} more than once; list each function once (its "
                    f"weight in task.reward_weights can be any number)")
    if t.correct_by:
        need(t.correct_by in entries or t.correct_by in names,
             f"task.correct_by: {t.correct_by!r} is not one of the task.reward entries {entries}; name the entry that "
             f"decides correctness (as written, or its metric name {names}), or leave it empty for the first")
    need(math.isfinite(t.correct_threshold), f"task.correct_threshold: must be a finite number, got "
                                             f"{t.correct_threshold}")
    if t.answer_pattern:
        try:
            groups = re.compile(t.answer_pattern).groups
        except re.error as e:
            raise ConfigError(f"task.answer_pattern: {t.answer_pattern!r} is not a regular expression ({e})") from None
        need(groups >= 1, f"task.answer_pattern: {t.answer_pattern!r} needs a group around the answer, e.g. "
                          f"'Answer: *(-?[0-9]+)'")
    w = t.reward_weights
    if w is not None:
        need(len(w) == len(entries),
             f"task.reward_weights: {len(w)} weight(s) for {len(entries)} reward function(s) in task.reward "
             f"{entries}; give one weight per entry, in order, or null for all 1")
        need(all(math.isfinite(x) for x in w), f"task.reward_weights: every weight must be a finite number, got {w}")
        need(any(x != 0 for x in w), "task.reward_weights: all weights are 0, so every reward would be 0 and nothing "
                                     "would be learned; give at least one function a nonzero weight")


# ----------------------------------------------------------------------------------------------------------------
# field documentation (read from the source, so the docstring under each field is the one source)


def selected_entries(cfg: Config) -> dict[str, list[Entry]]:
    """The entries a config selects, per section (`algo`, `sampling`, `budget`), in config order, including those
    an entry selects in turn (`Entry.selects`, e.g. the adaptive schedule's base)."""
    fill_registry()
    a, s, b = cfg.algo, cfg.sampling, cfg.budget
    chosen = {"algo": [*(("reward_shaper", x) for x in a.reward_shapers), ("estimator", a.advantage),
                       *(("shaper", x) for x in a.shapers), ("policy_loss", a.loss), ("token_filter", a.token_filter),
                       ("importance_weights", a.importance_weights)],
              "sampling": [("temperature_schedule", s.schedule)], "budget": [("budget_policy", b.policy)]}
    out: dict[str, list[Entry]] = {}
    for section_name, queue in chosen.items():
        section, found = getattr(cfg, section_name), []
        queue = [(kind, name, SELECTED_BY[kind]) for kind, name in queue]
        while queue:
            kind, name, field_name = queue.pop(0)
            entry = _registered(kind, name, field_name)
            if entry in found:
                continue
            found.append(entry)
            if entry.selects is not None:
                owner = lookup(kind, entry.options_owner)
                raw = section.options.get(owner.name)
                options = raw if owner.options is None or isinstance(raw, owner.options) else \
                    from_dict(owner.options, raw, f"{section_name}.{owner.name}.")
                queue += [(kind, n, f"{section_name}.{owner.name}.{f}") for f, n in entry.selects(options).items()]
        out[section_name] = found
    return out


def resolve_options(cfg: Config) -> None:
    """Replace each section's raw `options` by the typed options of its selected entries, defaults filled in (so
    a run's config.yaml records every selected method's options); refuse options of entries that are not selected,
    unknown fields (with the full key and a "did you mean") and wrong types (naming the key)."""
    for section_name, chosen in selected_entries(cfg).items():
        section = getattr(cfg, section_name)
        raw, typed = dict(section.options), {}
        for entry in chosen:
            owner = lookup(entry.kind, entry.options_owner)
            if owner.options is None or owner.name in typed:
                continue
            value = raw.get(owner.name)
            typed[owner.name] = value if isinstance(value, owner.options) else \
                from_dict(owner.options, value, f"{section_name}.{owner.name}.")
        for key in raw:
            if key not in typed:
                raise ConfigError(_stray_options_message(cfg, section_name, key))
        section.options = typed


def _stray_options_message(cfg: Config, section_name: str, key: str) -> str:
    """Why `section.key` (options of no selected entry) is refused, and the fix."""
    where = f"{section_name}.{key}"
    kinds = [k for k, s in SECTIONS.items() if s == section_name]
    for kind in kinds:
        entry = entries(kind).get(key)
        if entry is None:
            continue
        if entry.options_from is not None:
            return (f"{where}: the {kind.replace('_', ' ')} {key!r} reads the options of {entry.options_from!r}; "
                    f"write them under {section_name}.{entry.options_from}")
        if entry.options is None:
            return f"{where}: the {kind.replace('_', ' ')} {key!r} has no options"
        field_name = SELECTED_BY[kind]
        value = _get(cfg, field_name)
        return (f"{where}: options of the {kind.replace('_', ' ')} {key!r}, which is not selected ({field_name} is "
                f"{value!r}); select it with {field_name}, or remove {where} (on the command line: {where}=null)")
    core = [f.name for f in dataclasses.fields(getattr(cfg, section_name)) if f.name != "options"]
    with_options = sorted({e.options_owner for k in kinds for e in entries(k).values() if e.options or e.options_from})
    near = difflib.get_close_matches(key, core + with_options, n=1)
    hint = f" Did you mean '{section_name}.{near[0]}'?" if near else ""
    return (f"unknown key '{where}'.{hint} Valid keys here: {', '.join(core)}, and the options of a selected "
            f"method under its name ({', '.join(with_options)})")


def _get(cfg: Config, dotted: str) -> Any:
    value: Any = cfg
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


# ----------------------------------------------------------------------------------------------------------------
# the configuration reference (`explorl config`, docs/configuration.md's table): core fields, then every entry's options


def reference(cls: type = Config, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """Rows (dotted name, type, default, doc) for every leaf field of the core config and, after it, the options of
    every method explorl itself registers (`algo.erpo.gamma`, ...), for `explorl config` and docs/configuration.md."""
    rows = _reference(cls, prefix)
    if cls is Config and not prefix:
        fill_registry()
        for kind, section in SECTIONS.items():
            for name, entry in sorted(entries(kind).items()):
                if entry.options is None or not entry.fn.__module__.startswith("explorl."):
                    continue  # explorl's own methods (a plugin's are listed by its own module's docs)
                shared = sorted(n for n, e in entries(kind).items() if e.options_from == name)
                note = f"{kind.replace('_', ' ')} `{name}`" + (f" (and {', '.join(shared)})" if shared else "")
                rows += [(r[0], r[1], r[2], f"{note}: {r[3]}") for r in _reference(entry.options, f"{section}.{name}.")]
    return rows


def _reference(cls: type, prefix: str) -> list[tuple[str, str, str, str]]:
    rows = []
    docs = field_docs(cls)
    hints = _hints(cls)
    default = cls()
    for f in dataclasses.fields(cls):
        if f.name == "options":
            continue
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            rows.extend(_reference(tp, f"{prefix}{f.name}."))
        else:
            choices = CHOICES.get(f"{prefix}{f.name}")
            shown = " | ".join(map(repr, choices)) if choices else _type_name(tp)
            rows.append((f"{prefix}{f.name}", shown, repr(getattr(default, f.name)), docs.get(f.name, "")))
    return rows
