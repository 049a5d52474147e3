"""The aggregation of token values into one loss (docs/methods.md §1d): masked reductions, the `loss_agg` modes
(registered as kind `aggregation` with their papers, selected by `algo.loss_agg`; `LOSS_AGG_MODES` lists them and
the config is validated against it), E3's eq. 1 weights per question, and the micro-batch accounting of gradient
accumulation, and `Reduction`, what a policy loss does after its token formula. Pure tensor functions, torch only.

Per-token multipliers never change the normaliser: a token whose weight is 0 still counts in the `token-mean`
denominator (the number of valid tokens of `mask`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from explorl.algos.registry import Cite, entries, lookup, register

if TYPE_CHECKING:
    from explorl.algos.batch import RolloutBatch

__all__ = ["LOSS_AGG", "LOSS_AGG_MODES", "PER_QUESTION", "question_weights", "zero_padding", "masked_sum",
           "masked_mean", "aggregate", "aggregation_count", "micro_batch_share", "Reduction"]


PER_QUESTION = "seq-mean-token-mean-per-question"
"""E3 eq. 1 with a group size per question: the mean over questions of the mean over the question's responses
of each response's token mean. Aggregated as `seq-mean-token-mean` of token losses weighted per response by
`question_weights` (the step passes them as token weights), which is the same number (docs/methods.md §1d)."""


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


def _valid_tokens(mask: Tensor) -> float:
    return float(mask.sum())


def _nonempty_responses(mask: Tensor) -> float:
    return float((mask.sum(-1) > 0).sum())


def _responses(mask: Tensor) -> float:
    return float(mask.shape[0])


@register("aggregation", "token-mean", count=_valid_tokens,
          cites=(Cite("DAPO", "section 3.3", doc="5c"), Cite("ERPO", "eq. 5", doc="1d")))
def token_mean(token_values: Tensor, mask: Tensor, max_response_len: int | None = None) -> Tensor:
    """Sum over all valid tokens / their number: every token weighs the same, so long responses weigh more (DAPO,
    Yu et al. 2025, section 3.3 "Token-Level Policy Gradient Loss")."""
    return masked_mean(token_values, mask)


@register("aggregation", "seq-mean-token-mean", count=_nonempty_responses,
          cites=(Cite("GRPO", "section 4.1.2, eq. 3", doc="1"), Cite("E3", "eq. 1", doc="1d"),
                 Cite("CW-GRPO", "section 2.3", doc="1d")))
def seq_mean_token_mean(token_values: Tensor, mask: Tensor, max_response_len: int | None = None) -> Tensor:
    """Mean over responses of each response's token mean (the GRPO objective, Shao et al. 2024 eq. 3); E3 eq. 1
    when every question has the same number of responses. Responses without valid tokens are left out of the outer
    mean."""
    per_seq = masked_mean(token_values, mask, dim=-1)  # [N]; 0 for empty responses
    has_tokens = mask.bool().any(dim=-1)  # [N]
    return masked_mean(per_seq, has_tokens)


@register("aggregation", "seq-mean-token-sum-norm", count=_responses, cites=(Cite("Dr.GRPO", doc="1d"),))
def seq_mean_token_sum_norm(token_values: Tensor, mask: Tensor, max_response_len: int | None = None) -> Tensor:
    """Sum over all valid tokens / (N * max_response_len), a constant that does not depend on the lengths (Dr.GRPO,
    Liu et al. 2025); `max_response_len` is the configured length limit (e.g. `sampling.max_new_tokens`)."""
    if max_response_len is None or max_response_len < 1:
        raise ValueError(
            f"loss aggregation 'seq-mean-token-sum-norm' needs max_response_len >= 1 (the configured "
            f"length limit, e.g. sampling.max_new_tokens), got {max_response_len!r}"
        )
    n = token_values.shape[0]
    return masked_sum(token_values, mask) / float(max(n, 1) * max_response_len)


@register("aggregation", "seq-mean-token-mean-per-question", count=_nonempty_responses, per_question=True,
          formula=(question_weights, seq_mean_token_mean), cites=(Cite("E3", "eq. 1", doc="1d"),
                                                                  Cite("explorl", doc="1d")))
def seq_mean_token_mean_per_question(token_values: Tensor, mask: Tensor,
                                     max_response_len: int | None = None) -> Tensor:
    """E3 eq. 1 with a rollout count per question (E3's dynamic budgets): the mean over questions of the mean over
    each question's responses of their token means, so every question weighs the same. Reduced as
    `seq-mean-token-mean`: the step has weighted the token values per response by `question_weights` (the entry's
    `per_question`); the KL and entropy terms, unweighted, are then `seq-mean-token-mean`."""
    return seq_mean_token_mean(token_values, mask, max_response_len)


LOSS_AGG_MODES: tuple[str, ...] = tuple(entries("aggregation"))
"""Valid values of `agg` and of the config's `algo.loss_agg`: the registered aggregations (docs/methods.md §1d)."""

LOSS_AGG: dict[str, str] = {name: " ".join((e.fn.__doc__ or "").split()) for name, e in entries("aggregation").items()}
"""The `loss_agg` modes, each with what it computes (its function's docstring)."""


def aggregate(
    token_values: Tensor, mask: Tensor, agg: str = "token-mean", max_response_len: int | None = None
) -> Tensor:
    """Reduce per-token values `[N, T]` to a scalar, over the tokens where `mask != 0`, by the aggregation
    registered as `agg` (docs/methods.md §1d): `token-mean` (DAPO), `seq-mean-token-mean` (GRPO),
    `seq-mean-token-sum-norm` (Dr.GRPO, needs `max_response_len`), `seq-mean-token-mean-per-question` (E3 eq. 1:
    reduced as `seq-mean-token-mean`, the per-question weights come in the token values, `question_weights`).

    Args:
        token_values: `[N, T]` per-token values (differentiable).
        mask: `[N, T]` 1 on the tokens that count.
        agg: one of `LOSS_AGG_MODES`.
        max_response_len: the configured response length limit (`seq-mean-token-sum-norm` only).
    Returns:
        Scalar tensor; 0 (with a graph back to `token_values`) when no token is valid.
    """
    entry = _aggregation(agg)
    if token_values.dim() != 2 or mask.shape != token_values.shape:
        raise ValueError(
            f"aggregate: expected token_values and mask of the same shape [N, T]; "
            f"got {tuple(token_values.shape)} and {tuple(mask.shape)}"
        )
    return entry.fn(token_values, mask, max_response_len)


def _aggregation(agg: str):
    """The registry entry of aggregation `agg`; ValueError listing the valid ones."""
    try:
        return lookup("aggregation", agg)
    except KeyError:
        raise ValueError(f"unknown loss aggregation {agg!r}; valid: {', '.join(entries('aggregation'))}") from None


def aggregation_count(mask: Tensor, agg: str) -> float:
    """What aggregation `agg` divides a batch's summed loss by (its entry's `count`): its valid tokens
    (token-mean), non-empty responses (seq-mean-token-mean) or responses (seq-mean-token-sum-norm). `mask`: `[N, T]`
    the batch's loss mask."""
    return _aggregation(agg).count(mask)


def micro_batch_share(mask: Tensor, rows: Tensor, agg: str) -> float:
    """Share of micro-batch `rows` in the normaliser of its mini-batch under aggregation `agg`.

    Weighting each micro-batch's aggregated loss by this share and summing the gradients gives exactly the
    gradient of the whole mini-batch's loss (gradient accumulation): the micro-batch's `aggregation_count` over
    the mini-batch's.

    Args:
        mask: `[M, T]` the mini-batch's loss mask; rows: indices into its rows.
    """
    return aggregation_count(mask[rows], agg) / max(aggregation_count(mask, agg), 1.0)


@dataclass(frozen=True)
class Reduction:
    """How a policy loss turns its `[N, T]` token losses into one scalar (docs/methods.md §1d): the detached per-token
    multipliers `is_weights` and `token_weights` scale the token loss, then the aggregation `agg` reduces it over the
    valid tokens. The multipliers never change the normaliser: a token whose weight is 0 still counts in it."""

    agg: str = "token-mean"
    """The aggregation, one of `LOSS_AGG_MODES` (`aggregate`; the config's `algo.loss_agg`)."""
    max_response_len: int | None = None
    """The configured response length limit, the normaliser of `seq-mean-token-sum-norm` (required there only)."""
    is_weights: Tensor | None = None
    """`[N, T]` importance weights multiplying the token loss, detached (e.g. `tis_weights`); None: none."""
    token_weights: Tensor | None = None
    """`[N, T]` per-token multipliers of the token loss, detached (e.g. a 0/1 token selection, E3's per-question
    weights); None: none."""

    @classmethod
    def of(cls, batch: RolloutBatch, agg: str) -> Reduction:
        """The reduction of a micro-batch `batch` (its `max_response_len`, `is_weights`, `token_weights`) under the
        aggregation `agg` (the config's `algo.loss_agg`)."""
        return cls(agg, batch.max_response_len, batch.is_weights, batch.token_weights)

    def weighted(self, token_loss: Tensor, valid: Tensor) -> Tensor:
        """`[N, T]` the token loss times the weights (detached, in its dtype, 0 on padding); `valid` `[N, T]` bool."""
        for w in (self.is_weights, self.token_weights):
            if w is not None:
                token_loss = token_loss * zero_padding(w.detach().to(token_loss.dtype), valid)
        return token_loss

    def __call__(self, token_loss: Tensor, valid: Tensor) -> Tensor:
        """The scalar loss: `aggregate` of the weighted token loss `[N, T]` over `valid` `[N, T]`."""
        return aggregate(self.weighted(token_loss, valid), valid, self.agg, self.max_response_len)

    def record(self, stats: dict[str, float], valid: Tensor, n_valid: int, dtype: torch.dtype) -> dict[str, float]:
        """`stats` with the weights' statistics over the `n_valid` valid tokens: `loss/is_weight_mean` (the mean
        importance weight, in `dtype`) when there are `is_weights`, `loss/masked_frac` (the fraction whose token
        weight is 0) when there are `token_weights`."""
        if self.is_weights is not None:
            stats["loss/is_weight_mean"] = float(masked_mean(self.is_weights.detach().to(dtype), valid))
        if self.token_weights is not None:
            stats["loss/masked_frac"] = float(((self.token_weights.detach() == 0) & valid).sum()) / max(n_valid, 1)
        return stats
