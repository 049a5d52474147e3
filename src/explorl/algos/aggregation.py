"""The aggregation of token values into one loss (docs/methods.md §1d): masked reductions, the `loss_agg` modes
(`LOSS_AGG_MODES`, the one list of them: the config's `algo.loss_agg` is validated against it), E3's eq. 1 weights
per question, and the micro-batch accounting of gradient accumulation. Pure tensor functions, torch only.

Per-token multipliers never change the normaliser: a token whose weight is 0 still counts in the `token-mean`
denominator (the number of valid tokens of `mask`).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["LOSS_AGG", "LOSS_AGG_MODES", "PER_QUESTION", "question_weights", "zero_padding", "masked_sum",
           "masked_mean", "aggregate", "aggregation_count", "micro_batch_share"]


PER_QUESTION = "seq-mean-token-mean-per-question"
"""E3 eq. 1 with a group size per question: the mean over questions of the mean over the question's responses
of each response's token mean. Aggregated as `seq-mean-token-mean` of token losses weighted per response by
`question_weights` (the step passes them as token weights), which is the same number (docs/methods.md §1d)."""

LOSS_AGG: dict[str, str] = {
    "token-mean": "sum over all valid tokens / their number: every token weighs the same, so long responses weigh "
                  "more (DAPO, Yu et al. 2025, section 3.3)",
    "seq-mean-token-mean": "mean over responses of each response's token mean (the GRPO objective, Shao et al. 2024 "
                           "eq. 3); E3 eq. 1 when every question has the same number of responses",
    "seq-mean-token-sum-norm": "sum over all valid tokens / (N * max_response_len), a constant that does not depend "
                               "on the lengths (Dr.GRPO, Liu et al. 2025)",
    PER_QUESTION: "E3 eq. 1 with a rollout count per question (E3's dynamic budgets): the mean over questions of "
                  "the mean over each question's responses of their token means, so every question weighs the same",
}
"""The `loss_agg` modes, each with what it computes (docs/methods.md §1d): the one source of the modes."""

LOSS_AGG_MODES: tuple[str, ...] = tuple(LOSS_AGG)
"""Valid values of `agg` and of the config's `algo.loss_agg` (docs/methods.md §1d)."""


def question_weights(group: Tensor, valid_rows: Tensor) -> Tensor:
    """Per-response weights `[N]` that turn `seq-mean-token-mean` into E3's eq. 1 with a group size per
    question: `w_i = n / (Q * G_q(i))`, n the responses with valid tokens, Q their questions, G_q the question's
    responses with valid tokens; so that (1/n) sum_i w_i m_i = (1/Q) sum_q (1/G_q) sum_{i in q} m_i for any response
    means m_i. Equal groups give every weight 1. Responses without valid tokens get 0.

    Args:
        group: `[N]` int64 question ids; valid_rows: `[N]` bool, responses with at least one valid token.
    """
    ids = torch.unique(group, return_inverse=True)[1]
    sizes = torch.zeros(int(ids.max()) + 1 if len(ids) else 0, dtype=torch.float64, device=group.device)
    sizes.index_add_(0, ids, valid_rows.to(torch.float64))
    n, q = float(valid_rows.sum()), float((sizes > 0).sum())
    w = n / (q * sizes[ids].clamp_min(1.0)) if q > 0 else torch.zeros(len(ids), dtype=torch.float64)
    return torch.where(valid_rows, w, torch.zeros((), dtype=torch.float64, device=group.device))


def zero_padding(x: Tensor, mask: Tensor) -> Tensor:
    """`x` with exactly 0 where `mask == 0` (a `where`, so nan/inf in the padding cannot leak, nor its gradient)."""
    return torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device))


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of `x` over the elements where `mask != 0` (all of them, or along `dim`). Shapes: x, mask `[...]`."""
    x = zero_padding(x, mask)
    return x.sum() if dim is None else x.sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of `x` over the elements where `mask != 0`; 0 (not nan) where there are none. Shapes: x, mask `[...]`."""
    count = mask.bool().sum() if dim is None else mask.bool().sum(dim)
    return masked_sum(x, mask, dim) / count.clamp_min(1).to(x.dtype)


