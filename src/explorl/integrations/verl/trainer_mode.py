"""verl's trainer mode `explorl` (`trainer.v1.trainer_mode=explorl`): `ExplorlTrainer`, verl's synchronous v1
trainer with explorl's advantage step, explorl's rollout control and explorl's run directory (what it does and why:
`trainer.py`). Importing this module imports verl's v1 trainer (TransferQueue, Ray) and registers the class;
`trainer.register_trainer` does so where verl is installed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch
from transformers import AutoConfig
from verl.trainer.ppo.v1 import trainer_base
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

import explorl.integrations.verl.agent_loop  # noqa: F401  (registers `explorl_single_turn`)
from explorl.integrations.verl.adapters import CONFIG_KEY
from explorl.runs import nofollow
from explorl.integrations.verl.rollout import (
    AGENT_LOOP,
    ANNEAL_FIELD,
    TEMPERATURE_FIELD,
    RolloutControl,
    needs_control,
    observed_per_prompt,
    rollout_config,
)
from explorl.integrations.verl.step import (FIELDS, LOSS_MASK, REWARD_INFO, RUN_KEY, RunWriter, advantage_step,
                                           reward_infos)

__all__ = ["ExplorlTrainer"]


class ExplorlTrainer(PPOTrainerSync):
    """verl's synchronous trainer; advantages from explorl's step (`advantage_step`), sampling steered by
    explorl's rollout controllers (`RolloutControl`) when configured, explorl's run directory written when
    `+explorl.config` names the run's explorl config (`RunWriter`)."""

    _control: RolloutControl | None = None
    _control_state: dict | None = None
    _prompt_index: dict
    _plan_stats: dict
    _prompt_temperature: dict
    _writer: RunWriter | None = None

    @property
    def trainer_mode(self) -> str:
        """`sync` for verl's base class: it builds the synchronous replay buffer, dataloader and checkpoints
        for that name only (any other name is treated as an asynchronous trainer)."""
        return "sync"

    @trainer_mode.setter
    def trainer_mode(self, value: str) -> None:  # verl's __init__ assigns `trainer.v1.trainer_mode` (explorl)
        pass

    def _run_writer(self) -> RunWriter | None:
        path = ((self.config.get(RUN_KEY) or {}) if hasattr(self.config, "get") else {}).get("config")
        if self._writer is None and path:
            trainer = self.config.trainer
            self._writer = RunWriter(path, {"world_size": int(trainer.nnodes) * int(trainer.n_gpus_per_node),
                                            "trainer_mode": "explorl"})
        return self._writer

    def _rollout_control(self) -> RolloutControl | None:
        settings = (self.config.algorithm or {}).get(CONFIG_KEY)
        if self._control is None and needs_control(settings):
            rollout = self.config.actor_rollout_ref.rollout
            cfg = rollout_config(settings, temperature=rollout.temperature, group_size=rollout.n,
                                 max_new_tokens=rollout.response_length, top_p=rollout.top_p,
                                 total_steps=self.total_training_steps)
            model_path = self.config.actor_rollout_ref.model.path
            remote_code = bool(self.config.actor_rollout_ref.model.get("trust_remote_code", False))
            vocab_size = AutoConfig.from_pretrained(model_path, trust_remote_code=remote_code).vocab_size
            self._control = RolloutControl(cfg, vocab_size, len(self.train_dataset))
            if self._control_state is not None:
                self._control.load_state_dict(self._control_state)
            self._prompt_index, self._plan_stats, self._prompt_temperature = {}, {}, {}
        return self._control

    def _next_train_batch(self, num_prompts: int | None = None):
        batch = super()._next_train_batch(num_prompts)
        control = self._rollout_control()
        if control is None:
            return batch
        from omegaconf import open_dict  # verl's: its own venv only
        from verl.utils import tensordict_utils as tu  # verl: installed in its own venv only

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
        uids = [str(u) for u in batch["uid"]]
        self._prompt_index.update(zip(uids, ids))
        self._prompt_temperature.update(zip(uids, plan.temperature))
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
            nofollow.write_atomic(Path(path) / "explorl_rollout.json", json.dumps(self._control.state_dict()))

    def _load_checkpoint(self):
        super()._load_checkpoint()
        path = os.path.join(self._checkpoint_folder(), "explorl_rollout.json")
        if self.global_steps > 0 and os.path.exists(path):
            with open(path) as f:
                self._control_state = json.load(f)

    def _compute_advantage(self, batch, metrics: dict):
        import transfer_queue as tq  # verl's: its own venv only
        from tensordict import TensorDict  # verl's: its own venv only
        from verl import DataProto  # verl: installed in its own venv only
        from verl.workers.utils.padding import response_to_nested  # verl: installed in its own venv only

        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=list(FIELDS))
        response_mask = data["response_mask"]
        data = DataProto(batch=data.to_padded_tensor())
        data.batch["token_level_rewards"] = data.batch["rm_scores"]
        data.non_tensor_batch["uid"] = np.array(data.batch.pop("uid").tolist(), dtype=object)
        if self._run_writer() is not None:
            extra = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                                    select_fields=["extra_fields"])
            data.non_tensor_batch[REWARD_INFO] = reward_infos(extra["extra_fields"])
        keep = np.array([not tag.get("is_padding", False) for tag in batch.tags], dtype=bool)
        metrics.update(self._explorl_step(data, keep))
        fields = ["advantages", "returns"] + [f for f in ("rollout_is_weights", LOSS_MASK) if f in data.batch.keys()]
        # the loss mask goes back as verl's response_mask (as verl's own rejection sampling writes it)
        output = TensorDict({"response_mask" if f == LOSS_MASK else f: response_to_nested(data.batch[f], response_mask)
                             for f in fields}, batch_size=len(batch))
        return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=output)

    def _explorl_step(self, data, keep=None) -> dict:
        """explorl's advantage step on the `DataProto` of verl's step (advantages written into it), the
        controllers told what came back, the run directory's record written; returns verl's metrics.
        `keep` `[N]` bool: the real responses (verl pads a batch with no-op rows of uid `pad...`)."""
        keep = np.ones(len(data), dtype=bool) if keep is None else np.asarray(keep, dtype=bool)
        rollout = self.config.actor_rollout_ref.rollout
        writer = self._run_writer()
        batch = advantage_step(data, self.config.algorithm, step=self.global_steps,
                               response_length=int(rollout.response_length),
                               reward_parts=writer.reward_parts(data, keep) if writer is not None else None)
        metrics = {f"explorl/{k}": v for k, v in batch.stats.items()}
        extra = {"temperature/train": float(rollout.temperature)}
        temperatures = torch.full((len(data),), float(rollout.temperature))
        if self._control is not None:
            rows = torch.as_tensor(keep)
            uids = data.non_tensor_batch["uid"][keep]
            planned = self._prompt_temperature
            all_uids = [str(u) for u in data.non_tensor_batch["uid"]]
            temperatures = torch.tensor([float(planned.get(u, rollout.temperature)) for u in all_uids])
            for u in set(all_uids):
                planned.pop(u, None)
            ids, rewards, entropy = observed_per_prompt(
                uids, self._prompt_index, data.batch["token_level_rewards"][rows], data.batch["entropy"][rows],
                data.batch["response_mask"][rows])
            self._control.observe(self.global_steps - 1, ids, rewards, entropy)
            metrics.update({f"explorl/{k}": v for k, v in self._plan_stats.items()})
            metrics["explorl/temperature/train"] = float(rollout.temperature)
            extra.update(self._plan_stats)
        if writer is not None:  # also into verl's own log: its v1 trainer logs no reward extra info in training
            record = writer.write(self.global_steps, data, batch, keep=keep, temperatures=temperatures, extra=extra)
            metrics.update({f"explorl/{k}": v for k, v in record.items()
                            if k.startswith("reward/") and isinstance(v, (int, float))})
        return metrics


if "explorl" not in trainer_base.TRAINER_REGISTRY:
    trainer_base.register_trainer("explorl")(ExplorlTrainer)
