"""explorl's verl trainer: verl's synchronous v1 trainer with explorl's advantage step.

verl's estimator call carries rewards and the response mask only. ERPO (entropy, reference log-probs), the
covariance and PPL shapers (pi_old's log-probs), the entropy-based advantage, the forking-token filter (entropies),
truncated importance weights (the rollout engine's log-probs) and step windows (the training step) need more. This
trainer replaces verl's `_compute_advantage` by `explorl_advantages` on everything verl has computed by then, and
hands the per-token loss weights (TIS x token filter) to verl's actor as `rollout_is_weights`, which verl's policy
losses multiply into the token loss, as explorl's `is_weights` and `token_weights` are.

It also drives explorl's rollout controllers (`rollout.py`) when `algorithm.explorl.sampling.schedule` or
`algorithm.explorl.budget.policy` asks for them: before each batch is generated it gives each prompt its rollout
count (`__rollout_n__`, E3's budgets), its request temperature (E3's tau, per-prompt temperature) and EAD's
annealing arguments (sampled through the `explorl_single_turn` agent loop and, per token, vLLM's
`explorl.integrations.vllm:EADLogitsProcessor`), and sets the actor's training temperature; after the rewards
and entropies are in, it tells the controllers. Their state is saved with each verl checkpoint
(`explorl_rollout.json`) and restored on resume.

Select it with `trainer.v1.trainer_mode=explorl` and `+algorithm.explorl.<field>=...` (explorl's `AlgoConfig`;
`+algorithm.explorl.sampling.<field>` and `+algorithm.explorl.budget.<field>` for the controllers).
"""

from __future__ import annotations

import json
import os

import torch

from explorl.algos import compute_advantages
from explorl.integrations.verl.adapters import CONFIG_KEY, algo_config, rollout_batch
from explorl.integrations.verl.rollout import (AGENT_LOOP, ANNEAL_FIELD, TEMPERATURE_FIELD, RolloutControl,
                                              needs_control, observed_per_prompt, rollout_config)

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

        import explorl.integrations.verl.agent_loop  # noqa: F401  (registers `explorl_single_turn`)
    except ImportError:
        return False
    if "explorl" in trainer_base.TRAINER_REGISTRY:
        return True

    @trainer_base.register_trainer("explorl")
    class ExplorlTrainer(PPOTrainerSync):
        """verl's synchronous trainer; advantages from explorl's step (`explorl_advantages`), sampling steered by
        explorl's rollout controllers (`RolloutControl`) when configured."""

        _control: RolloutControl | None = None
        _control_state: dict | None = None
        _prompt_index: dict
        _plan_stats: dict

        def _rollout_control(self) -> RolloutControl | None:
            settings = (self.config.algorithm or {}).get(CONFIG_KEY)
            if self._control is None and needs_control(settings):
                from transformers import AutoConfig

                rollout = self.config.actor_rollout_ref.rollout
                cfg = rollout_config(settings, temperature=rollout.temperature, group_size=rollout.n,
                                     max_new_tokens=rollout.response_length, top_p=rollout.top_p,
                                     total_steps=self.total_training_steps)
                model_path = self.config.actor_rollout_ref.model.path
                vocab_size = AutoConfig.from_pretrained(model_path, trust_remote_code=True).vocab_size
                self._control = RolloutControl(cfg, vocab_size, len(self.train_dataset))
                if self._control_state is not None:
                    self._control.load_state_dict(self._control_state)
                self._prompt_index, self._plan_stats = {}, {}
            return self._control

        def _next_train_batch(self, num_prompts: int | None = None):
            batch = super()._next_train_batch(num_prompts)
            control = self._rollout_control()
            if control is None:
                return batch
            from omegaconf import open_dict
            from verl.utils import tensordict_utils as tu

            index = batch["index"]
            ids = [int(i) for i in (index.tolist() if hasattr(index, "tolist") else list(index))]
            plan = control.plan(self.global_steps - 1, ids)  # verl counts steps from 1, explorl from 0
            batch["__rollout_n__"] = torch.tensor(plan.rollout_n, dtype=torch.long)
            batch[TEMPERATURE_FIELD] = torch.tensor(plan.temperature, dtype=torch.float64)
            if any(a is not None for a in plan.anneal):
                tu.assign_non_tensor_stack(batch, ANNEAL_FIELD, list(plan.anneal))
            if "agent_name" in batch.keys():
                raise ValueError(f"the dataset sets `agent_name`; explorl's per-prompt sampling runs in the "
                                 f"`{AGENT_LOOP}` agent loop (single turn): drop the field, or apply "
                                 f"{TEMPERATURE_FIELD} / {ANNEAL_FIELD} in your agent loop")
            tu.assign_non_tensor_data(batch, "agent_name", AGENT_LOOP)
            with open_dict(self.config):  # the actor's log-probs use it (old, reference, update)
                self.config.actor_rollout_ref.rollout.temperature = plan.train_temperature
            self._prompt_index.update(zip((str(u) for u in batch["uid"]), ids))
            self._plan_stats = plan.stats
            return batch

        def _checkpoint_folder(self) -> str:
            trainer = self.config.trainer
            if trainer.resume_mode == "resume_path" and trainer.get("resume_from_path"):
                return trainer.resume_from_path
            return os.path.join(trainer.default_local_dir, f"global_step_{self.global_steps}")

        def _save_checkpoint(self):
            super()._save_checkpoint()
            if self._control is not None:
                path = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
                with open(os.path.join(path, "explorl_rollout.json"), "w") as f:
                    json.dump(self._control.state_dict(), f)

        def _load_checkpoint(self):
            super()._load_checkpoint()
            path = os.path.join(self._checkpoint_folder(), "explorl_rollout.json")
            if self.global_steps > 0 and os.path.exists(path):
                with open(path) as f:
                    self._control_state = json.load(f)

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
            if self._control is not None:
                ids, rewards, entropy = observed_per_prompt(
                    data.non_tensor_batch["uid"], self._prompt_index, data.batch["token_level_rewards"],
                    data.batch["entropy"], data.batch["response_mask"])
                self._control.observe(self.global_steps - 1, ids, rewards, entropy)
                metrics.update({f"explorl/{k}": v for k, v in self._plan_stats.items()})
                metrics["explorl/temperature/train"] = float(self.config.actor_rollout_ref.rollout.temperature)
            fields = ["advantages", "returns"] + (["rollout_is_weights"] if "rollout_is_weights" in data.batch.keys()
                                                  else [])
            output = TensorDict({f: response_to_nested(data.batch[f], response_mask) for f in fields},
                                batch_size=len(batch))
            return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=output)

    return True
