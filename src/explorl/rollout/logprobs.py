"""Log-probabilities and entropies of response tokens by one full forward pass: the training code path.

The old policy, the new policy and the reference are all scored here, so the first PPO ratio is exactly 1.
Layout (as the sampler returns it): left-padded prompt of width P, then the response, right-padded to T.
"""

from __future__ import annotations

import torch

from explorl.metrics import token_entropy


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding: 0 at each row's first real token. [N, L] -> [N, L] (int64)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp_(min=0)


def full_sequences(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, response_ids: torch.Tensor):
    """(input_ids, attention_mask, position_ids) [N, P + T] of prompts followed by their responses.

    Padded response positions stay attendable so no query row is fully masked; their outputs are never used.
    """
    input_ids = torch.cat([prompt_ids, response_ids], dim=1)
    attention_mask = torch.cat([prompt_mask.long(), torch.ones_like(response_ids)], dim=1)
    return input_ids, attention_mask, position_ids_from_mask(attention_mask)


def _as_temperature(temperature, n: int, t: int, device) -> torch.Tensor:
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
                 with_entropy: bool):
    """Log-probs [N, c] and entropies [N, c] of one block of positions; only [N, c, V] logits exist here."""
    logits = torch.nn.functional.linear(hidden, weight, bias).float() / temp
    logz = torch.logsumexp(logits, dim=-1)
    lp = logits.gather(-1, targets[..., None]).squeeze(-1) - logz
    ent = token_entropy(logits) if with_entropy else torch.zeros_like(lp)
    return lp, ent


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


def _fused_hidden(h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layers: tuple, norm: tuple,
                  dims: tuple[int, int, int]) -> torch.Tensor:
    """The decoder layers of a Llama-family model as one function of their parameters (the sampler's fused math,
    without a cache) on `packed_sequences` rows: the embedded tokens h [N, L, H], cos / sin [1, L, D] of positions
    0..L-1 -> the final normalised hidden states [N, L, H]. Causal attention, no mask: each row's real tokens come
    first. Differentiable in `layers` and `norm` (the model's own parameters), so the training forward and backward
    compile to a few fused loops and the matmuls (`model.compile`). The embedding lookup stays outside: its backward
    is a scatter-add, which the compiler parallelises with atomic adds on the CPU, so the embedding's gradient would
    depend on thread timing (consecutive runs differed by ~1e-9); eager's is deterministic."""
    from explorl.rollout.engines.native import _rms, _rotate

    norm_w, norm_eps = norm
    n_heads, n_kv, d = dims
    n, length = h.shape[:2]
    cos, sin = cos[:, None], sin[:, None]  # [1, 1, L, D]
    for ln1, eps1, q_w, k_w, v_w, q_b, k_b, v_b, o_w, o_b, ln2, eps2, gate_w, up_w, down_w in layers:
        qkv_b = None if q_b is None else torch.cat([q_b, k_b, v_b])
        qkv = torch.nn.functional.linear(_rms(h, ln1, eps1), torch.cat([q_w, k_w, v_w]), qkv_b)
        hq, hk = n_heads * d, n_kv * d
        q = qkv[..., :hq].view(n, length, n_heads, d).transpose(1, 2)
        k = qkv[..., hq:hq + hk].view(n, length, n_kv, d).transpose(1, 2)
        v = qkv[..., hq + hk:].view(n, length, n_kv, d).transpose(1, 2)
        o = torch.nn.functional.scaled_dot_product_attention(_rotate(q, cos, sin), _rotate(k, cos, sin), v,
                                                             is_causal=True, enable_gqa=n_kv != n_heads)
        h = h + torch.nn.functional.linear(o.transpose(1, 2).reshape(n, length, hq), o_w, o_b)
        gate, up = torch.nn.functional.linear(_rms(h, ln2, eps2), torch.cat([gate_w, up_w])).chunk(2, dim=-1)
        h = h + torch.nn.functional.linear(torch.nn.functional.silu(gate) * up, down_w)
    return _rms(h, norm_w, norm_eps)


