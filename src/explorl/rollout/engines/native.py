"""Batched autoregressive sampling with a KV cache, per-prompt sample counts and per-token temperatures.

Two decoders share one sampling step:
- the fused path for Llama-family models (Qwen2, Llama, Mistral without sliding window; no LoRA wrapper):
  a preallocated KV cache and one matmul for q, k and v per layer, reusing the model's own weights, norms,
  MLPs and rotary embedding (`rollout.forward`, the forward it shares with training). On small models Python
  overhead dominates decoding, and this path removes most of it;
- the generic path for any other causal LM: the Hugging Face forward with a `DynamicCache`.
Both are checked against a full forward pass (`rollout.logprobs.response_logprobs`) in the tests.

What the sampler returns for each token (`rollout.draw`): the behaviour log-prob under the distribution actually
sampled from (temperature, then top-p renormalisation) and the entropy of the temperature-scaled distribution
(before top-p truncation).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import torch

from explorl.algos.batch import RolloutBatch
from explorl.rollout.draw import draw_dynamic_dims, draw_tokens, uniforms
from explorl.rollout.engines.static import DrawSettings, decode_static
from explorl.rollout.forward import (FusedCache, attention_dims, cache_step_dynamic_dims, cache_weights,
                                     compile_failed, forward_with_cache, maybe_compiled, position_ids_from_mask,
                                     rotary_tables)
from explorl.rollout.prompts import left_pad_prompts

Temperature = float | Sequence[float] | torch.Tensor | Callable[[int], float | torch.Tensor]


def _temperature_source(temperature: Temperature, n_per_prompt: list[int], n: int, max_new: int, device):
    """Return fn(t) -> Tensor[N] giving each response's temperature for generated token t."""
    if callable(temperature) and not isinstance(temperature, torch.Tensor):
        def from_fn(t: int) -> torch.Tensor:
            v = temperature(t)
            v = torch.as_tensor(v, dtype=torch.float32, device=device)
            return v.expand(n) if v.dim() == 0 else v
        return from_fn
    if isinstance(temperature, torch.Tensor):
        temp = temperature.to(device=device, dtype=torch.float32)
        if temp.dim() == 0:
            temp = temp.expand(n)
        if temp.dim() == 1:
            if temp.shape[0] == len(n_per_prompt) == n and any(k != 1 for k in n_per_prompt):
                raise ValueError(f"temperature of length {n} is ambiguous: there are {n} prompts and {n} responses "
                                 f"(n={n_per_prompt}); expand it per response yourself and pass [N, max_new_tokens]")
            if temp.shape[0] == len(n_per_prompt) and temp.shape[0] != n:
                temp = temp.repeat_interleave(torch.tensor(n_per_prompt, device=device))
            if temp.shape[0] != n:
                raise ValueError(f"temperature tensor of shape {tuple(temperature.shape)}: expected [N={n}] "
                                 f"per response or [B={len(n_per_prompt)}] per prompt")
            return lambda t: temp
        if temp.dim() == 2:
            if temp.shape[0] != n or temp.shape[1] < max_new:
                raise ValueError(f"per-token temperature of shape {tuple(temp.shape)}: expected [N={n}, "
                                 f">= max_new_tokens={max_new}]")
            return lambda t: temp[:, t]
        raise ValueError("temperature tensor must be 0-, 1- or 2-dimensional")
    if isinstance(temperature, (list, tuple)):
        return _temperature_source(torch.tensor(temperature, dtype=torch.float32), n_per_prompt, n, max_new, device)
    value = torch.full((n,), float(temperature), device=device)
    return lambda t: value


# ---------------------------------------------------------------------------------------------------------------
# decoders: prefill(prompt_ids, prompt_mask, total_len, repeats) -> last logits; keep(rows); step(tokens, t) -> logits


