"""explorl's batches from TRL's tensors, across processes.

TRL splits each generation batch across processes; explorl's statistics are batch-wide (the batch covariance of
`cw`, the entropy quantile of the forking filter, the Clip-Cov / KL-Cov selections, the token-mean normaliser, groups
that straddle two processes). So:
- the advantage step runs on the batch gathered from every process (rows padded to the widest, `gather_rows`;
  `generation_batch`), identically on every rank, and each rank keeps its own rows (`local_rows`);
- the loss of a micro-batch is explorl's loss of the micro-batches of all processes together
  (`global_micro_batch`), where only this rank's rows carry a gradient; the trainer multiplies it by the number of
  processes because DDP, DeepSpeed and FSDP average gradients, so the summed gradient is that of the whole
  micro-batch, as on one process. A micro-batch's share of its gradient-accumulation window is explorl's
  `micro_batch_share` over the window of every process (`window_total`).
One process computes exactly what several do; tests/integrations/test_trl.py runs both and compares.

Groups: TRL lays out a generation batch as `num_generations` consecutive completions per prompt, across processes in
rank order; the group id of global row i is `i // num_generations`. Truncation: a completion whose last token is not
an EOS token hit `max_completion_length` (`truncated`; DAPO's overlong shaping, `algo.reward_shapers`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from explorl.algos import RolloutBatch
from explorl.algos.batch import TopK
from explorl.algos.losses import aggregation_count
from explorl.rollout.lines import ends_line_table, line_start_mask
from explorl.rollout.logprobs import LogprobOptions, response_logprobs

__all__ = ["TokenForwards", "gather_rows", "generation_batch", "global_micro_batch", "line_starts", "local_rows",
           "micro_batch", "pi_old_forward", "topk_forward", "truncated", "window_total"]


def gather_rows(accelerator, x: Tensor | None) -> Tensor | None:
    """`[n, t]` (or `[n]`) rows of every process, concatenated in rank order, padded with 0 to the widest `t`.

    Every process must call it with a tensor or every process with None (it is a collective)."""
    if x is None or accelerator.num_processes == 1:
        return x
    if x.dim() >= 2:  # [n, t] or [n, t, K]
        x = accelerator.pad_across_processes(x.contiguous(), dim=1, pad_index=0)
    return accelerator.gather(x.contiguous())


def truncated(completion_ids: Tensor, mask: Tensor, eos_ids: list[int]) -> Tensor:
    """`[n]` bool: the completion has tokens and its last one is no EOS (it ran into the length limit)."""
    lengths = mask.sum(-1).long()
    last = completion_ids.gather(1, (lengths - 1).clamp_min(0)[:, None]).squeeze(1)
    return (lengths > 0) & ~torch.isin(last, torch.tensor(eos_ids, device=last.device))


def line_starts(out: dict, mask: Tensor, tokenizer) -> Tensor:
    """`[n, T]` 1.0 on this process's completion tokens that begin a line (`explorl.rollout.lines`: after a token
    that decodes to text ending with a newline; TRL's prompts are left-padded as the function expects), the tokens
    of `algo.kl_tokens: line_starts`'s KL term."""
    return line_start_mask(out["prompt_ids"], out["prompt_mask"], out["completion_ids"], mask,
                           ends_line_table(tokenizer))


def pi_old_forward(trainer, out: dict, mask: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
    """pi_old's log-probs and entropies `[n, T]` of this process's completions (`mask` `[n, T]`) at the training
    temperature, and its top-K log-probs `[n, T, K]` where the loss reads them (SimKO; else None): one no-grad forward,
    TRL's fused log-prob head, or explorl's `response_logprobs` for the top-K (the loss's forward is then explorl's
    too, `topk_forward`, so that the ratios compare one kernel's values)."""
    k = trainer.explorl_needs.topk
    if k:
        with torch.no_grad():
            lp, ent, topk, _ = response_logprobs(trainer.accelerator.unwrap_model(trainer.model), out["prompt_ids"],
                                                 out["prompt_mask"], out["completion_ids"], mask, trainer._train_tau,
                                                 LogprobOptions(top_k=k))
        return lp, ent, topk
    ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
    att = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
    with torch.no_grad():
        lp, ent, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, att, out["completion_ids"].size(1),
            batch_size=trainer.args.per_device_train_batch_size, compute_entropy=True)
    return lp, ent, None


def topk_forward(trainer, model, inputs: dict, response: Tensor) -> tuple[Tensor, Tensor, TopK]:
    """The loss's forward of a micro-batch where the loss reads the top-K log-probs (SimKO): explorl's
    `response_logprobs` through `model` (TRL's, wrapped for DDP), at the training temperature: log-probs and entropies
    `[n, t]` with their gradient, and the `TopK` (entropies detached)."""
    lp, ent, topk, top1 = response_logprobs(model, inputs["prompt_ids"], inputs["prompt_mask"],
                                            inputs["completion_ids"], response, trainer._train_tau,
                                            LogprobOptions(top_k=trainer.explorl_needs.topk))
    return lp, ent, TopK(logprobs=topk, entropy=ent.detach(), is_top1=top1)


