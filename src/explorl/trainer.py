"""The training loop: sample, score, compute advantages, update, log, checkpoint; one function, top to bottom.

Deliberate choices, stated up front:
- The optimised policy is softmax(logits / the batch's training temperature): the fixed temperature, or the E3
  tau that sampled the batch; under EAD the base temperature (the annealed per-token ones are behaviour only).
  Old, new and reference log-probs all come from `rollout.logprobs.response_logprobs` (the same code path), so
  the first PPO ratio is exactly 1. With one update per batch and nothing needing pi_old before it, pi_old is
  that update's own forward, detached (`explorl.algos.step.single_update_shortcut`), which saves a forward pass,
  as TRL does.
- The sampler's own log-probs are behaviour log-probs: they feed truncated importance weights (`algo.tis`).
- The loop names no method: the temperature schedule and budget policy (`rollout.controllers`), the estimator,
  shapers, token filter and loss (`explorl.algos`) are looked up by name in one registry, and the method logic is
  `algos.step.compute_advantages` and `algos.step.policy_objective`, which the engine integrations call too.
- A response counts as correct (for `entropy/pos`, all-correct/all-wrong fractions) when its reward > 0.5.
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

import math
import random
import signal
import threading
import time
from pathlib import Path

import torch

from explorl.algos.batch import RolloutBatch
from explorl.algos.losses import micro_batch_share
from explorl.algos.registry import lookup
from explorl.algos.step import PreparedBatch, compute_advantages, policy_objective, requirements, single_update_shortcut
from explorl.config import Config, ConfigError, ModelConfig, dump_yaml, load_config, to_dict
from explorl.evaluate import held_out_evaluator
from explorl.models import check_fingerprint, check_run_inputs, load_policy, make_reference, reference_mode
from explorl.rewards import RewardRunner
from explorl.rollout.collect import collect_rollouts
from explorl.rollout.controllers import Controllers, PromptStream
from explorl.rollout.logprobs import response_logprobs
from explorl.rollout.sampler import Rollouts
from explorl.runlog import (
    Progress, RewardFailureLog, RunLog, load_checkpoint, model_card, restore_rng, rng_state, rollout_metrics,
)
from explorl.tasks import load_task
from explorl.tasks.chat import prompt_encoder


class NonFiniteError(RuntimeError):
    """The loss or the gradient norm of an update was NaN or infinite."""


class NonFiniteWeightsError(RuntimeError):
    """An optimizer step left NaN or infinite values in the trainable weights (they are ruined)."""


class RunStopped(ValueError):
    """The run stopped itself for a reason the user has to fix (a broken reward function, non-finite weights); the
    message says what happened, what was kept and what to do. A ValueError, so `explorl train` prints it as one
    error line."""


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM stopped the run after its current step, with a checkpoint; `--resume` continues it."""


def check_trainable_dtype(model_cfg: ModelConfig) -> None:
    """Refuse a parameter dtype the device cannot train in, with `auto` resolved for this machine: float16
    anywhere (AdamW keeps its moments in the weights' dtype: squared gradients below ~2e-4 and its eps of 1e-8
    round to 0 in float16, so the first step writes inf and NaN), bfloat16 on a GPU without it."""
    from explorl.models import resolve_device, resolve_dtype

    device = resolve_device(model_cfg.device)
    dtype = resolve_dtype(model_cfg.dtype, device)
    if dtype == torch.float16:
        raise ConfigError(f"model.dtype: {model_cfg.dtype} resolves to float16 on {device}, which cannot be trained "
                          f"here (AdamW's moments underflow in float16 and the first step writes inf/NaN into the "
                          f"weights); use model.dtype=float32, or bfloat16 on a GPU that supports it (`auto` picks it)")
    if dtype == torch.bfloat16 and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigError(f"model.dtype: bfloat16 is not supported by {torch.cuda.get_device_name(device)}; "
                          f"use model.dtype=float32 (or auto)")


