"""The per-step metrics of training: every key a step's record in metrics.jsonl has (`STEP_METRICS`, the source of
docs/run-directory.md's table) and the rollout statistics computed from one step's batch (`rollout_metrics`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from explorl.analysis.measures import entropy_by_position

if TYPE_CHECKING:
    from explorl.algos.batch import RolloutBatch

# Every key written to metrics.jsonl at each training step, with its meaning (docs/run-directory.md's table comes
# from here).
STEP_METRICS: dict[str, str] = {
    "step": "training step (1-based)",
    "reward/mean": "mean reward of the step's responses",
    "reward/std": "population std of the rewards",
    "reward/correct_frac": "fraction of correct responses (task.correct_by's score above task.correct_threshold)",
    "reward/all_correct_frac": "fraction of prompts whose responses are all correct (zero advantage in GRPO)",
    "reward/all_wrong_frac": "fraction of prompts whose responses are all wrong (zero advantage in GRPO)",
    "reward/errors": "reward-function failures this step (scored 0)",
    "reward/timeouts": "reward-function timeouts this step (scored 0)",
    "reward/greedy_baseline": "mean reward of the prompts' greedy responses, ReMax's baseline (only with "
                              "algo.advantage: remax)",
    "entropy/mean": "mean token entropy of the policy at the training temperature over response tokens",
    "entropy/pos": "the same over correct responses (null when none)",
    "entropy/neg": "the same over incorrect responses (null when none)",
    "entropy/behavior_mean": "mean entropy of the distribution actually sampled from",
    "temperature/mean": "mean sampling temperature over response tokens",
    "temperature/train": "temperature of the optimised policy (the E3 tau; the base temperature otherwise)",
    "rollouts/per_prompt_min": "fewest responses sampled for a prompt",
    "rollouts/per_prompt_max": "most responses sampled for a prompt",
    "rollouts/per_prompt_mean": "mean responses per prompt",
    "rollouts/total": "responses this step (N)",
    "length/mean": "mean response length in tokens (EOS included)",
    "length/max": "longest response",
    "length/truncated_frac": "fraction of responses that hit sampling.max_new_tokens",
    "entropy/by_position": "mean token entropy in 10 relative-position bins of the responses (a list)",
    "adv/mean": "mean advantage over response tokens",
    "adv/std": "std of the advantage over response tokens",
    "tokens/masked_frac": "fraction of response tokens removed from the loss (overlong masking, forking filter)",
    "tokens/downweighted_frac": "fraction of response tokens whose |advantage| the shapers reduced",
    "loss/pg": "clipped policy-gradient loss (aggregated)",
    "loss/clip_frac": "fraction of tokens where the clipped term is active",
    "loss/clip_frac_low": "fraction clipped at 1 - eps_low (A < 0)",
    "loss/clip_frac_high": "fraction clipped at 1 + eps_high (A > 0)",
    "loss/ratio_mean": "mean importance ratio pi_new / pi_old (exactly 1 on the first update)",
    "loss/ratio_max": "largest importance ratio",
    "loss/ratio_min": "smallest importance ratio (with ratio_max: whether the updates after the first move pi)",
    "loss/ppo_kl": "mean of logp_old - logp_new over tokens",
    "loss/nonfinite": "1 when this step's update was skipped for a non-finite loss or gradient",
    "algo/entropy_coef": "the entropy-bonus coefficient this step's update applied (only with algo.entropy_control."
                         "enabled: Skywork-OR1's adaptive coefficient, 0 while the entropy is above the target)",
    "ref/reset": "1 at a step after whose update the reference was reset to the policy and AdamW's state cleared "
                 "(only with algo.reference_reset.every > 0: ProRL's reset, on those steps)",
    "optim/grad_norm": "global gradient norm before clipping",
    "optim/lr": "learning rate after the step",
    "perf/step_s": "wall time of the step",
    "perf/sample_s": "wall time of sampling",
    "perf/update_s": "wall time of the policy update (epochs x mini-batches)",
    "perf/tokens_per_s": "generated tokens per second of sampling",
    "perf/mem_sample_gib": "CUDA only: peak GPU memory (GiB) while sampling and scoring (docs/gpu.md)",
    "perf/mem_logprob_gib": "CUDA only: peak GPU memory while pi_old's and the reference's log-probs are computed",
    "perf/mem_update_gib": "CUDA only: peak GPU memory of the update's forward, backward and optimizer steps",
    "perf/mem_peak_gib": "CUDA only: the step's peak GPU memory, the largest of the three above",
}
# Present only when configured (docs/run-directory.md lists them): kl/mean (a reference model is kept),
# kl/line_start_mean (algo.kl_tokens: line_starts), loss/entropy
# (algo.entropy_coef != 0), temperature/tau|h_target|h_init|clamped (E3 schedule), temperature/ead_d|ead_min|
# at_min_frac (EAD, RevEAD), temperature/adaptive_factor_min|max (adaptive schedule), is/* (algo.importance_weights),
# rollouts/dapo_rounds|dapo_kept_frac (DAPO sampling), loss/clip_cov_frac, loss/kl_cov_frac,
# loss/kl_cov_penalty_share (those losses),
# loss/dual_clip_frac (algo.ppo.dual_clip_c), mismatch/* (the rollout/trainer mismatch, explorl.algos.mismatch:
# every step with behaviour log-probs, which explorl's sampler and vLLM always return, unless the single-update
# shortcut's forward left out every response as idle), reward/<name> (several task.reward functions: each one's mean,
# unweighted), eval/* (run.eval_every > 0, and once after the last step).


def rollout_metrics(batch: RolloutBatch, correct: torch.Tensor) -> dict:
    """Per-step statistics of a batch of rollouts (namespaced metric names, docs/run-directory.md): the step's
    `RolloutBatch` through `compute_advantages` (its shaped rewards, pi_old's entropies, the advantages, the
    sampler's entropies and temperatures). `correct[N]` (bool) says which responses are correct by the task's rule
    (`Task.correct`), not by the shaped reward."""
    mask, rewards, entropy, advantages = batch.mask, batch.shaped_rewards, batch.entropy, batch.advantages
    correct = correct.to(torch.bool)
    group = batch.group
    n_groups = int(group.max()) + 1 if len(group) else 0
    counts = torch.bincount(group, minlength=n_groups)
    n_correct = torch.bincount(group, weights=correct.float(), minlength=n_groups)
    present = counts > 0
    ent_rows = mask * entropy
    pos, neg = correct[:, None] & (mask > 0), (~correct)[:, None] & (mask > 0)
    lengths = mask.sum(-1)
    valid = mask > 0
    adv = advantages[valid]
    return {
        "reward/mean": float(rewards.mean()),
        "reward/std": float(rewards.std(unbiased=False)),
        "reward/correct_frac": float(correct.float().mean()),
        "reward/all_correct_frac": float((n_correct[present] == counts[present]).float().mean()),
        "reward/all_wrong_frac": float((n_correct[present] == 0).float().mean()),
        "entropy/mean": float(ent_rows.sum() / mask.sum().clamp_min(1)),
        "entropy/pos": float(entropy[pos].mean()) if pos.any() else float("nan"),
        "entropy/neg": float(entropy[neg].mean()) if neg.any() else float("nan"),
        "entropy/behavior_mean": float((batch.behavior_entropy * mask).sum() / mask.sum().clamp_min(1)),
        "temperature/mean": float((batch.temperatures * mask).sum() / mask.sum().clamp_min(1)),
        "rollouts/per_prompt_min": int(counts[present].min()),
        "rollouts/per_prompt_max": int(counts[present].max()),
        "rollouts/per_prompt_mean": float(counts[present].float().mean()),
        "rollouts/total": int(len(rewards)),
        "length/mean": float(lengths.mean()),
        "length/max": int(lengths.max()),
        "length/truncated_frac": float(batch.truncated.float().mean()),
        "entropy/by_position": entropy_by_position(entropy, mask, bins=10).tolist(),
        "adv/mean": float(adv.mean()) if adv.numel() else 0.0,
        "adv/std": float(adv.std(unbiased=False)) if adv.numel() else 0.0,
    }
