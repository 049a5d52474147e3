"""The token covariance c of covariance weighting and its distribution (CW-GRPO, Figure 3 and Table 1; c is
`algos.advantages.token_covariance`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from explorl.algos.advantages import grpo, token_covariance
from explorl.rollout.logprobs import LogprobOptions, response_logprobs


@torch.no_grad()
def batch_covariance(model, ro, rewards: Sequence[float], *, temperature: float = 1.0,
                     per_group: bool = True) -> Tensor:
    """Token covariance c `[N, T]` of a sampled batch `ro` (`RolloutBatch`) under GRPO's advantages.

    The log-probs are the training forward's (`rollout.logprobs.response_logprobs` at `temperature`), the
    advantages `algos.advantages.grpo`, and c is `algos.advantages.token_covariance` with the means per prompt
    group (`per_group`, the paper's and `cw_group`'s) or over the batch (`cw`'s). float64, 0 on padding.
    """
    lp, _ = response_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.mask, temperature,
                              options=LogprobOptions(with_entropy=False))
    r = torch.as_tensor(list(rewards), dtype=torch.float32, device=ro.mask.device)
    adv = grpo(r, ro.group, ro.mask)
    return token_covariance(adv, lp, ro.mask, ro.group if per_group else None)


def _signed(c: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, int]:
    if c.shape != mask.shape:
        raise ValueError(f"covariance and mask must have one shape, got {tuple(c.shape)} and {tuple(mask.shape)}")
    vals = c.detach().cpu().double()[(mask > 0).cpu()]
    pos = torch.sort(vals[vals > 0], descending=True).values
    neg = torch.sort(vals[vals < 0]).values  # most negative first
    return pos, neg, int((vals == 0).sum())


def covariance_percentiles(c: Tensor, mask: Tensor,
                           percentiles: Sequence[float] = (0.01, 1.0, 20.0, 40.0, 100.0)) -> dict:
    """The covariance at percentile thresholds of its positive and of its negative values (CW-GRPO, Table 1).

    Reading of the table: at p%, the positive column is the smallest of the largest p% of the positive c (the
    `ceil(p / 100 * n_pos)`-th largest), the negative column the largest of the most negative p% of the negative
    c. So 0.01% lies near the extremes and 100% is the positive (negative) value closest to 0.

    Args:
        c: `[N, T]` token covariances (`batch_covariance`); mask: `[N, T]`.
        percentiles: in (0, 100].
    Returns:
        `{"percentiles": [...], "positive": [...], "negative": [...], "n_positive", "n_negative", "n_zero"}`,
        NaN where a sign has no token.
    """
    if any(not 0 < p <= 100 for p in percentiles):
        raise ValueError(f"percentiles must lie in (0, 100], got {list(percentiles)}")
    pos, neg, zero = _signed(c, mask)

    def at(sorted_vals: Tensor, p: float) -> float:
        n = sorted_vals.numel()
        if n == 0:
            return float("nan")
        return float(sorted_vals[min(n, max(1, math.ceil(p / 100 * n - 1e-9))) - 1])

    return {"percentiles": list(percentiles), "positive": [at(pos, p) for p in percentiles],
            "negative": [at(neg, p) for p in percentiles], "n_positive": pos.numel(), "n_negative": neg.numel(),
            "n_zero": zero}


def covariance_cumulative(c: Tensor, mask: Tensor, fractions: Sequence[float]) -> dict:
    """Cumulative contribution of the most extreme covariances (CW-GRPO, Figure 3): for each fraction f, the
    share of the total |c| of one sign carried by the `ceil(f * n)` tokens of that sign with the largest |c|.

    Returns `{"fractions": [...], "positive": [...], "negative": [...]}` (NaN where a sign has no token).
    """
    pos, neg, _ = _signed(c, mask)

    def curve(sorted_abs: Tensor) -> list[float]:
        n = sorted_abs.numel()
        if n == 0:
            return [float("nan")] * len(fractions)
        cum = sorted_abs.cumsum(0)
        return [float(cum[min(n, max(1, math.ceil(f * n - 1e-9))) - 1] / cum[-1]) for f in fractions]

    return {"fractions": list(fractions), "positive": curve(pos), "negative": curve(neg.abs())}
