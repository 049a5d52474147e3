"""The rollout/trainer mismatch of one batch: how far the log-probs the sampler returned for the tokens it drew are
from the trainer's log-probs of the same tokens under the same weights (docs/methods.md §8g; issue 52).

The sampler's log-probs (`RolloutBatch.behavior_logprobs`) are those of the distribution actually sampled (the
temperature, per token under EAD, then top-p truncation and renormalisation); the trainer's are pi_old's
(`RolloutBatch.logprobs`) or, under the single-update shortcut, the update forward's own before its optimizer step.
With the same kernels, dtype, temperature and no truncation the two are equal and every figure below is at its
ideal value (KL 0, ratios 1, ESS 1); bfloat16 kernels, a different engine, top-p the trainer does not apply or a
per-token sampling temperature all move them. verl 0.9.1 logs the same figures
(`verl/trainer/ppo/rollout_corr_helper.py`: `compute_offpolicy_metrics` and the token-level ratio statistics of
`compute_is_metrics`); tests/integrations/test_verl_mismatch.py holds this function equal to them.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["mismatch_stats", "mismatch_metrics", "MISMATCH_KEYS", "SAFETY_BOUND", "PREFIX"]

SAFETY_BOUND = 20.0
"""Log-ratios are clamped to [-20, 20] before `exp` in the ratio statistics (verl's `SAFETY_BOUND`): a ratio is at
most e^20 ~ 4.9e8, never infinite in metrics.jsonl."""

MISMATCH_KEYS: dict[str, str] = {
    "kl": "k1 estimate of KL(rollout || trainer): mean over tokens of log p_rollout - log p_trainer",
    "k3_kl": "k3 estimate of KL(rollout || trainer): mean over tokens of rho - log rho - 1, rho = p_trainer / "
             "p_rollout (>= 0 token by token)",
    "training_ppl": "mean over responses of exp(-mean over its tokens of log p_trainer)",
    "rollout_ppl": "the same of log p_rollout",
    "training_log_ppl": "mean over responses of -mean over its tokens of log p_trainer",
    "rollout_log_ppl": "the same of log p_rollout",
    "log_ppl_diff": "mean over responses of (mean log p_rollout - mean log p_trainer) = log(training ppl / "
                    "rollout ppl) of a response",
    "log_ppl_abs_diff": "mean over responses of |mean log p_rollout - mean log p_trainer|",
    "ppl_ratio": "mean over responses of training ppl / rollout ppl = exp(log_ppl_diff of the response)",
    "chi2_token": "token chi-square divergence: mean over tokens of rho^2, less 1",
    "ratio_oob": "share of tokens whose rho is outside [0.9, 1.1]",
    "ratio_low": "share of tokens with rho < 0.9",
    "ratio_high": "share of tokens with rho > 1.1",
    "ratio_max": "largest rho over the tokens",
    "ratio_min": "smallest rho over the tokens",
    "ess": "token effective sample size of the weights rho, normalised to (0, 1]: mean(rho)^2 / mean(rho^2)",
    "tokens": "number of response tokens measured",
}
"""Each key `mismatch_stats` returns, with its formula (the loop logs them as `mismatch/<key>`)."""


def mismatch_stats(trainer_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor, *, low: float = 0.9,
                   high: float = 1.1) -> dict[str, float]:
    """The rollout/trainer mismatch figures of one batch (`MISMATCH_KEYS`), computed in float64.

    Args:
        trainer_logprobs: [N, T] log p_trainer of the sampled tokens (pi_old, or the update forward's detached).
        rollout_logprobs: [N, T] log p_rollout of the same tokens, as the sampler returned them.
        mask: [N, T], nonzero on the tokens to measure (the response tokens; padding and unmeasured rows 0). At least
            one token must be measured. Rows with no measured token are left out of the per-response means.
        low, high: the bounds of the token ratio for `ratio_oob`, `ratio_low`, `ratio_high`.

    With d = log p_trainer - log p_rollout per token, rho = exp(clamp(d, -20, 20)), means over the measured tokens
    (all rows pooled, as verl's token-mean) and over the responses of per-response token means:
        kl = mean(-d);  k3_kl = mean(exp(d) - d - 1)  (d not clamped, as verl);  chi2_token = mean(rho^2) - 1
        training_log_ppl = mean_i(-m_i(log p_trainer)),  training_ppl = mean_i(exp(-m_i(log p_trainer))), and
        the same of log p_rollout, m_i the mean over response i's tokens
        log_ppl_diff = mean_i(m_i(log p_rollout) - m_i(log p_trainer)), log_ppl_abs_diff its |.|,
        ppl_ratio = mean_i(exp(m_i(log p_rollout) - m_i(log p_trainer)))
        ratio_oob = mean(rho < low or rho > high), ratio_low, ratio_high; ratio_max, ratio_min = max, min of rho
        ess = mean(rho)^2 / mean(rho^2)  (= 1 / mean((rho / mean(rho))^2), 1 when every rho is equal)
    Equal to verl 0.9.1's `compute_offpolicy_metrics` and token-level `compute_is_metrics` on the same tensors
    up to verl's 1e-8 added to each mean's denominator (verl's per-response means also count an all-masked row as
    a response of perplexity 1; here it is left out).
    """
    if trainer_logprobs.shape != rollout_logprobs.shape or trainer_logprobs.shape != mask.shape:
        raise ValueError(f"mismatch_stats: shapes differ: trainer {tuple(trainer_logprobs.shape)}, rollout "
                         f"{tuple(rollout_logprobs.shape)}, mask {tuple(mask.shape)}")
    if trainer_logprobs.dim() != 2:
        raise ValueError(f"mismatch_stats: expected [N, T] tensors, got shape {tuple(trainer_logprobs.shape)}")
    on = mask != 0
    n_tok = int(on.sum())
    if n_tok == 0:
        raise ValueError("mismatch_stats: the mask selects no token")
    # masked positions to 0 first: padding may hold anything (-inf, nan) and must not reach a sum
    train = torch.where(on, trainer_logprobs.detach().double(), 0.0)
    roll = torch.where(on, rollout_logprobs.detach().double(), 0.0)
    w = on.double()

    def mean(x: Tensor) -> Tensor:  # over the measured tokens, all rows pooled
        return (x * w).sum() / n_tok

    d = train - roll
    rho = torch.exp(d.clamp(-SAFETY_BOUND, SAFETY_BOUND))
    rows = on.any(-1)
    per_row = w.sum(-1)[rows]
    m_train, m_roll = train.sum(-1)[rows] / per_row, roll.sum(-1)[rows] / per_row
    diff = m_roll - m_train
    mean_rho, mean_rho2 = mean(rho), mean(rho.square())
    rho_on = rho[on]
    return {
        "kl": float(mean(-d)),
        "k3_kl": float(mean(torch.exp(d) - d - 1.0)),
        "training_ppl": float(torch.exp(-m_train).mean()),
        "rollout_ppl": float(torch.exp(-m_roll).mean()),
        "training_log_ppl": float((-m_train).mean()),
        "rollout_log_ppl": float((-m_roll).mean()),
        "log_ppl_diff": float(diff.mean()),
        "log_ppl_abs_diff": float(diff.abs().mean()),
        "ppl_ratio": float(torch.exp(diff).mean()),
        "chi2_token": float(mean_rho2 - 1.0),
        "ratio_oob": float(((rho_on < low) | (rho_on > high)).double().mean()),
        "ratio_low": float((rho_on < low).double().mean()),
        "ratio_high": float((rho_on > high).double().mean()),
        "ratio_max": float(rho_on.max()),
        "ratio_min": float(rho_on.min()),
        "ess": float(mean_rho.square() / mean_rho2),
        "tokens": float(n_tok),
    }


PREFIX = "mismatch/"


def mismatch_metrics(trainer_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor) -> dict[str, float]:
    """`mismatch_stats` as the loop logs it: each key under `mismatch/`, or nothing when `mask` selects no token
    (under the single-update shortcut a step whose responses are all idle has no trainer log-probs)."""
    if not bool((mask != 0).any()):
        return {}
    return {PREFIX + k: v for k, v in mismatch_stats(trainer_logprobs, rollout_logprobs, mask).items()}
