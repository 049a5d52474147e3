"""DPPO: the policy gradient inside a trust region of the sampled token's probability shift (Binary-TV, Binary-KL).

DPPO: Penghui Qi, Xiangxin Zhou, Zichen Liu, Tianyu Pang, Chao Du, Min Lin, Wee Sun Lee (2026), "Rethinking the
Trust Region in LLM Reinforcement Learning", arXiv 2602.04879.

Implements DPPO's Binary approximations as verl 0.9.1 computes them (`compute_policy_loss_dppo_tv`,
`compute_policy_loss_dppo_kl`); docs/methods.md §5j. Instead of clipping the ratio, a token's gradient is dropped
when the policy has left the trust region in the direction its advantage pushes: with p = pi(y_t), q = pi_old(y_t)
the divergence is that of the two Bernoulli distributions (the sampled token against the rest of the vocabulary),
`TV = |p - q|` (`dppo_tv`) or `KL = q log(q/p) + (1-q) log((1-q)/(1-p))` (`dppo_kl`). A token with A > 0 keeps its
gradient unless p has risen beyond the bound (`p - q > delta_high`, resp. `KL > delta_high` with p > q), a token with
A <= 0 unless p has fallen beyond it (`q - p > delta_low`, resp. `KL > delta_low` with p < q). The kept tokens get
the importance-weighted policy gradient `-A * sg[min(r, C)] * log pi(y_t)`, r = p / q, C the truncation cap
(`ratio_cap`, verl's `clip_ratio_c`: verl truncates the ratio instead of a dual clip and, citing the paper's
section 5.4 on the truncation's bias, recommends a large cap). Policy losses `dppo_tv`, `dppo_kl`, options
`algo.dppo_tv.<field>` / `algo.dppo_kl.<field>` (`DppoOptions`); the bounds delta_low / delta_high are the core
`algo.eps_low` / `algo.eps_high` (verl reads them from `clip_ratio_low` / `clip_ratio_high`: 0.15 for TV and 0.05
for KL in its DPPO example, recipe `dppo`).

Differences, said where they act: the aggregation is `algo.loss_agg` (verl's DPPO example uses
`seq-mean-token-sum-norm`, the recipe's); the loss value is verl's, `-A * w * log pi` (its gradient is the
objective's; its value is not the surrogate's); only the Binary approximations (the paper's Top-K is not here).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from explorl.algos.aggregation import Reduction, zero_padding
from explorl.algos.batch import RolloutBatch
from explorl.algos.core import as_constant, check_loss_inputs, importance_ratio, ratio_stats, valid_fraction
from explorl.algos.registry import Cite, register

DIVERGENCES = ("tv", "kl")
"""The Binary divergences: total variation (`dppo_tv`) and KL (`dppo_kl`) of the sampled token's Bernoulli."""

BINARY_KL_EPS = 1e-8
"""Added to `1 - q` and `1 - p` inside the Binary-KL's log (verl 0.9.1's), so a probability of 1 gives a finite KL."""


@dataclass
class DppoOptions:
    """DPPO's options, `algo.dppo_tv.<field>` and `algo.dppo_kl.<field>` (Qi et al. 2026; docs/methods.md §5j)."""

    ratio_cap: float | None = 3.0
    """C, the cap of the (detached) importance ratio that weighs a kept token's gradient, `min(r, C)`: verl's
    `actor.clip_ratio_c` (default 3.0, which verl's vanilla PPO shares as its dual clip). verl recommends a large cap
    (truncation biases the gradient; it cites the paper's section 5.4) and its DPPO example sets 10000; the method
    layer `dppo` sets null. Must be > 0; null: no truncation."""


def _check_dppo(name: str):
    def check(cfg) -> str | None:
        cap = cfg.algo.options[name].ratio_cap
        if cap is not None and not cap > 0:
            return (f"algo.{name}.ratio_cap: must be > 0 (verl's clip_ratio_c is 3.0; verl recommends a large cap) "
                    f"or null for no truncation, got {cap}")
        return None

    check.__name__ = check.__qualname__ = f"_check_{name}"
    return check


