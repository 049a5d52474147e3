"""The policy update of one batch: pi_old's and the reference's log-probs (`fill_logprobs`, stage 3 of the step's
`RolloutBatch`), then epochs x mini-batches x micro-batches of the configured objective (`update_policy`), AdamW with warm-up and cosine decay
(`make_optimizer`). A loss or gradient that is not finite skips the rest of the step's updates before
`optimizer.step` (`NonFiniteError`); weights left non-finite by a step raise `NonFiniteWeightsError`. On a resume
the config's lr, betas and decay go back over a checkpoint's (`configured_hyperparameters`,
`keep_configured_optimizer`; TRL's adapter uses them too).
"""

from __future__ import annotations

import copy
import math

import torch

from explorl.algos.batch import RolloutBatch, TopK
from explorl.algos.losses import micro_batch_share
from explorl.algos.mismatch import mismatch_metrics
from explorl.algos.registry import lookup
from explorl.algos.step import idle_rows, policy_objective, requirements, single_update_shortcut
from explorl.config import Config
from explorl.models import reference_mode
from explorl.rollout.logprobs import LogprobOptions, response_logprobs


class NonFiniteError(RuntimeError):
    """The loss or the gradient norm of an update was NaN or infinite."""


class NonFiniteWeightsError(RuntimeError):
    """An optimizer step left NaN or infinite values in the trainable weights (they are ruined)."""


def _nonfinite(model) -> list[str]:
    """Names of the trainable parameters holding a NaN or an infinity (one device sync when there are none)."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not named:
        return []
    flags = [torch.isfinite(p).all() for _, p in named]
    if bool(torch.stack([f.to(flags[0].device) for f in flags]).all()):
        return []
    return [n for (n, _), ok in zip(named, flags) if not bool(ok)]


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


def fused_compile(cfg: Config) -> bool:
    """`model.compile`, unless gradient checkpointing asks for the Hugging Face forward's recomputation."""
    return cfg.model.compile and not cfg.model.gradient_checkpointing


def _micro_batches(mb: torch.Tensor, lengths: torch.Tensor, a) -> list[torch.Tensor]:
    """Positions in mini-batch `mb` of each micro-batch: rows sorted by length (longest first) and cut into
    `micro_batch_size` rows, or into `length_buckets` parts, so each forward pads only to its own longest row.
    The accumulated gradient is the mini-batch's (`micro_batch_share`); only the padding compute changes."""
    order = torch.sort(lengths[mb], descending=True, stable=True).indices
    size = a.micro_batch_size if a.micro_batch_size > 0 else math.ceil(len(mb) / max(1, a.length_buckets))
    return list(order.split(max(1, size)))


def _logprobs(model, micro: RolloutBatch, loss_mask: torch.Tensor, temp, with_entropy: bool, compile: bool,
              top_k: int = 0):
    """`response_logprobs` of a micro-batch (`RolloutBatch.select`: its rows, its response columns), without the
    left-padding columns all of its rows share: log-probs and entropies (None without `with_entropy`) shaped like
    `loss_mask`, and the same forward's `TopK` with `top_k` > 0 (its entropies detached; else None)."""
    lead = int((micro.prompt_mask.cumsum(-1) == 0).sum(-1).min())  # left-padding columns common to all rows
    out = response_logprobs(model, micro.prompt_ids[:, lead:], micro.prompt_mask[:, lead:], micro.response_ids,
                            loss_mask, temp, options=LogprobOptions(with_entropy=with_entropy or top_k > 0,
                                                                    compile=compile, top_k=top_k))
    if top_k <= 0:
        return (*out, None)
    lp, ent, topk, top1 = out
    return lp, ent if with_entropy else None, TopK(logprobs=topk, entropy=ent.detach(), is_top1=top1)


def _logprobs_without_idle(model, micro: RolloutBatch, idle: torch.Tensor, loss_mask: torch.Tensor, temp, *,
                           on_policy: bool, compile: bool):
    """Log-probs, shaped like `loss_mask`, of a micro-batch whose `idle` rows (`algos.step.idle_rows`) add nothing
    to the loss or its gradient: only the others go through the forward with grad, so the backward skips the idle
    ones. The idle rows' values feed only the loss's statistics: with `on_policy` (pi_old is this forward, detached)
    any value gives them ratio 1 exactly, as their forward would, so they are left at 0; otherwise (pi_old from an
    earlier forward) they come from a forward without grad. Entropies and top-K log-probs are not returned (idle
    rows exist only without the entropy bonus and for losses that read no top-K). A lone row goes through the
    forward with a neighbour whose output is dropped, since a compiled forward specialises, and recompiles, for a
    batch of one row."""
    n, width = loss_mask.shape
    lp = torch.zeros(n, width, device=loss_mask.device)

    def put(lp, which, grad: bool):  # `which`' log-probs into lp; a lone row is computed with a neighbour
        pick = which if len(which) != 1 or n == 1 else torch.cat([which, (which[:1] + 1) % n])
        w = max(int(loss_mask[pick].sum(-1).max()), 1)
        with torch.set_grad_enabled(grad and torch.is_grad_enabled()):
            part, _, _ = _logprobs(model, micro.select(pick, w), loss_mask[pick, :w], temp, False, compile)
        return lp.index_copy(0, which, torch.nn.functional.pad(part[:len(which)], (0, width - w)))

    live, rest = (~idle).nonzero().squeeze(-1), idle.nonzero().squeeze(-1)
    if len(live):
        lp = put(lp, live, grad=True)
    if not on_policy and len(rest):
        lp = put(lp, rest, grad=False)
    return lp, None, None


