"""The probability shift of each token after one policy update, by outcome, entropy, token category and response
PPL (STILL, section 3.2.2, Figures 3(b), 4 and 5(a)). `one_update_effects` runs the training loop's own update."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from explorl.algos.step import compute_advantages
from explorl.analysis.text import CATEGORIES, token_category
from explorl.rollout.logprobs import LogprobOptions, response_logprobs
from explorl.train.loop import fill_logprobs, make_optimizer, update_policy
from explorl.train.update import fused_compile


def one_update_effects(model, ro, rewards: Sequence[float], cfg, *, temperature: float = 1.0, ref=None,
                       seed: int = 0) -> dict:
    """Take exactly one policy update on a sampled batch, as `explorl train` takes it, and measure every token
    before and after (STILL, section 3.2.2, Figures 4 and 5(a)).

    The trainer's own pieces: `train.loop.fill_logprobs` (pi_old's log-probs and entropies by the training forward),
    `algos.step.compute_advantages` (the configured estimator and shapers, step 1), `train.loop.make_optimizer` and
    `train.loop.update_policy` (`cfg.algo.epochs` x `cfg.algo.mini_batches` optimizer steps on the batch, one with
    the defaults; the first step's lr multiplier is 1 when `cfg.optim.warmup_steps` is 0). The model is updated in
    place. `ref`: the frozen reference when the method needs one (`algos.step.requirements(cfg.algo).ref`).

    Args:
        ro: the sampled `RolloutBatch`; rewards: `[N]`, its scores; cfg: a `Config`; temperature: the training
            temperature.
    Returns:
        `{"logprobs_before", "logprobs_after", "entropy_before", "entropy_after", "advantages"}` `[N, T]` float32
        (0 on padding, training temperature) and `"stats"` (the update's metrics).
    """
    device = ro.mask.device
    scored = ro.replace(rewards=torch.tensor(list(rewards), dtype=torch.float32, device=device))
    batch = fill_logprobs(model, ref, scored, temperature, cfg, pi_old_from_update=False)
    batch = compute_advantages(batch, cfg.algo, 1)
    optimizer, scheduler = make_optimizer(model, cfg, device)
    was_training = model.training
    model.train()
    try:
        shuffle = torch.Generator().manual_seed(seed)
        stats = update_policy(model, optimizer, scheduler, batch, cfg, shuffle, temperature=temperature)
    finally:
        model.train(was_training)
    optimizer.zero_grad(set_to_none=True)
    with torch.no_grad():
        # the forward of pi_old
        lp_after, ent_after = response_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.mask,
                                                temperature, LogprobOptions(compile=fused_compile(cfg)))
    return {"logprobs_before": batch.logprobs, "logprobs_after": lp_after, "entropy_before": batch.entropy,
            "entropy_after": ent_after, "advantages": batch.advantages, "stats": stats}


def _rank_bins(values: Tensor, bins: int) -> Tensor:
    """Equal-count bins by rank (stable; ties by index): element of rank r of n goes to bin `r * bins // n`."""
    order = torch.sort(values, stable=True).indices
    rank = torch.empty_like(order)
    rank[order] = torch.arange(values.numel())
    return rank * bins // max(values.numel(), 1)


@dataclass(frozen=True)
class ShiftSummarySettings:
    """How `update_shift_summary` divides the tokens: its top tokens, its bins and its "small" shift."""

    top_frac: float = 0.2
    """The share of the valid tokens with the largest |delta_p| that are the "top" tokens."""
    bins: int = 5
    """Equal-count bins of entropy (and of PPL)."""
    small: float = 0.06
    """The paper's "probability change of less than 0.06"."""


def update_shift_summary(delta_p: Tensor, entropy: Tensor, mask: Tensor, *, correct: Sequence[bool],
                         tokens: Sequence[Sequence[str]] | None = None, ppl: Tensor | Sequence[float] | None = None,
                         settings: ShiftSummarySettings = ShiftSummarySettings()) -> dict:
    """Where one update moved token probabilities (STILL, section 3.2.2 and Figures 4, 5(a)).

    `delta_p = p_after(o_t) - p_before(o_t)` per token; the "top" tokens are the `ceil(settings.top_frac * n)`
    valid tokens with the largest |delta_p| (ties by position, row-major).

    Args:
        delta_p, entropy (before the update), mask: `[N, T]`.
        correct: `[N]` whether each response is correct (positive sample).
        tokens: per response, the decoded text of each valid token, in order (for the token categories of
            `analysis.text.token_category`); None skips `by_category`.
        ppl: `[N]` response perplexities before the update (`analysis.measures.response_perplexity`); None skips
            `by_ppl`.
        settings: the share of top tokens, the bins and the "small" shift (`ShiftSummarySettings`).
    Returns:
        `overall` (tokens, mean |dp|, share with |dp| < small, the top threshold, mean entropy of all vs top tokens),
        `by_outcome` (Fig. 4(a): for positive and negative responses, tokens, mean dp, share raised, share in top),
        `by_entropy` (Fig. 4(b): per entropy bin, its range, mean |dp|, share in top), `by_category` (per category:
        tokens, mean |dp|, share of its tokens in the top, share of the top), `by_ppl` (Fig. 5(a): per PPL bin,
        its range, mean |dp|, share in top).
    """
    top_frac, bins, small = settings.top_frac, settings.bins, settings.small
    valid = (mask > 0).cpu()
    dp = delta_p.detach().cpu().double()[valid]
    ent = entropy.detach().cpu().double()[valid]
    row = torch.arange(valid.shape[0])[:, None].expand_as(valid)[valid]
    n = dp.numel()
    if n == 0:
        raise ValueError("update_shift_summary: no valid tokens")
    mag = dp.abs()
    m = max(1, math.ceil(top_frac * n - 1e-9))
    top = torch.zeros(n, dtype=torch.bool)
    top[torch.sort(-mag, stable=True).indices[:m]] = True
    pos = torch.as_tensor(list(correct), dtype=torch.bool)[row]

    def share(sel: Tensor) -> float:
        return float(top[sel].double().mean()) if sel.any() else float("nan")

    out: dict = {"overall": {"tokens": n, "mean_abs_shift": float(mag.mean()), f"share_below_{small:g}":
                             float((mag < small).double().mean()), "top_threshold": float(mag[top].min()),
                             "mean_entropy_all": float(ent.mean()), "mean_entropy_top": float(ent[top].mean())}}
    out["by_outcome"] = {}
    for name, sel in (("positive", pos), ("negative", ~pos)):
        out["by_outcome"][name] = {"tokens": int(sel.sum()),
                                   "mean_shift": float(dp[sel].mean()) if sel.any() else float("nan"),
                                   "share_raised": float((dp[sel] > 0).double().mean()) if sel.any() else float("nan"),
                                   "share_in_top": share(sel)}

    def binned(values: Tensor) -> list[dict]:
        b = _rank_bins(values, min(bins, n))
        return [{"low": float(values[b == i].min()), "high": float(values[b == i].max()),
                 "mean_abs_shift": float(mag[b == i].mean()), "share_in_top": share(b == i)}
                for i in range(min(bins, n))]

    out["by_entropy"] = binned(ent)
    if tokens is not None:
        flat = [t for row_tokens in tokens for t in row_tokens]
        if len(flat) != n:
            raise ValueError(f"update_shift_summary: tokens hold {len(flat)} entries for {n} valid tokens")
        cats = [token_category(t) for t in flat]
        out["by_category"] = {}
        for c in CATEGORIES:
            sel = torch.tensor([x == c for x in cats], dtype=torch.bool)
            out["by_category"][c] = {"tokens": int(sel.sum()),
                                     "mean_abs_shift": float(mag[sel].mean()) if sel.any() else float("nan"),
                                     "share_in_top": share(sel), "share_of_top": float((sel & top).sum()) / m}
    if ppl is not None:
        out["by_ppl"] = binned(torch.as_tensor(ppl, dtype=torch.float64).cpu()[row])
    return out


def entropy_change_by_token(entropy_before: Tensor, entropy_after: Tensor, mask: Tensor,
                            tokens: Sequence[Sequence[str]], *, min_count: int = 2, top: int = 10) -> list[dict]:
    """Token texts whose entropy fell most in the update (STILL, Figure 3(b)): the mean `H_after - H_before`
    over the occurrences of each token text seen at least `min_count` times, most negative first (ties by text).
    `tokens`: per response, the decoded text of each valid token. Returns `top` dicts `{token, count, change}`."""
    valid = (mask > 0).cpu()
    change = (entropy_after.detach().cpu().double() - entropy_before.detach().cpu().double())[valid].tolist()
    flat = [t for row_tokens in tokens for t in row_tokens]
    if len(flat) != len(change):
        raise ValueError(f"entropy_change_by_token: tokens hold {len(flat)} entries for {len(change)} valid tokens")
    sums: dict[str, list[float]] = {}
    for t, d in zip(flat, change):
        sums.setdefault(t, []).append(d)
    rows = [{"token": t, "count": len(v), "change": sum(v) / len(v)} for t, v in sums.items() if len(v) >= min_count]
    return sorted(rows, key=lambda r: (r["change"], r["token"]))[:top]