def binary_divergence(logprobs_new: Tensor, logprobs_old: Tensor, divergence: str) -> Tensor:
    """`[N, T]` the divergence between the Bernoulli distributions (sampled token, the rest) of pi_old and pi:
    `TV = |p - q|` or `KL(q || p) = q (log q - log p) + (1 - q) log((1 - q + 1e-8) / (1 - p + 1e-8))`,
    p = exp(logp_new), q = exp(logp_old). Detached."""
    if divergence not in DIVERGENCES:
        raise ValueError(f"binary_divergence: divergence must be one of {', '.join(DIVERGENCES)}, got {divergence!r}")
    with torch.no_grad():
        p, q = torch.exp(logprobs_new), torch.exp(logprobs_old)
        if divergence == "tv":
            return (p - q).abs()
        return q * (logprobs_old - logprobs_new) + (1 - q) * torch.log((1 - q + BINARY_KL_EPS) /
                                                                       (1 - p + BINARY_KL_EPS))


def trust_region_mask(logprobs_new: Tensor, logprobs_old: Tensor, advantages: Tensor, divergence: str,
                      delta_low: float, delta_high: float) -> Tensor:
    """Bool `[N, T]`: the tokens DPPO keeps (all inputs `[N, T]`, detached).

    A > 0: kept unless p moved up out of the region (TV: `p - q > delta_high`; KL: `KL > delta_high` and `p > q`).
    A <= 0: kept unless p moved down out of it (TV: `q - p > delta_low`; KL: `KL > delta_low` and `p < q`). A move
    against the advantage's push always keeps the gradient, which pulls the token back."""
    with torch.no_grad():
        p, q = torch.exp(logprobs_new), torch.exp(logprobs_old)
        if divergence == "tv":
            up_ok, down_ok = (p - q) <= delta_high, (p - q) >= -delta_low
        else:
            kl = binary_divergence(logprobs_new, logprobs_old, "kl")
            up_ok, down_ok = (kl <= delta_high) | (p <= q), (kl <= delta_low) | (p >= q)
        return torch.where(advantages > 0, up_ok, down_ok)


# The trust region's bounds are one `(delta_low, delta_high)` pair (the config's eps_low / eps_high), not two
# keywords: with the divergence, the cap and the reduction, two would make nine parameters.
def dppo_loss(
    logprobs_new: Tensor,
    logprobs_old: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    divergence: str = "tv",
    trust_region: tuple[float, float] = (0.15, 0.15),
    ratio_cap: float | None = 3.0,
    reduction: Reduction = Reduction("token-mean"),
) -> tuple[Tensor, dict[str, float]]:
    """DPPO-Binary-TV / -KL as a loss to minimise (Qi et al. 2026; docs/methods.md §5j), as verl 0.9.1 computes it.

    Token loss `-A * sg[min(r, ratio_cap)] * logp_new * keep`, `r = exp(logp_new - logp_old)` (log clamped to +-20),
    `keep` the trust-region mask (`trust_region_mask`, bounds `trust_region` on the Binary divergence). Weights
    multiply the token loss as in `explorl.algos.methods.ppo.policy_loss`; aggregated by the reduction's `agg`.

    Args:
        logprobs_new: `[N, T]` log-probs under the policy being optimised (differentiable).
        logprobs_old: `[N, T]` log-probs under the policy that produced the batch (constant).
        advantages: `[N, T]` per-token advantages (constant).
        mask: `[N, T]` 1 on response tokens.
        divergence: `tv` or `kl`.
        trust_region: `(delta_low, delta_high)`, the bounds on the divergence (the config's `eps_low` / `eps_high`).
        ratio_cap: the truncation cap C of the ratio weight (> 0), or None for none.
        reduction: the aggregation (`aggregate`), the length limit it may need and the optional `[N, T]` detached
            `is_weights` / `token_weights` multiplying the token loss (`Reduction`).
    Returns:
        `(loss, stats)`: the scalar loss and detached statistics over valid tokens: `loss/pg`, the ratio statistics
        (`loss/ratio_*`, `loss/ppo_kl`), `loss/clip_frac` (tokens out of the trust region, verl's `pg_clipfrac`),
        `loss/clip_frac_high` / `loss/clip_frac_low` (of them, those with A > 0 / A <= 0), `loss/truncated_frac` (kept
        tokens whose ratio is above the cap, verl's `pg_clipfrac_lower`), and the weights' statistics.
    """
    check_loss_inputs("dppo_loss", logprobs_new, logprobs_old, advantages, mask, reduction)
    if divergence not in DIVERGENCES:
        raise ValueError(f"dppo_loss: divergence must be one of {', '.join(DIVERGENCES)}, got {divergence!r}")
    if ratio_cap is not None and not ratio_cap > 0:
        raise ValueError(f"dppo_loss: ratio_cap must be > 0 (or None for no truncation), got {ratio_cap!r}")
    valid = mask.bool()
    log_ratio, ratio = importance_ratio(logprobs_new, logprobs_old, valid)
    new = zero_padding(logprobs_new, valid)
    old = as_constant(logprobs_old, valid, new.dtype)
    adv = as_constant(advantages, valid, new.dtype)
    weight = ratio.detach() if ratio_cap is None else ratio.detach().clamp(max=ratio_cap)
    keep = trust_region_mask(new.detach(), old, adv, divergence, *trust_region) & valid
    loss = reduction(-adv * weight * new * keep.to(new.dtype), valid)
    with torch.no_grad():
        n_valid = int(valid.sum())
        stats = ratio_stats(loss, ratio, log_ratio, valid, n_valid)
        out = valid & ~keep
        stats["loss/clip_frac"] = valid_fraction(out, valid, n_valid)
        stats["loss/clip_frac_high"] = valid_fraction(out & (adv > 0), valid, n_valid)
        stats["loss/clip_frac_low"] = valid_fraction(out & (adv <= 0), valid, n_valid)
        capped = keep & (ratio > ratio_cap) if ratio_cap is not None else torch.zeros_like(keep)
        stats["loss/truncated_frac"] = valid_fraction(capped, valid, n_valid)
        reduction.record(stats, valid, n_valid, ratio.dtype)
    return loss, stats