def update_policy(model, optimizer, scheduler, batch: RolloutBatch, cfg: Config, shuffle: torch.Generator,
                  temperature: float | None = None) -> dict:
    """Epochs x mini-batches of policy-gradient updates on one batch of rollouts. Returns mean stats.

    `batch`: the step's `RolloutBatch` through `compute_advantages` (stage 4): its token ids for the forward, its
    advantages and weights; each micro-batch is one `select(rows, width)` of it.
    `temperature` is the training temperature of the batch (the optimised policy is softmax(logits / it)).
    """
    a = cfg.algo
    params = [p for p in model.parameters() if p.requires_grad]
    batch.require("advantages", "loss_mask", by="update_policy (run compute_advantages first)")
    n = batch.loss_mask.shape[0]
    stats: dict[str, list[float]] = {}
    temp = cfg.sampling.temperature if temperature is None else temperature
    needs = requirements(a)
    need_entropy, top_k = needs.update_entropy, needs.topk
    batch.require("prompt_ids", "prompt_mask", "response_ids", by="update_policy")
    lengths = batch.prompt_mask.sum(-1) + batch.loss_mask.sum(-1)
    idle = idle_rows(batch, a)
    compile = fused_compile(cfg)
    # when no forward before the update computed pi_old (the single-update shortcut; verl's bypass mode, where pi_old
    # is the rollout's) the rollout/trainer mismatch is measured on this forward's log-probs, before the optimizer
    # step, on the tokens it computes (the response tokens, idle rows left out); with one update only, so that it
    # runs at the sampling weights
    pi_old_is_rollout = batch.logprobs is None or lookup("policy_loss", a.loss).old_is_behavior
    measure = (pi_old_is_rollout and batch.behavior_logprobs is not None and a.epochs == 1
               and a.mini_batches == 1)
    if measure:
        trainer_lp, measured = torch.zeros_like(batch.loss_mask), torch.zeros_like(batch.loss_mask)
    for _ in range(a.epochs):
        # drawn on the host (the same order on every device), then moved: indices live with what they index
        perm = torch.randperm(n, generator=shuffle).to(batch.loss_mask.device)
        for mb in perm.chunk(a.mini_batches):
            mb_mask = batch.loss_mask[mb]
            optimizer.zero_grad(set_to_none=True)
            stepped = False
            for local in _micro_batches(mb, lengths, a):
                rows = mb[local]
                # padding columns no row here uses; the forward reads the response mask: the loss mask may have holes
                # (rollout_rs rejects single tokens), which must still be attended to
                width = max(int(batch.mask[rows].sum(-1).max()), 1)
                micro = batch.select(rows, width)
                if bool(idle[rows].any()):
                    lp, ent, topk = _logprobs_without_idle(model, micro, idle[rows], micro.mask, temp,
                                                           on_policy=batch.logprobs is None, compile=compile)
                else:
                    lp, ent, topk = _logprobs(model, micro, micro.mask, temp, need_entropy, compile, top_k)
                if measure:
                    trainer_lp[rows, :width] = lp.detach().to(trainer_lp.dtype)
                    measured[rows, :width] = micro.mask * (~idle[rows])[:, None]
                loss, st = policy_objective(lp, ent, micro, a, generator=shuffle, topk=topk)
                if not torch.isfinite(loss):
                    raise NonFiniteError(f"loss is {float(loss.detach())} (pg={st.get('loss/pg')}); update skipped")
                if loss.requires_grad:  # not when every row of the micro-batch is idle
                    (loss * micro_batch_share(mb_mask, local, a.loss_agg)).backward()
                    stepped = True
                for k, v in st.items():
                    stats.setdefault(k, []).append(float(v))
            if not stepped:  # a mini-batch of idle rows only: AdamW still steps (decay, moments) on zero gradients
                for p in params:
                    p.grad = torch.zeros_like(p)
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
    if measure:
        out.update(mismatch_metrics(trainer_lp, batch.behavior_logprobs, measured))
    return out