def _nonfinite(model) -> list[str]:
    """Names of the trainable parameters holding a NaN or an infinity (one device sync when there are none)."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not named:
        return []
    flags = [torch.isfinite(p).all() for _, p in named]
    if bool(torch.stack([f.to(flags[0].device) for f in flags]).all()):
        return []
    return [n for (n, _), ok in zip(named, flags) if not bool(ok)]


class _StopOnSignal:
    """While training, SIGINT (Ctrl-C) and SIGTERM ask the loop to stop at its next safe point (after the current
    step, with a checkpoint); a second signal aborts at once (KeyboardInterrupt, no checkpoint). Handlers can only
    be installed from the main thread; elsewhere signals keep their usual meaning."""

    def __init__(self, console):
        self.console, self.signum, self.previous = console, None, {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum
        self.console.print(f"[yellow]{signal.Signals(signum).name}[/]: the run stops after this step, with a "
                           f"checkpoint (send it again to abort at once, without one)")

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        self.previous = {}


def lr_lambda(warmup: int, total: int, min_ratio: float):
    """Linear warm-up then cosine decay to `min_ratio` of the peak, as a LambdaLR multiplier."""

    def fn(i: int) -> float:
        if i < warmup:
            return (i + 1) / warmup
        progress = min(1.0, (i - warmup) / max(1, total - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return fn


def on_policy_single_update(cfg: Config) -> bool:
    """`single_update_shortcut` for a whole config: the schedule's registry entry says whether the sampled
    distribution is the optimised policy."""
    return single_update_shortcut(cfg.algo, lookup("temperature_schedule", cfg.sampling.schedule).behavior_is_policy)


def _micro_batches(mb: torch.Tensor, lengths: torch.Tensor, a) -> list[torch.Tensor]:
    """Positions in mini-batch `mb` of each micro-batch: rows sorted by length (longest first) and cut into
    `micro_batch_size` rows, or into `length_buckets` parts, so each forward pads only to its own longest row.
    The accumulated gradient is the mini-batch's (`micro_batch_share`); only the padding compute changes."""
    order = torch.sort(lengths[mb], descending=True, stable=True).indices
    size = a.micro_batch_size if a.micro_batch_size > 0 else math.ceil(len(mb) / max(1, a.length_buckets))
    return list(order.split(max(1, size)))


def update_policy(model, optimizer, scheduler, ro: Rollouts, batch: RolloutBatch, prepared: PreparedBatch,
                  cfg: Config, shuffle: torch.Generator, temperature: float | None = None) -> dict:
    """Epochs x mini-batches of policy-gradient updates on one batch of rollouts. Returns mean stats.

    `ro` holds the token ids for the forward; `batch` and `prepared` what `compute_advantages` saw and made.
    `temperature` is the training temperature of the batch (the optimised policy is softmax(logits / it)).
    """
    a = cfg.algo
    params = [p for p in model.parameters() if p.requires_grad]
    n = prepared.loss_mask.shape[0]
    stats: dict[str, list[float]] = {}
    temp = cfg.sampling.temperature if temperature is None else temperature
    need_entropy = requirements(a).update_entropy
    lengths = ro.prompt_mask.sum(-1) + prepared.loss_mask.sum(-1)
    for _ in range(a.epochs):
        perm = torch.randperm(n, generator=shuffle)
        for mb in perm.chunk(a.mini_batches):
            mb_mask = prepared.loss_mask[mb]
            optimizer.zero_grad(set_to_none=True)
            for local in _micro_batches(mb, lengths, a):
                rows = mb[local]
                width = max(int(prepared.loss_mask[rows].sum(-1).max()), 1)  # padding columns no row here uses
                micro = prepared.select(rows, width)
                prompt_mask = ro.prompt_mask[rows]
                lead = int((prompt_mask.cumsum(-1) == 0).sum(-1).min())  # left-padding columns common to all rows
                lp, ent = response_logprobs(model, ro.prompt_ids[rows, lead:], prompt_mask[:, lead:],
                                            ro.response_ids[rows, :width], micro.loss_mask, temp,
                                            with_entropy=need_entropy)
                loss, st = policy_objective(lp, ent, batch.select(rows, width), micro, a, generator=shuffle)
                if not torch.isfinite(loss):
                    raise NonFiniteError(f"loss is {float(loss.detach())} (pg={st.get('loss/pg')}); update skipped")
                (loss * micro_batch_share(mb_mask, local, a.loss_agg)).backward()
                for k, v in st.items():
                    stats.setdefault(k, []).append(float(v))
            clip = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else float("inf")
            grad_norm = torch.nn.utils.clip_grad_norm_(params, clip)
            if not torch.isfinite(grad_norm):
                optimizer.zero_grad(set_to_none=True)
                raise NonFiniteError(f"gradient norm is {float(grad_norm)}; update skipped")
            optimizer.step()
            bad = _nonfinite(model)
            if bad:
                names = ", ".join(bad[:3]) + (", ..." if len(bad) > 3 else "")
                raise NonFiniteWeightsError(f"the optimizer step left NaN or infinite values in {len(bad)} "
                                            f"trainable tensor(s) ({names})")
            scheduler.step()
            stats.setdefault("optim/grad_norm", []).append(float(grad_norm))
    out = {k: sum(v) / len(v) for k, v in stats.items()}
    out["optim/lr"] = scheduler.get_last_lr()[0]
    return out


