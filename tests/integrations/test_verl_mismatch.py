"""explorl's rollout/trainer mismatch figures (`explorl.algos.mismatch.mismatch_stats`, issue 52 item 4) equal the
ones verl 0.9.1 logs, from `verl/trainer/ppo/rollout_corr_helper.py`: `compute_offpolicy_metrics` (KL, k3 KL,
perplexities, log-ppl difference, ppl ratio, token chi-square) and the token-level ratio statistics of
`compute_rollout_correction_weights` / `compute_is_metrics` (the share of ratios outside [0.9, 1.1] through verl's
IcePop bounds "0.9_1.1"; the largest and smallest ratio and the effective sample size through a truncation bound
no ratio reaches). Float64 tensors, several seeds and mismatch sizes; run in `.venv-verl` (`make test-verl`).

The only difference is verl's 1e-8 added to the denominator of each masked mean (a relative 1e-8 at most), and an
all-masked row, which verl counts as a response of perplexity 1 and explorl leaves out (checked below).
"""

from __future__ import annotations

import pytest
import torch

verl = pytest.importorskip("verl", reason="verl is installed in .venv-verl only: run `make test-verl`")
from verl.trainer.ppo.rollout_corr_helper import (  # noqa: E402
    compute_offpolicy_metrics,
    compute_rollout_correction_weights,
)

from explorl.algos.mismatch import mismatch_stats  # noqa: E402

F64 = torch.float64
RTOL, ATOL = 1e-7, 1e-10
SEEDS = range(4)
NEVER = 1e30  # a truncation bound no ratio reaches: verl's weights are then the raw ratios


def make(seed: int, scale: float, n: int = 7, t: int = 11):
    """Trainer and rollout log-probs [n, t] of tokens of probability in (0, 1), the rollout's moved by noise of std
    `scale` (a few tokens by a lot), and a mask of variable lengths (every row at least one token); float64."""
    g = torch.Generator().manual_seed(seed)
    train = torch.log(torch.rand(n, t, generator=g, dtype=F64).clamp_min(1e-4))
    noise = scale * torch.randn(n, t, generator=g, dtype=F64)
    noise[torch.rand(n, t, generator=g) < 0.05] *= 20.0
    roll = (train + noise).clamp_max(0.0)
    lengths = torch.randint(1, t + 1, (n,), generator=g)
    mask = (torch.arange(t)[None, :] < lengths[:, None]).to(F64)
    return train, roll, mask


def verl_figures(train, roll, mask) -> dict[str, float]:
    off = compute_offpolicy_metrics(old_log_prob=train, rollout_log_prob=roll, response_mask=mask)
    log_ratio = train - roll
    _, oob = compute_rollout_correction_weights(log_ratio, mask, rollout_is="token", rollout_is_threshold="0.9_1.1")
    _, raw = compute_rollout_correction_weights(log_ratio, mask, rollout_is="token", rollout_is_threshold=NEVER)
    return {
        **{k: off[k] for k in ("kl", "k3_kl", "training_ppl", "rollout_ppl", "training_log_ppl", "rollout_log_ppl",
                               "log_ppl_diff", "log_ppl_abs_diff", "ppl_ratio", "chi2_token")},
        "ratio_oob": oob["rollout_is_oob_ratio"], "ratio_low": oob["rollout_is_ratio_fraction_low"],
        "ratio_high": oob["rollout_is_ratio_fraction_high"], "ratio_max": raw["rollout_is_max"],
        "ratio_min": raw["rollout_is_min"], "ess": raw["rollout_is_eff_sample_size"],
    }


def close(ours: dict, theirs: dict) -> None:
    """Each of verl's figures equals explorl's to a relative 1e-7; the token chi-square as mean(rho^2) = chi2 + 1,
    since verl's 1e-8 in the mean's denominator is a relative error of that mean, not of the difference to 1."""
    for key, want in theirs.items():
        got = ours[key]
        if key == "chi2_token":
            got, want = got + 1.0, want + 1.0
        assert got == pytest.approx(want, rel=RTOL, abs=ATOL), key


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("scale", [0.0, 1e-3, 0.05, 0.5])
def test_mismatch_stats_equal_verls(seed, scale):
    train, roll, mask = make(seed, scale)
    ours = mismatch_stats(train, roll, mask)
    theirs = verl_figures(train, roll, mask)
    assert set(theirs) <= set(ours)
    close(ours, theirs)
    assert ours["tokens"] == float(mask.sum())
    if scale >= 0.05:  # the figures are not all trivially at their ideal
        assert ours["ratio_oob"] > 0 and ours["k3_kl"] > 0 and ours["ess"] < 1


def test_an_empty_row_is_the_only_difference():
    """verl counts an all-masked response as perplexity 1 (0 / (0 + 1e-8) = 0 as its mean log-prob); explorl leaves
    it out of the per-response means: verl on the batch without that row equals explorl on the batch with it."""
    train, roll, mask = make(5, 0.1)
    mask[2] = 0.0
    ours = mismatch_stats(train, roll, mask)
    keep = torch.tensor([i for i in range(len(mask)) if i != 2])
    theirs = verl_figures(train[keep], roll[keep], mask[keep])
    close(ours, theirs)
    with_row = compute_offpolicy_metrics(old_log_prob=train, rollout_log_prob=roll, response_mask=mask)
    assert with_row["training_ppl"] != pytest.approx(ours["training_ppl"], rel=1e-6)
