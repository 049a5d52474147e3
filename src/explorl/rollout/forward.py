"""The fused forward of a Llama-family model (Qwen2, Llama, Mistral without sliding window; no LoRA wrapper): the
decoder layers written as one function of the model's own weights, shared by the sampler and the training forward.

- `forward_with_cache`: new tokens against a preallocated KV cache (the sampler's prefill and decode step,
  `rollout.engines.native`); q, k and v are one matmul per layer, as are gate and up;
- `fused_hidden`: whole packed sequences without a cache, differentiable in the parameters (the training forward,
  `rollout.logprobs.response_logprobs` with `model.compile`);
- `maybe_compiled`: either function (and the sampler's draw) as a torch.compile'd graph, with one eager fallback
  for the process when compilation fails.
Both reproduce the Hugging Face forward (RMSNorm in float32 scaled in the weight's dtype, rotary embeddings from the
model's own `rotary_emb`); the tests check them against it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

FUSED_MODEL_TYPES = ("qwen2", "llama", "mistral")
"""Model types whose decoder layers are exactly the fused math (given `supports_fused_forward`'s other checks)."""


def supports_fused_forward(model) -> bool:
    """Whether `model` is a Llama-family causal LM the fused forward reproduces exactly: a `FUSED_MODEL_TYPES` model
    without a PEFT wrapper, sliding window, MLP bias, non-SiLU activation or rotary scaling."""
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) not in FUSED_MODEL_TYPES or hasattr(model, "peft_config"):
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


def attention_dims(cfg) -> tuple[int, int, int]:
    """(query heads, key/value heads, head size) of a model config."""
    n_heads = cfg.num_attention_heads
    return (n_heads, getattr(cfg, "num_key_value_heads", None) or n_heads,
            getattr(cfg, "head_dim", None) or cfg.hidden_size // n_heads)


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding: 0 at each row's first real token. [N, L] -> [N, L] (int64)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp_(min=0)


def rotary_tables(decoder, length: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [1, length, D] of positions 0..length-1 from the decoder's own rotary embedding (in its dtype)."""
    positions = torch.arange(length, device=device)[None]
    return decoder.rotary_emb(decoder.embed_tokens.weight[:1, None], positions)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # as HF's Qwen2RMSNorm: normalise in float32, scale in the weight's dtype
    return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding of x [..., D] (HF's rotate_half convention)."""
    h = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., h:], x[..., :h]), dim=-1) * sin


# ---------------------------------------------------------------------------------------------------------------
# with a KV cache: the sampler's prefill and decode step


def cache_weights(model) -> tuple:
    """The model's weights as `forward_with_cache` takes them (`FusedCache.weights`), detached: (embedding, per
    layer (ln1, eps1, qkv_w, qkv_b, o_w, o_b, ln2, eps2, gate_up_w, down_w), (norm_w, norm_eps), head_w, head_b).
    The q/k/v and gate/up matrices are concatenated copies (one matmul each), so they hold the weights of the moment
    they were taken."""
    inner = model.model
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
    norm = (inner.norm.weight.detach(), inner.norm.variance_epsilon)
    return (inner.embed_tokens.weight.detach(), tuple(layers), norm, head.weight.detach(),
            None if head.bias is None else head.bias.detach())


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor, n_kv: int,
               reduce_kernel: bool) -> torch.Tensor:
    """q [n, H, s, D], k/v [n, KV, L, D], attn_mask bool broadcastable to [n, 1, s, L] -> [n, H, s, D]."""
    n, n_heads, s, d = q.shape
    g = n_heads // n_kv
    if s > 1:  # prefill: a fused kernel. CUDA's memory-efficient kernel takes a mask but not grouped K/V heads
        # (`enable_gqa` with a mask leaves only the math kernel, [n, H, s, L] in float32): repeat them to every head
        if g > 1:
            k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
    q = q.view(n, n_kv, g, 1, d)
    if reduce_kernel:  # compiled: products and sums that inductor fuses into one loop, no [.., L, D] intermediate
        scores = (q * k[:, :, None]).sum(-1) * (d ** -0.5)  # [n, KV, g, L]
        scores = scores.masked_fill(~attn_mask.view(n, 1, 1, -1), float("-inf"))
        return (torch.softmax(scores, dim=-1)[..., None] * v[:, :, None]).sum(-2).view(n, n_heads, 1, d)
    # eager: grouped matmuls without expanding K/V (faster than SDPA's kernel for tiny shapes)
    scores = torch.matmul(q.squeeze(3), k.transpose(-1, -2)) * (d ** -0.5)
    scores = scores.masked_fill(~attn_mask.view(n, 1, 1, -1), float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v).view(n, n_heads, 1, d)


