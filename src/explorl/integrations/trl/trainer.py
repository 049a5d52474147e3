"""`ExplorlGRPOTrainer`: TRL 1.16's `GRPOTrainer` with explorl's advantage step, losses and temperature schedules.

TRL keeps generation (transformers or its vLLM client), reward functions, the data loader, the optimizer, the launch
(accelerate, DeepSpeed, FSDP, torchrun) and its fused log-prob kernel. explorl replaces TRL's advantages
(`_generate_and_score_completions`: the rewards TRL gathered from every process go through
`explorl.algos.compute_advantages`) and TRL's loss (`_compute_loss`: `explorl.algos.policy_objective`), and drives
the temperature schedule once per generation round through its schedule driver (`_begin_round`:
`explorl.rollout.schedule.ScheduleDriver`, the one every engine uses). This class holds TRL's hooks; each concern
has its module: TRL settings explorl replaces or cannot honour (`config.py`), where the temperatures act
(`temperature.py`), the colocated vLLM engine (`generation.py`), batches across processes, so several compute
exactly what one does (`batch.py`), and `explorl train`'s run directory (`run.py`).

Conventions:
- Rewards: TRL's weighted sum over reward functions (`reward_weights`, NaN skipped); a completion every reward
  function declined scores 0.
- Step: explorl's 1-based step is the generation round; EAD's 0-based step is the rounds before it.
- pi_old: taken from the update's own forward when `single_update_shortcut` holds (one update per batch, behaviour
  = policy, nothing reads pi_old before the update: TRL does the same); otherwise one extra no-grad forward computes
  pi_old's log-probs and entropies before the advantage step (also when a method asks for token entropies before
  the update, e.g. the forking filter: then the round's first advantage call finds them missing and the extra
  forward is kept from then on). E3's entropy then comes from the round's update forwards, summed over processes
  and fed back when the next round begins.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sized

import torch
from torch import Tensor

from explorl.algos import compute_advantages, policy_objective, requirements
from explorl.algos.batch import MissingInputError
from explorl.algos.losses import aggregation_count
from explorl.algos.step import shaper_states, single_update_shortcut
from explorl.config import Config, ConfigError
from explorl.rollout.schedule import ScheduleDriver
from explorl.train.adaptive_entropy import EntropyCoefficient

try:
    from trl import GRPOConfig, GRPOTrainer
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError(f"explorl.integrations.trl needs TRL: pip install -e \".[trl]\" ({e})") from None

from explorl.integrations.trl.batch import (TokenForwards, gather_rows, generation_batch, global_micro_batch,
                                            line_starts, local_rows, micro_batch, pi_old_forward, topk_forward,
                                            window_total)
from explorl.integrations.trl.config import check_run_config, checkpointing_field, explorl_config, generation_rounds
from explorl.integrations.trl.generation import ColocatedVLLM, colocated_engine
from explorl.integrations.trl.run import (RoundRecord, RunOptions, configured_hyperparameters, explorl_scheduler,
                                          finish_run, judge_column, keep_configured_optimizer, open_run, round_algo,
                                          round_record, without_tied_keys, write_round)
from explorl.integrations.trl.outcomes import check_outcomes, outcome_parts, reads_verdicts
from explorl.integrations.trl.round_state import (check_reference_reset, load_round_state,
                                                  reset_reference_after_round, save_round_state)
from explorl.integrations.trl.temperature import (PerTokenTemperature, behavior_logprobs, send_anneal,
                                                  set_sampling_temperature, set_train_temperature, sum_pi_squared,
                                                  with_logits_processor)

__all__ = ["ColocatedVLLM", "ExplorlGRPOTrainer", "PerTokenTemperature", "checkpointing_field", "explorl_config",
           "gather_rows", "generation_rounds"]


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
        run_options: with `run_config`: which reward decides correctness and how the run was launched
            (`RunOptions`).
    Raises `ConfigError` for settings TRL cannot honour or that explorl's config replaces (see `explorl_config`).

    Metrics: explorl's statistics under `explorl/...` (advantage step and loss) and `temperature/...` in TRL's logs.

    Run directory (`run_config`): the main process writes config.yaml and engine.json when `train()` starts (a
    directory that holds a run is refused unless `train(resume_from_checkpoint=...)` continues it; its records after
    the checkpoint are dropped), one metrics.jsonl record per generation round with `explorl train`'s keys (from
    the batch the advantage step gathers from every process, written after the round's last optimizer step) and
    samples.jsonl (the first `run.log_samples` prompts of the main process's rows); after training, on the main
    process alone, explorl's held-out evaluation, final/ and eval.json (last). Correct is the task's rule when a
    `TaskReward` scores (the first one), else `run_options.correct_by`'s score above the threshold. Needs whole
    parameters on the main process at the end: refused under DeepSpeed ZeRO-3 and FSDP.
    """

    def __init__(self, model, reward_funcs, args: GRPOConfig | None = None, *rest, algo=None, sampling=None,
                 budget=None, run_config: Config | None = None, run_options: RunOptions | None = None, **kwargs):
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
            check_run_config(run_config, cfg)
        need = requirements(cfg.algo)
        check_outcomes(need, cfg.algo, reward_funcs)  # the outcome bonus reads final answers by a task's rule
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
            self.vllm_generation = colocated_engine(self, args)
            self._last_loaded_step = -1  # TRL's tag: sync before the first generation
        self.explorl, self.explorl_needs = cfg, need
        check_reference_reset(self)  # ProRL's reset needs a reference model of its own and whole parameters
        self.explorl_shaper_states = shaper_states(cfg.algo)  # a shaper's counts across steps (the outcome bonus)
        vocab = self.accelerator.unwrap_model(self.model).config.get_text_config().vocab_size
        # the budget policy is static (explorl_config refuses the others): the dataset's size only sizes its state
        prompts = len(self.train_dataset) if isinstance(self.train_dataset, Sized) else 1
        self.explorl_driver = ScheduleDriver(cfg, vocab, max(prompts, 1))
        self.explorl_entropy_coef = EntropyCoefficient(cfg.algo)
        self._round_algo = cfg.algo  # the algo config of this round's updates (its entropy coefficient)
        # pi_old's forward before the advantage step: the adaptive coefficient gates by the round's entropy, SimKO
        # reads pi_old's top-K, and a shaper's counts must not advance twice (the retry below)
        self._pre_forward = (self.explorl_entropy_coef.adaptive or need.topk > 0 or bool(self.explorl_shaper_states)
                             or not single_update_shortcut(cfg.algo, self.explorl_driver.behavior_is_policy))
        self._round = 0  # generation rounds begun in training (explorl's 1-based step of the current one)
        self._train_tau = float(args.temperature)  # the temperature TRL's fused head divides by now
        self._ead_table: Tensor | None = None  # the round's per-token sampling temperatures (EAD)
        self._window_totals: dict[tuple, float] = {}
        # the same seed on every rank: Clip-Cov draws its tokens from the gathered micro-batch identically everywhere
        self.explorl_generator = torch.Generator().manual_seed(int(args.seed) + 1)
        run_options = run_options or RunOptions()
        self.run_config, self.run_launch = run_config, dict(run_options.launch or {})
        self.run_log = None  # the run directory's RunLog (main process, while training with run_config)
        self._failure_log = None  # its reward_errors.log (`runlog.RewardFailureLog`, main process)
        self._record: RoundRecord | None = None  # the round being collected for its metrics record
        self._round_started, self._round_stats = 0.0, {}
        self._samples: tuple | None = None  # (prompts, completions, answers) of this process's rows, this round
        if run_config is not None:
            self._judge = judge_column(self.reward_func_names, run_options.correct_by)
            if self.is_fsdp_enabled or (self.is_deepspeed_enabled
                                        and self.accelerator.state.deepspeed_plugin.zero_stage == 3):
                raise ConfigError("run_config: the held-out evaluation after training runs on the main process "
                                  "alone and needs whole parameters, which DeepSpeed ZeRO-3 and FSDP shard; train "
                                  "with ZeRO-2 or DDP, or leave run_config out and evaluate the saved model with "
                                  "`explorl eval --model DIR`")

    @property
    def explorl_schedule(self):
        """The temperature schedule the driver steers (`rollout.temperature_schedules`)."""
        return self.explorl_driver.schedule

    # ------------------------------------------------------------------------------------------------------------
    # temperature schedule: one round of the schedule driver per generation round

    def _begin_round(self) -> None:
        """Before a training round's generation: end the last round on the driver (its entropy, when it came from
        the update forwards of every process), then set this round's sampling and training temperatures."""
        driver, acc = self.explorl_driver, self.accelerator
        if driver.entropy_pending:
            driver.end(reduce=lambda t: acc.reduce(t.to(acc.device), reduction="sum") if acc.num_processes > 1 else t)
        self._round += 1
        self._round_started = time.perf_counter()
        temps = driver.begin(self._round - 1)
        self._round_stats = {**temps.stats, "temperature/train": float(temps.train)}
        set_train_temperature(self, float(temps.train))
        if temps.per_token:  # EAD's behaviour temperature: a table of T x tau(t), through a logits processor
            self._ead_table = temps.table(self.explorl.sampling.max_new_tokens)
            if self.use_vllm:  # vLLM samples at T * tau(t): explorl.integrations.vllm's processor, per request
                set_sampling_temperature(self, self.explorl.sampling.temperature)
                send_anneal(self.vllm_generation, driver.requests([0])[0].anneal)
            else:  # the table holds T * tau(t) already
                set_sampling_temperature(self, 1.0)
        else:
            self._ead_table = None
            set_sampling_temperature(self, float(temps.sampler))
        for k, v in self._round_stats.items():
            self._metrics["train"][k].append(float(v))

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        if self._ead_table is None or not self.model.training:
            return super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations,
                                                 has_tool_images)
        with with_logits_processor(self.accelerator.unwrap_model(self.model), PerTokenTemperature(self._ead_table)):
            return super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations,
                                                 has_tool_images)

    # ------------------------------------------------------------------------------------------------------------
    # checkpoints: the driver's state travels with TRL's, so a resumed run continues its temperature exactly

    def _save_checkpoint(self, model, trial) -> None:
        super()._save_checkpoint(model, trial)
        if self.args.should_save:
            save_round_state(self, os.path.join(self._get_output_dir(trial=trial),
                                                f"checkpoint-{self.state.global_step}"))

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        if load_round_state(self, resume_from_checkpoint) and self.run_log is not None:
            # the rounds after the checkpoint (and the final evaluation) are done again
            self.run_log.truncate_metrics(self._round)
            self.run_log.truncate_samples(self._round)

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        if self.run_config is None or self.lr_scheduler is not None:  # a GRPOConfig of the user's own: TRL's
            return super().create_scheduler(num_training_steps, optimizer)
        self.lr_scheduler = explorl_scheduler(optimizer or self.optimizer, self.run_config.optim, num_training_steps)
        self._created_lr_scheduler = True
        return self.lr_scheduler

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
        super()._issue_warnings_after_load(without_tied_keys(self.model, load_result))

    # ------------------------------------------------------------------------------------------------------------
    # advantages

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._explorl_rewards_per_func = rewards_per_func  # [N_global, F]: TRL gathers it from every process
        if self.run_config is not None or reads_verdicts(self.explorl_needs):  # samples.jsonl, outcome_parts
            self._samples = (prompts, completions, [x.get("answer") for x in inputs])
        return rewards_per_func

    def _behavior_logprobs(self, out: dict, mask: Tensor) -> Tensor:
        """Log-probs `[n, T]` under the distribution sampled from: vLLM's own, or EAD's per-token temperature."""
        if out.get("sampling_per_token_logps") is not None:
            return out["sampling_per_token_logps"]
        t = out["completion_ids"].size(1)
        table = self._ead_table if self._ead_table is not None else torch.full((t,), self._train_tau)
        return behavior_logprobs(self.accelerator.unwrap_model(self.model), out, mask, table)

    def _generate_and_score_completions(self, inputs):
        train = self.model.training
        if train:
            self._begin_round()
        sample_started = time.perf_counter()
        out = super()._generate_and_score_completions(inputs)
        sample_s = time.perf_counter() - sample_started
        mask = out["completion_mask"] if "tool_mask" not in out else out["completion_mask"] * out["tool_mask"]
        mask = mask.to(torch.float32)
        rpf = self._explorl_rewards_per_func
        rewards = (rpf * self.reward_weights.to(rpf.device)[None, :]).nansum(dim=1).to(torch.float32)
        group = torch.arange(rewards.shape[0], device=rewards.device) // (
            self.num_generations if train else self.num_generations_eval)
        old = ent = beh = topk_old = None
        if self._pre_forward:
            old, ent, topk_old = pi_old_forward(self, out, mask)
        if self.explorl_needs.behavior:
            beh = self._behavior_logprobs(out, mask)
            if old is not None:  # tokens vLLM could not score (NaN): ratio 1, as TRL does
                beh = torch.where(torch.isnan(beh), old, beh)
        # several reward functions: each one's scores (NaN, TRL's "no score", counts 0 as in its nansum) for GDPO
        parts = {} if rpf.shape[1] < 2 else {
            "reward_components": torch.nan_to_num(rpf.to(device=mask.device, dtype=torch.float32), nan=0.0),
            "reward_weights": tuple(float(w) for w in self.reward_weights)}
        parts.update(outcome_parts(self) if reads_verdicts(self.explorl_needs) else {})
        s2 = (sum_pi_squared(self.accelerator.unwrap_model(self.model), out, mask, self._train_tau)
              if self.explorl_needs.sum_pi_squared else None)
        gathered = lambda old, ent: generation_batch(  # noqa: E731  (collective: every rank calls it alike)
            self.accelerator, out, mask, rewards, group, self.max_completion_length, self.eos_token_ids,
            TokenForwards(old, ent, beh, s2, topk_old)).replace(**parts)
        batch, step = gathered(old, ent), max(self._round, 1)
        try:
            batch = compute_advantages(batch, self.explorl.algo, step, states=self.explorl_shaper_states)
        except MissingInputError:
            if self._pre_forward:
                raise
            # a method reads pi_old's log-probs or entropies before the update (e.g. the forking filter): keep the
            # extra forward from now on (every rank takes this branch: the batch is the same everywhere)
            self._pre_forward = True
            old, ent, _ = pi_old_forward(self, out, mask)
            batch = compute_advantages(gathered(old, ent), self.explorl.algo, step, states=self.explorl_shaper_states)
        for k, v in batch.stats.items():
            self._metrics["train" if train else "eval"][f"explorl/{k}"].append(v)
        if train and self.run_config is not None:
            self._record = round_record(self, batch, sample_s, tuple(mask.shape))
            out["explorl_row"] = torch.arange(mask.shape[0], device=mask.device)  # which entropies a forward computed
        if train and batch.entropy is not None:  # explorl's loop: the batch's mean token entropy at the training tau
            entropy = float((batch.entropy * batch.mask).sum() / batch.mask.sum().clamp_min(1))
            self.explorl_driver.end(entropy)
            self._round_algo = round_algo(self, entropy)  # Skywork-OR1's entropy coefficient, when adaptive
        elif train:  # the update forwards of this round are pi_old's (single-update shortcut): summed there
            self.explorl_driver.defer_entropy()
        out.update(local_rows(self.accelerator, batch, tuple(mask.shape)))
        out["explorl_old_logps"], out["explorl_ref_logps"] = old, out.get("ref_per_token_logps")
        if self.explorl_needs.line_starts:  # the KL term's tokens (algo.kl_tokens: line_starts)
            out["explorl_line_starts"] = line_starts(out, mask, self.processing_class)
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
            inputs = self._buffered_inputs[window * ga:(window + 1) * ga]
            self._window_totals = {key: window_total(self.accelerator, inputs, agg)}
        return self._window_totals[key]

    def _compute_loss(self, model, inputs):
        algo, world = self._round_algo, self.accelerator.num_processes
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        att = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        train = self.model.training
        response = inputs["completion_mask"] if "tool_mask" not in inputs else \
            inputs["completion_mask"] * inputs["tool_mask"]
        response = response.float()
        topk = aux = None
        if self.explorl_needs.topk:  # SimKO reads the top-K log-probs: explorl's forward, as pi_old's was
            lp, ent, topk = topk_forward(self, model, inputs, response)
        else:
            lp, ent, aux = self._get_per_token_logps_and_entropies(
                model, ids, att, inputs["completion_ids"].size(1), compute_entropy=True,
                compute_aux_loss=self.aux_loss_enabled)
        if train and self.explorl_driver.entropy_pending:
            self.explorl_driver.add_entropy(float((ent.detach() * response).sum()), float(response.sum()))
        batch = micro_batch(inputs, response, self.max_completion_length)
        entropy = ent if algo.entropy_coef != 0 else None
        if world > 1:
            lp, entropy, batch, topk = global_micro_batch(self.accelerator, lp, entropy, batch, topk)
        loss, stats = policy_objective(lp, entropy, batch, algo, generator=self.explorl_generator, topk=topk)
        total = self._window_total(algo.loss_agg) if train else None
        if total is not None:  # this micro-batch's share of its window (explorl's micro_batch_share)
            loss = loss * (aggregation_count(batch.loss_mask, algo.loss_agg) / max(total, 1.0))
        # DDP / DeepSpeed / FSDP average the ranks' gradients; each rank's loss holds only its own rows' gradient
        loss = loss * world
        if self.aux_loss_enabled and aux is not None:
            loss = loss + self.router_aux_loss_coef * aux / (self.current_gradient_accumulation_steps if train else 1)
        mode = "train" if train else "eval"
        for k, v in stats.items():
            self._metrics[mode][f"explorl/{k}"].append(v)
        self._metrics[mode]["entropy"].append(float((ent.detach() * response).sum() / response.sum().clamp_min(1)))
        if train and self._record is not None:
            self._record.observe_update(inputs["explorl_row"], ent, stats)
        return loss

    # ------------------------------------------------------------------------------------------------------------
    # run directory (run_config): `explorl train`'s files, written by the main process (`run.py`)

    def _get_grad_norm(self, model, grad_norm=None):
        grad_norm = super()._get_grad_norm(model, grad_norm=grad_norm)
        if self._record is not None and grad_norm is not None:
            self._record.grad_norms.append(float(grad_norm))
        return grad_norm

    def _maybe_log_save_evaluate(self, *args, **kwargs):
        # after each optimizer step; a round is done after steps_per_generation x num_iterations micro-batches.
        # Before TRL saves a checkpoint here, so a checkpoint's rounds all have their records (and its reference).
        if self._step % (self.args.steps_per_generation * self.num_iterations) == 0:
            reset_reference_after_round(self)  # ProRL's, where due
            if self._record is not None:
                write_round(self)
        return super()._maybe_log_save_evaluate(*args, **kwargs)

    def train(self, resume_from_checkpoint: str | bool | None = None, *args, **kwargs):
        """TRL's training; with `run_config`, the run directory around it (the class docstring)."""
        if self.run_config is None:
            return super().train(resume_from_checkpoint, *args, **kwargs)
        open_run(self, resume=bool(resume_from_checkpoint), checkpoint=resume_from_checkpoint)
        try:
            output = super().train(resume_from_checkpoint, *args, **kwargs)
            if self._record is not None:  # a round that max_steps cut short
                write_round(self)
            if self.accelerator.is_main_process:  # nothing collective from here: the other processes are done
                finish_run(self)
        finally:
            if self.run_log is not None:
                self.run_log.close()
        return output
