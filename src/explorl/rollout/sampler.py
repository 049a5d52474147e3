"""Batched autoregressive sampling with a KV cache, per-prompt sample counts and per-token temperatures.

Two decoders share one sampling step:
- the fused path for Llama-family models (Qwen2, Llama, Mistral without sliding window; no LoRA wrapper):
  a preallocated KV cache and one matmul for q, k and v per layer, reusing the model's own weights, norms,
  MLPs and rotary embedding. On small models Python overhead dominates decoding, and this path removes most
  of it;
- the generic path for any other causal LM: the Hugging Face forward with a `DynamicCache`.
Both are checked against a full forward pass (`rollout.logprobs.response_logprobs`) in the tests.

What the sampler returns for each token: the behaviour log-prob under the distribution actually sampled
from (temperature, then top-p renormalisation) and the entropy of the temperature-scaled distribution
(before top-p truncation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence, Union

import torch
import torch.nn.functional as F

from explorl.metrics import token_entropy

Temperature = Union[float, Sequence[float], torch.Tensor, Callable[[int], Union[float, torch.Tensor]]]


@dataclass
class Rollouts:
    """Responses to a batch of prompts. N responses, prompts left-padded to P, responses right-padded to T."""

    prompt_ids: torch.Tensor  # [N, P] int64, left-padded
    prompt_mask: torch.Tensor  # [N, P] int64, 1 on real prompt tokens
    response_ids: torch.Tensor  # [N, T] int64, pad after EOS
    mask: torch.Tensor  # [N, T] float32, 1 on response tokens up to and including EOS
    behavior_logprobs: torch.Tensor  # [N, T] float32, log-prob under the distribution sampled from
    entropy: torch.Tensor  # [N, T] float32, entropy of softmax(logits / temperature)
    temperatures: torch.Tensor  # [N, T] float32, the temperature each token was sampled at (0 on padding)
    truncated: torch.Tensor  # [N] bool, hit the length limit without EOS
    group: torch.Tensor  # [N] int64, index of the prompt each response answers

    @property
    def lengths(self) -> torch.Tensor:
        return self.mask.sum(-1).long()

    def select(self, index: torch.Tensor) -> "Rollouts":
        """Rows `index` of every field (mini-batching, dynamic sampling)."""
        return Rollouts(**{k: getattr(self, k)[index] for k in self.__dataclass_fields__})

    @staticmethod
    def cat(parts: Sequence["Rollouts"], pad_token_id: int) -> "Rollouts":
        """Stack rollouts of several sampling rounds (DAPO dynamic sampling): prompts re-left-padded to one width,
        responses re-right-padded to one length. Group ids are kept as they are: make them distinct first."""
        width = max(p.prompt_ids.shape[1] for p in parts)
        length = max(p.response_ids.shape[1] for p in parts)

        def pad(x: torch.Tensor, to: int, left: bool, value) -> torch.Tensor:
            extra = to - x.shape[1]
            if extra == 0:
                return x
            filler = torch.full((x.shape[0], extra), value, dtype=x.dtype, device=x.device)
            return torch.cat([filler, x] if left else [x, filler], dim=1)

        return Rollouts(
            prompt_ids=torch.cat([pad(p.prompt_ids, width, True, pad_token_id) for p in parts]),
            prompt_mask=torch.cat([pad(p.prompt_mask, width, True, 0) for p in parts]),
            response_ids=torch.cat([pad(p.response_ids, length, False, pad_token_id) for p in parts]),
            mask=torch.cat([pad(p.mask, length, False, 0.0) for p in parts]),
            behavior_logprobs=torch.cat([pad(p.behavior_logprobs, length, False, 0.0) for p in parts]),
            entropy=torch.cat([pad(p.entropy, length, False, 0.0) for p in parts]),
            temperatures=torch.cat([pad(p.temperatures, length, False, 0.0) for p in parts]),
            truncated=torch.cat([p.truncated for p in parts]),
            group=torch.cat([p.group for p in parts]))


def _left_pad(prompts: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        if len(p):
            ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p):] = 1
    return ids.to(device), mask.to(device)


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


def _sample_step(logits: torch.Tensor, temp: torch.Tensor, top_p: float, generator) -> tuple[torch.Tensor, ...]:
    """One draw per row. logits [N, V], temp [N] -> (tokens [N], behaviour log-probs [N], entropy [N])."""
    scaled = logits.float() / temp.clamp_min(1e-6)[:, None]
    entropy = token_entropy(scaled)
    logp = torch.log_softmax(scaled, dim=-1)
    if top_p < 1.0:
        sorted_logp, order = torch.sort(logp, dim=-1, descending=True)
        cum = sorted_logp.exp().cumsum(-1)
        drop = (cum - sorted_logp.exp()) >= top_p  # keep the smallest prefix whose mass reaches top_p
        sorted_logp = sorted_logp.masked_fill(drop, float("-inf"))
        logp = torch.full_like(logp, float("-inf")).scatter(-1, order, sorted_logp)
        logp = torch.log_softmax(logp, dim=-1)  # renormalise over the nucleus
    # inverse-CDF draw: one uniform per row (cheaper than multinomial's exponential race on the CPU)
    # 1 - rand lies in (0, 1]: a draw of exactly 0 would otherwise pick token 0 even where its probability is 0
    u = 1.0 - torch.rand((logp.shape[0], 1), device=logp.device, generator=generator)
    cdf = logp.exp().cumsum(-1)
    token = (cdf < u * cdf[:, -1:]).sum(-1).clamp_(max=logp.shape[-1] - 1)
    return token, logp.gather(-1, token[:, None]).squeeze(-1), entropy


# ---------------------------------------------------------------------------------------------------------------
# decoders: prefill(prompt_ids, prompt_mask, total_len) -> last logits; step(tokens, step_index) -> logits


class _GenericDecoder:
    """Any HF causal LM: its own forward with a DynamicCache."""

    def __init__(self, model):
        self.model = model

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor, total: int, repeats: torch.Tensor) -> torch.Tensor:
        from transformers import DynamicCache

        ids, mask = ids.repeat_interleave(repeats, dim=0), mask.repeat_interleave(repeats, dim=0)
        n, p = ids.shape
        self.attn = torch.ones((n, total), dtype=torch.long, device=ids.device)
        self.attn[:, :p] = mask
        self.next_pos = mask.sum(-1, keepdim=True)
        self.p = p
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=_positions(mask),
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


def _positions(mask: torch.Tensor) -> torch.Tensor:
    return (mask.long().cumsum(-1) - 1).clamp_(min=0)


class _FusedDecoder:
    """Llama-family decoding with a preallocated cache and fused projections (same weights, same math).

    Prompts are prefilled once each and their cache rows repeated for the n_i samples; rows that finished
    are dropped from the batch (`keep`), so the cost follows the live responses, not the longest one.
    """

    SUPPORTED = ("qwen2", "llama", "mistral")

    @classmethod
    def applies(cls, model) -> bool:
        cfg = getattr(model, "config", None)
        if cfg is None or getattr(cfg, "model_type", None) not in cls.SUPPORTED or hasattr(model, "peft_config"):
            return False
        if getattr(cfg, "use_sliding_window", False) or getattr(cfg, "hidden_act", "silu") != "silu":
            return False
        if cfg.model_type == "mistral" and getattr(cfg, "sliding_window", None):  # Mistral applies it whenever set
            return False
        if getattr(cfg, "mlp_bias", False):
            return False
        rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
        if rope.get("rope_type", rope.get("type", "default")) != "default":
            return False
        inner = getattr(model, "model", None)
        return inner is not None and hasattr(inner, "layers") and hasattr(inner, "rotary_emb")

    def __init__(self, model):
        self.model = model
        inner = model.model
        self.inner = inner
        cfg = model.config
        self.n_heads = cfg.num_attention_heads
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads
        self.layers = []
        for layer in inner.layers:
            a, m = layer.self_attn, layer.mlp
            qkv_w = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight], dim=0).detach()
            qkv_b = None
            if a.q_proj.bias is not None:
                qkv_b = torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias], dim=0).detach()
            gate_up_w = torch.cat([m.gate_proj.weight, m.up_proj.weight], dim=0).detach()
            self.layers.append(dict(
                ln1=(layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon),
                ln2=(layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon),
                qkv_w=qkv_w, qkv_b=qkv_b, o=a.o_proj, gate_up_w=gate_up_w, down=m.down_proj))
        self.final_norm = (inner.norm.weight, inner.norm.variance_epsilon)

    @staticmethod
    def _rms(x: torch.Tensor, norm) -> torch.Tensor:
        weight, eps = norm
        # as HF's Qwen2RMSNorm: normalise in float32, scale in the weight's dtype
        return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., h:], x[..., :h]), dim=-1) * sin

    def _attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor) -> torch.Tensor:
        """q [n, H, s, D], k/v [n, KV, L, D], attn_mask bool broadcastable to [n, 1, s, L] -> [n, H, s, D]."""
        n, _, s, d = q.shape
        if s > 1:  # prefill: the fused kernel
            return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, enable_gqa=self.n_kv != self.n_heads)
        # one query per row: grouped matmuls without expanding K/V (faster than SDPA's kernel for tiny shapes)
        g = self.n_heads // self.n_kv
        scores = torch.matmul(q.view(n, self.n_kv, g, d), k.transpose(-1, -2)) * (d ** -0.5)
        scores = scores.masked_fill(~attn_mask.view(n, 1, 1, -1), float("-inf"))
        return torch.matmul(torch.softmax(scores, dim=-1), v).view(n, self.n_heads, 1, d)

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, start: int, attn_mask) -> torch.Tensor:
        n, s = ids.shape
        h = self.inner.embed_tokens(ids)
        cos, sin = self.cos[positions][:, None], self.sin[positions][:, None]  # [n, 1, s, D]
        hq, hk = self.n_heads * self.head_dim, self.n_kv * self.head_dim
        end = start + s
        for i, lw in enumerate(self.layers):
            qkv = F.linear(self._rms(h, lw["ln1"]), lw["qkv_w"], lw["qkv_b"])
            q = qkv[..., :hq].view(n, s, self.n_heads, self.head_dim).transpose(1, 2)
            k = qkv[..., hq:hq + hk].view(n, s, self.n_kv, self.head_dim).transpose(1, 2)
            v = qkv[..., hq + hk:].view(n, s, self.n_kv, self.head_dim).transpose(1, 2)
            self.k[i][:, :, start:end] = self._rotate(k, cos, sin)
            self.v[i][:, :, start:end] = v
            o = self._attention(self._rotate(q, cos, sin), self.k[i][:, :, :end], self.v[i][:, :, :end], attn_mask)
            h = h + lw["o"](o.transpose(1, 2).reshape(n, s, hq))
            gate, up = F.linear(self._rms(h, lw["ln2"]), lw["gate_up_w"]).chunk(2, dim=-1)
            h = h + lw["down"](F.silu(gate) * up)
        return self.model.lm_head(self._rms(h[:, -1], self.final_norm))

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor, total: int, repeats: torch.Tensor) -> torch.Tensor:
        """Prefill B distinct prompts [B, P]; cache rows are then repeated `repeats[b]` times."""
        b, p = ids.shape
        dtype = self.inner.embed_tokens.weight.dtype
        positions = torch.arange(total, device=ids.device)[None]
        cos, sin = self.inner.rotary_emb(self.inner.embed_tokens.weight[:1, None], positions)
        self.cos, self.sin = cos[0], sin[0]  # [total, D] tables, indexed by position
        shape = (b, self.n_kv, total, self.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=ids.device) for _ in self.layers]
        self.v = [torch.zeros(shape, dtype=dtype, device=ids.device) for _ in self.layers]
        causal = torch.ones((p, p), dtype=torch.bool, device=ids.device).tril()
        allowed = causal[None] & mask.bool()[:, None, :]
        allowed |= torch.eye(p, dtype=torch.bool, device=ids.device)[None]  # pad queries see themselves: no NaN rows
        logits = self._forward(ids, _positions(mask), 0, allowed[:, None])
        self.k = [k.repeat_interleave(repeats, dim=0) for k in self.k]
        self.v = [v.repeat_interleave(repeats, dim=0) for v in self.v]
        mask = mask.repeat_interleave(repeats, dim=0)
        self.key_valid = torch.ones((mask.shape[0], total), dtype=torch.bool, device=ids.device)
        self.key_valid[:, :p] = mask.bool()
        self.next_pos = mask.sum(-1, keepdim=True)
        self.p = p
        return logits.repeat_interleave(repeats, dim=0)

    def keep(self, rows: torch.Tensor) -> None:
        """Drop finished rows from the cache; `rows` indexes the current batch."""
        self.k = [k[rows] for k in self.k]
        self.v = [v[rows] for v in self.v]
        self.key_valid = self.key_valid[rows]
        self.next_pos = self.next_pos[rows]

    def step(self, tokens: torch.Tensor, t: int) -> torch.Tensor:
        end = self.p + t + 1
        return self._forward(tokens[:, None], self.next_pos + t, self.p + t, self.key_valid[:, None, None, :end])


@torch.no_grad()
def sample(model, prompts: Sequence[Sequence[int]], n: int | Sequence[int], *, eos_token_id: int | Sequence[int],
           pad_token_id: int, max_new_tokens: int, temperature: Temperature = 1.0, top_p: float = 1.0,
           generator: torch.Generator | None = None, fast_path: bool = True) -> Rollouts:
    """Sample `n_i` responses for each prompt.

    Args:
        prompts: B token-id lists (unpadded).
        n: samples per prompt, an int or a list of B ints (variable group sizes; 0 is allowed).
        temperature: a float; [B] per prompt or [N] per response (list or tensor); [N, >= max_new_tokens]
            per generated token; or a callable `t -> float | Tensor[N]` for generated-token index t (0-based).
        top_p: nucleus mass (1.0 = off).
        generator: a torch.Generator on the model's device, for reproducible draws.
        fast_path: use the fused Llama-family decoder when it applies.
    Returns:
        Rollouts with N = sum(n_i) rows in prompt order (group[i] = index of the prompt).
    """
    device = next(model.parameters()).device
    n_per_prompt = [int(n)] * len(prompts) if isinstance(n, int) else [int(x) for x in n]
    if len(n_per_prompt) != len(prompts):
        raise ValueError(f"n has {len(n_per_prompt)} entries for {len(prompts)} prompts")
    if any(x < 0 for x in n_per_prompt):
        raise ValueError("n: sample counts must be >= 0")
    eos = torch.tensor([eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id), device=device)
    group = torch.repeat_interleave(torch.arange(len(prompts)), torch.tensor(n_per_prompt, dtype=torch.long))
    expanded = [list(prompts[g]) for g in group.tolist()]
    num = len(expanded)
    temp_at = _temperature_source(temperature, n_per_prompt, num, max_new_tokens, device)
    if num == 0:
        empty = torch.zeros((0, 0))
        return Rollouts(torch.zeros((0, 0), dtype=torch.long), torch.zeros((0, 0), dtype=torch.long),
                        torch.zeros((0, 0), dtype=torch.long), empty, empty, empty, empty,
                        torch.zeros(0, dtype=torch.bool), group)
    # prefill each distinct prompt once; rows of prompts with n_i = 0 are never decoded
    used = [i for i, k in enumerate(n_per_prompt) if k > 0]
    uniq_ids, uniq_mask = _left_pad([list(prompts[i]) for i in used], pad_token_id, device)
    repeats = torch.tensor([n_per_prompt[i] for i in used], device=device)
    ids, pmask = uniq_ids.repeat_interleave(repeats, dim=0), uniq_mask.repeat_interleave(repeats, dim=0)
    was_training = model.training
    model.eval()
    decoder = _FusedDecoder(model) if fast_path and _FusedDecoder.applies(model) else _GenericDecoder(model)
    tokens = torch.full((num, max_new_tokens), pad_token_id, dtype=torch.long, device=device)
    logps = torch.zeros((num, max_new_tokens), device=device)
    ents = torch.zeros((num, max_new_tokens), device=device)
    temps = torch.zeros((num, max_new_tokens), device=device)
    mask = torch.zeros((num, max_new_tokens), device=device)
    alive = torch.zeros(num, dtype=torch.bool, device=device)  # per original row: no EOS by the end
    rows = torch.arange(num, device=device)  # original row of each row of the decoder's (compacted) batch
    length = 0
    try:
        logits = decoder.prefill(uniq_ids, uniq_mask, ids.shape[1] + max_new_tokens, repeats)
        live = torch.ones(num, dtype=torch.bool, device=device)  # per row of the decoder's batch
        for t in range(max_new_tokens):
            temp = temp_at(t)[rows]
            tok, lp, ent = _sample_step(logits, temp, top_p, generator)
            tok = torch.where(live, tok, torch.full_like(tok, pad_token_id))
            live_f = live.float()
            tokens[rows, t] = tok
            logps[rows, t] = lp * live_f
            ents[rows, t] = ent * live_f
            temps[rows, t] = temp * live_f
            mask[rows, t] = live_f
            length = t + 1
            live = live & ~torch.isin(tok, eos)
            n_live = int(live.sum())
            if n_live == 0 or t + 1 == max_new_tokens:
                break
            if len(rows) - n_live >= max(1, len(rows) // 8):  # drop finished rows: later steps cost only live ones
                keep = live.nonzero().squeeze(-1)
                decoder.keep(keep)
                rows, tok, live = rows[keep], tok[keep], live[keep]
            logits = decoder.step(tok, t)
        alive[rows[live]] = True
    finally:
        model.train(was_training)
    truncated = alive  # still going at the limit: no EOS was produced
    t_used = max(length, 1)
    return Rollouts(prompt_ids=ids, prompt_mask=pmask, response_ids=tokens[:, :t_used], mask=mask[:, :t_used],
                    behavior_logprobs=logps[:, :t_used], entropy=ents[:, :t_used], temperatures=temps[:, :t_used],
                    truncated=truncated, group=group.to(device))


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