@dataclass(frozen=True)
class FusedCache:
    """A Llama-family model's fused weights with its preallocated KV cache and rotary tables: what
    `forward_with_cache` reads besides the new tokens (the sampler's `_FusedDecoder` holds one from its prefill on).
    Frozen: a forward writes the caches' tensors in place; dropping rows makes a new one (`dataclasses.replace`)."""

    weights: tuple
    """`cache_weights(model)`: the model's weights, detached, q/k/v and gate/up concatenated."""
    k: list[torch.Tensor]
    """Per layer, the key cache [n, KV, L, D] (rotary applied), written in place."""
    v: list[torch.Tensor]
    """Per layer, the value cache [n, KV, L, D], written in place."""
    cos: torch.Tensor
    """The rotary cos table [L, D], indexed by position."""
    sin: torch.Tensor
    """The rotary sin table [L, D], indexed by position."""
    dims: tuple[int, int, int]
    """`attention_dims`: (query heads, key/value heads, head size)."""


def forward_with_cache(ids: torch.Tensor, rope_pos: torch.Tensor, slots: torch.Tensor, attn_mask: torch.Tensor,
                       cache: FusedCache, reduce_kernel: bool) -> torch.Tensor:
    """A Llama-family forward over new tokens: ids [n, s] at rotary positions rope_pos [n, s], their keys and values
    written to cache slots `slots` [s] of cache.k / cache.v (per layer [n, KV, L, D], updated in place); the queries
    attend to the first M slots, as attn_mask (bool, broadcastable to [n, 1, s, M]) allows. Returns the last
    position's logits [n, V]. The model's own weights (`cache.weights`, `cache_weights`) and math; q/k/v and gate/up
    are one matmul each."""
    embed, layers, (norm_w, norm_eps), head_w, head_b = cache.weights
    n_heads, n_kv, d = cache.dims
    n, s = ids.shape
    m = attn_mask.shape[-1]
    h = F.embedding(ids, embed)
    cos, sin = cache.cos[rope_pos][:, None], cache.sin[rope_pos][:, None]  # [n, 1, s, D]
    hq, hk = n_heads * d, n_kv * d
    layer_caches = zip(layers, cache.k, cache.v)
    for (ln1, eps1, qkv_w, qkv_b, o_w, o_b, ln2, eps2, gate_up_w, down_w), k_cache, v_cache in layer_caches:
        qkv = F.linear(rms_norm(h, ln1, eps1), qkv_w, qkv_b)
        q = qkv[..., :hq].view(n, s, n_heads, d).transpose(1, 2)
        k = qkv[..., hq:hq + hk].view(n, s, n_kv, d).transpose(1, 2)
        k_cache.index_copy_(2, slots, apply_rotary(k, cos, sin))
        v_cache.index_copy_(2, slots, qkv[..., hq + hk:].view(n, s, n_kv, d).transpose(1, 2))
        o = _attention(apply_rotary(q, cos, sin), k_cache[:, :, :m], v_cache[:, :, :m], attn_mask, n_kv,
                       reduce_kernel)
        h = h + F.linear(o.transpose(1, 2).reshape(n, s, hq), o_w, o_b)
        gate, up = F.linear(rms_norm(h, ln2, eps2), gate_up_w).chunk(2, dim=-1)
        h = h + F.linear(F.silu(gate) * up, down_w)
    # `.to`: a float32 head (model.lm_head_fp32) takes the final states in float32; a no-op otherwise
    return F.linear(rms_norm(h[:, -1], norm_w, norm_eps).to(head_w.dtype), head_w, head_b)


def cache_step_dynamic_dims(ids: torch.Tensor, rope_pos: torch.Tensor, slots: torch.Tensor, attn_mask: torch.Tensor,
                            cache: FusedCache, reduce_kernel: bool):
    """The dimensions of `forward_with_cache`'s arguments that vary within a run (rows, cache and mask lengths);
    `slots` and `reduce_kernel` have none."""
    yield from ((ids, 0), (rope_pos, 0), (attn_mask, 0), (attn_mask, 3), (cache.cos, 0), (cache.sin, 0))
    for layer_cache in (*cache.k, *cache.v):
        yield from ((layer_cache, 0), (layer_cache, 2))


# ---------------------------------------------------------------------------------------------------------------
# without a cache: the training forward