@torch.no_grad()
def rollout_batch(model, ref, ro: Rollouts, rewards: list[float], temperature: float, cfg: Config,
                  pi_old_from_update: bool) -> RolloutBatch:
    """The `RolloutBatch` of a step: pi_old's log-probs and entropies (a forward pass, unless the update's own
    forward serves as pi_old) and the reference's log-probs when the method needs them."""
    if pi_old_from_update:  # the sampler's entropies are the policy's at this temperature (behaviour = policy)
        old_lp, old_ent = None, ro.entropy
    else:
        old_lp, old_ent = response_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.mask,
                                            temperature)
    ref_lp = None
    if requirements(cfg.algo).ref:
        with reference_mode(model, ref) as ref_model:
            ref_lp, _ = response_logprobs(ref_model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.mask,
                                          temperature, with_entropy=False)
    return RolloutBatch(mask=ro.mask, rewards=torch.tensor(rewards, dtype=torch.float32, device=ro.mask.device),
                        group=ro.group, max_response_len=cfg.sampling.max_new_tokens, logprobs=old_lp,
                        behavior_logprobs=ro.behavior_logprobs, ref_logprobs=ref_lp, entropy=old_ent,
                        lengths=ro.lengths, truncated=ro.truncated)


def make_optimizer(model, cfg: Config, device: torch.device):
    """AdamW on the trainable parameters with warm-up and cosine decay over all optimizer steps."""
    o = cfg.optim
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=o.lr, betas=(o.beta1, o.beta2), weight_decay=o.weight_decay,
                                  foreach=device.type == "cuda")
    total_updates = cfg.run.steps * cfg.algo.epochs * cfg.algo.mini_batches
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(o.warmup_steps, total_updates, o.min_lr_ratio))
    return optimizer, scheduler


# ----------------------------------------------------------------------------------------------------------------


def _restore(log: RunLog, model, optimizer, scheduler, stream, controllers, gens, device, console,
             steps: int) -> tuple[int, int]:
    """Continue a run from its last checkpoint: weights, optimizer, prompt stream, controllers and every RNG;
    the records of later steps are dropped (they are recomputed identically). Without a checkpoint the run starts
    over from step 1. Returns (steps done, consecutive non-finite steps)."""
    from rich.markup import escape

    if not log.checkpoints():  # stopped before its first checkpoint: nothing to continue from
        log.truncate_metrics(0)
        log.truncate_samples(0)
        console.print(f"[bold]restarting[/] {escape(str(log.dir))} from step 1: it has no checkpoint yet "
                      f"(the steps it logged are dropped and done again)")
        return 0, 0
    state = load_checkpoint(log.checkpoints()[-1], model, optimizer, scheduler)
    start = state["step"]
    stream.load_state_dict(state["stream"])
    controllers.load_state_dict(state.get("controllers", {}))
    restore_rng(state, gens, device)
    log.truncate_metrics(start)
    log.truncate_samples(start)
    console.print(f"[bold]resuming[/] {escape(str(log.dir))} from {log.checkpoints()[-1].name} "
                  f"(step {start}/{steps})")
    return start, state.get("nonfinite_run", 0)


