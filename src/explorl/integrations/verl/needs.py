"""What a method needs from verl: explorl's trainer mode (`trainer_needs`, asked of the registry) and the rollout
controllers' settings (`controller_settings`), both from the validated explorl config."""

from __future__ import annotations

import torch

from explorl.algos import RolloutBatch, compute_advantages, requirements
from explorl.algos.batch import MissingInputError
from explorl.algos.registry import lookup
from explorl.config import Config, to_dict
from explorl.integrations.verl.rollout import needs_control
from explorl.rewards import reward_entries

__all__ = ["VERL_SAMPLING", "controller_settings", "takes_rewards_apart", "trainer_needs"]


def takes_rewards_apart(cfg: Config) -> bool:
    """The estimator reads each of several `task.reward` functions' own scores (`needs_reward_components`: GDPO),
    which explorl's verl trainer mode takes from the reward extra info and the run's explorl config."""
    several = len(reward_entries(cfg.task.reward)) > 1
    return several and lookup("estimator", cfg.algo.advantage).needs_reward_components


def trainer_needs(cfg: Config) -> list[str]:
    """Why the method needs explorl's verl trainer (`trainer.v1.trainer_mode=explorl`), from the registry: what
    explorl's advantage step reads beyond verl's plain estimator call (rewards, mask, groups: entropies, pi_old's,
    reference or rollout log-probs), a step window, overlong shaping (the length limit), per-token loss weights,
    and sampling steered by explorl's controllers. Empty: verl's own trainer runs the method."""
    algo, reasons = cfg.algo, []
    # what verl's plain estimator call carries: rewards, the response mask, the groups
    probe = RolloutBatch(mask=torch.ones(4, 3), rewards=torch.tensor([1.0, 0.0, 1.0, 0.0]),
                         group=torch.tensor([0, 0, 1, 1]), max_response_len=3, lengths=torch.full((4,), 3),
                         truncated=torch.zeros(4, dtype=torch.bool))
    try:
        probe = compute_advantages(probe, algo, step=1)
        if probe.token_weights is not None or probe.is_weights is not None:
            reasons.append("the method weights tokens in the loss (rollout_is_weights)")
    except MissingInputError as e:
        reasons.append(f"verl's estimator call lacks what the advantage step reads: {e}")
    needs = requirements(algo)
    if not reasons:  # the registry's own account, should an entry read an input only on some batches
        for flag, what in ((needs.ref, "reference log-probs"), (needs.old_logprobs, "pi_old's log-probs"),
                           (needs.behavior, "the rollout's log-probs")):
            if flag:
                reasons.append(f"the method reads {what}")
    for name in algo.shapers:
        entry = lookup("shaper", name)
        if entry.needs_step is not None and entry.needs_step(entry.options_in(algo)):
            reasons.append(f"shaper {name!r} has a step window")
    for name in algo.reward_shapers:  # DAPO's overlong shaping reads the length limit and the truncation flags
        if lookup("reward_shaper", name).needs_length_limit:
            reasons.append(f"reward shaper {name!r} needs the response-length limit")
    if takes_rewards_apart(cfg):
        reasons.append(f"estimator {algo.advantage!r} reads each task.reward function's own scores")
    if needs_control(controller_settings(cfg)):
        reasons.append(f"explorl's controllers steer sampling (sampling.schedule={cfg.sampling.schedule}, "
                       f"budget.policy={cfg.budget.policy})")
    return list(dict.fromkeys(reasons))


VERL_SAMPLING = ("group_size", "temperature", "top_p", "max_new_tokens", "fast_path", "compile", "cuda_graph",
                 "engine", "vllm_memory")
"""`sampling` fields verl's own keys carry (or that only tune explorl's sampler)."""


def controller_settings(cfg: Config) -> dict:
    """`algorithm.explorl.sampling|budget` for the rollout controllers: the schedule and budget policy with their
    options when they are not static (a fixed temperature and `n` need no control; DAPO is verl's own filter)."""
    out: dict = {}
    if not lookup("temperature_schedule", cfg.sampling.schedule).static:
        out["sampling"] = {k: v for k, v in to_dict(cfg.sampling).items() if k not in VERL_SAMPLING}
    policy = lookup("budget_policy", cfg.budget.policy)
    if not policy.static and not policy.resamples:
        out["budget"] = to_dict(cfg.budget)
    return out
