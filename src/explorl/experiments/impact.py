"""Token impact by replacement (STILL, eq. 5 and 6; docs/methods.md §8b).

For a response o to prompt q and a position t, the alternative token is the most probable other token,

    o~_t = argmax_{v != o_t} pi(v | q, o_<t),

and k continuations are sampled from each of the prefixes (q, o_<t, o_t) and (q, o_<t, o~_t). Each completed
response is scored with the reward function, and

    I_t = mean_j Acc_j(q, o_<t, o_t) - mean_j Acc_j(q, o_<t, o~_t).

Readings chosen here:
- Acc is the reward value, float(reward_fn(response_text, answer)); with a 0/1 verifier this is the accuracy.
- The scored text is the whole response, decode(o_<t + token + continuation) without special tokens (the
  prompt is not part of it), the text a reward function sees during training.
- The argmax runs over the tokenizer's vocabulary (a model's logit rows beyond len(tokenizer) are unused
  padding) minus o_t, and minus the pad token when it differs from EOS: pad is layout filler, never a token
  of a response. The argmax does not depend on the sampling temperature.
- A prefix that ends with EOS is already a complete response: it is scored once (no continuation exists,
  so all k "continuations" are that same text) and the sampler is not run for it.
- All prefixes go to the sampler together (n = k each), in as few calls as `ImpactSampling.max_rows` allows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from explorl.rollout.engines.native import sample
from explorl.rollout.sampler import Sampler


def _eos_ids(tokenizer, eos_token_id) -> list[int]:
    eos = tokenizer.eos_token_id if eos_token_id is None else eos_token_id
    if eos is None:
        raise ValueError("no EOS token: pass eos_token_id or use a tokenizer that defines one")
    return [int(eos)] if isinstance(eos, int) else [int(e) for e in eos]


@torch.no_grad()
def alternative_tokens(model, prompt_ids: Sequence[int], response_ids: Sequence[int], positions: Sequence[int], *,
                       vocab_size: int | None = None, exclude: Sequence[int] = ()) -> list[int]:
    """The most probable token other than o_t at each position t (eq. 5), from one forward pass.

    `vocab_size` limits the candidates to ids below it; ids in `exclude` are never chosen either.
    """
    if len(prompt_ids) == 0:
        raise ValueError("the prompt is empty: there is no distribution for the first response token")
    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt_ids) + list(response_ids)], dtype=torch.long, device=device)
    was_training = model.training
    model.eval()
    try:
        logits = model(input_ids=ids, use_cache=False).logits[0].float()
    finally:
        model.train(was_training)
    if vocab_size is not None:
        logits = logits[:, :vocab_size]
    rows = torch.tensor([len(prompt_ids) - 1 + t for t in positions], dtype=torch.long, device=device)
    picked = logits[rows].clone()  # [len(positions), V]: the distribution each o_t was drawn from
    for tok in exclude:
        if 0 <= tok < picked.shape[-1]:
            picked[:, tok] = float("-inf")
    own = torch.tensor([response_ids[t] for t in positions], dtype=torch.long, device=device)
    picked.scatter_(-1, own[:, None].clamp(max=picked.shape[-1] - 1), float("-inf"))
    return picked.argmax(-1).tolist()


@dataclass
class ImpactSampling:
    """How `token_impact` samples the continuations of each prefix (`rollout.engines.native.sample`)."""

    k: int
    """Continuations sampled from each of the two prefixes of a position."""
    max_new_tokens: int
    """The length limit of each continuation."""
    temperature: float = 1.0
    """The sampling temperature of the continuations."""
    top_p: float = 1.0
    """The nucleus mass of the continuations (1: off)."""
    generator: torch.Generator | None = None
    """The generator the continuations are drawn with."""
    eos_token_id: int | Sequence[int] | None = None
    """The ids that end a response (None: the tokenizer's)."""
    max_rows: int | None = None
    """At most this many sampled rows per `sample` call (None: one call for all positions)."""


def token_impact(model, tokenizer, prompt: str, response_ids: list[int], positions: list[int], *,
                 reward_fn: Callable[[str, str], float], answer: str, sampling: ImpactSampling) -> list[dict]:
    """Token impact I_t (eq. 6) at each of `positions` of a response.

    Args:
        prompt: the prompt text (encoded without special tokens, as the trainer does).
        response_ids: the response's token ids, unpadded (a final EOS may be included).
        positions: 0-based indices into response_ids.
        reward_fn: fn(response_text, answer) -> score (1.0 correct, 0.0 not).
        sampling: k continuations of each prefix, their length limit, temperature, top-p, generator, EOS ids and
            rows per call (`ImpactSampling`).
    Returns:
        One dict per position, in order: position, token (o_t), alternative (o~_t), acc_original,
        acc_replaced, impact = acc_original - acc_replaced.
    """
    k, max_rows = sampling.k, sampling.max_rows
    if k < 1:
        raise ValueError("k must be >= 1")
    response_ids = [int(x) for x in response_ids]
    positions = [int(t) for t in positions]
    bad = [t for t in positions if not 0 <= t < len(response_ids)]
    if bad:
        raise ValueError(f"positions {bad} outside the response (length {len(response_ids)})")
    if not positions:
        return []
    eos = _eos_ids(tokenizer, sampling.eos_token_id)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    alts = alternative_tokens(model, prompt_ids, response_ids, positions, vocab_size=len(tokenizer),
                              exclude=[] if pad in eos else [pad])

    # prefixes 2i (original) and 2i + 1 (replaced): the response part, and the full prompt for the sampler
    heads = []
    for t, alt in zip(positions, alts):
        heads.append(response_ids[:t] + [response_ids[t]])
        heads.append(response_ids[:t] + [alt])
    scores: list[list[float]] = [[] for _ in heads]

    def score(head: list[int], continuation: list[int]) -> float:
        text = tokenizer.decode(head + continuation, skip_special_tokens=True)
        return float(reward_fn(text, answer))

    open_heads = []
    for i, head in enumerate(heads):
        if head[-1] in eos:  # already complete: nothing to continue
            scores[i].append(score(head, []))
        else:
            open_heads.append(i)
    per_call = len(open_heads) if max_rows is None else max(1, max_rows // k)
    for s in range(0, len(open_heads), per_call):
        chunk = open_heads[s:s + per_call]
        ro = sample(Sampler(model, eos_token_id=eos, pad_token_id=pad, max_new_tokens=sampling.max_new_tokens,
                            top_p=sampling.top_p),
                    [prompt_ids + heads[i] for i in chunk], k, temperature=sampling.temperature,
                    generator=sampling.generator)
        for row, (g, length) in enumerate(zip(ro.group.tolist(), ro.lengths.tolist())):
            i = chunk[g]
            scores[i].append(score(heads[i], ro.response_ids[row, :length].tolist()))

    out = []
    for j, (t, alt) in enumerate(zip(positions, alts)):
        acc_o = sum(scores[2 * j]) / len(scores[2 * j])
        acc_r = sum(scores[2 * j + 1]) / len(scores[2 * j + 1])
        out.append(dict(position=t, token=response_ids[t], alternative=alt, acc_original=acc_o,
                        acc_replaced=acc_r, impact=acc_o - acc_r))
    return out
