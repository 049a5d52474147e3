"""explorl's verl trainer: verl's synchronous v1 trainer with explorl's advantage step.

verl's estimator call carries rewards and the response mask only. ERPO (entropy, reference log-probs), the
covariance and PPL shapers (pi_old's log-probs), the entropy-based advantage, the forking-token filter (entropies),
truncated importance weights (the rollout engine's log-probs) and step windows (the training step) need more. This
trainer replaces verl's `_compute_advantage` by `explorl_advantages` on everything verl has computed by then, and
hands the per-token loss weights (TIS x token filter) to verl's actor as `rollout_is_weights`, which verl's policy
losses multiply into the token loss, as explorl's `is_weights` and `token_weights` are.

Select it with `trainer.v1.trainer_mode=explorl` and `+algorithm.explorl.<field>=...` (explorl's `AlgoConfig`).
"""

from __future__ import annotations

import torch

from explorl.algos import compute_advantages
from explorl.integrations.verl.adapters import CONFIG_KEY, algo_config, rollout_batch

FIELDS = ("uid", "response_mask", "rm_scores", "rollout_log_probs", "old_log_probs", "ref_log_prob", "entropy")
"""What `_compute_advantage` reads from verl's batch store (verl's own list plus the entropies)."""


def explorl_advantages(data, algorithm_config, step: int) -> dict[str, float]:
    """Fill `advantages`, `returns` and (when the method weights tokens) `rollout_is_weights` of a verl `DataProto`.

    `data.batch` holds `token_level_rewards` and `response_mask` `[N, T]` and, when verl computed them,
    `old_log_probs`, `entropy`, `ref_log_prob`, `rollout_log_probs`; `data.non_tensor_batch["uid"]` the prompt ids.
    `algorithm_config` is verl's `algorithm` section (its `explorl` mapping holds explorl's settings). Returns the
    method's metrics (explorl's names under `explorl/`).
    """
    b = data.batch
    get = (lambda k: b[k] if k in b.keys() else None)
    batch = rollout_batch(b["token_level_rewards"], b["response_mask"], data.non_tensor_batch["uid"],
                          old_log_probs=get("old_log_probs"), ref_log_prob=get("ref_log_prob"),
                          entropy=get("entropy"), rollout_log_probs=get("rollout_log_probs"))
    algo = algo_config((algorithm_config or {}).get(CONFIG_KEY), group_size=int(torch.bincount(batch.group).max()))
    prepared = compute_advantages(batch, algo, step=step)
    advantages = prepared.advantages.to(b["token_level_rewards"].dtype)
    b["advantages"], b["returns"] = advantages, advantages
    weights = None
    for w in (prepared.is_weights, prepared.token_weights):
        if w is not None:
            weights = w if weights is None else weights * w
    if weights is not None:
        b["rollout_is_weights"] = weights.to(advantages.dtype)
    return {f"explorl/{k}": v for k, v in prepared.stats.items()}


def register_trainer() -> bool:
    """Register `ExplorlTrainer` as verl's v1 trainer mode `explorl`; False when verl's v1 trainer cannot be imported
    here (it needs TransferQueue and Ray, installed by `explorl[verl]`)."""
    try:
        from verl.trainer.ppo.v1 import trainer_base
        from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
    except ImportError:
        return False
    if "explorl" in trainer_base.TRAINER_REGISTRY:
        return True

    @trainer_base.register_trainer("explorl")
    class ExplorlTrainer(PPOTrainerSync):
        """verl's synchronous trainer; advantages from explorl's step (`explorl_advantages`)."""

        def _compute_advantage(self, batch, metrics: dict):
            import numpy as np
            import transfer_queue as tq
            from tensordict import TensorDict
            from verl import DataProto
            from verl.workers.utils.padding import response_to_nested

            data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=list(FIELDS))
            response_mask = data["response_mask"]
            data = DataProto(batch=data.to_padded_tensor())
            data.batch["token_level_rewards"] = data.batch["rm_scores"]
            data.non_tensor_batch["uid"] = np.array(data.batch.pop("uid").tolist(), dtype=object)
            metrics.update(explorl_advantages(data, self.config.algorithm, step=self.global_steps))
            fields = ["advantages", "returns"] + (["rollout_is_weights"] if "rollout_is_weights" in data.batch.keys()
                                                  else [])
            output = TensorDict({f: response_to_nested(data.batch[f], response_mask) for f in fields},
                                batch_size=len(batch))
            return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=output)

    return True