@torch.no_grad()
def fill_logprobs(model, ref, batch: RolloutBatch, temperature: float, cfg: Config,
                  pi_old_from_update: bool) -> RolloutBatch:
    """Stage 3 of the step's `RolloutBatch`: pi_old's log-probs and entropies at the training `temperature` (a
    forward pass, unless the update's own forward serves as pi_old or verl's bypass mode takes the rollout's) and
    the reference's log-probs when the method needs them, and pi_old's `sum_pi_squared` when a registered entry
    declares `needs_sum_pi_squared` and its `topk_logprobs` when the policy loss declares `needs_topk` (both from
    the same forward; without one, the update's forward stands in for pi_old's top-K). `batch`: the sampled (and
    scored) batch."""
    needs = requirements(cfg.algo)
    need_s2, top_k, s2, topk = needs.sum_pi_squared, needs.topk, None, None
    if pi_old_from_update:  # the sampler's entropies are the policy's at this temperature (behaviour = policy)
        old_lp, old_ent = None, batch.behavior_entropy
    elif lookup("policy_loss", cfg.algo.loss).old_is_behavior:  # verl's bypass mode: pi_old is the rollout's
        old_lp, old_ent = batch.behavior_logprobs, batch.behavior_entropy
    else:
        options = LogprobOptions(compile=fused_compile(cfg), with_sum_pi_squared=need_s2, top_k=top_k)
        old_lp, old_ent, *more = response_logprobs(model, batch.prompt_ids, batch.prompt_mask, batch.response_ids,
                                                   batch.mask, temperature, options)
        s2 = more.pop(0) if need_s2 else None
        topk = more[0] if top_k else None  # pi_old's own top-K (the authors' `old_log_probs_topk`)
    if need_s2 and s2 is None:  # pi_old's log-probs taken from elsewhere: its sum_pi_squared still needs a forward
        _, _, s2 = response_logprobs(model, batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.mask,
                                     temperature, LogprobOptions(with_entropy=False, compile=fused_compile(cfg),
                                                                 with_sum_pi_squared=True))
    ref_lp = None
    if needs.ref:
        with reference_mode(model, ref) as ref_model:
            ref_lp, _ = response_logprobs(ref_model, batch.prompt_ids, batch.prompt_mask, batch.response_ids,
                                          batch.mask, temperature,
                                          options=LogprobOptions(with_entropy=False, compile=fused_compile(cfg)))
    return batch.replace(logprobs=old_lp, entropy=old_ent, ref_logprobs=ref_lp, sum_pi_squared=s2,
                         topk_logprobs=topk)


def configured_hyperparameters(optimizer) -> list[dict]:
    """Each param group's settings as the run's arguments made them (lr, initial_lr, betas, eps, weight_decay, ...),
    taken before a checkpoint's optimizer state is loaded over them (explorl's loop, TRL's)."""
    return [{k: copy.deepcopy(v) for k, v in group.items() if k != "params"} for group in optimizer.param_groups]


def keep_configured_optimizer(optimizer, scheduler, configured: list[dict]) -> None:
    """After a checkpoint's optimizer and scheduler were loaded (explorl's loop, TRL's): AdamW's moments and the
    schedule's position stay the checkpoint's, its settings become the configured ones again (`configured`, from
    `configured_hyperparameters`): torch's `load_state_dict` restores the old run's lr, betas and weight decay, and
    the schedule's base rate (`base_lrs`), so a resume with `optim.lr` changed would silently keep the old rate. The
    learning rate is then the configured schedule at the checkpoint's step: base rate x the schedule's factor at
    `scheduler.last_epoch`."""
    for group, want in zip(optimizer.param_groups, configured):
        group.update(want)
    lambdas = getattr(scheduler, "lr_lambdas", None)
    if lambdas is None:  # not a LambdaLR (explorl's and TRL's schedules are): its own state stands
        return
    scheduler.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
    rates = [base * factor(scheduler.last_epoch) for base, factor in zip(scheduler.base_lrs, lambdas)]
    for group, rate in zip(optimizer.param_groups, rates):
        group["lr"] = rate
    scheduler._last_lr = rates  # what get_last_lr() reports until the next step


def make_optimizer(model, cfg: Config, device: torch.device):
    """AdamW on the trainable parameters with warm-up and cosine decay over all optimizer steps."""
    o = cfg.optim
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=o.lr, betas=(o.beta1, o.beta2), weight_decay=o.weight_decay,
                                  foreach=device.type == "cuda")
    total_updates = cfg.run.steps * cfg.algo.epochs * cfg.algo.mini_batches
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(o.warmup_steps, total_updates, o.min_lr_ratio))
    return optimizer, scheduler
