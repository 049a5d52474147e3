"""The sampler's draw: one token per row from its logits at a temperature, with optional top-p, by inverse CDF.

For each token it gives the behaviour log-prob under the distribution actually sampled from (temperature, then
top-p renormalisation) and the entropy of the temperature-scaled distribution (before top-p truncation).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from explorl.metrics import token_entropy


def uniforms(n: int, device, generator) -> torch.Tensor:
    """One uniform per row in (0, 1]: a draw of exactly 0 would otherwise pick token 0 where its probability is 0."""
    return 1.0 - torch.rand((n, 1), device=device, generator=generator)


def draw_tokens(logits: torch.Tensor, temp: torch.Tensor, top_p: float, u: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """One draw per row. logits [N, V], temp [N], u [N, 1] uniforms in (0, 1]
    -> (tokens [N], behaviour log-probs [N], entropy [N])."""
    scaled = logits.float() / temp.clamp_min(1e-6)[:, None]
    if top_p >= 1.0:  # one exp over the vocabulary serves the entropy, the normaliser and the draw
        shifted = scaled - scaled.amax(-1, keepdim=True)
        weights = shifted.exp()
        z = weights.sum(-1, keepdim=True)
        logp_shifted = shifted - z.log()  # log p; tokens of p = 0 (logits of -inf) add 0 to the entropy
        entropy = -torch.where(weights > 0, weights * logp_shifted, 0.0).sum(-1) / z.squeeze(-1)
        token = inverse_cdf(weights, u)
        return token, logp_shifted.gather(-1, token[:, None]).squeeze(-1), entropy
    entropy = token_entropy(scaled)  # of the temperature-scaled distribution, before the nucleus
    sorted_logp, order = torch.sort(torch.log_softmax(scaled, dim=-1), dim=-1, descending=True)
    cum = sorted_logp.exp().cumsum(-1)
    drop = (cum - sorted_logp.exp()) >= top_p  # keep the smallest prefix whose mass reaches top_p
    sorted_logp = sorted_logp.masked_fill(drop, float("-inf"))
    logp = torch.full_like(scaled, float("-inf")).scatter(-1, order, sorted_logp)
    logp = torch.log_softmax(logp, dim=-1)  # renormalise over the nucleus
    token = inverse_cdf(logp.exp(), u)
    return token, logp.gather(-1, token[:, None]).squeeze(-1), entropy


CDF_BLOCK = 256
"""Vocabularies above 4 blocks are drawn by blocks of this many tokens (`inverse_cdf`)."""


def inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
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


def draw_dynamic_dims(logits, temp, top_p, u):
    """The dimension of `draw_tokens`' arguments that varies within a run when compiled: the rows."""
    yield from ((logits, 0), (temp, 0), (u, 0))
