"""ERPO: the token-level entropy-regulated advantage.

ERPO: Song Yu, Li Li, Wenwen Zhao, Zhisheng Yang, "ERPO: Token-Level Entropy-Regulated Policy Optimization for Large
  Reasoning Models" (arXiv 2603.28204).

Implements eqs. 7-10 and Algorithm 1 (the implicit progress signal, the entropy gate, the relative-position
bucket normalisation, the outcome-anchored token term and the group re-normalisation, whose property is
eq. 16); docs/methods.md §3. Estimator `erpo`, options `algo.erpo.<field>` (`ErpoOptions`); needs a frozen
reference model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from explorl.algos.core import (check_response_inputs, check_token_inputs, dense_ids, float_dtype, group_range_equal,
                                segment_stats, token_positions)
from explorl.algos.methods.grpo import grpo
from explorl.algos.registry import Cite, register

if TYPE_CHECKING:
    from explorl.algos.batch import RolloutBatch
    from explorl.config.schema import AlgoConfig


@dataclass
class ErpoOptions:
    """ERPO's options, `algo.erpo.<field>` (ERPO; docs/methods.md §3)."""

    beta_progress: float = 0.1
    """beta of the implicit progress signal s = beta * (logp - ref_logp) (eq. 7)."""
    gamma: float = 5.0
    """Sharpness gamma of the entropy gate (eq. 8)."""
    eta: float = 0.2
    """Weight eta of the token-level term in A_group + eta * Psi."""
    num_buckets: int = 10
    """Relative-position buckets K of the progress normalisation (eq. 9)."""
    sigma_target: float = 1.0
    """Target scale of the token-level term."""


def erpo(rewards: Tensor, group: Tensor, mask: Tensor, entropy: Tensor, logprobs: Tensor, ref_logprobs: Tensor, *,
         options: ErpoOptions = ErpoOptions(), delta: float = 1e-6) -> Tensor:
    """ERPO token-level advantage (docs/methods.md §3; Yu et al. 2026, "ERPO: Token-Level Entropy-Regulated
    Policy Optimization for Large Reasoning Models", eqs. 7-10 and Algorithm 1).

    Per group G (all valid tokens of all responses of one prompt), with population std throughout, and
    `beta_progress`, `gamma`, `eta`, `K = num_buckets` and `sigma_target` the fields of `options`:
      1. `s = beta_progress * (logprobs - ref_logprobs)`                                        (eq. 7)
      2. `W = sigmoid(gamma * (H - mean_G(H)) / (std_G(H) + delta))`                            (eq. 8)
      3. token t (1-based) of response i: `k = min(floor(K * t / |o_i|), K - 1)`;
         `s~ = (s - mean_{k,G}(s)) / (std_{k,G}(s) + delta)`, stats over the group's valid tokens in bucket k (eq. 9)
      4. `raw = W * sign(A_group) * s~`; `Psi = sigma_target * raw / (std_active(raw) + delta)`, the std over the
         group's *active* tokens (valid, `A_group != 0`)                                          (eq. 10)
      5. `A_final = (X - mean_G(X)) / (std_G(X) + delta)` with `X = A_group + eta * Psi`, over the group's valid
         tokens (eq. 10's Norm_G), so each group has mean 0 and variance ~1 over its valid tokens (eq. 16).
    `A_group` is `grpo(rewards, group, ...)` (unbiased std, `eps = delta`). A group whose rewards are all equal
    (including a group of one response) gets 0 everywhere, as does a response without valid tokens.

    Readings: the paper writes `log pi_theta` in eq. 7; the statistics are computed once per batch from the
    old policy (section 4.5.3), so `logprobs` (old policy) is used. `t / |o_i|` counts valid tokens, so left
    padding is harmless; the bucket index is computed in integers (`(t * K) // |o_i|`), free of float rounding.
    If the active raw values of a group have std 0, `Psi = raw / delta` literally (bounded again by step 5).
    No gradient flows through the result.

    Args:
        rewards: `[N]` one scalar reward per response.
        group: `[N]` int64 prompt ids; arbitrary values, any order, any group sizes.
        mask: `[N, T]` 1 on response tokens, 0 on padding.
        entropy: `[N, T]` token entropy H of the old policy.
        logprobs: `[N, T]` old-policy log-probabilities of the sampled tokens.
        ref_logprobs: `[N, T]` reference-model log-probabilities of the sampled tokens.
        options: `beta_progress`, `gamma`, `eta`, `num_buckets` (K) and `sigma_target`, as in the steps above.
        delta: the stabiliser added to every std, as in the steps above.
    Returns:
        `[N, T]` advantages in the floating dtype of `logprobs` (float32 otherwise), 0.0 where `mask == 0`.
    """
    check_response_inputs(rewards, group, mask)
    check_token_inputs(mask, entropy=entropy, logprobs=logprobs, ref_logprobs=ref_logprobs)
    if options.num_buckets < 1:
        raise ValueError(f"num_buckets must be >= 1, got {options.num_buckets}")
    out_dtype = float_dtype(logprobs, entropy, rewards)
    n, t_len = mask.shape
    if n == 0 or t_len == 0:
        return torch.zeros(mask.shape, dtype=out_dtype, device=mask.device)
    valid, f64 = mask.bool(), torch.float64
    zero = torch.zeros((), dtype=f64, device=mask.device)
    dense, n_groups = dense_ids(group)
    # A_group per response: grpo on a one-token mask gives [N, 1]
    a_group = grpo(rewards.detach().to(f64), group, torch.ones(n, 1, device=mask.device), eps=delta)[:, 0]
    degenerate = group_range_equal(rewards, dense, n_groups, torch.ones(n, dtype=torch.bool, device=mask.device))
    gid = dense[:, None].expand(n, t_len)
    h = torch.where(valid, entropy.detach().to(f64), zero)
    s = torch.where(valid, options.beta_progress * (logprobs.detach().to(f64) - ref_logprobs.detach().to(f64)),
                    zero)  # eq. 7

    w = _entropy_gate(h, gid, valid, options.gamma, delta)  # 2. eq. 8
    s_tilde = _bucket_normalised(s, gid, valid, options.num_buckets, delta)  # 3. eq. 9
    psi = _process_term(w, s_tilde, a_group, gid, valid, options.sigma_target, delta)  # 4. eq. 10
    # 5. group z-score over valid tokens
    x = torch.where(valid, a_group[:, None] + options.eta * psi, zero)
    x_mean, x_std, _ = segment_stats(x, gid, valid)
    out = (x - x_mean) / (x_std + delta)
    return torch.where(valid & ~degenerate[:, None], out, zero).to(out_dtype)