class _GenericDecoder:
    """Any HF causal LM: its own forward with a DynamicCache."""

    def __init__(self, model):
        self.model = model

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor, total: int, repeats: torch.Tensor) -> torch.Tensor:
        # transformers: ~0.7 s at import, paid only by the generic decoder (importing the sampler skips it)
        from transformers import DynamicCache

        ids, mask = ids.repeat_interleave(repeats, dim=0), mask.repeat_interleave(repeats, dim=0)
        n, p = ids.shape
        self.attn = torch.ones((n, total), dtype=torch.long, device=ids.device)
        self.attn[:, :p] = mask
        self.next_pos = mask.sum(-1, keepdim=True)
        self.p = p
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask),
                         past_key_values=DynamicCache(), use_cache=True, logits_to_keep=1)
        self.cache = out.past_key_values
        return out.logits[:, -1]

    def keep(self, rows: torch.Tensor) -> None:
        self.cache.batch_select_indices(rows)
        self.attn = self.attn[rows]
        self.next_pos = self.next_pos[rows]

    def step(self, tokens: torch.Tensor, t: int) -> torch.Tensor:
        out = self.model(input_ids=tokens[:, None], attention_mask=self.attn[:, :self.p + t + 1],
                         position_ids=self.next_pos + t, past_key_values=self.cache, use_cache=True)
        self.cache = out.past_key_values
        return out.logits[:, -1]


class _FusedDecoder:
    """Llama-family decoding with a preallocated cache and fused projections (`rollout.forward.forward_with_cache`:
    the same weights, the same math).

    Prompts are prefilled once each and their cache rows repeated for the n_i samples; rows that finished
    are dropped from the batch (`keep`), so the cost follows the live responses, not the longest one. With
    `compile`, each decode step is one torch.compile'd graph: on the CPU a handful of fused C++ loops and the
    matmuls per layer instead of some thirty small kernels, each paying Python's dispatch.
    """

    def __init__(self, model, compile: bool = False):
        self.inner = model.model
        self.dims = attention_dims(model.config)
        self.n_kv = self.dims[1]
        self.weights = cache_weights(model)
        self.compile = compile
        self._step = maybe_compiled("decode", forward_with_cache, compile, cache_step_dynamic_dims)

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor, total: int, repeats: torch.Tensor) -> torch.Tensor:
        """Prefill B distinct prompts [B, P]; cache rows are then repeated `repeats[b]` times."""
        b, p = ids.shape
        dtype = self.inner.embed_tokens.weight.dtype
        cos, sin = rotary_tables(self.inner, total, ids.device)
        shape = (b, self.n_kv, total, self.dims[2])
        k = [torch.zeros(shape, dtype=dtype, device=ids.device) for _ in self.weights[1]]
        v = [torch.zeros(shape, dtype=dtype, device=ids.device) for _ in self.weights[1]]
        self.cache = FusedCache(self.weights, k, v, cos[0], sin[0], self.dims)  # cos, sin: [total, D] by position
        causal = torch.ones((p, p), dtype=torch.bool, device=ids.device).tril()
        allowed = causal[None] & mask.bool()[:, None, :]
        allowed |= torch.eye(p, dtype=torch.bool, device=ids.device)[None]  # pad queries see themselves: no NaN rows
        logits = forward_with_cache(ids, position_ids_from_mask(mask), torch.arange(p, device=ids.device),
                                    allowed[:, None], self.cache, False)
        rows = int(repeats.sum())  # one host read: without output_size each repeat_interleave syncs on CUDA
        grow = lambda x: x.repeat_interleave(repeats, dim=0, output_size=rows)  # noqa: E731
        self.cache = replace(self.cache, k=[grow(k) for k in self.cache.k], v=[grow(v) for v in self.cache.v])
        mask = grow(mask)
        # the slots each row attends to: its prompt's, then each generated token's as it is written
        self.key_valid = torch.zeros((mask.shape[0], total), dtype=torch.bool, device=ids.device)
        self.key_valid[:, :p] = mask.bool()
        self.next_pos = mask.sum(-1, keepdim=True)
        self.p = p
        self.slots = torch.arange(p, total, device=ids.device)  # the cache slot of generated token t: slots[t]
        return grow(logits)

    def keep(self, rows: torch.Tensor) -> None:
        """Drop finished rows from the cache; `rows` indexes the current batch."""
        self.cache = replace(self.cache, k=[k[rows] for k in self.cache.k], v=[v[rows] for v in self.cache.v])
        self.key_valid = self.key_valid[rows]
        self.next_pos = self.next_pos[rows]

    def step(self, tokens: torch.Tensor, t: int) -> torch.Tensor:
        slot = self.p + t
        self.key_valid[:, slot] = True
        # the slots written so far (the mask's length is a dynamic dimension of the compiled graph)
        compiled = self.compile and not compile_failed()
        return self._step(tokens[:, None], self.next_pos + t, self.slots[t:t + 1],
                          self.key_valid[:, None, None, :slot + 1], self.cache, compiled)


