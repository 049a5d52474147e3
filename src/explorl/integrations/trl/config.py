"""TRL's `GRPOConfig` and explorl's config side by side: `explorl_config` builds the explorl `Config` an
`ExplorlGRPOTrainer` runs (algo, sampling, budget; run.steps from TRL's optimizer steps, `generation_rounds`) and
refuses, naming the field to use instead, every TRL setting that explorl's config replaces (`loss_type`,
`scale_rewards`, `epsilon*`, `delta`, `beta` as a coefficient, `top_entropy_quantile`, `entropy_coef`, ...) or that
the adapter cannot honour (per-prompt budgets and temperatures: TRL samples `num_generations` per prompt at one
temperature). `check_run_config` holds a `run_config`'s run section against TRL's arguments.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any

from trl import GRPOConfig

from explorl.algos.registry import lookup, names
from explorl.config import AlgoConfig, BudgetConfig, Config, ConfigError, RunConfig, SamplingConfig, from_dict, validate
from explorl.config.validation import fill_registry
from explorl.integrations.loop_only import refuse_branching
from explorl.integrations.trl.loss_fields import TRL_LOSS_FIELDS

__all__ = ["ELSEWHERE", "VLLM_DRIVEN", "check_run_config", "checkpointing_field", "explorl_config",
           "generation_rounds"]

ELSEWHERE = ("explorl's own loop (`explorl train RECIPE`, which samples each prompt's budget itself) or verl "
             "(`explorl.integrations.verl`)")


def _section(cls: type, value: Any, prefix: str):
    """An explorl config section from a dataclass instance, a mapping of its fields, or None (the defaults)."""
    if value is None:
        return cls()
    if isinstance(value, cls):
        return dataclasses.replace(value)
    if isinstance(value, Mapping):
        return from_dict(cls, dict(value), prefix)
    raise ConfigError(f"{prefix.rstrip('.')}: expected a {cls.__name__} or a mapping of its fields, got "
                      f"{type(value).__name__}")


def explorl_config(args: GRPOConfig, algo: AlgoConfig | Mapping | None = None,
                   sampling: SamplingConfig | Mapping | None = None,
                   budget: BudgetConfig | Mapping | None = None) -> Config:
    """The explorl `Config` an `ExplorlGRPOTrainer` runs, validated by explorl's rules and against TRL's `args`.

    `sampling` defaults to TRL's own settings (`num_generations`, `temperature`, `top_p`, `max_completion_length`);
    when given, the fields both configs have must agree, so nothing is decided twice. Raises `ConfigError` naming
    the field and the fix.
    """
    a = _section(AlgoConfig, algo, "algo.")
    b = _section(BudgetConfig, budget, "budget.")
    given = sampling is not None
    s = _section(SamplingConfig, sampling, "sampling.")
    if not given:
        s.group_size, s.temperature, s.top_p = args.num_generations, args.temperature, args.top_p
        s.max_new_tokens = args.max_completion_length
    pairs = [("group_size", "num_generations"), ("temperature", "temperature"), ("top_p", "top_p"),
             ("max_new_tokens", "max_completion_length")]
    for ours, theirs in pairs:
        if getattr(s, ours) != getattr(args, theirs):
            raise ConfigError(f"sampling.{ours}={getattr(s, ours)} differs from GRPOConfig.{theirs}="
                              f"{getattr(args, theirs)}: set both to the same value (TRL samples with its own)")
    fill_registry()
    try:
        budget = lookup("budget_policy", b.policy)
    except KeyError as e:
        raise ConfigError(f"budget.policy: {e.args[0]}") from None
    refuse_branching(b.policy, "TRL's generation")
    if not budget.static:
        raise ConfigError(f"budget.policy={b.policy}: this budget policy changes the number of responses per prompt "
                          f"or re-samples prompts, which TRL's fixed `num_generations` rules out; train this method "
                          f"with {ELSEWHERE}, or use a budget policy without per-prompt budgets")
    gen_batch = args.generation_batch_size or args.per_device_train_batch_size * args.steps_per_generation
    cfg = Config(algo=a, sampling=s, budget=b,
                 run=RunConfig(steps=generation_rounds(args), batch_size=max(gen_batch // s.group_size, 1),
                               seed=args.seed))
    _check_against_trl(cfg, args)
    _check_loop_only(a)
    # vLLM's sampler differs from the trainer numerically even at one tau: its log-probs are a behaviour policy
    vllm_weights = args.use_vllm and a.importance_weights != AlgoConfig().importance_weights
    check = dataclasses.replace(cfg, sampling=dataclasses.replace(s, top_p=min(s.top_p, 0.999))) if vllm_weights \
        else cfg
    validate(check)
    s.options = check.sampling.options  # the typed options validation built (on the copy, with vLLM's TIS)
    return cfg


def generation_rounds(args: GRPOConfig) -> int:
    """explorl's steps in a TRL run: the generation rounds of `max_steps` optimizer steps. A round is
    steps_per_generation x num_iterations micro-batches (explorl's mini-batches x epochs), gradient_accumulation_steps
    of them per optimizer step; so `max_steps = run.steps x algo.epochs x algo.mini_batches` runs `run.steps`."""
    micro = max(int(args.max_steps), 1) * args.gradient_accumulation_steps
    return max(math.ceil(micro / (args.steps_per_generation * args.num_iterations)), 1)


# SamplingParams fields that TRL's vLLM generation sets from GRPOConfig and explorl's schedule, and what a
# generation_kwargs entry overriding them would break
VLLM_DRIVEN = {
    "temperature": "explorl's temperature schedule sets the request temperature each step (the trainer's log-probs "
                   "divide by the same one)",
    "top_p": "explorl checks the sampling distribution against GRPOConfig.top_p / sampling.top_p",
    "top_k": "explorl checks the sampling distribution against GRPOConfig.top_k",
    "min_p": "explorl checks the sampling distribution against GRPOConfig.min_p",
    "repetition_penalty": "explorl checks the sampling distribution against GRPOConfig.repetition_penalty",
    "logprobs": "TRL keeps the first of the returned log-probs as the sampled token's (the behaviour log-probs of "
                "algo.importance_weights=tis), which holds only for logprobs=0",
}


def _trl_is_hint(args: GRPOConfig) -> str:
    """The refusal of TRL's own vLLM importance sampling: the explorl settings that reproduce it (rollout_is)."""
    mode = getattr(args, "vllm_importance_sampling_mode", "sequence_mask")
    level, _, how = mode.partition("_")
    hi, lo = getattr(args, "vllm_importance_sampling_clip_max", 3.0), getattr(args, "vllm_importance_sampling_clip_min",
                                                                              None)
    none = lambda v: "null" if v is None else v  # noqa: E731
    return (f"GRPOConfig.vllm_importance_sampling_correction: explorl's loss replaces TRL's; set "
            f"algo.importance_weights=rollout_is algo.rollout_is.level={level} algo.rollout_is.mode={how} "
            f"algo.rollout_is.threshold={none(hi)} algo.rollout_is.threshold_lower={none(lo)} (TRL's "
            f"vllm_importance_sampling_mode={mode} on vLLM's log-probs, docs/methods.md §6d), or "
            f"algo.importance_weights=tis (EAD's truncated weights), or vllm_importance_sampling_correction=False")


def _check_against_trl(cfg: Config, args: GRPOConfig) -> None:
    """TRL settings that explorl's config replaces, or that the adapter cannot honour."""
    a, s = cfg.algo, cfg.sampling
    ga, spg = args.gradient_accumulation_steps, args.steps_per_generation

    def need(cond: bool, msg: str) -> None:
        if not cond:
            raise ConfigError(msg)

    need(a.epochs == args.num_iterations,
         f"algo.epochs={a.epochs} differs from GRPOConfig.num_iterations={args.num_iterations}: TRL makes that many "
         f"passes over each generation batch; set both to the same value")
    need(spg % ga == 0 and a.mini_batches == spg // ga,
         f"algo.mini_batches={a.mini_batches}: TRL takes GRPOConfig.steps_per_generation / "
         f"gradient_accumulation_steps = {spg} / {ga} optimizer steps per generation batch; set "
         f"steps_per_generation = algo.mini_batches * gradient_accumulation_steps")
    need(args.beta == 0 or args.beta == a.kl_coef,
         f"GRPOConfig.beta={args.beta}: the KL coefficient is algo.kl_coef={a.kl_coef}; leave beta at 0 (the "
         f"trainer keeps TRL's reference model whenever explorl's method needs one)")
    need(a.kl_coef == 0 or getattr(args, "use_bias_correction_kl", False) == a.kl_importance_weighted,
         f"GRPOConfig.use_bias_correction_kl={getattr(args, 'use_bias_correction_kl', None)} and "
         f"algo.kl_importance_weighted={a.kl_importance_weighted}: explorl's KL term replaces TRL's and is weighted by "
         f"the ratio only with algo.kl_importance_weighted (docs/methods.md §1c); set both to the same value")
    need(not args.mask_truncated_completions,
         "GRPOConfig.mask_truncated_completions: use algo.reward_shapers=[dapo_overlong_filter] (DAPO's overlong "
         "filtering in explorl's step)")
    need(args.top_entropy_quantile == 1.0,
         "GRPOConfig.top_entropy_quantile: use algo.token_filter=forking with algo.forking.top_frac (the share kept)")
    need(args.entropy_coef == 0, "GRPOConfig.entropy_coef: use algo.entropy_coef (explorl's entropy bonus)")
    need(not args.use_adaptive_entropy,
         "GRPOConfig.use_adaptive_entropy: explorl's entropy term replaces TRL's; set algo.entropy_control.enabled "
         "(with algo.entropy_control.target / delta / coef_min / coef_max; docs/methods.md §5aa), which the "
         "trainer drives as explorl's loop does")
    need(args.importance_sampling_level == "token",
         "GRPOConfig.importance_sampling_level: explorl's loss replaces TRL's; GSPO's sequence-level ratio is "
         "algo.loss=gspo, sequence-level truncated importance weights algo.tis.level=sequence")
    need(args.loss_type not in names("policy_loss") or a.loss == args.loss_type,  # TRL's cispo, sapo, luspo, vespo
         f"GRPOConfig.loss_type={args.loss_type}: explorl's loss replaces TRL's; set algo.loss={args.loss_type} "
         f"(`explorl methods` names its section of docs/methods.md, which says where TRL's differs)")
    need(not lookup("policy_loss", a.loss).old_is_behavior,
         f"algo.loss={a.loss}: verl's bypass mode takes pi_old from the rollout, and TRL's trainer computes its own; "
         f"run it in explorl's loop (explorl train), or here use algo.importance_weights=rollout_is "
         f"(docs/methods.md §6d)")
    trl_default = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}
    for loss, fields in TRL_LOSS_FIELDS.items():
        for ours, theirs in fields.items():
            need(getattr(args, theirs, None) == trl_default.get(theirs),  # a TRL without SAPO / VESPO has neither
                 f"GRPOConfig.{theirs}: explorl's loss replaces TRL's; set algo.{loss}.{ours} (with algo.loss={loss})")
    need(args.off_policy_mask_threshold is None,
         f"GRPOConfig.off_policy_mask_threshold={args.off_policy_mask_threshold}: explorl's loss replaces TRL's; set "
         f"algo.shapers=[..., off_policy_mask] with algo.off_policy_mask.threshold="
         f"{args.off_policy_mask_threshold} (DeepSeek-V3.2's off-policy sequence mask, docs/methods.md §6d) and "
         f"leave it None")
    need(not (args.use_vllm and args.vllm_importance_sampling_correction
              and a.importance_weights == AlgoConfig().importance_weights),
         _trl_is_hint(args))
    if args.use_vllm:
        given = args.generation_kwargs or {}
        given = json.loads(given) if isinstance(given, str) else given
        for key in (k for k in VLLM_DRIVEN if k in given):
            raise ConfigError(f"GRPOConfig.generation_kwargs[{key!r}]: TRL's vLLM generation lets generation_kwargs "
                              f"override its SamplingParams, and {VLLM_DRIVEN[key]}; set it through GRPOConfig's own "
                              f"field (and explorl's sampling config), not generation_kwargs")
    schedule = lookup("temperature_schedule", s.schedule)
    why = ("TRL's vLLM generation sends one SamplingParams (one temperature) with every prompt of a batch"
           if args.use_vllm else "TRL's transformers generation samples a batch with one GenerationConfig")
    need(not schedule.per_prompt_temperature,
         f"sampling.schedule={s.schedule}: per-prompt temperatures are not wired into TRL's generation ({why}); use "
         f"{ELSEWHERE}")
    if not schedule.behavior_is_policy:  # a per-token temperature table (EAD, RevEAD)
        need(not args.use_transformers_continuous_batching,
             f"sampling.schedule={s.schedule}: transformers' continuous batching takes no logits processor; set "
             f"GRPOConfig.use_transformers_continuous_batching=False")
        need(s.top_p == 1.0 and not args.top_k and args.min_p is None and args.repetition_penalty == 1.0,
             f"sampling.schedule={s.schedule}: the per-token temperature is applied after transformers' own "
             f"processors, so top_p / top_k / min_p / repetition_penalty would act before it (explorl's sampler "
             f"applies the temperature first); set them off (top_p=1, top_k=0, min_p=None, repetition_penalty=1)")