def _entropy_gate(h: Tensor, gid: Tensor, valid: Tensor, gamma: float, delta: float) -> Tensor:
    """ERPO eq. 8, `[N, T]`: `W = sigmoid(gamma * (H - mean_G(H)) / (std_G(H) + delta))` per group `gid`."""
    h_mean, h_std, _ = segment_stats(h, gid, valid)
    return torch.sigmoid(gamma * (h - h_mean) / (h_std + delta))


def _bucket_normalised(s: Tensor, gid: Tensor, valid: Tensor, num_buckets: int, delta: float) -> Tensor:
    """ERPO eq. 9, `[N, T]`: the progress signal z-scored within each (group, relative-position bucket `k`),
    `k = min((t * K) // |o_i|, K - 1)` in integers, t the 1-based position among the response's valid tokens."""
    pos, length = token_positions(valid)
    k = torch.clamp((pos * num_buckets) // length.clamp_min(1), max=num_buckets - 1)
    s_mean, s_std, _ = segment_stats(s, gid * num_buckets + k, valid)
    return (s - s_mean) / (s_std + delta)


def _process_term(w: Tensor, s_tilde: Tensor, a_group: Tensor, gid: Tensor, valid: Tensor, sigma_target: float,
                  delta: float) -> Tensor:
    """ERPO eq. 10, `[N, T]`: `Psi = sigma_target * raw / (std_active(raw) + delta)`, `raw = W * sign(A_group) *
    s~`, the std over the group's active tokens (valid, `A_group != 0`)."""
    raw = w * torch.sign(a_group)[:, None] * s_tilde
    active = valid & (a_group != 0)[:, None]
    _, raw_std, _ = segment_stats(raw, gid, active)
    return sigma_target * raw / (raw_std + delta)


def _check_erpo(cfg) -> str | None:
    o = cfg.algo.options["erpo"]
    return None if o.num_buckets >= 1 else f"algo.erpo.num_buckets: must be >= 1, got {o.num_buckets}"


@register("estimator", "erpo", needs_ref=True, options=ErpoOptions, check=_check_erpo, formula=erpo,
          cites=(Cite("ERPO", "eq. 7, eq. 8, eq. 9, eq. 10, eq. 16", doc="3"),))
def _erpo_adapter(batch: RolloutBatch, cfg: AlgoConfig, *, options: ErpoOptions) -> Tensor:
    """ERPO: GRPO plus the entropy-gated, bucket-normalised implicit progress term; needs a reference."""
    batch.require("entropy", "logprobs", "ref_logprobs", by="advantage 'erpo' (it compares the policy with a frozen "
                  "reference model)")
    return erpo(batch.rewards, batch.group, batch.mask, batch.entropy, batch.logprobs, batch.ref_logprobs,
                options=options)