def _stop_if_rewards_failed(step: int, got, cfg: Config, log: RunLog, last_checkpoint: str) -> None:
    """RunStopped, before the step's update, when more than `task.max_reward_failure_frac` of its samples' rewards
    failed or timed out: such a step would train on zeros. A sample counts once however many of several reward
    functions failed on it."""
    failed = len({f.index for f in got.failures})
    if failed <= cfg.task.max_reward_failure_frac * got.scored:
        return
    raise RunStopped(
        f"stopping before the update of step {step}: the reward failed or timed out on {failed} of "
        f"{got.scored} samples ({got.errors} errors, {got.timeouts} timeouts; more than "
        f"task.max_reward_failure_frac={cfg.task.max_reward_failure_frac:g}), so the step would train "
        f"on zeros; the weights were not changed by it. First failure: {got.failures[0].message}; "
        f"every distinct failure, with its traceback and input, is in {log.reward_errors_path}. Fix "
        f"task.reward={cfg.task.reward} (or raise task.reward_timeout_s), then continue with "
        f"`explorl train --resume {log.dir}` (last checkpoint: {last_checkpoint}); or raise "
        f"task.max_reward_failure_frac to train anyway")


def train(cfg: Config, *, resume: str | Path | None = None, console=None, progress: bool = True) -> Path:
    """Run GRPO-style RL as configured; returns the run directory. `resume` continues a stopped or killed run
    from its last checkpoint (from step 1 when it has none; a complete run is left as it is)."""
    from rich.console import Console
    from rich.markup import escape

    console = console or Console()
    r, s = cfg.run, cfg.sampling
    if resume is None:  # everything the run reads, before anything is written (`explorl train` checks it too)
        check_run_inputs(cfg)
    check_trainable_dtype(cfg.model)
    cfg.model.fingerprint = check_fingerprint(cfg.model)  # config.yaml records which weights it started from
    log = RunLog.open(r.out_dir, dump_yaml(cfg), resume)
    if resume is not None and log.is_complete(r.steps):
        console.print(f"{escape(str(log.dir))} is a complete run ({r.steps}/{r.steps} steps; final/ and eval.json "
                      f"are written): nothing to do", highlight=False)
        return log.dir
    if r.threads > 0:
        torch.set_num_threads(r.threads)
    torch.manual_seed(r.seed)
    random.seed(r.seed)

    model, tok, device = load_policy(cfg.model)
    task = load_task(cfg.task)
    encode = prompt_encoder(tok, cfg.task)
    if cfg.task.chat_template == "auto":  # the run's config says what `auto` resolved to
        cfg.task.chat_template = "on" if encode.chat else "off"
        log.write_config(dump_yaml(cfg))
    runner = RewardRunner(task.reward_fn, isolate=task.isolate, timeout_s=cfg.task.reward_timeout_s,
                          workers=cfg.task.reward_workers)
    ref = make_reference(model) if requirements(cfg.algo).ref else None
    model.train()
    optimizer, scheduler = make_optimizer(model, cfg, device)
    stream = PromptStream(len(task.train), r.seed)
    controllers = Controllers(cfg, model.config.vocab_size, len(task.train))
    pi_old_from_update = single_update_shortcut(cfg.algo, controllers.behavior_is_policy)
    gens = {"sampler_rng": torch.Generator(device=device).manual_seed(r.seed),
            "shuffle_rng": torch.Generator().manual_seed(r.seed + 1)}
    start, nonfinite_run = 0, 0
    if resume is not None:
        start, nonfinite_run = _restore(log, model, optimizer, scheduler, stream, controllers, gens, device,
                                        console, r.steps)
    log.start_trackers(r, to_dict(cfg), resume_step=start if resume is not None else None)
    failures = RewardFailureLog(log.reward_errors_path, console, start)

    def checkpoint(step: int) -> None:
        state = {"step": step, "stream": stream.state_dict(), "nonfinite_run": nonfinite_run,
                 "controllers": controllers.state_dict(), **rng_state(gens, device)}
        log.save_checkpoint(step, model, optimizer, scheduler, state, r.keep_checkpoints)

    def last_checkpoint() -> str:
        ckpts = log.checkpoints()
        return str(ckpts[-1]) if ckpts else "none yet, so a resume starts over from step 1"

    run_eval = held_out_evaluator(model, tok, cfg, task, encode)  # the task's split and run.eval_sets

    def interrupted(step: int) -> Interrupted:
        failures.print_summary()
        console.print(f"[yellow]stopped by {stop.name}[/] after step {step}/{r.steps}; checkpoint "
                      f"{escape(last_checkpoint())}; continue with `explorl train --resume {escape(str(log.dir))}`",
                      soft_wrap=True)  # never break the command a user copies
        return Interrupted(f"stopped by {stop.name} after step {step}; checkpoint written")

    stop = _StopOnSignal(console)
    bar = Progress(console, r.steps, start, enabled=progress)
    try:
        for step in range(start, r.steps):
            t0 = time.perf_counter()
            got = collect_rollouts(model, tok, task, runner, stream, controllers, batch_size=r.batch_size,
                                   max_new_tokens=s.max_new_tokens, top_p=s.top_p, fast_path=s.fast_path,
                                   step=step, generator=gens["sampler_rng"], encode=encode)
            failures.record(step + 1, got.failures, got.scored)
            _stop_if_rewards_failed(step + 1, got, cfg, log, last_checkpoint())
            ro, t_sample = got.rollouts, time.perf_counter() - t0
            batch = rollout_batch(model, ref, ro, got.rewards, got.train_temperature, cfg, pi_old_from_update)
            prepared = compute_advantages(batch, cfg.algo, step + 1)
            h_now = float((batch.entropy * ro.mask).sum() / ro.mask.sum().clamp_min(1))
            controllers.schedule.observe(step + 1, h_now)
            t1 = time.perf_counter()
            record = {"step": step + 1, **rollout_metrics(ro, prepared.rewards, batch.entropy, prepared.advantages),
                      "reward/errors": got.errors, "reward/timeouts": got.timeouts, **got.stats,
                      "temperature/train": got.train_temperature, **prepared.stats}
            try:
                record.update(update_policy(model, optimizer, scheduler, ro, batch, prepared, cfg, gens["shuffle_rng"],
                                            temperature=got.train_temperature))
                record["loss/nonfinite"], nonfinite_run = 0, 0
            except NonFiniteError as e:
                nonfinite_run += 1
                record["loss/nonfinite"] = 1
                console.print(f"[bold red]step {step + 1}: {escape(str(e))}.[/] The weights were not changed by it "
                              f"({nonfinite_run} such step(s) in a row; limit run.max_nonfinite_steps="
                              f"{r.max_nonfinite_steps}).")
            except NonFiniteWeightsError as e:
                raise RunStopped(f"stopping at step {step + 1}: {e}, so the weights in memory are ruined; nothing "
                                 f"of them is written (no record, checkpoint or final/ for this step). Last good "
                                 f"checkpoint: {last_checkpoint()}. Lower optim.lr (or use model.dtype=float32), "
                                 f"then continue with `explorl train --resume {log.dir} optim.lr=...`") from None
            t2 = time.perf_counter()
            record.update({"perf/step_s": t2 - t0, "perf/sample_s": t_sample, "perf/update_s": t2 - t1,
                           "perf/tokens_per_s": float(ro.mask.sum()) / max(t_sample, 1e-9)})
            if r.eval_every > 0 and (step + 1) % r.eval_every == 0 and step + 1 < r.steps:
                record.update({f"eval/{k}": v for k, v in run_eval(step + 1).items()})
            log.append_metrics(record)
            log.log_samples(step + 1, got.problems, ro, got.texts, got.rewards, r.log_samples)
            bar.update(step + 1, record)
            if nonfinite_run >= r.max_nonfinite_steps:
                raise RuntimeError(f"stopping: {nonfinite_run} consecutive steps had a non-finite loss or "
                                   f"gradient. Lower optim.lr, check the reward function, or raise "
                                   f"run.max_nonfinite_steps. Last good checkpoint: {last_checkpoint()}")
            saved = r.save_every > 0 and (step + 1) % r.save_every == 0 and step + 1 < r.steps
            if saved or stop.signum is not None:  # a signal's stop is the safe point between two steps
                checkpoint(step + 1)
            if stop.signum is not None:
                raise interrupted(step + 1)
        # finishing: the last checkpoint first, then the evaluation, final/ and, last, eval.json (marks it complete)
        if not log.checkpoints() or log.checkpoints()[-1].name != f"step_{r.steps:07d}":
            checkpoint(r.steps)
        if stop.signum is not None:
            raise interrupted(r.steps)
        final = run_eval(r.steps)
        log.save_final_model(model, tok, model_card(cfg, final, r.steps))
        log.append_metrics({"step": r.steps, **{f"eval/{k}": v for k, v in final.items()}})
        log.write_eval(r.steps, final, cfg.model.fingerprint)
        failures.print_summary()
    finally:
        stop.restore()
        bar.close()
        log.close()
    return log.dir


def train_from_files(config_path: str | None, overrides: list[str]) -> Path:
    return train(load_config(config_path, overrides))