def aggregate(
    token_values: Tensor, mask: Tensor, agg: str = "token-mean", max_response_len: int | None = None
) -> Tensor:
    """Reduce per-token values `[N, T]` to a scalar, over the tokens where `mask != 0` (docs/methods.md §1d).

    - `token-mean`: sum over all valid tokens / number of valid tokens. Every token weighs the same, so long
      responses weigh more (DAPO, Yu et al. 2025, section 3.3 "Token-Level Policy Gradient Loss").
    - `seq-mean-token-mean`: mean over responses of each response's mean over its tokens (the GRPO objective,
      Shao et al. 2024 eq. 3). Responses without valid tokens are left out of the outer mean.
    - `seq-mean-token-sum-norm`: sum over all valid tokens / (N * max_response_len), a constant that does not
      depend on the lengths (Dr.GRPO, Liu et al. 2025). `max_response_len` (the configured length limit) is
      required in this mode and ignored in the others.
    - `seq-mean-token-mean-per-question` (E3 eq. 1 with per-question group sizes): reduced here as
      `seq-mean-token-mean`; the per-question weights come in the token values (`question_weights`).

    Args:
        token_values: `[N, T]` per-token values (differentiable).
        mask: `[N, T]` 1 on the tokens that count.
        agg: one of `LOSS_AGG_MODES`.
        max_response_len: the configured response length limit (`seq-mean-token-sum-norm` only).
    Returns:
        Scalar tensor; 0 (with a graph back to `token_values`) when no token is valid.
    """
    if agg not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss aggregation {agg!r}; valid: {', '.join(LOSS_AGG_MODES)}")
    if token_values.dim() != 2 or mask.shape != token_values.shape:
        raise ValueError(
            f"aggregate: expected token_values and mask of the same shape [N, T]; "
            f"got {tuple(token_values.shape)} and {tuple(mask.shape)}"
        )
    if agg == "token-mean":
        return masked_mean(token_values, mask)
    if agg in ("seq-mean-token-mean", PER_QUESTION):
        per_seq = masked_mean(token_values, mask, dim=-1)  # [N]; 0 for empty responses
        has_tokens = mask.bool().any(dim=-1)  # [N]
        return masked_mean(per_seq, has_tokens)
    if max_response_len is None or max_response_len < 1:
        raise ValueError(
            f"loss aggregation 'seq-mean-token-sum-norm' needs max_response_len >= 1 (the configured "
            f"length limit, e.g. sampling.max_new_tokens), got {max_response_len!r}"
        )
    n = token_values.shape[0]
    return masked_sum(token_values, mask) / float(max(n, 1) * max_response_len)


def aggregation_count(mask: Tensor, agg: str) -> float:
    """What aggregation `agg` divides a batch's summed loss by: its valid tokens (token-mean), non-empty responses
    (seq-mean-token-mean) or responses (seq-mean-token-sum-norm). `mask`: `[N, T]` the batch's loss mask."""
    if agg == "token-mean":
        return float(mask.sum())
    if agg in ("seq-mean-token-mean", PER_QUESTION):
        return float((mask.sum(-1) > 0).sum())
    return float(mask.shape[0])


def micro_batch_share(mask: Tensor, rows: Tensor, agg: str) -> float:
    """Share of micro-batch `rows` in the normaliser of its mini-batch under aggregation `agg`.

    Weighting each micro-batch's aggregated loss by this share and summing the gradients gives exactly the
    gradient of the whole mini-batch's loss (gradient accumulation): the micro-batch's `aggregation_count` over
    the mini-batch's.

    Args:
        mask: `[M, T]` the mini-batch's loss mask; rows: indices into its rows.
    """
    return aggregation_count(mask[rows], agg) / max(aggregation_count(mask, agg), 1.0)


