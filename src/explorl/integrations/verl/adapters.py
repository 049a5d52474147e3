"""verl's calling conventions to explorl's step, and back.

verl 0.9 calls an advantage estimator as `fn(token_level_rewards, response_mask, index, config, ...)` and a policy
loss as `fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights)`
(`verl/trainer/ppo/core_algos.py`). The functions here turn those tensors into an `explorl.algos.RolloutBatch`,
the configs into an explorl `AlgoConfig` (validated with explorl's own errors), call the registered explorl
functions, and hand verl what it expects. Nothing here re-implements a method.

Conventions (docs/methods.md §9):
- Groups: verl's `uid` index (any hashable per response) becomes explorl's integer group ids.
- Truncation: verl gives no flag; a response as long as the rollout's length limit is truncated (DAPO's overlong
  shaping). The plain estimator call does not carry the limit, so there the padded width stands in for it (right
  in verl's v0 trainer, which pads to the limit); explorl's trainer mode passes the limit itself.
- Loss aggregation: verl normalises each micro-batch by the global batch (`config.global_batch_info`: data-parallel
  size, tokens and sequences of the global batch, `loss_scale_factor`); the explorl loss of the micro-batch is
  rescaled to that normaliser, so a verl step sums to the same gradient as explorl's whole-batch loss.
- Loss options: `loss_fields.VERL_LOSS_FIELDS` says where verl keeps each loss's options: verl's plain PPO
  always applies `clip_ratio_c` (default 3), which `explorl_ppo` takes as its dual clip, so it equals verl's
  `vanilla` loss; Clip-Cov and KL-Cov read verl's `policy_loss` fields (KL-Cov's `kl_cov_ratio` is a fraction,
  explorl's `algo.kl_cov.k_percent` a percentage).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from explorl.algos import RolloutBatch, compute_advantages
from explorl.algos.batch import MissingInputError
from explorl.algos.registry import entries, lookup
from explorl.config import AlgoConfig, Config, ConfigError, SamplingConfig, from_dict, validate
from explorl.integrations.loop_only import refuse_loop_only_shapers
from explorl.integrations.verl.loss_fields import verl_fields
from explorl.integrations.verl.rollout import BUDGET_KEY, SAMPLING_KEY
from explorl.integrations.verl.rollout import plain as _plain

PREFIX = "explorl_"
CONFIG_KEY = "explorl"
"""Estimators read explorl's algorithm settings from `algorithm.explorl` of verl's config
(`+algorithm.explorl.x=...`)."""
TRAINER_HINT = ("select explorl's verl trainer (`trainer.v1.trainer_mode=explorl`), which hands the estimator "
                "verl's entropies, old, reference and rollout log-probs")


def algo_config(settings: Mapping | None, prefix: str = f"algorithm.{CONFIG_KEY}.", group_size: int = 8,
                **fixed) -> AlgoConfig:
    """An explorl `AlgoConfig` from a mapping of its fields (`fixed` overrides), validated by explorl's rules
    (`group_size`: the largest group of the batch, for checks such as pass@k's k <= G).

    Errors are explorl's `ConfigError`, naming the field under `prefix` (e.g. `algorithm.explorl.passk.k`).
    In verl the behaviour policy is the inference engine's (vLLM, SGLang): it differs from the trainer's forward
    numerically even at one fixed temperature, so truncated importance weights are accepted without EAD.
    """
    # the controllers' sampling and budget sections are read by `rollout.rollout_config`
    data = {k: v for k, v in {**_plain(settings), **fixed}.items() if k not in (SAMPLING_KEY, BUDGET_KEY)}
    try:
        algo = from_dict(AlgoConfig, data, prefix)
        weighs = algo.importance_weights != AlgoConfig().importance_weights  # the rollout's log-probs differ
        sampling = SamplingConfig(group_size=max(group_size, 1), top_p=0.999 if weighs else 1.0)
        validate(Config(algo=algo, sampling=sampling))
    except ConfigError as e:
        raise ConfigError(str(e).replace("algo.", prefix)) from None
    refuse_loop_only_shapers(algo.shapers, "verl's trainer", prefix)  # outcomes and counts: explorl's loop only
    return algo


def group_ids(index, device: torch.device) -> torch.Tensor:
    """verl's per-response `uid` array as int64 group ids `[N]` (equal uid, equal id)."""
    ids = np.unique(np.asarray([str(u) for u in index]), return_inverse=True)[1]
    return torch.as_tensor(ids, dtype=torch.long, device=device)


def rollout_batch(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index, *,
                  old_log_probs=None, ref_log_prob=None, entropy=None, rollout_log_probs=None,
                  max_response_len: int | None = None) -> RolloutBatch:
    """The `RolloutBatch` of verl's tensors (all `[N, T]`, padded to a common width T).

    `max_response_len`: the length limit the rollout sampled under (`actor_rollout_ref.rollout.response_length`);
    a response of that many tokens is truncated. None: the padded width T stands in for it, which is right when
    verl pads to the limit (its v0 trainer) and wrong when it pads to the batch's longest response (the v1 trainer's
    `to_padded_tensor`): explorl's trainer mode passes the limit."""
    mask = response_mask.to(torch.float32)
    lengths = mask.sum(-1).long()
    limit = int(mask.shape[-1] if max_response_len is None else max_response_len)
    return RolloutBatch(mask=mask, rewards=token_level_rewards.to(torch.float32).sum(-1),
                        group=group_ids(index, mask.device), max_response_len=limit,
                        logprobs=old_log_probs, behavior_logprobs=rollout_log_probs, ref_logprobs=ref_log_prob,
                        entropy=entropy, lengths=lengths, truncated=lengths >= limit)


def estimator_for(name: str):
    """verl estimator `explorl_<name>`: explorl's whole advantage step with `algo.advantage = name`."""

    def estimator(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index=None, config=None,
                  **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        if index is None:
            raise ValueError(f"{PREFIX}{name}: verl passed no `uid` index; explorl's estimators are group-relative")
        batch = rollout_batch(token_level_rewards, response_mask, index, old_log_probs=kwargs.get("old_log_probs"))
        if lookup("estimator", name).needs_sum_pi_squared:  # verl passes it to its own estimators only
            raise ConfigError(f"{PREFIX}{name}: {name} needs each token's sum_pi_squared, which verl 0.9.1 computes "
                              f"only in its legacy trainer (trainer.use_v1=false), for its own estimators: run it "
                              f"with explorl train or TRL's trainer")
        if lookup("estimator", name).needs_greedy_baseline:  # verl samples the greedy baseline for its own remax only
            if kwargs.get("reward_baselines") is None:
                raise ConfigError(f"{PREFIX}{name}: its baseline_rewards are each prompt's greedy response's reward, "
                                  f"which verl 0.9.1 samples only in its legacy trainer (trainer.use_v1=false), for "
                                  f"its own estimator: run it with explorl train or TRL's trainer")
            batch = batch.replace(baseline_rewards=kwargs["reward_baselines"].to(torch.float32))
        algo = algo_config((config or {}).get(CONFIG_KEY), group_size=int(torch.bincount(batch.group).max()),
                           advantage=name)
        shapers = [lookup("shaper", x) for x in algo.shapers]
        windowed = [e.name for e in shapers if e.needs_step is not None and e.needs_step(e.options_in(algo))]
        if windowed and "step" not in kwargs:
            raise ValueError(f"{PREFIX}{name}: the step window of shaper {windowed[0]!r} needs the training step; "
                             + TRAINER_HINT)
        try:
            batch = compute_advantages(batch, algo, step=int(kwargs.get("step", 1)))
        except MissingInputError as e:
            raise MissingInputError(f"{PREFIX}{name}: {e}; verl's estimator call carries only rewards and the "
                                    f"mask: {TRAINER_HINT}") from None
        if batch.token_weights is not None or batch.is_weights is not None:
            raise ValueError(f"{PREFIX}{name}: algorithm.explorl.token_filter / importance_weights produce per-token "
                             f"loss weights that verl's estimator call cannot return; {TRAINER_HINT}")
        advantages = batch.advantages.to(token_level_rewards.dtype)
        return advantages, advantages

    estimator.__name__ = f"{PREFIX}{name}"
    estimator.__doc__ = f"explorl's `{name}` advantage step (docs/methods.md) in verl's estimator registry."
    return estimator


def _verl_value(config, key: str, default):
    """`config[a][b]` for the dotted `key` `a.b` of verl's actor config (a mapping or DictConfig), or `default`."""
    value = config
    for part in key.split("."):
        value = (value or {}).get(part) if hasattr(value or {}, "get") else None
    return default if value is None else value


def loss_settings(config, name: str) -> dict:
    """explorl's `algo` settings for loss `name` from verl's actor config (`ActorConfig` or its DictConfig, with
    `policy_loss`): the clip range, and the loss's options where verl keeps them (`verl_fields`; e.g. the dual clip
    only for losses that take one: verl's Clip-Cov and KL-Cov have none)."""
    clip = config.get("clip_ratio", 0.2)
    low, high = config.get("clip_ratio_low"), config.get("clip_ratio_high")
    settings: dict = {"eps_low": clip if low is None else low, "eps_high": clip if high is None else high}
    entry = lookup("policy_loss", name)
    fields = verl_fields(name)
    if fields:
        values = {option: _verl_value(config, f.key, f.default) for option, f in fields.items()}
        settings[entry.options_owner] = {option: None if values[option] is None else f.factor * values[option]
                                         for option, f in fields.items()}  # None: verl has no value (DRO's beta)
    return settings


def verl_scale(mask: torch.Tensor, agg: str, info: Mapping) -> float:
    """Factor turning explorl's aggregate over this micro-batch into verl's global-batch normalisation.

    explorl divides by the micro-batch's own tokens (token-mean), non-empty rows (seq-mean-token-mean) or rows
    (seq-mean-token-sum-norm); verl by the global batch's (`batch_num_tokens`, `global_batch_size`), times the
    data-parallel size (`agg_loss` in verl/trainer/ppo/core_algos.py). Without global information both are local.
    """
    dp = info.get("dp_size") or 1
    nonempty = float((mask.sum(-1) > 0).sum())
    if agg == "token-mean":
        local, total = float(mask.sum()), info.get("batch_num_tokens")
    elif agg == "seq-mean-token-mean":
        local, total = nonempty, info.get("global_batch_size")
    else:
        local, total = float(mask.shape[0]), info.get("global_batch_size")
    total = float(total) if total is not None else (nonempty if agg != "token-mean" else local)
    return local / total * dp if total > 0 else 0.0


SUPPORTED_AGG = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def policy_loss_for(name: str):
    """verl policy loss `explorl_<name>`: explorl's registered loss variant, aggregated as verl aggregates."""
    entry = lookup("policy_loss", name)

    def loss_fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode: str = "token-mean", config=None,
                rollout_is_weights=None):
        if entry.needs_topk is not None:  # verl hands a loss old and new log-probs of the sampled tokens only
            raise ConfigError(f"actor_rollout_ref.actor.policy_loss.loss_mode={PREFIX}{name} (algo.loss={name}): it "
                              f"reads each token's top-K log-probs under the current policy and pi_old, which verl's "
                              f"actor does not compute; run it in explorl's loop (explorl train)")
        if loss_agg_mode not in SUPPORTED_AGG:
            raise ValueError(f"{PREFIX}{name}: actor.loss_agg_mode={loss_agg_mode!r} is not one of explorl's "
                             f"aggregations {', '.join(SUPPORTED_AGG)}")
        algo = algo_config(loss_settings(config, name), prefix="actor_rollout_ref.actor.", loss=name,
                           loss_agg=loss_agg_mode)
        info = _plain(config.get("global_batch_info") or {})
        mask = response_mask.to(log_prob.dtype)
        max_len = info.get("loss_scale_factor") or mask.shape[-1]  # verl's seq-mean-token-sum-norm horizon
        batch = RolloutBatch.for_loss(mask, advantages, logprobs=old_log_prob, max_response_len=int(max_len),
                                      is_weights=rollout_is_weights)
        loss, stats = entry.bind(algo)(log_prob, batch, algo)
        metrics = {f"actor/{PREFIX}{k.split('/', 1)[-1]}": v for k, v in stats.items()}
        return loss * verl_scale(mask, loss_agg_mode, info), metrics

    loss_fn.__name__ = f"{PREFIX}{name}"
    loss_fn.__doc__ = f"explorl's `{name}` policy loss (docs/methods.md) in verl's policy-loss registry."
    return loss_fn


def register_all() -> list[str]:
    """Register every explorl estimator and policy loss with verl under `explorl_<name>`; returns the names.

    Idempotent: verl accepts a re-registration of the same function object, so the functions are cached.
    """
    from verl.trainer.ppo import core_algos  # verl: installed in its own venv only

    names = []
    for name in entries("estimator"):
        fn = _CACHE.setdefault(("estimator", name), estimator_for(name))
        core_algos.register_adv_est(f"{PREFIX}{name}")(fn)
        names.append(f"{PREFIX}{name}")
    for name in entries("policy_loss"):
        fn = _CACHE.setdefault(("policy_loss", name), policy_loss_for(name))
        if f"{PREFIX}{name}" not in core_algos.POLICY_LOSS_REGISTRY:
            core_algos.register_policy_loss(f"{PREFIX}{name}")(fn)
        names.append(f"{PREFIX}{name}")
    return names


_CACHE: dict[tuple[str, str], Any] = {}