# ---------------------------------------------------------------------------------------------------------------
# the decoding loop


class _Responses:
    """What a decode writes for each response row and generated token t: [N, max_new_tokens] buffers."""

    def __init__(self, num: int, max_new_tokens: int, pad_token_id: int, device):
        self.tokens = torch.full((num, max_new_tokens), pad_token_id, dtype=torch.long, device=device)
        self.logps = torch.zeros((num, max_new_tokens), device=device)
        self.entropy = torch.zeros((num, max_new_tokens), device=device)
        self.temperatures = torch.zeros((num, max_new_tokens), device=device)
        self.mask = torch.zeros((num, max_new_tokens), device=device)
        self.length = 0  # tokens generated by the longest response

    def write(self, rows: torch.Tensor, t: int, tokens, logps, entropy, temperatures, live: torch.Tensor) -> None:
        """Token t of the batch rows `rows` (original row indices); rows no longer `live` are written as padding."""
        live_f = live.float()
        self.tokens[rows, t] = tokens
        self.logps[rows, t] = logps * live_f
        self.entropy[rows, t] = entropy * live_f
        self.temperatures[rows, t] = temperatures * live_f
        self.mask[rows, t] = live_f
        self.length = t + 1

    def batch(self, prompt_ids, prompt_mask, truncated, group) -> RolloutBatch:
        """The sampled batch (stage 1 of `RolloutBatch`), cut to the longest response."""
        t = max(self.length, 1)
        return RolloutBatch(mask=self.mask[:, :t], rewards=None, group=group, max_response_len=self.tokens.shape[1],
                            prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=self.tokens[:, :t],
                            behavior_logprobs=self.logps[:, :t], behavior_entropy=self.entropy[:, :t],
                            temperatures=self.temperatures[:, :t], truncated=truncated)


