"""What `explorl eval` evaluates with, and where each value came from.

`resolve_eval_settings` turns plain values (a model path, a task name, task options, the sampling flags given,
`SamplingFlags`) into the task, its held-out problems and the sampling settings of an evaluation. A run's output
(RUN, RUN/final, RUN/checkpoints/step_N) is evaluated as the run was: its config.yaml supplies the task, the prompt
template, the length limit, the held-out split, the temperature and top_p, and any value given overrides it; a
config file of the user's (`explorl eval --config FILE`) supplies them the same way, for a model directory or in
place of a run's. The code a run's config.yaml names is used only when the command was told to trust it
(`explorl.config.trust`).
`settings` lists each value with its origin (`--temperature`, `run config: run.eval_temperature`, `--config:
sampling.top_p`, `default`, ...): the "eval settings" table of `explorl eval` and the `settings` of its JSON
summary. `EvalSettings.sampling` is the sampling section the evaluation's one sampler is built from
(`EvalSettings.sampler`, `rollout.sampler.Sampler`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from explorl.algos.registry import lookup, names
from explorl.config import Config, ConfigError, SamplingConfig, command_task, load_config, validate
from explorl.config.recorded import is_recorded_config, recorded_model
from explorl.config.trust import CodeTrust
from explorl.config.validation import fill_registry
from explorl.models import find_run_output
from explorl.rollout.sampler import Sampler
from explorl.rollout.temperature_schedules import PromptTemperature
from explorl.tasks import load_task  # importing explorl.tasks fills the task registry

if TYPE_CHECKING:
    from explorl.config import TaskConfig
    from explorl.models import RunOutput
    from explorl.tasks import Task


@dataclass
class EvalSettings:
    """An evaluation's task, problems and sampling settings (`resolve_eval_settings`)."""

    run: RunOutput | None
    """The run output evaluated, or None for a plain model."""
    run_cfg: Config | None
    """The run's config, or None."""
    task_cfg: TaskConfig
    """The task's settings: the run's, or the named task's defaults; the task options on top."""
    task: Task
    """The loaded task."""
    problems: list
    """The held-out problems evaluated (the first `limit` of `task.eval`, or all)."""
    sampling: SamplingConfig
    """What the sampler is built from (`sampler`): the run's `sampling` section (decoder, compilation, CUDA graph),
    else the defaults, with the length limit and top-p resolved here."""
    temperature: float
    schedule: str
    """The inference-time temperature schedule (a registered `static` or `per_token` one)."""
    schedule_options: dict
    """Its options as given (`--schedule-opt FIELD=VALUE`), the rest at their defaults."""
    sampler_temperature: PromptTemperature
    """How each prompt is sampled (`inference_schedule`): at `temperature`, or with a per-token schedule's
    arguments."""
    settings: list[tuple[str, Any, str]]
    """(setting, value, where it came from) of each setting, in the order shown."""
    config_path: Path | None = None
    """The config file the settings came from (the run's config.yaml, or `--config`), or None."""

    @property
    def max_new_tokens(self) -> int:
        return self.sampling.max_new_tokens

    @property
    def top_p(self) -> float:
        return self.sampling.top_p

    def sampler(self, model, tokenizer) -> Sampler:
        """The evaluation's sampler for `model` (explorl's own: an evaluation never samples through vLLM)."""
        return Sampler.from_config(model, tokenizer, self.sampling)

    def record(self) -> dict[str, dict]:
        """`settings` as the eval summary stores them: {setting: {"value": ..., "from": ...}}."""
        return {name: {"value": value, "from": where} for name, value, where in self.settings}


