"""The training loop: sample, score, compute advantages, update, log, checkpoint; one function, top to bottom.

Deliberate choices, stated up front:
- The optimised policy is softmax(logits / the batch's training temperature): the fixed temperature, or the E3
  tau that sampled the batch; under EAD the base temperature (the annealed per-token ones are behaviour only).
  Old, new and reference log-probs all come from `rollout.logprobs.response_logprobs` (the same code path), so
  the first PPO ratio is exactly 1. With one update per batch and nothing needing pi_old before it, pi_old is
  that update's own forward, detached (`explorl.algos.step.single_update_shortcut`), which saves a forward pass,
  as TRL does.
- The sampler's own log-probs are behaviour log-probs: they feed importance weights (`algo.importance_weights`).
- The loop names no method: the temperature schedule and budget policy (`rollout.temperature_schedules`,
  `rollout.budget_policies`), the estimator, shapers, token filter and loss (`explorl.algos`) are looked up by name
  in one registry; the schedule and policy are driven by `rollout.schedule.ScheduleDriver` and the method logic is
  `algos.step.compute_advantages` and `algos.step.policy_objective`, all three of which the engine integrations
  call too.
- A response counts as correct (for `entropy/pos`, all-correct/all-wrong fractions, `RolloutBatch.correct`) by the
  task's rule: one reward entry's own score above a threshold (`task.correct_by`, `task.correct_threshold`), never
  the shaped reward.
- A loss or gradient that is not finite skips the rest of that step's updates before `optimizer.step`, so the
  weights and the AdamW moments never see it; too many such steps in a row stop the run. The trainable weights
  are checked after every optimizer step as well: non-finite weights stop the run before anything of them is
  written (the last checkpoint stays the last good one). A dtype the device cannot train in is refused first.
- Reward failures are shown (the first traceback on the console, every distinct one in RUN/reward_errors.log);
  when more than `task.max_reward_failure_frac` of a step's samples fail or time out, the run stops before that
  step's update.
- SIGINT / SIGTERM: the current step finishes, a checkpoint is written and the run stops (`--resume` continues
  it); a second signal aborts at once. A resumed run without a checkpoint restarts from step 1, and a resumed
  run that is complete does nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from rich.console import Console
from rich.markup import escape

from explorl.algos.step import compute_advantages, requirements, shaper_states, single_update_shortcut
from explorl.config import Config, load_config, to_dict
from explorl.evaluation.evaluate import held_out_evaluator
from explorl.train.adaptive_entropy import EntropyCoefficient
from explorl.train.reference_reset import load_reference, reference_state, reset_due, reset_reference
from explorl.train.guards import Interrupted, RunGuards, RunStopped
from explorl.train.memory import PhasePeaks
from explorl.models import make_reference, resolve_model_path
from explorl.train.preflight import check_run_inputs
from explorl.rollout.collect import BoundTask, collect_rollouts, outcome_keys
from explorl.rollout.lines import ends_line_table, line_start_mask
from explorl.rollout.sampler import Sampler
from explorl.rollout.controllers import PromptStream
from explorl.rollout.engines.vllm import VllmRollouts  # vLLM itself is imported only when it samples
from explorl.rollout.forward import supports_fused_forward
from explorl.rollout.schedule import ScheduleDriver
from explorl.train.setup import check_trainable_dtype, load_run_model, open_run_dir, warn_small_training_set
from explorl.runs.checkpoints import load_checkpoint, restore_rng, rng_state
from explorl.runs.final import model_card
from explorl.runs.log import RunLog
from explorl.runs.metrics import rollout_metrics
from explorl.runs.progress import Progress
from explorl.tasks import load_task
from explorl.train.update import (
    NonFiniteError,
    NonFiniteWeightsError,
    configured_hyperparameters,
    fused_compile,
    keep_configured_optimizer,
    lr_lambda,
    make_optimizer,
    fill_logprobs,
    on_policy_single_update,
    update_policy,
)

__all__ = ["train", "train_from_files", "update_policy", "fill_logprobs", "make_optimizer", "lr_lambda",
           "on_policy_single_update", "check_trainable_dtype", "NonFiniteError", "NonFiniteWeightsError",
           "RunStopped", "Interrupted"]


@dataclass
class TrainState:
    """Everything a step changes and a checkpoint keeps: the policy (and frozen reference), AdamW and its schedule,
    the prompt order, the schedule driver (temperature schedule, budget policy), the entropy-bonus coefficient
    (Skywork-OR1's adaptive one), the states of the shapers that keep one (the outcome counts of outcome-based
    exploration: `ShaperEntry.state`) and every random generator."""

    model: torch.nn.Module
    ref: torch.nn.Module | None
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    stream: PromptStream
    driver: ScheduleDriver
    gens: dict
    device: torch.device
    entropy_coef: EntropyCoefficient
    shaper_states: dict

    @classmethod
    def new(cls, cfg: Config, model, device, num_prompts: int) -> TrainState:
        ref = make_reference(model) if requirements(cfg.algo).ref else None
        model.train()
        optimizer, scheduler = make_optimizer(model, cfg, device)
        gens = {"sampler_rng": torch.Generator(device=device).manual_seed(cfg.run.seed),
                "shuffle_rng": torch.Generator().manual_seed(cfg.run.seed + 1)}
        return cls(model, ref, optimizer, scheduler, PromptStream(num_prompts, cfg.run.seed),
                   ScheduleDriver(cfg, model.config.vocab_size, num_prompts), gens, device,
                   EntropyCoefficient(cfg.algo), shaper_states(cfg.algo))

    def checkpoint(self, log: RunLog, step: int, nonfinite_run: int, cfg: Config) -> None:
        state = {"step": step, "stream": self.stream.state_dict(), "nonfinite_run": nonfinite_run,
                 "driver": self.driver.state_dict(), **rng_state(self.gens, self.device)}
        if self.entropy_coef.adaptive:  # absent otherwise: the other methods' checkpoints stay as they were
            state["entropy_coef"] = self.entropy_coef.state_dict()
        state.update(reference_state(cfg.algo, self.ref, step))  # ProRL's reset reference, once there is one
        if self.shaper_states:  # absent otherwise, as the entropy coefficient's
            state["shaper_states"] = {name: s.state_dict() for name, s in self.shaper_states.items()}
        log.save_checkpoint(step, self.model, self.optimizer, self.scheduler, state, cfg.run.keep_checkpoints,
                            cfg.run.save_every)

    def restore(self, log: RunLog, console, steps: int) -> tuple[int, int]:
        """Continue from the run's last checkpoint: weights, optimizer, prompt stream, schedule driver and every RNG;
        the records of later steps are dropped (they are recomputed identically). Without a checkpoint the run
        starts over from step 1. Returns (steps done, consecutive non-finite steps)."""
        if not log.checkpoints():  # stopped before its first checkpoint: nothing to continue from
            log.truncate_metrics(0)
            log.truncate_samples(0)
            console.print(f"[bold]restarting[/] {escape(str(log.dir))} from step 1: it has no checkpoint yet "
                          f"(the steps it logged are dropped and done again)")
            return 0, 0
        # AdamW's moments and the schedule's position come from the checkpoint; its lr, betas and decay from this
        # config, so a resume with `optim.lr` changed runs what config.yaml says
        configured = configured_hyperparameters(self.optimizer)
        state = load_checkpoint(log.checkpoints()[-1], self.model, self.optimizer, self.scheduler)
        keep_configured_optimizer(self.optimizer, self.scheduler, configured)
        self.stream.load_state_dict(state["stream"])
        self.driver.load_state_dict(state["driver"])
        self.entropy_coef.load_state_dict(state.get("entropy_coef"))
        for name, kept in self.shaper_states.items():
            kept.load_state_dict(state.get("shaper_states", {}).get(name))
        load_reference(self.ref, state)
        restore_rng(state, self.gens, self.device)
        log.truncate_metrics(state["step"])
        log.truncate_samples(state["step"])
        console.print(f"[bold]resuming[/] {escape(str(log.dir))} from {log.checkpoints()[-1].name} "
                      f"(step {state['step']}/{steps})")
        return state["step"], state.get("nonfinite_run", 0)


def train_step(step: int, cfg: Config, st: TrainState, sampler: Sampler, bound: BoundTask,
               guards: RunGuards) -> tuple:
    """One step (0-based `step`): sample and score rollouts of `bound`'s problems, advantages, the policy update;
    returns its metrics record (without evaluations) and the step's `Collected` (its scored `RolloutBatch` and
    texts). `sampler`: the run's (`Sampler.from_config`); a vLLM engine in it is given the policy's weights first."""
    peaks = PhasePeaks(st.device)  # perf/mem_*_gib on CUDA
    t0 = time.perf_counter()
    if sampler.engine is not None:
        sampler.engine.sync(st.model)
    needs = requirements(cfg.algo)  # what the configured method reads besides the rollouts
    with peaks.phase("sample"):
        got = collect_rollouts(sampler, bound, st.stream, st.driver, batch_size=cfg.run.batch_size, step=step,
                               generator=st.gens["sampler_rng"], greedy_baseline=needs.greedy_baseline)
    guards.rewards(step + 1, got)
    t_sample = time.perf_counter() - t0
    # vLLM's kernels are not the policy's: pi_old (and its entropies) come from a forward pass
    pi_old_from_update = single_update_shortcut(cfg.algo, st.driver.behavior_is_policy and sampler.engine is None)
    correct = torch.tensor(got.correct, dtype=torch.bool, device=got.batch.mask.device)  # by the task's rule
    # each response's question and final answer, where a shaper reads them (outcome-based exploration)
    outcomes = outcome_keys(got, bound.task.extract_answer) if needs.outcomes else None
    b = got.batch  # where each line begins, where the KL term anchors only the answer-or-another-line choice
    line_starts = (line_start_mask(b.prompt_ids, b.prompt_mask, b.response_ids, b.mask, ends_line_table(bound.tok))
                   if needs.line_starts else None)
    with peaks.phase("logprob"):
        batch = fill_logprobs(st.model, st.ref, b.replace(correct=correct, outcomes=outcomes, line_starts=line_starts),
                              got.train_temperature, cfg, pi_old_from_update)
    batch = compute_advantages(batch, cfg.algo, step + 1, states=st.shaper_states)
    entropy = float((batch.entropy * batch.mask).sum() / batch.mask.sum().clamp_min(1))
    st.driver.end(entropy)  # E3's feedback
    coef = st.entropy_coef.step(entropy)  # Skywork-OR1's adaptive coefficient (algo.entropy_coef when fixed)
    step_cfg = replace(cfg, algo=st.entropy_coef.algo_for(cfg.algo, coef)) if st.entropy_coef.adaptive else cfg
    t1 = time.perf_counter()
    record = {"step": step + 1, **rollout_metrics(batch, correct), "reward/errors": got.errors,
              "reward/timeouts": got.timeouts, **got.stats, "temperature/train": got.train_temperature,
              **batch.stats, **({"algo/entropy_coef": coef} if st.entropy_coef.adaptive else {})}
    with peaks.phase("update"):
        record.update(guards.update(step + 1, lambda: update_policy(
            st.model, st.optimizer, st.scheduler, batch, step_cfg, st.gens["shuffle_rng"],
            temperature=got.train_temperature)))
    if reset_due(cfg.algo, step + 1):  # ProRL: the reference becomes the policy, AdamW starts afresh
        reset_reference(st.model, st.ref, st.optimizer)
        record["ref/reset"] = 1
    t2 = time.perf_counter()
    record.update({"perf/step_s": t2 - t0, "perf/sample_s": t_sample, "perf/update_s": t2 - t1,
                   "perf/tokens_per_s": float(batch.mask.sum()) / max(t_sample, 1e-9), **peaks.metrics()})
    return record, got


def rollout_engine(cfg: Config, model):
    """The vLLM engine that samples the training rollouts (`sampling.engine: vllm`), else None. It reads the model
    directory's config; its weights are replaced by the policy's before every step."""
    if cfg.sampling.engine != "vllm":
        return None
    # prompt + response must fit: the longest training prompt is not known before sampling, so the model's own limit
    limit = int(getattr(model.config, "max_position_embeddings", 0) or 0) or 4096
    return VllmRollouts(str(resolve_model_path(cfg.model.path)), dtype=next(model.parameters()).dtype,
                        max_model_len=limit, seed=cfg.run.seed, memory=cfg.sampling.vllm_memory,
                        trust_remote_code=cfg.model.trust_remote_code)


def compiles(cfg: Config, sampler: Sampler) -> bool:
    """Whether this run's first step compiles: the sampler's fused decoding step (`Sampler.compile`, decided when
    the sampler was built) or the fused training forward (`model.compile`), on a model the fused path takes."""
    return sampler.compile or (fused_compile(cfg) and supports_fused_forward(sampler.model))


def train(cfg: Config, *, resume: str | Path | None = None, console=None, progress: bool = True) -> Path:
    """Run GRPO-style RL as configured; returns the run directory. `resume` continues a stopped or killed run
    from its last checkpoint (from step 1 when it has none; a complete run is left as it is)."""
    console, r = console or Console(), cfg.run
    if resume is None:  # everything the run reads, before anything is written (`explorl train` checks it too)
        check_run_inputs(cfg)
    log = open_run_dir(cfg, resume)
    if resume is not None and log.is_complete(r.steps):
        console.print(f"{escape(str(log.dir))} is a complete run ({r.steps}/{r.steps} steps; final/ and eval.json "
                      f"are written): nothing to do", highlight=False)
        return log.dir
    model, tok, device, encode = load_run_model(cfg, log)
    task = load_task(cfg.task)
    warn_small_training_set(cfg, len(task.train), console)
    runner = task.reward_runner(cfg.task.reward_timeout_s, cfg.task.reward_workers)
    st = TrainState.new(cfg, model, device, len(task.train))
    start, nonfinite_run = st.restore(log, console, r.steps) if resume is not None else (0, 0)
    log.start_trackers(r, to_dict(cfg), resume_step=start if resume is not None else None)
    run_eval = held_out_evaluator(model, tok, cfg, task, encode, console)  # the task's split and run.eval_sets
    sampler = Sampler.from_config(model, tok, cfg.sampling, rollout_engine(cfg, model))
    bound = BoundTask(tok, task, runner, encode)
    guards = RunGuards(cfg, log, console, start, nonfinite_run)
    bar = Progress(console, r.steps, start, enabled=progress, compiling=compiles(cfg, sampler))
    try:
        for step in range(start, r.steps):
            record, got = train_step(step, cfg, st, sampler, bound, guards)
            if r.eval_every > 0 and (step + 1) % r.eval_every == 0 and step + 1 < r.steps:
                record.update({f"eval/{k}": v for k, v in run_eval(step + 1).items()})
            log.append_metrics(record)
            log.log_samples(step + 1, got.problems, got.batch, got.texts, got.rewards, r.log_samples)
            bar.update(step + 1, record)
            guards.after_step()
            saved = r.save_every > 0 and (step + 1) % r.save_every == 0 and step + 1 < r.steps
            if saved or guards.stopping:  # a signal's stop is the safe point between two steps
                st.checkpoint(log, step + 1, guards.nonfinite_run, cfg)
            if guards.stopping:
                raise guards.interrupted(step + 1)
        # finishing: the last checkpoint first, then the evaluation, final/ and, last, eval.json (marks it complete)
        if not log.checkpoints() or log.checkpoints()[-1].name != f"step_{r.steps:07d}":
            st.checkpoint(log, r.steps, guards.nonfinite_run, cfg)
        if guards.stopping:
            raise guards.interrupted(r.steps)
        final = run_eval(r.steps)
        log.save_final_model(model, tok, model_card(cfg, final, r.steps, log.dir))
        log.append_metrics({"step": r.steps, **{f"eval/{k}": v for k, v in final.items()}})
        log.write_eval(r.steps, final, cfg.model.fingerprint)
        guards.failures.print_summary()
    finally:
        guards.close()
        bar.close()
        log.close()
    return log.dir


def train_from_files(config_path: str | None, overrides: list[str]) -> Path:
    return train(load_config(config_path, overrides))