def _decode(decoder, draw: Callable, logits: torch.Tensor, settings: DrawSettings, out: _Responses,
            avoid_single_row: bool) -> torch.Tensor:
    """Draw tokens from the prefill's `logits` on, as `settings` say, until every row produced an EOS or the length
    limit, writing them to `out`. Returns truncated [N] bool: the rows still going at the limit.

    Finished rows are dropped from the decoder's batch once they are an eighth of it: later steps cost only the
    live ones. With `avoid_single_row` (a compiled step), one finished row is kept as padding rather than leave a
    batch of 1, which would be a compilation of its own."""
    num, max_new_tokens = out.tokens.shape
    device = out.tokens.device
    rows = torch.arange(num, device=device)  # original row of each row of the decoder's (compacted) batch
    live = torch.ones(num, dtype=torch.bool, device=device)  # per row of the decoder's batch
    pad_rows = 0  # finished rows kept last in the batch
    temp_at, top_p, eos, pad_token_id, generator = (settings.temp_at, settings.top_p, settings.eos,
                                                    settings.pad_token_id, settings.generator)
    for t in range(max_new_tokens):
        temp = temp_at(t)[rows]
        u = uniforms(len(rows) - pad_rows, device, generator)  # the eager path's stream, padding or not
        if pad_rows:
            u = torch.cat([u, u.new_ones((pad_rows, 1))])
        tok, lp, ent = draw(logits, temp, top_p, u)
        tok = torch.where(live, tok, torch.full_like(tok, pad_token_id))
        out.write(rows, t, tok, lp, ent, temp, live)
        live = live & ~torch.isin(tok, eos)
        n_live = int(live.sum())
        if n_live == 0 or t + 1 == max_new_tokens:
            break
        real = len(rows) - pad_rows
        if real - n_live >= max(1, real // 8):
            keep = live.nonzero().squeeze(-1)
            pad_rows = int(avoid_single_row and n_live == 1)
            if pad_rows:
                keep = torch.cat([keep, (~live).nonzero()[:1, 0]])
            decoder.keep(keep)
            rows, tok, live = rows[keep], tok[keep], live[keep]
        logits = decoder.step(tok, t)
    truncated = torch.zeros(num, dtype=torch.bool, device=device)
    truncated[rows[live]] = True  # no EOS by the limit
    return truncated


def _counts_per_prompt(n: int | Sequence[int], n_prompts: int) -> list[int]:
    counts = [int(n)] * n_prompts if isinstance(n, int) else [int(x) for x in n]
    if len(counts) != n_prompts:
        raise ValueError(f"n has {len(counts)} entries for {n_prompts} prompts")
    if any(x < 0 for x in counts):
        raise ValueError("n: sample counts must be >= 0")
    return counts


@torch.no_grad()
def sample(sampler, prompts: Sequence[Sequence[int]], n: int | Sequence[int], temperature: Temperature = 1.0,
           generator: torch.Generator | None = None) -> RolloutBatch:
    """Sample `n_i` responses for each prompt with explorl's decoder, as `sampler` says.

    Args:
        sampler: a `rollout.sampler.Sampler`, the run's settings built once: its `model`, `eos_token_id`,
            `pad_token_id`, `max_new_tokens` and `top_p`; `fused` (the fused Llama-family decoder applies, decided at
            construction from `fast_path`), `compile` (with the fused decoder, run each decode step and draw as
            torch.compile'd graphs, `sampling.compile`: the first call of a process compiles, seconds to a minute;
            the draws are the same up to float rounding) and `cuda_graph` (with the fused decoder, decode a static
            batch, `rollout.engines.static`: finished rows masked, not removed, whose step is captured as a CUDA
            graph on CUDA and replayed per token, `sampling.cuda_graph`). Its `engine` is not used here.
        prompts: B token-id lists (unpadded).
        n: samples per prompt, an int or a list of B ints (variable group sizes; 0 is allowed).
        temperature: a float; [B] per prompt or [N] per response (list or tensor); [N, >= max_new_tokens]
            per generated token; or a callable `t -> float | Tensor[N]` for generated-token index t (0-based).
        generator: a torch.Generator on the model's device, for reproducible draws.
    Returns:
        The sampled `RolloutBatch` (rewards None) with N = sum(n_i) rows in prompt order (group[i] = index of the
        prompt).
    """
    model, eos_token_id, pad_token_id = sampler.model, sampler.eos_token_id, sampler.pad_token_id
    max_new_tokens, top_p = sampler.max_new_tokens, sampler.top_p
    # the sampler decided these once: the fused decoder applies, and compile and the graph only with it
    fused, compile, cuda_graph = sampler.fused, sampler.compile, sampler.cuda_graph
    device = next(model.parameters()).device
    n_per_prompt = _counts_per_prompt(n, len(prompts))
    eos = torch.tensor([eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id), device=device)
    group = torch.repeat_interleave(torch.arange(len(prompts)), torch.tensor(n_per_prompt, dtype=torch.long))
    num = len(group)
    temp_at = _temperature_source(temperature, n_per_prompt, num, max_new_tokens, device)
    if num == 0:
        return RolloutBatch.no_responses(group, max_new_tokens)
    # prefill each distinct prompt once; rows of prompts with n_i = 0 are never decoded
    used = [i for i, k in enumerate(n_per_prompt) if k > 0]
    uniq_ids, uniq_mask = left_pad_prompts([list(prompts[i]) for i in used], pad_token_id, device)
    repeats = torch.tensor([n_per_prompt[i] for i in used], device=device)
    was_training = model.training
    model.eval()
    decoder = _FusedDecoder(model, compile) if fused else _GenericDecoder(model)
    draw = maybe_compiled("draw", draw_tokens, compile and fused, draw_dynamic_dims)
    out = _Responses(num, max_new_tokens, pad_token_id, device)
    try:
        logits = decoder.prefill(uniq_ids, uniq_mask, uniq_ids.shape[1] + max_new_tokens, repeats)
        settings = DrawSettings(temp_at, top_p, eos, pad_token_id, generator)
        if fused and cuda_graph:
            truncated = decode_static(decoder, logits, settings, out, compile=compile, graph=True)
        else:
            truncated = _decode(decoder, draw, logits, settings, out, avoid_single_row=compile and fused)
    finally:
        model.train(was_training)
    return out.batch(uniq_ids.repeat_interleave(repeats, dim=0), uniq_mask.repeat_interleave(repeats, dim=0),
                        truncated, group.to(device))



def decode_responses(tokenizer, ro) -> list[str]:
    """Response texts without padding or EOS."""
    out = []
    eos = tokenizer.eos_token_id
    for ids, length in zip(ro.response_ids.tolist(), ro.lengths.tolist()):
        ids = ids[:length]
        if ids and ids[-1] == eos:
            ids = ids[:-1]
        out.append(tokenizer.decode(ids, skip_special_tokens=True))
    return out
