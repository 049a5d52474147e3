"""Log-probabilities and entropies of response tokens by one full forward pass: the training code path.

The old policy, the new policy and the reference are all scored here, so the first PPO ratio is exactly 1.
Layout (as the sampler returns it): left-padded prompt of width P, then the response, right-padded to T.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from explorl.metrics import token_entropy
from explorl.rollout.forward import (fused_hidden, fused_hidden_dynamic_dims, fused_training_params, maybe_compiled,
                                     position_ids_from_mask, rotary_tables)


def full_sequences(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, response_ids: torch.Tensor):
    """(input_ids, attention_mask, position_ids) [N, P + T] of prompts followed by their responses.

    Padded response positions stay attendable so no query row is fully masked; their outputs are never used.
    """
    input_ids = torch.cat([prompt_ids, response_ids], dim=1)
    attention_mask = torch.cat([prompt_mask.long(), torch.ones_like(response_ids)], dim=1)
    return input_ids, attention_mask, position_ids_from_mask(attention_mask)


def per_token_temperature(temperature, n: int, t: int, device) -> torch.Tensor:
    """Broadcastable temperature [N, T, 1] from a float, [N] or [N, T]."""
    if isinstance(temperature, torch.Tensor):
        temp = temperature.to(device=device, dtype=torch.float32)
        if temp.dim() == 0:
            temp = temp.expand(n)
        if temp.dim() == 1:
            temp = temp[:, None].expand(n, t)
        return temp[:, :t, None]
    return torch.full((n, t, 1), float(temperature), device=device)


# Model types whose logits are exactly `lm_head(final hidden state)` (no soft-capping or logit scaling), so the
# output layer can be applied one block of tokens at a time.
HEAD_SPLIT_MODEL_TYPES = ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "llama", "mistral", "phi3")


def _split_head(model):
    """(decoder, output layer) when logits are a plain linear map of the decoder's output, else None."""
    cfg = getattr(model, "config", None)
    if getattr(cfg, "model_type", None) not in HEAD_SPLIT_MODEL_TYPES:
        return None
    get_decoder, get_head = getattr(model, "get_decoder", None), getattr(model, "get_output_embeddings", None)
    if get_decoder is None or get_head is None:
        return None
    head = get_head()
    if not isinstance(head, torch.nn.Linear):
        return None
    return get_decoder(), head


def _block_stats(hidden: torch.Tensor, weight: torch.Tensor, bias, targets: torch.Tensor, temp: torch.Tensor,
                 with_entropy: bool, with_sum_pi_squared: bool = False, top_k: int = 0):
    """`_logit_stats` and `_logit_topk` of one block of positions; only [N, c, V] logits exist here."""
    # `hidden.to`: a float32 head (model.lm_head_fp32) multiplies in float32; a no-op otherwise
    logits = torch.nn.functional.linear(hidden.to(weight.dtype), weight, bias).float() / temp
    return _logit_stats(logits, targets, with_entropy, with_sum_pi_squared) + _logit_topk(logits, targets, top_k)


def _logit_stats(logits: torch.Tensor, targets: torch.Tensor, with_entropy: bool, with_sum_pi_squared: bool):
    """(log-probs, entropies or zeros, sum_v pi(v)^2 or None) of float32 temperature-scaled `logits` [N, c, V]:
    sum_v pi(v)^2 = exp(logsumexp(2 logits) - 2 logsumexp(logits)) as verl's `calculate_sum_pi_squared_from_logits`
    (one more [N, c, V] temporary of the block, none of the whole batch)."""
    logz = torch.logsumexp(logits, dim=-1)
    lp = logits.gather(-1, targets[..., None]).squeeze(-1) - logz
    ent = token_entropy(logits) if with_entropy else torch.zeros_like(lp)
    s2 = torch.exp(torch.logsumexp(2 * logits, dim=-1) - 2 * logz) if with_sum_pi_squared else None
    return lp, ent, s2


def _logit_topk(logits: torch.Tensor, targets: torch.Tensor, top_k: int) -> tuple:
    """(log-probs [N, c, K] of the K largest of float32 temperature-scaled `logits` [N, c, V], largest first; whether
    the target is the largest [N, c] bool), or (None, None) for `top_k` 0. The gradient is that of gathering the K
    log-probs, the ids chosen on the values (as SimKO's authors' `torch.topk(logits.detach())` then
    `logprobs_from_logits`); the top-1 flag is their `max_token`."""
    if top_k <= 0:
        return None, None
    values, ids = logits.topk(top_k, dim=-1)
    return values - torch.logsumexp(logits, dim=-1, keepdim=True), ids[..., 0] == targets


