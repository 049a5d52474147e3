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

Given `+explorl.config=PATH` (an explorl YAML; `examples/verl/launch.py` sets it), it also writes explorl's run
directory at that config's `run.out_dir` (`explorl.runs.engine`): config.yaml and engine.json before the
first step, then one metrics.jsonl record per step with `explorl train`'s keys (`RunWriter`), so that `explorl
analyze` and `explorl compare` read a verl run. The correctness and per-function rewards come from the reward
bridge's extra info (`explorl.integrations.verl.reward`); a step whose rewards failed on more than
`task.max_reward_failure_frac` of its samples stops the run before the update, as `explorl train` does.

verl's base trainer treats every trainer mode other than `sync` as asynchronous (an asynchronous replay buffer,
prompt-by-prompt refills, TransferQueue checkpoints); this trainer is verl's synchronous one and says so
(`trainer_mode` is `sync` inside the object), so verl samples, filters (DAPO's `algorithm.filter_groups`) and
checkpoints as for `trainer.v1.trainer_mode=sync`.

Select it with `trainer.v1.trainer_mode=explorl` and `+algorithm.explorl.<field>=...` (explorl's `AlgoConfig`;
`+algorithm.explorl.sampling.<field>` and `+algorithm.explorl.budget.<field>` for the controllers).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch

from explorl.algos import RolloutBatch, compute_advantages
from explorl.algos.step import PreparedBatch
from explorl.integrations.verl.adapters import CONFIG_KEY, algo_config, rollout_batch
from explorl.integrations.verl.rollout import (
    AGENT_LOOP,
    ANNEAL_FIELD,
    TEMPERATURE_FIELD,
    RolloutControl,
    needs_control,
    observed_per_prompt,
    rollout_config,
)

FIELDS = ("uid", "response_mask", "rm_scores", "rollout_log_probs", "old_log_probs", "ref_log_prob", "entropy")
"""What `_compute_advantage` reads from verl's batch store (verl's own list plus the entropies)."""
RUN_KEY = "explorl"
"""Top-level section of verl's config naming the explorl config of the run (`+explorl.config=PATH`)."""
REWARD_INFO = "reward_extra_info"
"""`DataProto.non_tensor_batch` key of the per-response dicts the reward function returned (verl's name)."""


def advantage_step(data, algorithm_config, step: int,
                   response_length: int | None = None) -> tuple[RolloutBatch, PreparedBatch]:
    """Fill `advantages`, `returns` and (when the method weights tokens) `rollout_is_weights` of a verl `DataProto`;
    returns explorl's view of the batch and what its advantage step made of it.

    `data.batch` holds `token_level_rewards` and `response_mask` `[N, T]` and, when verl computed them,
    `old_log_probs`, `entropy`, `ref_log_prob`, `rollout_log_probs`; `data.non_tensor_batch["uid"]` the prompt ids.
    `algorithm_config` is verl's `algorithm` section (its `explorl` mapping holds explorl's settings).
    `response_length`: the rollout's length limit (truncation, DAPO's overlong shaping); None: the padded width.
    """
    b = data.batch

    def get(key: str):
        return b[key] if key in b.keys() else None

    batch = rollout_batch(b["token_level_rewards"], b["response_mask"], data.non_tensor_batch["uid"],
                          old_log_probs=get("old_log_probs"), ref_log_prob=get("ref_log_prob"),
                          entropy=get("entropy"), rollout_log_probs=get("rollout_log_probs"),
                          max_response_len=response_length)
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
    return batch, prepared


def explorl_advantages(data, algorithm_config, step: int, response_length: int | None = None) -> dict[str, float]:
    """`advantage_step`, returning the method's metrics (explorl's names under `explorl/`)."""
    _, prepared = advantage_step(data, algorithm_config, step, response_length)
    return {f"explorl/{k}": v for k, v in prepared.stats.items()}


def reward_infos(extra_fields) -> np.ndarray:
    """Each response's reward extra info (the dict the reward function returned beside `score`) from the
    `extra_fields` verl's agent loop stores per trajectory, as an object array `[N]` of dicts."""
    rows = extra_fields.tolist() if hasattr(extra_fields, "tolist") else list(extra_fields)
    out = np.empty(len(rows), dtype=object)
    for i, row in enumerate(rows):
        row = getattr(row, "data", row)  # tensordict's NonTensorData
        info = row.get(REWARD_INFO) if isinstance(row, dict) else None
        out[i] = dict(info) if isinstance(info, dict) else {}
    return out


class RunWriter:
    """explorl's run directory for a verl run: the explorl config at `config_path` (what the launcher converted to
    verl's overrides) names it (`run.out_dir`).

    `write` appends one step's record (`rundir.step_record`: `explorl train`'s keys) from the batch verl has after
    the advantage step; the directory is opened on the first write (config.yaml with the weights' fingerprint,
    engine.json with `launch`), continued when verl resumed from a checkpoint (its records after the resumed step
    are dropped, as `explorl train --resume` does).
    """

    def __init__(self, config_path: str | Path, launch: dict | None = None):
        from explorl.config import load_config
        from explorl.rewards import reward_entries, reward_metric_name

        self.config_path = str(config_path)
        self.cfg = load_config(config_path)
        self.launch = dict(launch or {})
        command = Path(config_path).parent / "command.json"  # what examples/verl/launch.py ran
        if command.is_file() and "command" not in self.launch:
            self.launch["command"] = json.loads(command.read_text()).get("command")
        self.log = None
        entries = reward_entries(self.cfg.task.reward)
        self.reward_names = [reward_metric_name(e) for e in entries] if len(entries) > 1 else []

    def open(self, step: int):
        """The run directory, opened for verl's step `step` (1-based; > 1: verl resumed from a checkpoint)."""
        if self.log is None:
            from explorl.runs.engine import open_engine_run

            resume = step > 1
            try:
                self.log = open_engine_run(self.cfg, "verl", resume=resume, explorl_config=self.config_path,
                                           **self.launch)
            except FileExistsError:
                raise FileExistsError(
                    f"run.out_dir {self.cfg.run.out_dir} already holds a run and verl found no checkpoint to "
                    f"continue it from (trainer.default_local_dir); choose another run.out_dir, or remove the old "
                    f"run") from None
            if resume:
                self.log.truncate_metrics(step - 1)
                self.log.truncate_samples(step - 1)
        return self.log

    def record(self, step: int, data, batch: RolloutBatch, prepared: PreparedBatch, *, keep=None,
               temperatures: torch.Tensor | None = None, extra: dict | None = None) -> dict:
        """The step's record. `data.non_tensor_batch[REWARD_INFO]` (optional) holds each response's reward extra
        info: `correct` (by the task's rule), each reward function's score under its metric name, `reward_failed`,
        `reward_errors`, `reward_timeouts` (`explorl.integrations.verl.reward`); without it a response is correct
        when its reward exceeds `task.correct_threshold`. `keep` `[N]` bool: the real responses (verl pads a batch
        with no-op rows). `temperatures` `[N]`: each response's request temperature (None: 1). Raises
        `guards.RunStopped` when more than `task.max_reward_failure_frac` of the responses failed to score."""
        from explorl.train.guards import RunStopped, too_many_reward_failures
        from explorl.runs.engine import step_record
        from explorl.rewards import RewardResult

        n = len(batch.rewards)
        rows = torch.as_tensor(np.ones(n, dtype=bool) if keep is None else np.asarray(keep, dtype=bool))
        idx = torch.nonzero(rows).flatten()
        infos = data.non_tensor_batch.get(REWARD_INFO) if hasattr(data, "non_tensor_batch") else None
        infos = [dict(infos[i] or {}) for i in idx.tolist()] if infos is not None else [{} for _ in idx.tolist()]
        rewards = prepared.rewards[idx]
        if infos and all("correct" in info for info in infos):
            correct = torch.tensor([bool(float(info["correct"]) > 0.5) for info in infos])
        else:
            correct = batch.rewards[idx] > self.cfg.task.correct_threshold
        failed = sum(float(info.get("reward_failed", 0)) for info in infos)
        if too_many_reward_failures(failed, len(infos), self.cfg):
            raise RunStopped(
                f"stopping before the update of verl step {step}: the reward failed or timed out on {failed:g} of "
                f"{len(infos)} samples (more than task.max_reward_failure_frac="
                f"{self.cfg.task.max_reward_failure_frac:g}), so the step would train on zeros. Fix task.reward="
                f"{self.cfg.task.reward} (or raise task.reward_timeout_s); verl resumes from its last checkpoint")
        result = RewardResult(rewards=rewards.tolist(),
                              errors=int(sum(float(i.get("reward_errors", 0)) for i in infos)),
                              timeouts=int(sum(float(i.get("reward_timeouts", 0)) for i in infos)),
                              by_function={name: [float(i[name]) for i in infos] for name in self.reward_names
                                           if infos and all(name in i for i in infos)})
        group = torch.unique(batch.group[idx], return_inverse=True)[1]
        mask = batch.mask[idx]
        temps = None if temperatures is None else temperatures[idx].float()[:, None].expand_as(mask)
        return step_record(step, rewards=rewards, correct=correct, group=group, mask=mask,
                           advantages=prepared.advantages[idx],
                           entropy=None if batch.entropy is None else batch.entropy[idx],
                           truncated=batch.truncated[idx], temperatures=temps, reward_result=result,
                           extra={**prepared.stats, **(extra or {})})

    def write(self, step: int, data, batch: RolloutBatch, prepared: PreparedBatch, **kwargs) -> dict:
        """`record`, appended to the run's metrics.jsonl; returns it."""
        record = self.record(step, data, batch, prepared, **kwargs)
        self.open(step).append_metrics(record)
        return record


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
                from transformers import AutoConfig

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
                with open(os.path.join(path, "explorl_rollout.json"), "w") as f:
                    json.dump(self._control.state_dict(), f)

        def _load_checkpoint(self):
            super()._load_checkpoint()
            path = os.path.join(self._checkpoint_folder(), "explorl_rollout.json")
            if self.global_steps > 0 and os.path.exists(path):
                with open(path) as f:
                    self._control_state = json.load(f)

        def _compute_advantage(self, batch, metrics: dict):
            import transfer_queue as tq
            from tensordict import TensorDict
            from verl import DataProto
            from verl.workers.utils.padding import response_to_nested

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
            fields = ["advantages", "returns"] + (["rollout_is_weights"] if "rollout_is_weights" in data.batch.keys()
                                                  else [])
            output = TensorDict({f: response_to_nested(data.batch[f], response_mask) for f in fields},
                                batch_size=len(batch))
            return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=output)

        def _explorl_step(self, data, keep=None) -> dict:
            """explorl's advantage step on the `DataProto` of verl's step (advantages written into it), the
            controllers told what came back, the run directory's record written; returns verl's metrics.
            `keep` `[N]` bool: the real responses (verl pads a batch with no-op rows of uid `pad...`)."""
            keep = np.ones(len(data), dtype=bool) if keep is None else np.asarray(keep, dtype=bool)
            rollout = self.config.actor_rollout_ref.rollout
            batch, prepared = advantage_step(data, self.config.algorithm, step=self.global_steps,
                                             response_length=int(rollout.response_length))
            metrics = {f"explorl/{k}": v for k, v in prepared.stats.items()}
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
            writer = self._run_writer()
            if writer is not None:  # also into verl's own log: its v1 trainer logs no reward extra info in training
                record = writer.write(self.global_steps, data, batch, prepared, keep=keep, temperatures=temperatures,
                                      extra=extra)
                metrics.update({f"explorl/{k}": v for k, v in record.items()
                                if k.startswith("reward/") and isinstance(v, (int, float))})
            return metrics

    return True
