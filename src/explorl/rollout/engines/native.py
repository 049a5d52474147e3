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

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from explorl.metrics import token_entropy

Temperature = float | Sequence[float] | torch.Tensor | Callable[[int], float | torch.Tensor]


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

    def select(self, index: torch.Tensor) -> Rollouts:
        """Rows `index` of every field (mini-batching, dynamic sampling)."""
        return Rollouts(**{k: getattr(self, k)[index] for k in self.__dataclass_fields__})

    @staticmethod
    def cat(parts: Sequence[Rollouts], pad_token_id: int) -> Rollouts:
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


def _uniforms(n: int, device, generator) -> torch.Tensor:
    """One uniform per row in (0, 1]: a draw of exactly 0 would otherwise pick token 0 where its probability is 0."""
    return 1.0 - torch.rand((n, 1), device=device, generator=generator)


def _sample_step(logits: torch.Tensor, temp: torch.Tensor, top_p: float, u: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """One draw per row. logits [N, V], temp [N], u [N, 1] uniforms in (0, 1]
    -> (tokens [N], behaviour log-probs [N], entropy [N])."""
    scaled = logits.float() / temp.clamp_min(1e-6)[:, None]
    if top_p >= 1.0:  # one exp over the vocabulary serves the entropy, the normaliser and the draw
        shifted = scaled - scaled.amax(-1, keepdim=True)
        weights = shifted.exp()
        z = weights.sum(-1, keepdim=True)
        logp_shifted = shifted - z.log()  # log p; tokens of p = 0 (logits of -inf) add 0 to the entropy
        entropy = -torch.where(weights > 0, weights * logp_shifted, 0.0).sum(-1) / z.squeeze(-1)
        token = _inverse_cdf(weights, u)
        return token, logp_shifted.gather(-1, token[:, None]).squeeze(-1), entropy
    entropy = token_entropy(scaled)  # of the temperature-scaled distribution, before the nucleus
    sorted_logp, order = torch.sort(torch.log_softmax(scaled, dim=-1), dim=-1, descending=True)
    cum = sorted_logp.exp().cumsum(-1)
    drop = (cum - sorted_logp.exp()) >= top_p  # keep the smallest prefix whose mass reaches top_p
    sorted_logp = sorted_logp.masked_fill(drop, float("-inf"))
    logp = torch.full_like(scaled, float("-inf")).scatter(-1, order, sorted_logp)
    logp = torch.log_softmax(logp, dim=-1)  # renormalise over the nucleus
    token = _inverse_cdf(logp.exp(), u)
    return token, logp.gather(-1, token[:, None]).squeeze(-1), entropy


CDF_BLOCK = 256
"""Vocabularies above 4 blocks are drawn by blocks of this many tokens (`_inverse_cdf`)."""


def _inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw, one uniform per row (cheaper than multinomial's exponential race on the CPU).
    weights [N, V] >= 0 (unnormalised, each row some > 0), u [N, 1] in (0, 1] -> the token j [N] with
    cdf[j - 1] < u * cdf[V - 1] <= cdf[j]; a token of weight 0 is never drawn.

    Large vocabularies go by blocks of `CDF_BLOCK` tokens, the same draw with two short scans for one of length V:
    the block from the running sums of block totals, then the token from the running sum inside that block."""
    n, v = weights.shape
    if v <= 4 * CDF_BLOCK:
        cdf = weights.cumsum(-1)
        return (cdf < u * cdf[:, -1:]).sum(-1).clamp_(max=v - 1)
    blocks = F.pad(weights, (0, (-v) % CDF_BLOCK)).view(n, -1, CDF_BLOCK)  # [N, B, C], padding of weight 0
    block_cdf = blocks.sum(-1).cumsum(-1)  # [N, B]
    target = u * block_cdf[:, -1:]  # [N, 1]
    b = (block_cdf < target).sum(-1)  # the first block whose running sum reaches the target
    before = torch.where(b > 0, block_cdf.gather(-1, (b - 1).clamp(min=0)[:, None]).squeeze(-1), 0.0)
    inner = blocks.gather(1, b[:, None, None].expand(n, 1, CDF_BLOCK)).squeeze(1).cumsum(-1)  # [N, C]
    # target > before, so the rest is > 0; capped at the block's own sum against rounding, so the token drawn has a
    # weight > 0 (the last such token of the block at most)
    rest = torch.minimum(target.squeeze(-1) - before, inner[:, -1])
    return b * CDF_BLOCK + (inner < rest[:, None]).sum(-1)


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


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # as HF's Qwen2RMSNorm: normalise in float32, scale in the weight's dtype
    return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., h:], x[..., :h]), dim=-1) * sin


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor, n_kv: int,
               reduce_kernel: bool) -> torch.Tensor:
    """q [n, H, s, D], k/v [n, KV, L, D], attn_mask bool broadcastable to [n, 1, s, L] -> [n, H, s, D]."""
    n, n_heads, s, d = q.shape
    if s > 1:  # prefill: the fused kernel
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, enable_gqa=n_kv != n_heads)
    g = n_heads // n_kv
    q = q.view(n, n_kv, g, 1, d)
    if reduce_kernel:  # compiled: products and sums that inductor fuses into one loop, no [.., L, D] intermediate
        scores = (q * k[:, :, None]).sum(-1) * (d ** -0.5)  # [n, KV, g, L]
        scores = scores.masked_fill(~attn_mask.view(n, 1, 1, -1), float("-inf"))
        return (torch.softmax(scores, dim=-1)[..., None] * v[:, :, None]).sum(-2).view(n, n_heads, 1, d)
    # eager: grouped matmuls without expanding K/V (faster than SDPA's kernel for tiny shapes)
    scores = torch.matmul(q.squeeze(3), k.transpose(-1, -2)) * (d ** -0.5)
    scores = scores.masked_fill(~attn_mask.view(n, 1, 1, -1), float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v).view(n, n_heads, 1, d)


def _fused_forward(ids: torch.Tensor, rope_pos: torch.Tensor, slots: torch.Tensor, attn_mask: torch.Tensor,
                   weights: tuple, ks: list, vs: list, cos_tab: torch.Tensor, sin_tab: torch.Tensor,
                   dims: tuple[int, int, int], reduce_kernel: bool) -> torch.Tensor:
    """A Llama-family forward over new tokens: ids [n, s] at rotary positions rope_pos [n, s], their keys and values
    written to cache slots `slots` [s] of ks / vs (per layer [n, KV, L, D], updated in place); the queries attend
    to the first M slots, as attn_mask (bool, broadcastable to [n, 1, s, M]) allows. Returns the last position's
    logits [n, V]. The model's own weights (`_FusedDecoder.weights`) and math; q/k/v and gate/up are one matmul
    each."""
    embed, layers, (norm_w, norm_eps), head_w, head_b = weights
    n_heads, n_kv, d = dims
    n, s = ids.shape
    m = attn_mask.shape[-1]
    h = F.embedding(ids, embed)
    cos, sin = cos_tab[rope_pos][:, None], sin_tab[rope_pos][:, None]  # [n, 1, s, D]
    hq, hk = n_heads * d, n_kv * d
    for (ln1, eps1, qkv_w, qkv_b, o_w, o_b, ln2, eps2, gate_up_w, down_w), k_cache, v_cache in zip(layers, ks, vs):
        qkv = F.linear(_rms(h, ln1, eps1), qkv_w, qkv_b)
        q = qkv[..., :hq].view(n, s, n_heads, d).transpose(1, 2)
        k = qkv[..., hq:hq + hk].view(n, s, n_kv, d).transpose(1, 2)
        k_cache.index_copy_(2, slots, _rotate(k, cos, sin))
        v_cache.index_copy_(2, slots, qkv[..., hq + hk:].view(n, s, n_kv, d).transpose(1, 2))
        o = _attention(_rotate(q, cos, sin), k_cache[:, :, :m], v_cache[:, :, :m], attn_mask, n_kv, reduce_kernel)
        h = h + F.linear(o.transpose(1, 2).reshape(n, s, hq), o_w, o_b)
        gate, up = F.linear(_rms(h, ln2, eps2), gate_up_w).chunk(2, dim=-1)
        h = h + F.linear(F.silu(gate) * up, down_w)
    return F.linear(_rms(h[:, -1], norm_w, norm_eps), head_w, head_b)


# torch.compile'd twins of the decode step and the draw, made on first use. The row, cache-length and mask-length
# dimensions are marked dynamic (rows drop out as they finish, prompts differ in length, each step attends to one
# slot more), so one compilation serves a whole run; the weights are arguments, so training them in place needs
# none. Where compilation fails (no C compiler, an unsupported device) sampling falls back to the eager
# functions, once, with a warning.
_COMPILED: dict[str, Callable] = {}
_COMPILE_FAILED: list[str] = []


def _maybe_compiled(name: str, fn: Callable, compile: bool, dynamic_dims: Callable, what: str = "the sampler",
                    setting: str = "sampling.compile") -> Callable:
    """`fn`, or its compiled twin when `compile`; `dynamic_dims(*args)` yields (tensor, dim) pairs to mark dynamic.
    `what` and `setting` name the caller and its switch in the warning of a failed compilation."""
    if not compile or _COMPILE_FAILED:
        return fn
    if name not in _COMPILED:
        _COMPILED[name] = torch.compile(fn, dynamic=False)
    compiled = _COMPILED[name]

    def call(*args):
        if _COMPILE_FAILED:
            return fn(*args)
        for x, dim in dynamic_dims(*args):
            torch._dynamo.maybe_mark_dynamic(x, dim)
        try:
            return compiled(*args)
        except Exception as e:  # compilation failed: eager from now on (same math, same draws)
            import warnings

            _COMPILE_FAILED.append(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            warnings.warn(f"explorl: torch.compile of {what} failed ({_COMPILE_FAILED[0]}); running it eagerly "
                          f"({setting}: false skips the attempt)", RuntimeWarning, stacklevel=2)
            return fn(*args)
    return call


def _step_dynamic_dims(ids, rope_pos, slots, attn_mask, weights, ks, vs, cos_tab, sin_tab, *_):
    yield from ((ids, 0), (rope_pos, 0), (attn_mask, 0), (attn_mask, 3), (cos_tab, 0), (sin_tab, 0))
    for cache in (*ks, *vs):
        yield from ((cache, 0), (cache, 2))


def _draw_dynamic_dims(logits, temp, top_p, u):
    yield from ((logits, 0), (temp, 0), (u, 0))


class _FusedDecoder:
    """Llama-family decoding with a preallocated cache and fused projections (same weights, same math).

    Prompts are prefilled once each and their cache rows repeated for the n_i samples; rows that finished
    are dropped from the batch (`keep`), so the cost follows the live responses, not the longest one. With
    `compile`, each decode step is one torch.compile'd graph (`_fused_forward`): on the CPU a handful of fused C++
    loops and the matmuls per layer instead of some thirty small kernels, each paying Python's dispatch.
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

    def __init__(self, model, compile: bool = False):
        self.model = model
        inner = model.model
        self.inner = inner
        cfg = model.config
        n_heads = cfg.num_attention_heads
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or n_heads
        self.dims = (n_heads, self.n_kv, getattr(cfg, "head_dim", None) or cfg.hidden_size // n_heads)
        layers = []
        for layer in inner.layers:
            a, m = layer.self_attn, layer.mlp
            qkv_b = None
            if a.q_proj.bias is not None:
                qkv_b = torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias], dim=0).detach()
            layers.append((
                layer.input_layernorm.weight.detach(), layer.input_layernorm.variance_epsilon,
                torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight], dim=0).detach(), qkv_b,
                a.o_proj.weight.detach(), None if a.o_proj.bias is None else a.o_proj.bias.detach(),
                layer.post_attention_layernorm.weight.detach(), layer.post_attention_layernorm.variance_epsilon,
                torch.cat([m.gate_proj.weight, m.up_proj.weight], dim=0).detach(), m.down_proj.weight.detach()))
        head = model.lm_head
        self.weights = (inner.embed_tokens.weight.detach(), tuple(layers),
                        (inner.norm.weight.detach(), inner.norm.variance_epsilon), head.weight.detach(),
                        None if head.bias is None else head.bias.detach())
        self.compile = compile
        self._step = _maybe_compiled("decode", _fused_forward, compile, _step_dynamic_dims)

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor, total: int, repeats: torch.Tensor) -> torch.Tensor:
        """Prefill B distinct prompts [B, P]; cache rows are then repeated `repeats[b]` times."""
        b, p = ids.shape
        dtype = self.inner.embed_tokens.weight.dtype
        positions = torch.arange(total, device=ids.device)[None]
        cos, sin = self.inner.rotary_emb(self.inner.embed_tokens.weight[:1, None], positions)
        self.cos, self.sin = cos[0], sin[0]  # [total, D] tables, indexed by position
        shape = (b, self.n_kv, total, self.dims[2])
        self.k = [torch.zeros(shape, dtype=dtype, device=ids.device) for _ in self.weights[1]]
        self.v = [torch.zeros(shape, dtype=dtype, device=ids.device) for _ in self.weights[1]]
        causal = torch.ones((p, p), dtype=torch.bool, device=ids.device).tril()
        allowed = causal[None] & mask.bool()[:, None, :]
        allowed |= torch.eye(p, dtype=torch.bool, device=ids.device)[None]  # pad queries see themselves: no NaN rows
        logits = _fused_forward(ids, _positions(mask), torch.arange(p, device=ids.device), allowed[:, None],
                                self.weights, self.k, self.v, self.cos, self.sin, self.dims, False)
        self.k = [k.repeat_interleave(repeats, dim=0) for k in self.k]
        self.v = [v.repeat_interleave(repeats, dim=0) for v in self.v]
        mask = mask.repeat_interleave(repeats, dim=0)
        # the slots each row attends to: its prompt's, then each generated token's as it is written
        self.key_valid = torch.zeros((mask.shape[0], total), dtype=torch.bool, device=ids.device)
        self.key_valid[:, :p] = mask.bool()
        self.next_pos = mask.sum(-1, keepdim=True)
        self.p = p
        self.slots = torch.arange(p, total, device=ids.device)  # the cache slot of generated token t: slots[t]
        return logits.repeat_interleave(repeats, dim=0)

    def keep(self, rows: torch.Tensor) -> None:
        """Drop finished rows from the cache; `rows` indexes the current batch."""
        self.k = [k[rows] for k in self.k]
        self.v = [v[rows] for v in self.v]
        self.key_valid = self.key_valid[rows]
        self.next_pos = self.next_pos[rows]

    def step(self, tokens: torch.Tensor, t: int) -> torch.Tensor:
        slot = self.p + t
        self.key_valid[:, slot] = True
        # the slots written so far (the mask's length is a dynamic dimension of the compiled graph)
        compiled = self.compile and not _COMPILE_FAILED
        return self._step(tokens[:, None], self.next_pos + t, self.slots[t:t + 1],
                          self.key_valid[:, None, None, :slot + 1], self.weights, self.k, self.v, self.cos, self.sin,
                          self.dims, compiled)