def _dppo(divergence: str, logprobs_new: Tensor, batch: RolloutBatch, cfg,
          options: DppoOptions) -> tuple[Tensor, dict[str, float]]:
    """`dppo_loss` with `divergence`, the bounds `algo.eps_low` / `algo.eps_high`, the cap `options.ratio_cap` and
    the aggregation `algo.loss_agg` (both adapters')."""
    return dppo_loss(logprobs_new, batch.logprobs, batch.advantages, batch.loss_mask, divergence=divergence,
                     trust_region=(cfg.eps_low, cfg.eps_high), ratio_cap=options.ratio_cap,
                     reduction=Reduction.of(batch, cfg.loss_agg))


@register("policy_loss", "dppo_tv", needs_old_logprobs=False, rowwise=True, options=DppoOptions,
          check=_check_dppo("dppo_tv"), reads=("eps_low", "eps_high", "loss_agg"),
          formula=(dppo_loss, trust_region_mask, binary_divergence), cites=(Cite("DPPO", doc="5j"),))
def _dppo_tv_adapter(logprobs_new: Tensor, batch: RolloutBatch, cfg, *,
                     options: DppoOptions) -> tuple[Tensor, dict[str, float]]:
    """DPPO-Binary-TV (`dppo_loss`, divergence `tv`) with the bounds `algo.eps_low` / `algo.eps_high`, the cap
    `algo.dppo_tv.ratio_cap` and the aggregation `algo.loss_agg`."""
    return _dppo("tv", logprobs_new, batch, cfg, options)


@register("policy_loss", "dppo_kl", needs_old_logprobs=False, rowwise=True, options=DppoOptions,
          check=_check_dppo("dppo_kl"), reads=("eps_low", "eps_high", "loss_agg"),
          formula=(dppo_loss, trust_region_mask, binary_divergence), cites=(Cite("DPPO", doc="5j"),))
def _dppo_kl_adapter(logprobs_new: Tensor, batch: RolloutBatch, cfg, *,
                     options: DppoOptions) -> tuple[Tensor, dict[str, float]]:
    """DPPO-Binary-KL (`dppo_loss`, divergence `kl`) with the bounds `algo.eps_low` / `algo.eps_high`, the cap
    `algo.dppo_kl.ratio_cap` and the aggregation `algo.loss_agg`."""
    return _dppo("kl", logprobs_new, batch, cfg, options)
