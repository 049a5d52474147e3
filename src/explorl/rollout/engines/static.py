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

import torch

from explorl.rollout.draw import draw_tokens, uniforms
from explorl.rollout.forward import compile_failed, forward_with_cache, maybe_compiled

WARMUP_STEPS = 2
"""Steps run eagerly on a side stream before capture (CUDA's allocator and any compilation settle there)."""
CHECK_EVERY = 16
"""Steps between host checks of whether any row is still live (each check waits for the GPU)."""


def static_step(t: torch.Tensor, logits: torch.Tensor, live: torch.Tensor, written: tuple, temp_table: torch.Tensor,
                u_table: torch.Tensor, eos: torch.Tensor, next_pos: torch.Tensor, slots: torch.Tensor,
                key_valid: torch.Tensor, weights: tuple, ks: list, vs: list, cos_tab: torch.Tensor,
                sin_tab: torch.Tensor, dims: tuple[int, int, int], top_p: float, pad_token_id: int,
                reduce_kernel: bool) -> None:
    """One static decode step, every tensor updated in place: draw token t of every row from `logits` [N, V] at
    temperature temp_table[t] [N] with uniforms u_table[t] [N, 1], write it to `written` = (tokens, log-probs,
    entropy, temperatures, mask), each [N, T] (zeros and padding on rows no longer `live` [N] bool), end the rows
    that drew an EOS (`eos` [E]), then run the forward of the drawn tokens at cache slot slots[t] and rotary
    position next_pos + t (next_pos [N, 1]) over the whole cache (`key_valid` [N, L] bool marks written slots),
    leaving the next logits in `logits`, and advance t ([1] int64)."""
    tokens, logps, entropy, temps, mask = written
    temp = temp_table.index_select(0, t).squeeze(0)  # [N]
    tok, lp, ent = draw_tokens(logits, temp, top_p, u_table.index_select(0, t).squeeze(0))
    tok = torch.where(live, tok, pad_token_id)
    zero = torch.zeros_like(lp)
    for buffer, value in ((tokens, tok), (logps, torch.where(live, lp, zero)), (entropy, torch.where(live, ent, zero)),
                          (temps, torch.where(live, temp, zero)), (mask, live.to(mask.dtype))):
        buffer.index_copy_(1, t, value[:, None].to(buffer.dtype))
    live &= ~(tok[:, None] == eos[None]).any(-1)  # no `isin`: its CUDA kernel may sync with the host
    slot = slots.index_select(0, t)
    key_valid.index_fill_(1, slot, True)
    logits.copy_(forward_with_cache(tok[:, None], next_pos + t, slot, key_valid[:, None, None, :], weights, ks, vs,
                                    cos_tab, sin_tab, dims, reduce_kernel))
    t += 1


def static_step_dynamic_dims(t, logits, live, written, temp_table, u_table, eos, next_pos, slots, key_valid, weights,
                             ks, vs, cos_tab, sin_tab, *_):
    """The dimensions of `static_step`'s arguments that vary between sampling calls (rows, lengths)."""
    yield from ((logits, 0), (live, 0), (temp_table, 0), (temp_table, 1), (u_table, 0), (u_table, 1), (next_pos, 0),
                (slots, 0), (key_valid, 0), (key_valid, 1), (cos_tab, 0), (sin_tab, 0))
    for buffer in written:
        yield from ((buffer, 0), (buffer, 1))
    for cache in (*ks, *vs):
        yield from ((cache, 0), (cache, 2))


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


def replayer(step: Callable[[], None], device: torch.device, steps: int) -> tuple[Callable[[], None], int]:
    """(a function that runs one more step, the steps already run). On CUDA: `WARMUP_STEPS` steps run on a side
    stream, then one step is captured as a CUDA graph (capture records, it does not run) and replayed; elsewhere, or
    when capture fails (with a warning), `step` itself."""
    if device.type != "cuda" or steps <= WARMUP_STEPS:
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
        capture_failed_warning(e)
        return step, WARMUP_STEPS
    return graph.replay, WARMUP_STEPS


def decode_static(decoder, logits: torch.Tensor, temp_at: Callable[[int], torch.Tensor], top_p: float,
                  eos: torch.Tensor, generator, out, pad_token_id: int, *, compile: bool,
                  graph: bool) -> torch.Tensor:
    """Decode from the prefill's `logits` [N, V] with the static step until every row ended or the length limit,
    into `out` (the native sampler's [N, T] response buffers); `decoder` is a prefilled `_FusedDecoder` whose cache
    holds every row. With `graph`, on CUDA the step is replayed as a CUDA graph; with `compile`, it is one
    torch.compile'd graph. Returns truncated [N] bool: the rows with no EOS by the limit."""
    num, max_new_tokens = out.tokens.shape
    device = out.tokens.device
    temp_table, u_table = tables(temp_at, num, max_new_tokens, device, generator)
    live = torch.ones(num, dtype=torch.bool, device=device)
    t = torch.zeros(1, dtype=torch.long, device=device)
    written = (out.tokens, out.logps, out.entropy, out.temperatures, out.mask)
    logits = logits.contiguous()
    fn = maybe_compiled("static decode", static_step, compile, static_step_dynamic_dims)
    args = (t, logits, live, written, temp_table, u_table, eos, decoder.next_pos, decoder.slots, decoder.key_valid,
            decoder.weights, decoder.k, decoder.v, decoder.cos, decoder.sin, decoder.dims, top_p, pad_token_id,
            compile and not compile_failed())

    def step() -> None:
        fn(*args)

    run, done = replayer(step, device, max_new_tokens) if graph else (step, 0)
    while done < max_new_tokens:
        if done % CHECK_EVERY == 0 and done and not bool(live.any()):
            break
        run()
        done += 1
    written_any = out.mask.any(0).nonzero()
    out.length = int(written_any[-1]) + 1 if len(written_any) else 0
    return live.clone()