def inference_schedule(schedule: str | None, temperature: float, max_new_tokens: int,
                       options: Mapping[str, Any] | None = None) -> PromptTemperature:
    """How every prompt is sampled under an inference-time schedule (EAD section 5.4, EAD at inference): a
    registered temperature schedule that is `static` (the default, `sampling.schedule`'s: `temperature`) or has a
    `per_token` temperature, at training step 0 with `options` (its `sampling.<name>.*` fields, e.g. EAD's decay
    constant `d0`), times `temperature`: the schedule's own request (`per_prompt`), a `PromptTemperature` whose
    `table` is the temperature of each generated token's position. A schedule that adapts during training (E3's
    controller, per-prompt temperatures) is refused."""
    fill_registry()
    schedule = schedule or SamplingConfig.schedule
    usable = [n for n in names("temperature_schedule")
              if lookup("temperature_schedule", n).static or lookup("temperature_schedule", n).per_token is not None]
    if schedule not in usable:
        raise SystemExit(f"--schedule {schedule}: not a schedule that samples without training (a registered "
                         f"temperature schedule that is static or per-token); valid: {', '.join(usable)}")
    entry = lookup("temperature_schedule", schedule)
    cfg = Config(sampling=SamplingConfig(schedule=schedule, temperature=temperature, max_new_tokens=max_new_tokens,
                                         options={entry.options_owner: dict(options)} if options else {}))
    try:
        validate(cfg)
    except ConfigError as e:
        raise SystemExit(f"--schedule {schedule} / --schedule-opt: {e}") from None
    bound = entry.bind(cfg.sampling)(cfg, 2)
    sampler_temperature, _, _ = bound.at(0)
    return bound.per_prompt(0, sampler_temperature, [0])[0]


def eval_split(task_cfg, count: int, all_rows: bool) -> str:
    """The held-out problems an evaluation uses, in words, with the settings that chose them (`task.data_seed` only
    for a task that reads it: a generated one such as arith or rg, not the rows of a file or dataset)."""
    if task_cfg.name == "file":
        if all_rows:
            return f"all {count} rows of {task_cfg.eval_path}"
        if task_cfg.eval_path:
            return f"first {count} rows of {task_cfg.eval_path} (task.eval_size={task_cfg.eval_size})"
        return f"last {count} rows of {task_cfg.path} (task.eval_size={task_cfg.eval_size}; the rest trains)"
    if task_cfg.name == "hf":
        if task_cfg.eval_split:
            return (f"first {count} rows of split {task_cfg.eval_split!r} of {task_cfg.path} "
                    f"(task.eval_size={task_cfg.eval_size})")
        return (f"last {count} rows of split {task_cfg.split!r} of {task_cfg.path} (task.eval_size="
                f"{task_cfg.eval_size}; the rest trains)")
    seeded = "data_seed" in lookup("task", task_cfg.name).reads
    return (f"{count} held-out problems (task.eval_size={task_cfg.eval_size}"
            + (f", task.data_seed={task_cfg.data_seed})" if seeded else ")"))


def settings_config(run: RunOutput | None, config: str | Path | None,
                    trust: CodeTrust | None = None) -> tuple[Config | None, Path | None]:
    """(the config an evaluation's settings come from, its file): `config`, a file of the user's (with a run's
    output, the run's config.yaml then gives only the model, read as data: `recorded_model`); else the run's
    config.yaml, loaded only when the code it names is trusted (`trust`; RecordedCodeError otherwise, before
    anything is imported); else (None, None). A run's config.yaml given as `config` is held to the same rule."""
    trust = trust if trust is not None else CodeTrust()
    if config is not None:
        if is_recorded_config(config):
            trust.refuse_untrusted(config)
        cfg = load_config(config)
        return (dataclasses.replace(cfg, model=recorded_model(run.config_path)) if run is not None else cfg,
                Path(config))
    if run is None:
        return None, None
    trust.refuse_untrusted(run.config_path)
    return load_config(run.config_path), run.config_path


@dataclass(frozen=True)
class SamplingFlags:
    """The sampling values an evaluation was given (`explorl eval`'s flags); None: not given, so the run's value,
    else the default, holds (`resolve_eval_settings`)."""

    max_new_tokens: int | None = None
    """`--max-new-tokens`: the length limit (default the run's `sampling.max_new_tokens`, else 64)."""
    temperature: float | None = None
    """`--temperature` (default the run's `run.eval_temperature`, else 1.0)."""
    top_p: float | None = None
    """`--top-p` (default the run's `sampling.top_p`, else 1.0)."""
    schedule: str | None = None
    """`--schedule`: the inference-time temperature schedule (`inference_schedule`; default static)."""
    schedule_options: Mapping[str, Any] | None = None
    """`--schedule-opt FIELD=VALUE`: the schedule's options as given."""


