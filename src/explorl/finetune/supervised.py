"""The supervised step shared by `explorl sft`, `explorl rft` and `explorl bootstrap`: prompt + response + EOS as
one token sequence with the loss on the response and EOS only (`sft_example`, `sft_batch`), and one optimizer step
on the mean next-token cross-entropy over the labelled tokens of a batch, accumulated over micro-batches
(`supervised_step`). Pure torch on a Hugging Face causal LM; nothing of the loop is imported here.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

IGNORE = -100
"""Label of the positions that carry no loss (prompt and padding), as `F.cross_entropy`'s `ignore_index`."""


def sft_example(tok, prompt: str, response: str, max_length: int = 0) -> tuple[list[int], int]:
    """Token ids of prompt + response + EOS, and where the response starts (the loss covers response and EOS).
    `max_length > 0` keeps only the first that-many tokens."""
    prompt_ids = tok.encode(prompt, add_special_tokens=False)
    seq = prompt_ids + tok.encode(response, add_special_tokens=False) + [tok.eos_token_id]
    return (seq[:max_length] if max_length > 0 else seq), len(prompt_ids)


def sft_batch(seqs: list[list[int]], starts: list[int], rows: list[int], pad: int):
    """Right-padded (input_ids, attention_mask, labels) of sequences `rows`, each `[len(rows), longest]`; prompt and
    padding labels are -100."""
    width = max(len(seqs[i]) for i in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE, dtype=torch.long)
    for j, i in enumerate(rows):
        ids[j, :len(seqs[i])] = torch.tensor(seqs[i])
        attn[j, :len(seqs[i])] = 1
        labels[j, starts[i]:len(seqs[i])] = torch.tensor(seqs[i][starts[i]:])
    return ids, attn, labels


def supervised_loss(model, ids: torch.Tensor, attn: torch.Tensor, labels: torch.Tensor,
                    normaliser: int | None = None) -> torch.Tensor:
    """Next-token cross-entropy (in float32) of `model` on the labelled positions of one batch.

    Shapes: `ids`, `attn`, `labels` `[B, L]`; position t's logits predict `labels[:, t + 1]`. Returns the mean over
    the labelled tokens, or their sum divided by `normaliser` (a micro-batch's share of a larger batch's mean).
    """
    logits = model(input_ids=ids, attention_mask=attn).logits
    flat, targets = logits[:, :-1].reshape(-1, logits.shape[-1]).float(), labels[:, 1:].reshape(-1)
    if normaliser is None:
        return F.cross_entropy(flat, targets)
    return F.cross_entropy(flat, targets, reduction="sum") / normaliser


def labelled_tokens(labels: torch.Tensor) -> int:
    """Tokens that carry loss in a `[B, L]` label tensor (the first position predicts nothing)."""
    return int((labels[:, 1:] != IGNORE).sum())


def supervised_step(model, optimizer, batches: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], *,
                    grad_clip: float = 1.0) -> float:
    """One optimizer step on the mean next-token loss over every labelled token of `batches` (the micro-batches
    of one batch, tensors on the model's device); gradients accumulate over them. `grad_clip > 0` clips the
    global gradient norm. Returns the loss (a float; nan when no token is labelled, and then nothing changes)."""
    optimizer.zero_grad(set_to_none=True)
    if len(batches) == 1:
        loss = supervised_loss(model, *batches[0])
        if not torch.isfinite(loss):
            return float(loss.detach())
        loss.backward()
        total = float(loss.detach())
    else:
        count = sum(labelled_tokens(b[2]) for b in batches)
        if count == 0:
            return float("nan")
        total = 0.0
        for ids, attn, labels in batches:
            loss = supervised_loss(model, ids, attn, labels, normaliser=count)
            loss.backward()
            total += float(loss.detach())
    if grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    return total