@torch.no_grad()
def sample(model, prompts: Sequence[Sequence[int]], n: int | Sequence[int], *, eos_token_id: int | Sequence[int],
           pad_token_id: int, max_new_tokens: int, temperature: Temperature = 1.0, top_p: float = 1.0,
           generator: torch.Generator | None = None, fast_path: bool = True, compile: bool = False) -> Rollouts:
    """Sample `n_i` responses for each prompt.

    Args:
        prompts: B token-id lists (unpadded).
        n: samples per prompt, an int or a list of B ints (variable group sizes; 0 is allowed).
        temperature: a float; [B] per prompt or [N] per response (list or tensor); [N, >= max_new_tokens]
            per generated token; or a callable `t -> float | Tensor[N]` for generated-token index t (0-based).
        top_p: nucleus mass (1.0 = off).
        generator: a torch.Generator on the model's device, for reproducible draws.
        fast_path: use the fused Llama-family decoder when it applies.
        compile: with the fused decoder, run each decode step and draw as torch.compile'd graphs (`sampling.compile`;
            the first call of a process compiles, seconds to a minute; the draws are the same up to float rounding).
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
    fused = fast_path and _FusedDecoder.applies(model)
    decoder = _FusedDecoder(model, compile) if fused else _GenericDecoder(model)
    draw = _maybe_compiled("draw", _sample_step, compile and fused, _draw_dynamic_dims)
    tokens = torch.full((num, max_new_tokens), pad_token_id, dtype=torch.long, device=device)
    logps = torch.zeros((num, max_new_tokens), device=device)
    ents = torch.zeros((num, max_new_tokens), device=device)
    temps = torch.zeros((num, max_new_tokens), device=device)
    mask = torch.zeros((num, max_new_tokens), device=device)
    alive = torch.zeros(num, dtype=torch.bool, device=device)  # per original row: no EOS by the end
    rows = torch.arange(num, device=device)  # original row of each row of the decoder's (compacted) batch
    pad_rows = 0  # finished rows kept last in the batch so a compiled step never meets a batch of 1
    length = 0
    try:
        logits = decoder.prefill(uniq_ids, uniq_mask, ids.shape[1] + max_new_tokens, repeats)
        live = torch.ones(num, dtype=torch.bool, device=device)  # per row of the decoder's batch
        for t in range(max_new_tokens):
            temp = temp_at(t)[rows]
            u = _uniforms(len(rows) - pad_rows, device, generator)  # the eager path's stream, padding or not
            if pad_rows:
                u = torch.cat([u, u.new_ones((pad_rows, 1))])
            tok, lp, ent = draw(logits, temp, top_p, u)
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
            real = len(rows) - pad_rows
            if real - n_live >= max(1, real // 8):  # drop finished rows: later steps cost only live ones
                keep = live.nonzero().squeeze(-1)
                pad_rows = int(compile and fused and n_live == 1)  # a batch of 1: a compilation of its own
                if pad_rows:
                    keep = torch.cat([keep, (~live).nonzero()[:1, 0]])
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