def _fused_params(model) -> tuple | None:
    """(((embedding weight, padding_idx), layers, norm), dims) of a model the sampler's fused decoder takes and that
    trains without dropout, where layers, norm and dims are `_fused_hidden`'s arguments; None otherwise."""
    from explorl.rollout.engines.native import _FusedDecoder

    cfg = model.config
    if not _FusedDecoder.applies(model) or getattr(cfg, "attention_dropout", 0.0):
        return None
    layers = []
    for layer in model.model.layers:
        a, m = layer.self_attn, layer.mlp
        layers.append((layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon, a.q_proj.weight,
                       a.k_proj.weight, a.v_proj.weight, a.q_proj.bias, a.k_proj.bias, a.v_proj.bias, a.o_proj.weight,
                       a.o_proj.bias, layer.post_attention_layernorm.weight,
                       layer.post_attention_layernorm.variance_epsilon, m.gate_proj.weight, m.up_proj.weight,
                       m.down_proj.weight))
    n_heads = cfg.num_attention_heads
    dims = (n_heads, getattr(cfg, "num_key_value_heads", None) or n_heads,
            getattr(cfg, "head_dim", None) or cfg.hidden_size // n_heads)
    inner = model.model
    return ((inner.embed_tokens.weight, inner.embed_tokens.padding_idx), tuple(layers),
            (inner.norm.weight, inner.norm.variance_epsilon)), dims


def _hidden_dynamic_dims(h, cos, sin, *_):
    yield from ((h, 0), (h, 1), (cos, 1), (sin, 1))


def response_logprobs(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, response_ids: torch.Tensor,
                      response_mask: torch.Tensor, temperature=1.0, *, with_entropy: bool = True,
                      chunk_size: int = 2048, max_block_logits: int = 2**25, compile: bool = False):
    """Log-probs (and entropies) of the response tokens under softmax(logits / temperature).

    For Llama-family models (`HEAD_SPLIT_MODEL_TYPES`) the decoder runs once and the output layer is applied to
    blocks of about `min(chunk_size, max_block_logits // V)` tokens (all N rows x that // N positions); with
    gradients enabled each block is checkpointed (recomputed in the backward pass), so neither pass holds the
    float32 [N, T, V] logits: the peak is one block of at most ~`max_block_logits` float32 logits (128 MiB by
    default; a 152k vocabulary gets 220 tokens a block) and its few temporaries. Other models go through their own
    forward (`logits_to_keep` limits it to the response positions).

    Args:
        prompt_ids: [N, P] left-padded prompts; prompt_mask: [N, P] (1 = real token).
        response_ids: [N, T]; response_mask: [N, T] float (1 on response tokens incl. EOS).
        temperature: float, [N] (per response) or [N, T] (per token).
        chunk_size: tokens (rows x positions) per block of the output layer, at most.
        max_block_logits: logits (tokens x vocabulary) per block, at most: large vocabularies get smaller blocks.
        compile: for a model the sampler's fused decoder takes (Qwen2, Llama; no dropout, no LoRA), run the decoder
            as `_fused_hidden` compiled by torch.compile (`model.compile`), forward and backward; the same values
            up to float rounding.
    Returns:
        logprobs [N, T] and entropy [N, T] (None when with_entropy is False), 0.0 where response_mask == 0.
        Differentiable when called with grad enabled.
    """
    n, t = response_ids.shape
    p = prompt_ids.shape[1]
    split = _split_head(model)
    temp = None
    lps, ents = [], []
    if split is not None:
        decoder, head = split
        fused = _fused_params(model) if compile else None
        if fused is not None:
            from explorl.rollout.engines.native import _maybe_compiled

            ids, prompt_len = packed_sequences(prompt_ids, prompt_mask, response_ids, response_mask)
            positions = torch.arange(ids.shape[1], device=ids.device)[None]
            cos, sin = decoder.rotary_emb(decoder.embed_tokens.weight[:1, None], positions)
            ((embed, padding_idx), layers, norm), dims = fused
            h = torch.nn.functional.embedding(ids, embed, padding_idx)  # the pad row gets no gradient, as in the model
            hidden = _maybe_compiled("train_forward", _fused_hidden, True, _hidden_dynamic_dims,
                                     "the training forward", "model.compile")(h, cos, sin, layers, norm, dims)
            # response token j of row i is predicted at column prompt_len[i] + j - 1
            at = (prompt_len[:, None] - 1 + torch.arange(t, device=ids.device)).clamp_(0, ids.shape[1] - 1)
            hidden = hidden.gather(1, at[..., None].expand(-1, -1, hidden.shape[-1]))
        else:
            input_ids, attention_mask, position_ids = full_sequences(prompt_ids, prompt_mask, response_ids)
            hidden = decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             use_cache=False).last_hidden_state
            hidden = hidden[:, p - 1:p + t - 1]  # position j predicts token j + 1
        temp = _as_temperature(temperature, n, t, hidden.device)
        temp = temp.masked_fill(response_mask.to(hidden.device)[..., None] == 0, 1.0)
        step = max(1, min(chunk_size, max_block_logits // head.weight.shape[0]) // n)
        for s in range(0, t, step):
            args = (hidden[:, s:s + step], head.weight, head.bias, response_ids[:, s:s + step],
                    temp[:, s:s + step], with_entropy)
            if torch.is_grad_enabled():
                lp, ent = torch.utils.checkpoint.checkpoint(_block_stats, *args, use_reentrant=False)
            else:
                lp, ent = _block_stats(*args)
            lps.append(lp)
            ents.append(ent)
    else:
        input_ids, attention_mask, position_ids = full_sequences(prompt_ids, prompt_mask, response_ids)
        out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                    logits_to_keep=t + 1, use_cache=False)
        logits = out.logits[:, :-1]  # the logit at position j predicts token j + 1
        temp = _as_temperature(temperature, n, t, logits.device)
        # Rollouts.temperatures is 0 on padding: x/0 there would give NaN values (and NaN gradients through the mask)
        temp = temp.masked_fill(response_mask.to(logits.device)[..., None] == 0, 1.0)
        step = max(1, chunk_size // n)
        for s in range(0, t, step):
            block = logits[:, s:s + step].float() / temp[:, s:s + step]
            logz = torch.logsumexp(block, dim=-1)
            lps.append(block.gather(-1, response_ids[:, s:s + step, None]).squeeze(-1) - logz)
            ents.append(token_entropy(block) if with_entropy else torch.zeros_like(logz))
    mask = response_mask.to(torch.float32)
    logprobs = torch.cat(lps, dim=1) * mask
    entropy = torch.cat(ents, dim=1) * mask if with_entropy else None
    return logprobs, entropy
