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
  logits processor, or in vLLM through `explorl.integrations.vllm.EADLogitsProcessor` (the engine must load it:
  `logits_processors=["explorl.integrations.vllm:EADLogitsProcessor"]`; each request carries the step's annealing
  arguments in `SamplingParams.extra_args`), while the optimised policy stays at `sampling.temperature`.

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
  shaping, `algo.overlong`).
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
import dataclasses
import json
import os
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor

from explorl.algos import PreparedBatch, RolloutBatch, compute_advantages, policy_objective, requirements
from explorl.algos.batch import MissingInputError
from explorl.algos.losses import aggregation_count
from explorl.algos.registry import lookup
from explorl.algos.step import single_update_shortcut
from explorl.config.validation import fill_registry
from explorl.config import (AlgoConfig, BudgetConfig, Config, ConfigError, RunConfig, SamplingConfig, from_dict,
                            validate)

try:
    from transformers import LogitsProcessor, LogitsProcessorList
    from trl import GRPOConfig, GRPOTrainer
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError(f"explorl.integrations.trl needs TRL: pip install -e \".[trl]\" ({e})") from None

__all__ = ["ExplorlGRPOTrainer", "PerTokenTemperature", "explorl_config", "gather_rows"]

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
                 run=RunConfig(steps=max(int(args.max_steps), 1), batch_size=max(gen_batch // s.group_size, 1),
                               seed=args.seed))
    _check_against_trl(cfg, args)
    vllm_tis = args.use_vllm and a.tis  # vLLM's sampler differs from the trainer numerically even at one tau
    check = dataclasses.replace(cfg, sampling=dataclasses.replace(s, top_p=min(s.top_p, 0.999))) if vllm_tis else cfg
    validate(check)
    return cfg


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
         "GRPOConfig.mask_truncated_completions: use algo.overlong=mask (DAPO's overlong filtering in explorl's step)")
    need(args.top_entropy_quantile == 1.0,
         "GRPOConfig.top_entropy_quantile: use algo.token_filter=forking with algo.forking.top_frac (the share kept)")
    need(args.entropy_coef == 0 and not args.use_adaptive_entropy,
         "GRPOConfig.entropy_coef / use_adaptive_entropy: use algo.entropy_coef (explorl's entropy bonus)")
    need(args.importance_sampling_level == "token",
         "GRPOConfig.importance_sampling_level: explorl's ratio is per token; sequence-level truncated importance "
         "weights are algo.tis_level=sequence")
    need(args.off_policy_mask_threshold is None, "GRPOConfig.off_policy_mask_threshold: not an explorl method; "
                                                 "leave it None")
    need(not (args.use_vllm and args.vllm_importance_sampling_correction and not a.tis),
         "GRPOConfig.vllm_importance_sampling_correction: explorl's loss replaces TRL's; set algo.tis=true (explorl's "
         "truncated importance weights on vLLM's log-probs, cap algo.tis_cap) or vllm_importance_sampling_correction="
         "False")
    schedule = lookup("temperature_schedule", s.schedule)
    need(not schedule.can("per_prompt_temperature"),
         f"sampling.schedule={s.schedule}: per-prompt temperatures are not wired into TRL's generation; use "
         f"{ELSEWHERE}")
    if not schedule.behavior_is_policy:  # a per-token temperature table (EAD, RevEAD)
        need(not args.use_transformers_continuous_batching,
             f"sampling.schedule={s.schedule}: transformers' continuous batching takes no logits processor; set "
             f"GRPOConfig.use_transformers_continuous_batching=False")
        need(s.top_p == 1.0 and not args.top_k and args.min_p is None and args.repetition_penalty == 1.0,
             f"sampling.schedule={s.schedule}: the per-token temperature is applied after transformers' own "
             f"processors, so top_p / top_k / min_p / repetition_penalty would act before it (explorl's sampler "
             f"applies the temperature first); set them off (top_p=1, top_k=0, min_p=None, repetition_penalty=1)")


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


class ExplorlGRPOTrainer(GRPOTrainer):
    """TRL's `GRPOTrainer` with explorl's advantage step, loss variants and temperature schedule.

    Args:
        model, reward_funcs, args, **kwargs: as `GRPOTrainer` (`args` is required: a `GRPOConfig`).
        algo: explorl's `AlgoConfig` (or a mapping of its fields): estimator, shapers, token filter, TIS, loss.
        sampling: explorl's `SamplingConfig` (or a mapping): the temperature schedule (`fixed`, `e3`, `ead`,
            `revead`) and its settings; defaults to TRL's generation settings.
        budget: explorl's `BudgetConfig`; only `uniform` (TRL's fixed `num_generations`).
    Raises `ConfigError` for settings TRL cannot honour or that explorl's config replaces (see `explorl_config`).

    Metrics: explorl's statistics under `explorl/...` (advantage step and loss) and `temperature/...` in TRL's logs.
    """

    def __init__(self, model, reward_funcs, args: GRPOConfig | None = None, *rest, algo=None, sampling=None,
                 budget=None, **kwargs):
        if args is None:
            raise TypeError("ExplorlGRPOTrainer needs `args`, a trl.GRPOConfig (its num_generations, temperature and "
                            "max_completion_length are checked against explorl's sampling config)")
        cfg = explorl_config(args, algo, sampling, budget)
        need = requirements(cfg.algo)
        # TRL keeps (and scores with) its reference model only when beta != 0; explorl's coefficient is kl_coef,
        # and ERPO needs the reference without a KL term, so beta only switches the reference on here.
        args.beta = cfg.algo.kl_coef if cfg.algo.kl_coef > 0 else (1.0 if need.ref else 0.0)
        super().__init__(model, reward_funcs, args, *rest, **kwargs)
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
        sampler, train, stats = self.explorl_schedule.at(self._round - 1)
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
        self._set_train_temperature(float(state["train_tau"]))
        pending = state.get("entropy_sum")
        self._entropy_sum = None if pending is None else [torch.tensor(x, dtype=torch.float64) for x in pending]

    # ------------------------------------------------------------------------------------------------------------
    # advantages

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._explorl_rewards_per_func = rewards_per_func  # [N_global, F]: TRL gathers it from every process
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
        out = super()._generate_and_score_completions(inputs)
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
