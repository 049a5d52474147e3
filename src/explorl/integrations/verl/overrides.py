"""An explorl config as verl's Hydra overrides: `verl_overrides` maps every field verl has a counterpart for
(model, data and reward, sampling, optimizer, the method, the rollout controllers and DAPO's dynamic sampling, the
trainer), each override remembering the explorl field it comes from (`Overrides`), so a verl override given after
`--` that sets a derived key is refused naming the field to set instead. A setting verl has no counterpart for is
refused (`ConfigError`); one that only tunes explorl's own loop is listed as dropped in the printed comments.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from explorl.algos import requirements
from explorl.algos.registry import lookup
from explorl.config import Config, ConfigError, selected_entries, to_dict
from explorl.integrations.verl.data import CHAT_PASS_THROUGH, DataFiles
from explorl.integrations.verl.loss_fields import verl_fields
from explorl.integrations.verl.needs import controller_settings, takes_rewards_apart, trainer_needs
from explorl.integrations.verl.rollout import rollout_config
from explorl.integrations.vllm import PROCESSOR_NAME
from explorl.models import resolve_model_path
from explorl.rewards import reward_entries

__all__ = ["ALGO_OWNED", "DROPPED", "Overrides", "PLUGINS_ENV", "PYTHON_PATH_ENV", "REWARD_PATH", "hydra_value",
           "verl_overrides"]

REWARD_PATH = "pkg://explorl.integrations.verl.reward"
NEVER = 1e9
"""A verl field that cannot be turned off (the dual clip `clip_ratio_c`, the gradient clip) set so it never acts."""
VERL_OFF = {"clip_ratio_c": NEVER}
PLUGINS_ENV, PYTHON_PATH_ENV = "EXPLORL_PLUGINS", "EXPLORL_PYTHON_PATH"
"""Environment of verl's processes: modules `explorl.integrations.verl` imports before it registers the methods
(`run.plugins`, so a plugin's estimator or loss is registered in every worker), and where they are found."""
A, R, M = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.model"


# ----------------------------------------------------------------------------------------------------------------
# Hydra's override grammar


def hydra_value(value: Any) -> str:
    """A value as Hydra's override grammar reads it back (strings quoted when they hold anything but a plain
    name or path)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(float(f"{value:.12g}"))
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    text = str(value)
    if re.fullmatch(r"[A-Za-z0-9_./:@-]+", text) and isinstance(yaml.safe_load(text), str):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _flat(prefix: str, value: Any) -> list[tuple[str, Any]]:
    """A nested mapping as dotted keys (non-empty mappings are descended; lists and empty mappings are values)."""
    if isinstance(value, dict) and value:
        return [kv for k, v in value.items() for kv in _flat(f"{prefix}.{k}", v)]
    return [(prefix, value)]


@dataclass
class Overrides:
    """verl overrides in order, each with the explorl field it comes from ("" for a default of the launcher's
    that a verl override after `--` may replace), and comments for the printed command."""

    items: dict[str, Any] = field(default_factory=dict)
    owner: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def set(self, key: str, value: Any, source: str = "") -> None:
        self.items[key] = value
        self.owner[key.lstrip("+~")] = source

    def args(self) -> list[str]:
        return [f"{k}={hydra_value(v)}" for k, v in self.items.items()]

    def get(self, key: str, default: Any = None) -> Any:
        for k, v in self.items.items():
            if k.lstrip("+~") == key:
                return v
        return default

    def merge(self, extra: Sequence[str]) -> list[str]:
        """The overrides followed by the user's verl overrides `extra`: a key the explorl config decides is
        refused (set the explorl field instead); a launcher default is replaced."""
        keys = {}
        for item in extra:
            if "=" not in item:
                raise ConfigError(f"verl override {item!r} must look like key=value (after `--`)")
            keys[item.split("=", 1)[0].lstrip("+~")] = item
        for key in keys:
            source = self.owner.get(key)
            if source:
                raise ConfigError(f"verl override {key}: the launcher derives it from the explorl config ({source}); "
                                  f"set that instead (before `--`)")
        kept = [f"{k}={hydra_value(v)}" for k, v in self.items.items() if k.lstrip("+~") not in keys]
        return kept + list(extra)



# ----------------------------------------------------------------------------------------------------------------
# the config as verl's overrides, one section of verl's config at a time


ALGO_OWNED = ("advantage", "loss", "eps_low", "eps_high", "loss_agg", "kl_coef", "entropy_coef", "epochs",
              "mini_batches", "micro_batch_size", "length_buckets")
"""`algo` fields verl's own keys carry; every other one goes to `+algorithm.explorl.<field>`."""
DROPPED = {
    "model.attn_implementation": "verl picks the attention kernel (flash_attention_2)",
    "model.gradient_checkpointing": "verl's actor_rollout_ref.model.enable_gradient_checkpointing decides",
    "model.compile": "verl runs its own training forward",
    "sampling.fast_path, sampling.compile, sampling.cuda_graph, sampling.engine":
        "explorl's own sampler (verl samples with its rollout engine, actor_rollout_ref.rollout.name)",
    "algo.micro_batch_size, algo.length_buckets": "verl splits micro-batches by tokens (use_dynamic_bsz), the same "
                                                  "gradient",
    "run.threads, run.log_samples, run.max_nonfinite_steps": "explorl's own loop only (verl skips non-finite "
                                                             "updates itself)",
    "run.eval_k, run.eval_sets": "evaluated by the finishing step (explorl's held-out evaluation of the exported "
                                 "weights), not by verl's validation",
}


def verl_overrides(cfg: Config, data: DataFiles, *, run_dir: bool = True) -> Overrides:
    """verl's Hydra overrides for the validated explorl config `cfg` and its converted task `data`; ConfigError
    names an explorl field verl has no counterpart for. `run_dir`: write explorl's run directory (explorl's
    trainer mode then runs even where the method does not need it)."""
    if takes_rewards_apart(cfg) and not run_dir:
        rewards = reward_entries(cfg.task.reward)
        raise ConfigError(f"algo.advantage={cfg.algo.advantage} with {len(rewards)} task.reward functions reads each "
                          f"function's own scores, which explorl's trainer mode takes from the run's explorl config: "
                          f"launch without --no-run-dir")
    o = Overrides()
    for section in (_model, _data_and_reward, _sampling, _optimizer, _method, _controllers):
        section(o, cfg, data)
    _trainer(o, cfg, data, run_dir)
    o.notes.append("dropped (they tune explorl's own loop): " + "; ".join(f"{k} ({v})" for k, v in DROPPED.items()))
    return o


def _model(o: Overrides, cfg: Config, data: DataFiles) -> None:
    m = cfg.model
    if m.device != "auto" and m.device != "cuda":
        raise ConfigError(f"model.device={m.device}: verl places its workers on GPUs through Ray; use auto or cuda "
                          f"(and CUDA_VISIBLE_DEVICES / trainer.n_gpus_per_node to choose GPUs)")
    o.set(f"{M}.path", str(resolve_model_path(m.path)), "model.path")
    if m.trust_remote_code:  # verl's default is off, as explorl's
        o.set(f"{M}.trust_remote_code", True, "model.trust_remote_code")
    if m.lm_head_fp32:
        raise ConfigError("model.lm_head_fp32=true: verl 0.9.1's FSDP actor computes the output layer in its "
                          "mixed-precision dtype and has no float32 head (only its automodel engine's "
                          "lm_head_precision); set it false, or use explorl's own loop or TRL's cast_lm_head_to_fp32")
    if m.dtype == "float16":
        raise ConfigError("model.dtype=float16: explorl refuses to train in float16 (AdamW's moments underflow); "
                          "use auto or bfloat16 (verl: float32 master weights, bfloat16 compute) or float32")
    if m.dtype == "float32":
        for role in ("actor", "ref"):
            o.set(f"+actor_rollout_ref.{role}.fsdp_config.mixed_precision.param_dtype", "fp32", "model.dtype")
        o.set(f"{R}.dtype", "float32", "model.dtype")
    else:
        o.notes.append(f"model.dtype={m.dtype}: verl keeps float32 master weights and computes in bfloat16")
    if m.lora.enabled:
        if m.lora.dropout:
            raise ConfigError(f"model.lora.dropout={m.lora.dropout}: verl's FSDP LoRA has no dropout; set 0")
        o.set(f"{M}.lora_rank", m.lora.rank, "model.lora.rank")
        o.set(f"{M}.lora_alpha", m.lora.alpha, "model.lora.alpha")
        o.set(f"{M}.target_modules", list(m.lora.target_modules), "model.lora.target_modules")
    if not data.chat:
        o.set(f"{M}.custom_chat_template", CHAT_PASS_THROUGH, "task.chat_template")


def _data_and_reward(o: Overrides, cfg: Config, data: DataFiles) -> None:
    s, r = cfg.sampling, cfg.run
    o.set("data.train_files", str(data.train), "task")
    o.set("data.val_files", str(data.val), "task")
    o.set("data.max_prompt_length", data.max_prompt_tokens, "task (its longest prompt)")
    o.set("data.max_response_length", s.max_new_tokens, "sampling.max_new_tokens")
    o.set("data.train_batch_size", r.batch_size, "run.batch_size")
    o.set("data.seed", r.seed, "run.seed")
    o.set("reward.custom_reward_function.path", REWARD_PATH, "task.reward")
    o.set("reward.custom_reward_function.name", "compute_score", "task.reward")
    o.set("+reward.custom_reward_function.reward_kwargs.explorl_config", str(data.config), "task.reward")
    if data.batched_rewards:
        o.notes.append(f"task.reward {', '.join(data.batched_rewards)}: verl's v1 reward loop scores each response "
                       f"alone, so a batched function is called on batches of one")


def _sampling(o: Overrides, cfg: Config, data: DataFiles) -> None:
    s = cfg.sampling
    o.set(f"{R}.n", s.group_size, "sampling.group_size")
    o.set(f"{R}.temperature", s.temperature, "sampling.temperature")
    o.set(f"{R}.top_p", s.top_p, "sampling.top_p")
    o.set(f"{R}.seed", cfg.run.seed, "run.seed")
    o.set(f"{R}.name", "vllm")


def _optimizer(o: Overrides, cfg: Config, data: DataFiles) -> None:
    """verl steps its LR schedule once per training step, explorl once per optimizer step."""
    a, opt = cfg.algo, cfg.optim
    updates = a.epochs * a.mini_batches
    o.set(f"{A}.optim.lr", opt.lr, "optim.lr")
    o.set(f"{A}.optim.weight_decay", opt.weight_decay, "optim.weight_decay")
    o.set(f"{A}.optim.betas", [opt.beta1, opt.beta2], "optim.beta1, optim.beta2")
    o.set(f"{A}.optim.lr_warmup_steps", math.ceil(opt.warmup_steps / updates), "optim.warmup_steps")
    o.set(f"{A}.optim.lr_scheduler_type", "cosine", "optim")
    o.set(f"{A}.optim.min_lr_ratio", opt.min_lr_ratio, "optim.min_lr_ratio")
    o.set(f"{A}.optim.clip_grad", opt.grad_clip if opt.grad_clip > 0 else NEVER, "optim.grad_clip")
    if updates > 1 and opt.warmup_steps:
        o.notes.append(f"optim.warmup_steps={opt.warmup_steps} optimizer steps = "
                       f"{math.ceil(opt.warmup_steps / updates)} training steps of {updates} updates (verl steps "
                       f"its schedule once per training step)")
    if opt.grad_clip <= 0:
        o.notes.append(f"optim.grad_clip=0 (off): verl always clips, so {A}.optim.clip_grad={NEVER:g}")


def _method(o: Overrides, cfg: Config, data: DataFiles) -> None:
    """The estimator, the loss and its options, the objective's aggregation, mini-batches and KL."""
    a, s, r = cfg.algo, cfg.sampling, cfg.run
    estimator = lookup("estimator", a.advantage)
    if estimator.needs_greedy_baseline:  # verl 0.9.1 samples one for its own ReMax in its legacy v0 trainer only
        raise ConfigError(f"algo.advantage={a.advantage}: its baseline is each prompt's greedy response, which verl "
                          f"0.9.1 samples only in its legacy trainer (trainer.use_v1=false, deprecated) for its own "
                          f"estimator; its v1 trainer, which explorl's trainer mode extends, samples none. Run it in "
                          f"explorl's loop (explorl train) or TRL's trainer (docs/methods.md §5n)")
    if estimator.needs_sum_pi_squared:  # verl 0.9.1 computes it in its legacy v0 trainer only
        raise ConfigError(f"algo.advantage={a.advantage}: {a.advantage} needs each token's sum_pi_squared, which "
                          f"verl 0.9.1 computes only in its legacy trainer (trainer.use_v1=false, deprecated, with "
                          f"actor_rollout_ref.actor.calculate_sum_pi_squared=true) for its own estimators; its v1 "
                          f"trainer, which explorl's trainer mode extends, computes none. Run it in explorl's loop "
                          f"(explorl train) or TRL's trainer (docs/methods.md §5s)")
    o.set("algorithm.adv_estimator", f"explorl_{a.advantage}", "algo.advantage")
    o.set(f"{A}.policy_loss.loss_mode", f"explorl_{a.loss}", "algo.loss")
    loss = lookup("policy_loss", a.loss)
    if loss.old_is_behavior:
        raise ConfigError(f"algo.loss={a.loss}: explorl's verl plugin receives verl's pi_old; use verl's own bypass "
                          f"mode (`-- algorithm.rollout_correction.bypass_mode=true`, docs/methods.md §6d)")
    _loss_options(o, cfg, loss)
    o.set(f"{A}.clip_ratio_low", a.eps_low, "algo.eps_low")
    o.set(f"{A}.clip_ratio_high", a.eps_high, "algo.eps_high")
    if lookup("aggregation", a.loss_agg).per_question:
        raise ConfigError(f"algo.loss_agg={a.loss_agg}: verl aggregates over the tokens or the "
                          "responses of a mini-batch, not per question; set algo.loss_agg=seq-mean-token-mean (each "
                          "response weighs the same instead of each question) to run in verl")
    o.set(f"{A}.loss_agg_mode", a.loss_agg, "algo.loss_agg")
    if a.loss_agg == "seq-mean-token-sum-norm":  # explorl divides by the length limit, verl by default by the padding
        o.set(f"{A}.loss_scale_factor", s.max_new_tokens, "algo.loss_agg, sampling.max_new_tokens")
    if r.batch_size % a.mini_batches:
        raise ConfigError(f"algo.mini_batches={a.mini_batches}: verl splits the batch into mini-batches of whole "
                          f"prompts, and run.batch_size={r.batch_size} is not a multiple of it")
    o.set(f"{A}.ppo_mini_batch_size", r.batch_size // a.mini_batches, "run.batch_size / algo.mini_batches")
    o.set(f"{A}.ppo_epochs", a.epochs, "algo.epochs")
    o.set(f"{A}.data_loader_seed", r.seed, "run.seed")
    o.set(f"{A}.entropy_coeff", a.entropy_coef, "algo.entropy_coef")
    _kl(o, cfg)
    o.set(f"{A}.use_dynamic_bsz", True)
    o.set(f"{A}.ppo_max_token_len_per_gpu", max(16384, data.max_prompt_tokens + s.max_new_tokens))
    settings = {k: v for k, v in to_dict(a).items() if k not in (*ALGO_OWNED, loss.options_owner)}
    for key, value in _flat("+algorithm.explorl", settings):
        o.set(key, value, f"algo.{key.split('.', 2)[2]}")
    if requirements(a).behavior:  # the rollout's own log-probs (EAD's truncated importance weights)
        o.set(f"{R}.calculate_log_probs", True, "algo.importance_weights")


def _controllers(o: Overrides, cfg: Config, data: DataFiles) -> None:
    """The rollout controllers (explorl's trainer mode drives them) and DAPO's dynamic sampling (verl's filter)."""
    s, r = cfg.sampling, cfg.run
    control = controller_settings(cfg)
    for section, values in control.items():
        for key, value in _flat(f"+algorithm.explorl.{section}", values):
            o.set(key, value, f"{section}.{key.split('.', 3)[3]}")
    if control:
        rollout_config(control, temperature=s.temperature, group_size=s.group_size, max_new_tokens=s.max_new_tokens,
                       top_p=s.top_p, total_steps=r.steps)  # verl's own refusals, before a cluster is started
    if any(e.per_token is not None for e in selected_entries(cfg)["sampling"]):
        o.set(f"+{R}.engine_kwargs.vllm.logits_processors", [PROCESSOR_NAME], "sampling.schedule")
    policy = lookup("budget_policy", cfg.budget.policy)
    if policy.resamples:
        if not policy.drops_uniform_groups:
            raise ConfigError(f"budget.policy={cfg.budget.policy}: it re-samples prompts, and verl's only re-sampling "
                              f"is DAPO's filter of groups whose rewards all agree; use explorl's own loop "
                              f"(`explorl train`)")
        o.set("algorithm.filter_groups.enable", True, "budget.policy")
        o.set("algorithm.filter_groups.metric", "reward", "budget.policy")
        rounds = getattr(policy.options_in(cfg.budget), "max_rounds", None)
        o.notes.append(f"budget.{cfg.budget.policy}.max_rounds={rounds} dropped: verl's sampler refills dropped "
                       f"groups until the batch is full, without a round limit")


def _trainer(o: Overrides, cfg: Config, data: DataFiles, run_dir: bool) -> None:
    """The trainer mode, steps and epochs, checkpoints, validation, logging and the plugins' environment."""
    r = cfg.run
    reasons = trainer_needs(cfg)
    if reasons or run_dir:
        o.set("trainer.v1.trainer_mode", "explorl", "algo (the method's needs)" if reasons else "")
        why = "; ".join(reasons) if reasons else "only for the run directory (the method runs in verl's own trainer)"
        o.notes.append(f"trainer.v1.trainer_mode=explorl: {why}")
    if run_dir:
        o.set("+explorl.config", str(data.config), "run.out_dir")
    o.set("trainer.total_training_steps", r.steps, "run.steps")
    per_epoch = data.train_rows // r.batch_size
    o.set("trainer.total_epochs", math.ceil(r.steps / per_epoch), "run.steps")
    o.set("trainer.default_local_dir", str(data.dir / "checkpoints"), "run.out_dir")
    o.set("trainer.save_freq", r.save_every if r.save_every > 0 else r.steps, "run.save_every")
    o.set("trainer.max_actor_ckpt_to_keep", r.keep_checkpoints, "run.keep_checkpoints")
    o.set(f"{A}.checkpoint.save_contents", ["model", "optimizer", "extra", "hf_model"])
    o.set("trainer.test_freq", r.eval_every if r.eval_every > 0 else -1, "run.eval_every")
    o.set("trainer.val_before_train", False, "run.eval_every")
    o.set(f"{R}.val_kwargs.n", r.eval_n, "run.eval_n")
    o.set(f"{R}.val_kwargs.temperature", r.eval_temperature, "run.eval_temperature")
    o.set(f"{R}.val_kwargs.do_sample", r.eval_temperature > 0, "run.eval_temperature")
    loggers = ["console"] + [x for x in r.report_to if x in ("tensorboard", "wandb")]
    o.set("trainer.logger", loggers, "run.report_to")
    o.set("trainer.project_name", r.wandb_project, "run.wandb_project")
    o.set("trainer.experiment_name", Path(r.out_dir).name, "run.out_dir")
    if r.plugins:
        o.set(f"+ray_kwargs.ray_init.runtime_env.env_vars.{PLUGINS_ENV}", ",".join(r.plugins), "run.plugins")
        o.set(f"+ray_kwargs.ray_init.runtime_env.env_vars.{PYTHON_PATH_ENV}", os.pathsep.join(r.python_path),
              "run.python_path")


def _loss_options(o: Overrides, cfg: Config, loss) -> None:
    """The loss's options as verl's actor fields (`verl_fields`: option -> where verl keeps it); an option verl has
    no field for must keep its default."""
    options = loss.options_in(cfg.algo)
    if options is None:
        return
    fields = verl_fields(loss.name)
    defaults = type(options)()
    for f in dataclasses.fields(options):
        value, name = getattr(options, f.name), f"algo.{loss.options_owner}.{f.name}"
        if f.name in fields:
            key, factor = fields[f.name].key, fields[f.name].factor
            if value is None:
                if key not in VERL_OFF:
                    raise ConfigError(f"{name}=null: verl's {A}.{key} cannot be turned off")
                o.set(f"{A}.{key}", VERL_OFF[key], name)
                o.notes.append(f"{name}=null (off): verl always applies {A}.{key}, so it is {VERL_OFF[key]:g} "
                               f"(never active)")
            else:
                o.set(f"{A}.{key}", value / factor, name)
        elif value != getattr(defaults, f.name):
            raise ConfigError(f"{name}={value!r}: verl's policy loss has no field for it (loss {loss.name!r}); keep "
                              f"the default {getattr(defaults, f.name)!r} or use explorl's own loop")


def _kl(o: Overrides, cfg: Config) -> None:
    """The k3 KL term: verl's `low_var_kl` (its estimate clamped to [-10, 10]); a reference model also when the
    method reads reference log-probs without a KL term (verl computes them only with its KL loss on)."""
    a = cfg.algo
    o.set("algorithm.use_kl_in_reward", False, "algo.kl_coef")
    needs_ref = requirements(a).ref
    if a.kl_importance_weighted:
        raise ConfigError("algo.kl_importance_weighted=true: verl 0.9.1's KL loss has no ratio weighting (TRL's "
                          "use_bias_correction_kl); set it false or use explorl's own loop or its TRL trainer")
    if a.kl_coef > 0 or needs_ref:
        if a.kl_clamp is not None and a.kl_clamp != 10:
            raise ConfigError(f"algo.kl_clamp={a.kl_clamp}: verl's k3 KL (low_var_kl) clamps at 10; set "
                              f"algo.kl_clamp=10 or null")
        o.set(f"{A}.use_kl_loss", True, "algo.kl_coef")
        o.set(f"{A}.kl_loss_coef", a.kl_coef, "algo.kl_coef")
        o.set(f"{A}.kl_loss_type", "low_var_kl", "algo.kl_coef")
        if a.kl_coef == 0:
            o.notes.append(f"algo.kl_coef=0 with algo.advantage={a.advantage}: verl computes reference log-probs "
                           f"only with its KL loss on, so use_kl_loss=true with kl_loss_coef=0")
        if a.kl_clamp is None and a.kl_coef > 0:
            o.notes.append("algo.kl_clamp=null: verl's k3 KL clamps the log-ratio to [-20, 20] and the estimate to "
                           "[-10, 10] (algo.kl_clamp=10 in explorl's terms)")
    else:
        o.set(f"{A}.use_kl_loss", False, "algo.kl_coef")