def _check_loop_only(a: AlgoConfig) -> None:
    """explorl's settings that only its own loop carries out: an estimator's greedy baseline (the trainer runs the
    adaptive entropy coefficient, ProRL's reset, the top-K log-probs SimKO reads and the shapers of final answers)."""
    # an unknown estimator is left to the validation after these checks, which names the valid ones
    estimator = lookup("estimator", a.advantage) if a.advantage in names("estimator") else None
    if estimator is not None and estimator.needs_greedy_baseline:
        raise ConfigError(f"algo.advantage={a.advantage}: its baseline is each prompt's greedy response, which TRL's "
                          f"trainer does not sample; run it in explorl's loop (explorl train)")


def check_run_config(run: Config, cfg: Config) -> None:
    """`run_config`'s run section against what TRL's arguments make of it (`explorl_config`), so config.yaml describes
    the run that happens."""
    pairs = [("steps", "generation rounds: GRPOConfig.max_steps x gradient_accumulation_steps / "
                       "(steps_per_generation x num_iterations); set max_steps = run.steps x algo.epochs x "
                       "algo.mini_batches"),
             ("batch_size", "prompts per generation batch over every process: GRPOConfig.generation_batch_size / "
                            "num_generations"),
             ("seed", "GRPOConfig.seed")]
    for field, what in pairs:
        ours, theirs = getattr(run.run, field), getattr(cfg.run, field)
        if ours != theirs:
            raise ConfigError(f"run.{field}={ours} in run_config, but TRL's arguments give {theirs} ({what}); set "
                              f"both to the same value")


def checkpointing_field() -> str:
    """The `GRPOConfig` field that turns activation (gradient) checkpointing on: `activation_checkpointing` in
    recent transformers, `gradient_checkpointing` in earlier ones (verl's pin, for instance)."""
    fields = getattr(GRPOConfig, "__dataclass_fields__", {})
    return "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"