def fused_training_params(model) -> tuple | None:
    """(((embedding weight, padding_idx), layers, norm), dims) of a model the fused forward takes and that trains
    without dropout, where layers, norm and dims are `fused_hidden`'s arguments (the parameters themselves, not
    detached: gradients reach the model); None otherwise."""
    cfg = model.config
    if not supports_fused_forward(model) or getattr(cfg, "attention_dropout", 0.0):
        return None
    layers = []
    for layer in model.model.layers:
        a, m = layer.self_attn, layer.mlp
        layers.append((layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon, a.q_proj.weight,
                       a.k_proj.weight, a.v_proj.weight, a.q_proj.bias, a.k_proj.bias, a.v_proj.bias, a.o_proj.weight,
                       a.o_proj.bias, layer.post_attention_layernorm.weight,
                       layer.post_attention_layernorm.variance_epsilon, m.gate_proj.weight, m.up_proj.weight,
                       m.down_proj.weight))
    inner = model.model
    return ((inner.embed_tokens.weight, inner.embed_tokens.padding_idx), tuple(layers),
            (inner.norm.weight, inner.norm.variance_epsilon)), attention_dims(cfg)


def fused_hidden(h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layers: tuple, norm: tuple,
                 dims: tuple[int, int, int]) -> torch.Tensor:
    """The decoder layers of a Llama-family model as one function of their parameters (the sampler's fused math,
    without a cache) on `rollout.logprobs.packed_sequences` rows: the embedded tokens h [N, L, H], cos / sin
    [1, L, D] of positions 0..L-1 -> the final normalised hidden states [N, L, H]. Causal attention, no mask: each
    row's real tokens come first. Differentiable in `layers` and `norm` (the model's own parameters), so the training
    forward and backward compile to a few fused loops and the matmuls (`model.compile`). The embedding lookup stays
    outside: its backward is a scatter-add, which the compiler parallelises with atomic adds on the CPU, so the
    embedding's gradient would depend on thread timing (consecutive runs differed by ~1e-9); eager's is
    deterministic."""
    norm_w, norm_eps = norm
    n_heads, n_kv, d = dims
    n, length = h.shape[:2]
    cos, sin = cos[:, None], sin[:, None]  # [1, 1, L, D]
    for ln1, eps1, q_w, k_w, v_w, q_b, k_b, v_b, o_w, o_b, ln2, eps2, gate_w, up_w, down_w in layers:
        qkv_b = None if q_b is None else torch.cat([q_b, k_b, v_b])
        qkv = F.linear(rms_norm(h, ln1, eps1), torch.cat([q_w, k_w, v_w]), qkv_b)
        hq, hk = n_heads * d, n_kv * d
        q = qkv[..., :hq].view(n, length, n_heads, d).transpose(1, 2)
        k = qkv[..., hq:hq + hk].view(n, length, n_kv, d).transpose(1, 2)
        v = qkv[..., hq + hk:].view(n, length, n_kv, d).transpose(1, 2)
        o = F.scaled_dot_product_attention(apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v,
                                           is_causal=True, enable_gqa=n_kv != n_heads)
        h = h + F.linear(o.transpose(1, 2).reshape(n, length, hq), o_w, o_b)
        gate, up = F.linear(rms_norm(h, ln2, eps2), torch.cat([gate_w, up_w])).chunk(2, dim=-1)
        h = h + F.linear(F.silu(gate) * up, down_w)
    return rms_norm(h, norm_w, norm_eps)


def fused_hidden_dynamic_dims(h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layers: tuple, norm: tuple,
                              dims: tuple[int, int, int]):
    """The dimensions of `fused_hidden`'s arguments that vary between batches (rows, sequence length); the
    parameters have none."""
    yield from ((h, 0), (h, 1), (cos, 1), (sin, 1))


# ---------------------------------------------------------------------------------------------------------------
# torch.compile'd twins of the decode step, the draw and the training forward, made on first use. The row,
# cache-length and mask-length dimensions are marked dynamic (rows drop out as they finish, prompts differ in length,
# each step attends to one slot more), so one compilation serves a whole run; the weights are arguments, so training
# them in place needs none. Where compilation fails (no C compiler, an unsupported device) the callers fall back to
# the eager functions, once for the process, with a warning.
_COMPILED: dict[str, Callable] = {}
_COMPILE_FAILED: list[str] = []


def compile_failed() -> bool:
    """Whether a compilation failed in this process (every caller then runs eagerly)."""
    return bool(_COMPILE_FAILED)


def maybe_compiled(name: str, fn: Callable, compile: bool, dynamic_dims: Callable, what: str = "the sampler",
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
            if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                raise  # a CUDA graph capture's error, not the compiler's: the replayer decodes without the graph
            _COMPILE_FAILED.append(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            warnings.warn(f"explorl: torch.compile of {what} failed ({_COMPILE_FAILED[0]}); running it eagerly "
                          f"({setting}: false skips the attempt)", RuntimeWarning, stacklevel=2)
            return fn(*args)
    return call