def resolve_eval_settings(model: str, task: str | None = None, task_opts: Mapping[str, str] | None = None, *,
                          flags: SamplingFlags = SamplingFlags(), limit: int = 0, config: str | Path | None = None,
                          trust: CodeTrust | None = None) -> EvalSettings:
    """The settings of evaluating `model` (a model directory, `embedded`, or a run's output) on task `task` (None:
    the run's task, else arith) with `task_opts` (`field=value` text of task.* fields, as `--task-opt` gives it);
    `flags` (`SamplingFlags`): `max_new_tokens`, `temperature` and `top_p` override the run's values (None: the
    run's, else 64, 1.0, 1.0), `schedule` (None: the default, static) with `schedule_options` the inference-time
    temperature schedule (`inference_schedule`); `limit` keeps the first N problems (0 = all); `config`, `trust`:
    `settings_config`'s. Loads the task (not the model); raises ValueError if its data cannot be read, naming the
    settings' file."""
    max_new_tokens, temperature, top_p = flags.max_new_tokens, flags.temperature, flags.top_p
    schedule, schedule_options = flags.schedule, flags.schedule_options
    opts = dict(task_opts or {})
    # a run's output (RUN, RUN/final, RUN/checkpoints/step_N): evaluate it as the run did, flags override
    run = find_run_output(model)
    run_cfg, source = settings_config(run, config, trust)
    from_run = ("--config" if config is not None else "run config") if run_cfg is not None else ""
    if run_cfg is not None and task in (None, run_cfg.task.name):
        task_from = from_run
    else:
        task_from = "--task" if task else "default"
    task_cfg = command_task(run_cfg, task, opts)
    # `--task-opt path=test.jsonl` alone names the file to evaluate on: all of its rows, not a training split
    whole_file = task_cfg.name == "file" and "path" in opts and "eval_path" not in opts

    def origin(flag_given: bool, flag: str, run_field: str) -> str:
        if flag_given:
            return flag
        return f"{from_run}: {run_field}" if run_cfg is not None else "default"

    def task_origin(*fields: str) -> str:
        given = [f for f in fields if f in opts]
        if given:
            return ", ".join(f"--task-opt {f}" for f in given)
        return f"{from_run}: task.{', task.'.join(fields)}" if task_from == from_run and from_run else "default"

    r = run_cfg
    max_new = max_new_tokens if max_new_tokens is not None else (r.sampling.max_new_tokens if r is not None else 64)
    temp = temperature if temperature is not None else (r.run.eval_temperature if r is not None else 1.0)
    nucleus = top_p if top_p is not None else (r.sampling.top_p if r is not None else 1.0)
    sampler_temperature = inference_schedule(schedule, temp, max_new, schedule_options)
    sampling = dataclasses.replace(r.sampling if r is not None else SamplingConfig(), max_new_tokens=max_new,
                                   top_p=nucleus)
    try:
        loaded = load_task(task_cfg)
    except ValueError as e:
        if source is None:
            raise
        raise ValueError(f"{e} (the task settings come from {source}; override them with --task-opt "
                         f"FIELD=VALUE or --task)") from None
    problems = loaded.eval[:limit] if limit else loaded.eval
    split = eval_split(task_cfg, len(loaded.eval), whole_file and "eval_size" not in opts)
    if limit and limit < len(loaded.eval):
        split += f"; the first {len(problems)} of them (--limit)"
    settings = [
        ("model", str(run.model_dir) if run is not None else model,
         f"{run.kind} of the run {run.run_dir}" if run is not None else "--model"),
        ("task", task_cfg.name, "--task" if task else task_origin("name")),
        ("prompt template", task_cfg.prompt_template, task_origin("prompt_template")),
        ("eval split", split, "--task-opt path" if whole_file else task_origin("path", "eval_path", "eval_size")),
        ("reward", task_cfg.reward, task_origin("reward")),
        ("max_new_tokens", max_new, origin(max_new_tokens is not None, "--max-new-tokens",
                                           "sampling.max_new_tokens")),
        ("temperature", temp, origin(temperature is not None, "--temperature", "run.eval_temperature")),
        ("top_p", nucleus, origin(top_p is not None, "--top-p", "sampling.top_p")),
        ("schedule", (schedule or SamplingConfig.schedule) + "".join(
            f", {k} = {v}" for k, v in (schedule_options or {}).items()),
         "--schedule" if schedule is not None else "default"),
    ]
    return EvalSettings(run=run, run_cfg=run_cfg, task_cfg=task_cfg, task=loaded, problems=problems,
                        sampling=sampling, temperature=temp, schedule=schedule or SamplingConfig.schedule,
                        schedule_options=dict(schedule_options or {}), sampler_temperature=sampler_temperature,
                        settings=settings, config_path=source)