def packed_sequences(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, response_ids: torch.Tensor,
                     response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's prompt and response side by side from column 0, right-padded: (ids [N, L], prompt lengths [N]).

    L = max over rows of prompt length + response length (the response's last column with `response_mask` != 0),
    so neither the prompts' left padding nor a short row's response padding is computed; token j of row i's
    response sits at column `prompt_len[i] + j` and is predicted from column `prompt_len[i] + j - 1`. Causal
    attention alone is then exact for every real token (the padding comes after them), and the positions are
    0..L-1 in every row. The padding columns repeat the last column's id; their outputs are never used.
    """
    n, p = prompt_ids.shape
    t = response_ids.shape[1]
    prompt_len = prompt_mask.long().sum(-1)
    cols = torch.arange(t, device=response_ids.device)
    resp_len = torch.where(response_mask != 0, cols + 1, 0).amax(-1) if t else torch.zeros_like(prompt_len)
    length = max(int((prompt_len + resp_len).max()), 1) if n else 1
    both = torch.cat([prompt_ids, response_ids], dim=1)
    # row i's real tokens start at column p - prompt_len[i] of the left-padded layout: a shift left per row
    index = (p - prompt_len)[:, None] + torch.arange(length, device=both.device)[None]
    return both.gather(1, index.clamp_(max=p + t - 1)), prompt_len


@dataclass(frozen=True)
class LogprobOptions:
    """What `response_logprobs` computes besides the log-probs, and how: its statistics, its output-layer blocks and
    whether the decoder runs compiled."""

    with_entropy: bool = True
    """Also return the entropy [N, T] of each token's distribution (else None in its place)."""
    with_sum_pi_squared: bool = False
    """Also return sum_v pi(v)^2 [N, T] of the same distribution, computed in the same float32 blocks (verl's
    `sum_pi_squared`; the optimal token baseline, docs/methods.md §5s)."""
    chunk_size: int = 2048
    """Tokens (rows x positions) per block of the output layer, at most."""
    max_block_logits: int = 2**25
    """Logits (tokens x vocabulary) per block, at most: large vocabularies get smaller blocks."""
    top_k: int = 0
    """K > 0: also return the log-probs [N, T, K] of the K most probable tokens of each distribution, most probable
    first, and whether the response token is the most probable [N, T] bool (SimKO's inputs); from the same float32
    blocks, so only [N, T, K] more is kept."""
    compile: bool = False
    """For a model the fused forward takes (Qwen2, Llama; no dropout, no LoRA), run the decoder as
    `rollout.forward.fused_hidden` compiled by torch.compile (`model.compile`), forward and backward; the same values
    up to float rounding."""


def response_logprobs(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, response_ids: torch.Tensor,
                      response_mask: torch.Tensor, temperature=1.0, options: LogprobOptions = LogprobOptions()):
    """Log-probs (and entropies) of the response tokens under softmax(logits / temperature).

    For Llama-family models (`HEAD_SPLIT_MODEL_TYPES`) the decoder runs once and the output layer is applied to
    blocks of about `min(options.chunk_size, options.max_block_logits // V)` tokens (all N rows x that // N
    positions); with gradients enabled each block is checkpointed (recomputed in the backward pass), so neither pass
    holds the float32 [N, T, V] logits: the peak is one block of at most ~`max_block_logits` float32 logits (128 MiB
    by default; a 152k vocabulary gets 220 tokens a block) and its few temporaries. Other models go through their
    own forward (`logits_to_keep` limits it to the response positions).

    Args:
        prompt_ids: [N, P] left-padded prompts; prompt_mask: [N, P] (1 = real token).
        response_ids: [N, T]; response_mask: [N, T] float (1 on response tokens incl. EOS).
        temperature: float, [N] (per response) or [N, T] (per token).
        options: the statistics to return besides the log-probs, the output layer's block sizes and whether the
            decoder runs compiled (`LogprobOptions`).
    Returns:
        logprobs [N, T] and entropy [N, T] (None without `options.with_entropy`), 0.0 where response_mask == 0; with
        `options.with_sum_pi_squared`, a third tensor: sum_pi_squared [N, T], 0.0 where response_mask == 0; with
        `options.top_k` = K > 0, two more: the top-K log-probs [N, T, K] (0.0 where response_mask == 0) and the
        top-1 flags [N, T] (False there). Differentiable when called with grad enabled.
    """
    with_entropy, with_sum_pi_squared = options.with_entropy, options.with_sum_pi_squared
    chunk_size, max_block_logits, compile = options.chunk_size, options.max_block_logits, options.compile
    want = (with_entropy, with_sum_pi_squared, options.top_k)
    n, t = response_ids.shape
    split = _split_head(model)
    if split is None:
        blocks = _stats_from_model_logits(model, prompt_ids, prompt_mask, response_ids, response_mask, temperature,
                                          want, chunk_size)
    else:
        decoder, head = split
        hidden = _response_hidden(model, decoder, prompt_ids, prompt_mask, response_ids, response_mask, compile)
        temp = _response_temperature(temperature, response_mask, hidden.device)
        step = max(1, min(chunk_size, max_block_logits // head.weight.shape[0]) // n)
        blocks = _stats_by_head_blocks(hidden, head, response_ids, temp, want, step)
    lps, ents, s2s, topks, top1s = zip(*blocks)
    mask = response_mask.to(torch.float32)
    logprobs = torch.cat(lps, dim=1) * mask
    entropy = torch.cat(ents, dim=1) * mask if with_entropy else None
    out = (logprobs, entropy) + ((torch.cat(s2s, dim=1) * mask,) if with_sum_pi_squared else ())
    if options.top_k > 0:
        out += (torch.cat(topks, dim=1) * mask[..., None], torch.cat(top1s, dim=1) & (mask > 0))
    return out


def _response_temperature(temperature, response_mask: torch.Tensor, device) -> torch.Tensor:
    """`per_token_temperature` [N, T, 1], 1 where response_mask == 0: RolloutBatch.temperatures is 0 on padding, and x/0
    there would give NaN values (and NaN gradients through the mask)."""
    n, t = response_mask.shape
    temp = per_token_temperature(temperature, n, t, device)
    return temp.masked_fill(response_mask.to(device)[..., None] == 0, 1.0)


def _response_hidden(model, decoder, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, response_ids: torch.Tensor,
                     response_mask: torch.Tensor, compile: bool) -> torch.Tensor:
    """The decoder's final hidden states [N, T, H] at the positions predicting each response token: by the compiled
    fused forward on packed rows where `compile` and the model allows it, else by the decoder's own forward."""
    fused = fused_training_params(model) if compile else None
    if fused is not None:
        ids, prompt_len = packed_sequences(prompt_ids, prompt_mask, response_ids, response_mask)
        cos, sin = rotary_tables(decoder, ids.shape[1], ids.device)
        ((embed, padding_idx), layers, norm), dims = fused
        h = torch.nn.functional.embedding(ids, embed, padding_idx)  # the pad row gets no gradient, as in the model
        hidden = maybe_compiled("train_forward", fused_hidden, True, fused_hidden_dynamic_dims,
                                "the training forward", "model.compile")(h, cos, sin, layers, norm, dims)
        # response token j of row i is predicted at column prompt_len[i] + j - 1
        at = (prompt_len[:, None] - 1 + torch.arange(response_ids.shape[1], device=ids.device))
        at = at.clamp_(0, ids.shape[1] - 1)
        return hidden.gather(1, at[..., None].expand(-1, -1, hidden.shape[-1]))
    input_ids, attention_mask, position_ids = full_sequences(prompt_ids, prompt_mask, response_ids)
    hidden = decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                     use_cache=False).last_hidden_state
    p, t = prompt_ids.shape[1], response_ids.shape[1]
    return hidden[:, p - 1:p + t - 1]  # position j predicts token j + 1


def _stats_by_head_blocks(hidden: torch.Tensor, head: torch.nn.Linear, response_ids: torch.Tensor,
                          temp: torch.Tensor, want: tuple[bool, bool, int], step: int) -> list[tuple]:
    """Per block, `_logit_stats`' log-probs, entropies and sums of squared probabilities and `_logit_topk`'s top-K
    log-probs and top-1 flags (`want`: (entropy, sum_pi_squared, top_k); zeros and None where not wanted), the
    output layer applied `step` positions at a time (each block checkpointed under autograd, so the backward
    recomputes its logits instead of holding them)."""
    blocks = []
    for s in range(0, response_ids.shape[1], step):
        args = (hidden[:, s:s + step], head.weight, head.bias, response_ids[:, s:s + step], temp[:, s:s + step],
                *want)
        if torch.is_grad_enabled():
            blocks.append(torch.utils.checkpoint.checkpoint(_block_stats, *args, use_reentrant=False))
        else:
            blocks.append(_block_stats(*args))
    return blocks


def _stats_from_model_logits(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, response_ids: torch.Tensor,
                             response_mask: torch.Tensor, temperature, want: tuple[bool, bool, int],
                             chunk_size: int) -> list[tuple]:
    """Per block, `_logit_stats` and `_logit_topk` (`want`: (entropy, sum_pi_squared, top_k)) from the model's own
    forward (any causal LM; `logits_to_keep` limits the logits to the response positions), upcast to float32 one
    block of `chunk_size` tokens at a time."""
    n, t = response_ids.shape
    input_ids, attention_mask, position_ids = full_sequences(prompt_ids, prompt_mask, response_ids)
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                logits_to_keep=t + 1, use_cache=False)
    logits = out.logits[:, :-1]  # the logit at position j predicts token j + 1
    temp = _response_temperature(temperature, response_mask, logits.device)
    step = max(1, chunk_size // n)
    blocks = []
    for s in range(0, t, step):
        block, targets = logits[:, s:s + step].float() / temp[:, s:s + step], response_ids[:, s:s + step]
        blocks.append(_logit_stats(block, targets, *want[:2]) + _logit_topk(block, targets, want[2]))
    return blocks
