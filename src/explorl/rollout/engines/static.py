"""Static-batch decoding for CUDA graphs (`sampling.cuda_graph`): every decode step has the same shapes, so the
whole step (draw, bookkeeping and the fused forward) is captured once per sampling call as a CUDA graph and then
replayed once per token, without Python or kernel-launch overhead.

What makes the step static, against the native sampler's dynamic decode (`rollout.engines.native._decode`):
- finished rows are masked, not removed: they keep decoding padding, and what they write is zeroed;
- every step attends over the whole preallocated cache (`key_valid` masks the slots not written yet);
- the step index `t` is a device tensor the step advances itself;
- the temperatures ([T, N], from the same schedule) and the uniforms of the draw ([T, N, 1]) are tables made before
  the first token, so nothing inside the step depends on the host. The uniforms are drawn step by step exactly as
  the dynamic decode draws them while no row has finished (`uniforms(N)` per step), so the two decoders draw the
  same tokens when no row ends early; after a row ends the streams part, with the same distribution.
Without CUDA (or when capture fails, with a warning) the same step runs as an ordinary function, which the tests
check on the CPU against the dynamic decoder and a full forward.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from explorl.rollout.draw import draw_tokens, uniforms
from explorl.rollout.forward import FusedCache, compile_failed, forward_with_cache, maybe_compiled

WARMUP_STEPS = 2
"""Steps run eagerly on a side stream before capture (CUDA's allocator and any compilation settle there)."""
CHECK_EVERY = 16
"""Steps between host checks of whether any row is still live (each check waits for the GPU)."""


@dataclass(frozen=True)
class DrawSettings:
    """How a sampling call draws each token and ends a response, the same for both decoders (the native sampler's
    dynamic `_decode` and `decode_static`)."""

    temp_at: Callable[[int], torch.Tensor]
    """Each response's temperature [N] for generated token t (the sampler's temperature source)."""
    top_p: float
    """Nucleus mass (1.0 = off)."""
    eos: torch.Tensor
    """[E] the token ids that end a response."""
    pad_token_id: int
    """What a row writes after it ended."""
    generator: torch.Generator | None
    """The random stream of the draws' uniforms."""


@dataclass(frozen=True)
class StaticBatch:
    """Every tensor the static step reads or updates in place besides the model and its cache (`FusedCache`), made
    once per sampling call: each step (and a captured CUDA graph's every replay) works on these same tensors."""

    t: torch.Tensor
    """[1] int64: the index of the token the next step draws, advanced by the step."""
    logits: torch.Tensor
    """[N, V]: the logits the next token is drawn from, overwritten by the step's forward."""
    live: torch.Tensor
    """[N] bool: the rows that have not drawn an EOS."""
    written: tuple[torch.Tensor, ...]
    """(tokens, log-probs, entropy, temperatures, mask), each [N, T]: the native sampler's response buffers."""
    temp_table: torch.Tensor
    """[T, N] float32: each step's temperatures (`tables`)."""
    u_table: torch.Tensor
    """[T, N, 1]: the uniforms of each step's draw (`tables`)."""
    eos: torch.Tensor
    """[E] the token ids that end a response."""
    next_pos: torch.Tensor
    """[N, 1]: each row's rotary position of generated token 0 (its prompt length), from the prefill."""
    slots: torch.Tensor
    """[T]: the cache slot of generated token t, slots[t]."""
    key_valid: torch.Tensor
    """[N, L] bool: the cache slots written so far (the prompt's real tokens, then each drawn token's)."""


def static_step(batch: StaticBatch, cache: FusedCache, top_p: float, pad_token_id: int, reduce_kernel: bool) -> None:
    """One static decode step, every tensor of `batch` and `cache` updated in place: draw token t of every row from
    `logits` [N, V] at temperature temp_table[t] [N] with uniforms u_table[t] [N, 1], write it to `written` =
    (tokens, log-probs, entropy, temperatures, mask), each [N, T] (zeros and padding on rows no longer `live` [N]
    bool), end the rows that drew an EOS (`eos` [E]), then run the forward of the drawn tokens at cache slot slots[t]
    and rotary position next_pos + t (next_pos [N, 1]) over the whole cache (`key_valid` [N, L] bool marks written
    slots), leaving the next logits in `logits`, and advance t ([1] int64)."""
    # locals, so that `live &=` and `t +=` update the tensors in place without rebinding the frozen batch's fields
    t, logits, live, temp_table, u_table = batch.t, batch.logits, batch.live, batch.temp_table, batch.u_table
    tokens, logps, entropy, temps, mask = batch.written
    temp = temp_table.index_select(0, t).squeeze(0)  # [N]
    tok, lp, ent = draw_tokens(logits, temp, top_p, u_table.index_select(0, t).squeeze(0))
    tok = torch.where(live, tok, pad_token_id)
    zero = torch.zeros_like(lp)
    for buffer, value in ((tokens, tok), (logps, torch.where(live, lp, zero)), (entropy, torch.where(live, ent, zero)),
                          (temps, torch.where(live, temp, zero)), (mask, live.to(mask.dtype))):
        buffer.index_copy_(1, t, value[:, None].to(buffer.dtype))
    live &= ~(tok[:, None] == batch.eos[None]).any(-1)  # no `isin`: its CUDA kernel may sync with the host
    slot = batch.slots.index_select(0, t)
    batch.key_valid.index_fill_(1, slot, True)
    logits.copy_(forward_with_cache(tok[:, None], batch.next_pos + t, slot, batch.key_valid[:, None, None, :], cache,
                                    reduce_kernel))
    t += 1


def static_step_dynamic_dims(batch: StaticBatch, cache: FusedCache, top_p: float, pad_token_id: int,
                             reduce_kernel: bool):
    """The dimensions of `static_step`'s arguments that vary between sampling calls (rows, lengths); the scalars
    have none."""
    yield from ((batch.logits, 0), (batch.live, 0), (batch.temp_table, 0), (batch.temp_table, 1), (batch.u_table, 0),
                (batch.u_table, 1), (batch.next_pos, 0), (batch.slots, 0), (batch.key_valid, 0),
                (batch.key_valid, 1), (cache.cos, 0), (cache.sin, 0))
    for buffer in batch.written:
        yield from ((buffer, 0), (buffer, 1))
    for layer_cache in (*cache.k, *cache.v):
        yield from ((layer_cache, 0), (layer_cache, 2))


def tables(temp_at: Callable[[int], torch.Tensor], num: int, max_new_tokens: int, device,
           generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(temperatures [T, N] float32, uniforms [T, N, 1]) of every step, made before the first: the schedule's
    `temp_at(t)` and the dynamic decoder's uniform stream while all N rows are live."""
    temps = torch.stack([temp_at(t).to(device=device, dtype=torch.float32).expand(num) for t in range(max_new_tokens)])
    u = torch.stack([uniforms(num, device, generator) for _ in range(max_new_tokens)])
    return temps, u


def capture_failed_warning(error: BaseException) -> None:
    warnings.warn(f"explorl: capturing the decode step as a CUDA graph failed ({type(error).__name__}: "
                  f"{str(error).splitlines()[0] if str(error) else ''}); decoding without the graph "
                  "(sampling.cuda_graph: false skips the attempt)", RuntimeWarning, stacklevel=3)


GRAPHS = {"captured": 0, "failed": 0}
"""CUDA-graph captures of the decode step in this process, made and failed (bench/gpu.py prints them per method)."""


def replayer(step: Callable[[], None], device: torch.device, steps: int) -> tuple[Callable[[], None], int]:
    """(a function that runs one more step, the steps already run). On CUDA: `WARMUP_STEPS` steps run on a side
    stream, then one step is captured as a CUDA graph (capture records, it does not run) and replayed; elsewhere, or
    when capture fails (with a warning; once a capture failed in this process none is tried again: PyTorch leaves
    the allocator in an undefined state after one), `step` itself."""
    if device.type != "cuda" or steps <= WARMUP_STEPS or GRAPHS["failed"]:
        return step, 0
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(WARMUP_STEPS):
            step()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            step()
    except Exception as e:  # the state is as the warm-up left it: capture ran nothing
        GRAPHS["failed"] += 1
        torch.cuda.synchronize(device)
        capture_failed_warning(e)
        return step, WARMUP_STEPS
    GRAPHS["captured"] += 1
    return graph.replay, WARMUP_STEPS


def decode_static(decoder, logits: torch.Tensor, settings: DrawSettings, out, *, compile: bool,
                  graph: bool) -> torch.Tensor:
    """Decode from the prefill's `logits` [N, V] with the static step until every row ended or the length limit,
    drawing as `settings` say, into `out` (the native sampler's [N, T] response buffers); `decoder` is a prefilled
    `_FusedDecoder` whose cache holds every row. With `graph`, on CUDA the step is replayed as a CUDA graph; with
    `compile`, it is one torch.compile'd graph. Returns truncated [N] bool: the rows with no EOS by the limit."""
    num, max_new_tokens = out.tokens.shape
    device = out.tokens.device
    temp_table, u_table = tables(settings.temp_at, num, max_new_tokens, device, settings.generator)
    live = torch.ones(num, dtype=torch.bool, device=device)
    t = torch.zeros(1, dtype=torch.long, device=device)
    written = (out.tokens, out.logps, out.entropy, out.temperatures, out.mask)
    logits = logits.contiguous()
    fn = maybe_compiled("static decode", static_step, compile, static_step_dynamic_dims)
    batch = StaticBatch(t, logits, live, written, temp_table, u_table, settings.eos, decoder.next_pos, decoder.slots,
                        decoder.key_valid)

    def step() -> None:  # the attention's compiled form only while compiling works (decided at each call)
        fn(batch, decoder.cache, settings.top_p, settings.pad_token_id, compile and not compile_failed())

    run, done = replayer(step, device, max_new_tokens) if graph else (step, 0)
    while done < max_new_tokens:
        if done % CHECK_EVERY == 0 and done and not bool(live.any()):
            break
        run()
        done += 1
    written_any = out.mask.any(0).nonzero()
    out.length = int(written_any[-1]) + 1 if len(written_any) else 0
    return live.clone()