@dataclass
class TokenForwards:
    """This process's `[n, T]` per-token tensors from the forwards before the advantage step (None where not
    computed): pi_old's log-probs, its entropies and the behaviour log-probs (the distribution sampled from)."""

    old: Tensor | None = None
    """pi_old's log-probs of the sampled tokens."""
    entropy: Tensor | None = None
    """pi_old's token entropies."""
    behavior: Tensor | None = None
    """The behaviour log-probs of the sampled tokens."""
    sum_pi_squared: Tensor | None = None
    """pi_old's `sum_v pi(v)^2` per token (the optimal token baseline's)."""
    topk: Tensor | None = None
    """pi_old's `[n, T, K]` log-probs of its K most probable tokens (SimKO's)."""


def generation_batch(accelerator, out: dict, mask: Tensor, rewards: Tensor, group: Tensor, max_len: int,
                     eos_ids: list[int], forwards: TokenForwards) -> RolloutBatch:
    """The generation batch of every process as explorl's `RolloutBatch` (collective): this process's `[n, T]`
    `mask` and `forwards` (pi_old's log-probs and entropies, the behaviour log-probs) gathered; `rewards` and
    `group` are every process's already (`[N]`, TRL gathers the rewards)."""
    g = lambda x: gather_rows(accelerator, x)  # noqa: E731
    m = g(mask)
    return RolloutBatch(mask=m, rewards=rewards.to(m.device), group=group.to(m.device), max_response_len=max_len,
                        logprobs=g(forwards.old), behavior_logprobs=g(forwards.behavior),
                        ref_logprobs=g(out.get("ref_per_token_logps")), entropy=g(forwards.entropy),
                        sum_pi_squared=g(forwards.sum_pi_squared), topk_logprobs=g(forwards.topk),
                        lengths=g(mask.sum(-1).long()), truncated=g(truncated(out["completion_ids"], mask, eos_ids)))


def local_rows(accelerator, batch: RolloutBatch, shape: tuple[int, int]) -> dict[str, Tensor | None]:
    """This process's rows (`shape`: its `[n, T]`) of the advantage step's outputs (`batch` through
    `compute_advantages`), as TRL's batch carries them."""
    n, t = shape
    rows = slice(accelerator.process_index * n, (accelerator.process_index + 1) * n)
    local = lambda x: None if x is None else x[rows, :t]  # noqa: E731
    return {"advantages": local(batch.advantages), "explorl_loss_mask": local(batch.loss_mask),
            "explorl_token_weights": local(batch.token_weights), "explorl_is_weights": local(batch.is_weights),
            "explorl_topk_old": local(batch.topk_logprobs),
            "explorl_correct": None if batch.correct is None else batch.correct[rows]}


def micro_batch(inputs: dict, mask: Tensor, max_len: int) -> RolloutBatch:
    """A loss micro-batch of TRL's (this process's rows: `mask` `[n, t]`) as explorl's batch through its advantage
    step."""
    batch = RolloutBatch.for_loss(mask, inputs["advantages"], logprobs=inputs.get("explorl_old_logps"),
                                  loss_mask=inputs["explorl_loss_mask"], max_response_len=max_len,
                                  is_weights=inputs.get("explorl_is_weights"),
                                  token_weights=inputs.get("explorl_token_weights"),
                                  ref_logprobs=inputs.get("explorl_ref_logps"))
    # the KL term's line starts (algo.kl_tokens); pi_old's top-K and the correctness SimKO reads
    return batch.replace(line_starts=inputs.get("explorl_line_starts"), topk_logprobs=inputs.get("explorl_topk_old"),
                         correct=inputs.get("explorl_correct"))


def global_micro_batch(accelerator, lp: Tensor, entropy: Tensor | None, batch: RolloutBatch, topk: TopK | None = None):
    """The micro-batches of every process as one: gathered detached tensors, with this rank's rows replaced by its
    own log-probs (and entropies, and top-K log-probs), which carry the gradient."""
    g = lambda x: gather_rows(accelerator, None if x is None else x.detach())  # noqa: E731
    n, t = lp.shape
    mask = g(batch.mask)
    width = mask.shape[1]
    start = accelerator.process_index * n

    def splice(own: Tensor) -> Tensor:
        others = g(own)
        own = F.pad(own, (0, 0) * (own.dim() - 2) + (0, width - t))  # dim 1 to the widest
        return torch.cat([others[:start], own, others[start + n:]])

    lp_all = splice(lp)
    ent_all = None if entropy is None else splice(entropy)
    topk_all = None if topk is None else TopK(logprobs=splice(topk.logprobs), entropy=g(topk.entropy),
                                              is_top1=g(topk.is_top1))
    batch_all = RolloutBatch.for_loss(mask, g(batch.advantages), logprobs=g(batch.logprobs),
                                      loss_mask=g(batch.loss_mask), max_response_len=batch.max_response_len,
                                      is_weights=g(batch.is_weights), token_weights=g(batch.token_weights),
                                      ref_logprobs=g(batch.ref_logprobs)).replace(
        line_starts=g(batch.line_starts), topk_logprobs=g(batch.topk_logprobs), correct=g(batch.correct))
    return lp_all, ent_all, batch_all, topk_all


def window_total(accelerator, windows: list[dict], agg: str) -> float:
    """The loss normaliser of a gradient-accumulation window (its micro-batches' inputs, this process's) over every
    process: tokens, non-empty rows or rows, by `agg` (collective)."""
    total = sum(aggregation_count(inputs["explorl_loss_mask"], agg) for inputs in windows)
    t = torch.tensor(total, dtype=torch.float64, device=accelerator.device)
    return float(accelerator.reduce(t, reduction="sum")) if accelerator.num_processes > 1 else total
