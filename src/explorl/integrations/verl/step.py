"""explorl's part of one verl step that needs none of verl's classes: the advantage step on a verl `DataProto`
(`advantage_step`, `explorl_advantages`: verl's tensors in, explorl's `compute_advantages`, advantages and per-token
loss weights out) and explorl's run directory for a verl run (`RunWriter`: one metrics record per step with `explorl
train`'s keys). verl's trainer mode `explorl` (`trainer_mode.py`) calls them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from explorl.algos import RolloutBatch, compute_advantages
from explorl.config import load_config
from explorl.integrations.run_dir import open_engine_run, step_record
from explorl.integrations.verl.adapters import CONFIG_KEY, algo_config, rollout_batch
from explorl.integrations.verl.reward import metric_key
from explorl.rewards import RewardResult, reward_entries, reward_metric_name
from explorl.train.guards import RunStopped, too_many_reward_failures

__all__ = ["FIELDS", "LOSS_MASK", "REWARD_INFO", "RUN_KEY", "RewardParts", "RunWriter", "advantage_step",
           "explorl_advantages", "reward_infos"]

FIELDS = ("uid", "response_mask", "rm_scores", "rollout_log_probs", "old_log_probs", "ref_log_prob", "entropy")
"""What `_compute_advantage` reads from verl's batch store (verl's own list plus the entropies)."""
RUN_KEY = "explorl"
"""Top-level section of verl's config naming the explorl config of the run (`+explorl.config=PATH`)."""
REWARD_INFO = "reward_extra_info"
"""`DataProto.non_tensor_batch` key of the per-response dicts the reward function returned (verl's name)."""
LOSS_MASK = "explorl_loss_mask"
"""`DataProto.batch` key of the loss mask when a reward shaper took tokens out of it (`rollout_rs`' rejection, DAPO's
overlong filter): the trainer writes it back as verl's `response_mask`, as verl's own rejection sampling does, so
verl's aggregation divides by the tokens kept."""


@dataclass(frozen=True)
class RewardParts:
    """Each of the task's K > 1 reward functions' own scores (`components` `[N, K]`, unweighted) and their weights,
    for estimators that take the reward apart (`needs_reward_components`: GDPO)."""

    components: torch.Tensor
    weights: tuple[float, ...]


def advantage_step(data, algorithm_config, step: int, response_length: int | None = None,
                   reward_parts: RewardParts | None = None) -> RolloutBatch:
    """Fill `advantages`, `returns`, (when the method weights tokens) `rollout_is_weights` and (when a reward shaper
    took tokens out of the loss) `LOSS_MASK` of a verl `DataProto`; returns explorl's view of the batch through its
    advantage step (`compute_advantages`).

    `data.batch` holds `token_level_rewards` and `response_mask` `[N, T]` and, when verl computed them,
    `old_log_probs`, `entropy`, `ref_log_prob`, `rollout_log_probs`; `data.non_tensor_batch["uid"]` the prompt ids.
    `algorithm_config` is verl's `algorithm` section (its `explorl` mapping holds explorl's settings).
    `response_length`: the rollout's length limit (truncation, DAPO's overlong shaping); None: the padded width.
    `reward_parts`: each reward function's own scores (several `task.reward` functions; `RunWriter.reward_parts`).
    """
    b = data.batch

    def get(key: str):
        return b[key] if key in b.keys() else None

    batch = rollout_batch(b["token_level_rewards"], b["response_mask"], data.non_tensor_batch["uid"],
                          old_log_probs=get("old_log_probs"), ref_log_prob=get("ref_log_prob"),
                          entropy=get("entropy"), rollout_log_probs=get("rollout_log_probs"),
                          max_response_len=response_length)
    if reward_parts is not None:
        batch = batch.replace(reward_components=reward_parts.components.to(batch.mask.device),
                              reward_weights=reward_parts.weights)
    algo = algo_config((algorithm_config or {}).get(CONFIG_KEY), group_size=int(torch.bincount(batch.group).max()))
    batch = compute_advantages(batch, algo, step=step)
    advantages = batch.advantages.to(b["token_level_rewards"].dtype)
    b["advantages"], b["returns"] = advantages, advantages
    weights = None
    for w in (batch.is_weights, batch.token_weights):
        if w is not None:
            weights = w if weights is None else weights * w
    if weights is not None:
        b["rollout_is_weights"] = weights.to(advantages.dtype)
    if not torch.equal(batch.loss_mask, batch.mask):
        b[LOSS_MASK] = batch.loss_mask.to(b["response_mask"].dtype)
    return batch


def explorl_advantages(data, algorithm_config, step: int, response_length: int | None = None) -> dict[str, float]:
    """`advantage_step`, returning the method's metrics (explorl's names under `explorl/`)."""
    batch = advantage_step(data, algorithm_config, step, response_length)
    return {f"explorl/{k}": v for k, v in batch.stats.items()}


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

    `write` appends one step's record (`run_dir.step_record`: `explorl train`'s keys) from the batch verl has after
    the advantage step; the directory is opened on the first write (config.yaml with the weights' fingerprint,
    engine.json with `launch`), continued when verl resumed from a checkpoint (its records after the resumed step
    are dropped, as `explorl train --resume` does).
    """

    def __init__(self, config_path: str | Path, launch: dict | None = None):
        self.config_path = str(config_path)
        self.cfg = load_config(config_path)
        self.launch = dict(launch or {})
        command = Path(config_path).parent / "command.json"  # what examples/verl/launch.py ran
        if command.is_file() and "command" not in self.launch:
            self.launch["command"] = json.loads(command.read_text()).get("command")
        self.log = None
        entries = reward_entries(self.cfg.task.reward)
        self.reward_names = [reward_metric_name(e) for e in entries] if len(entries) > 1 else []
        weights = self.cfg.task.reward_weights
        self.reward_weights = tuple(float(w) for w in (weights if weights is not None else [1.0] * len(entries)))

    def reward_parts(self, data, keep=None) -> RewardParts | None:
        """Each reward function's own score of each response (`RewardParts`), from the reward extra info the reward
        bridge returns (`explorl.integrations.verl.reward`: each function under its metric name); None with one
        function. `keep` `[N]` bool: the real responses (verl's padding rows score 0 throughout)."""
        if not self.reward_names:
            return None
        infos = data.non_tensor_batch.get(REWARD_INFO) if hasattr(data, "non_tensor_batch") else None
        n = len(data)
        keep = np.ones(n, dtype=bool) if keep is None else np.asarray(keep, dtype=bool)
        components = torch.zeros(n, len(self.reward_names))
        for i in np.flatnonzero(keep):
            info = dict(infos[i] or {}) if infos is not None else {}
            missing = [name for name in self.reward_names if metric_key(name) not in info]
            if missing:
                raise ValueError(f"verl's reward extra info of response {i} has no score of reward function "
                                 f"{missing[0]!r}: the estimator takes the task.reward functions apart, which needs "
                                 f"explorl's reward bridge (explorl.integrations.verl.reward, which "
                                 f"examples/verl/launch.py selects)")
            components[i] = torch.tensor([float(info[metric_key(name)]) for name in self.reward_names])
        return RewardParts(components, self.reward_weights)

    def open(self, step: int):
        """The run directory, opened for verl's step `step` (1-based; > 1: verl resumed from a checkpoint)."""
        if self.log is None:
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

    def record(self, step: int, data, batch: RolloutBatch, *, keep=None, temperatures: torch.Tensor | None = None,
               extra: dict | None = None) -> dict:
        """The step's record of `batch` (`advantage_step`'s). `data.non_tensor_batch[REWARD_INFO]` (optional) holds
        each response's reward extra info: `correct` (by the task's rule), each reward function's score under its
        metric name, `reward_failed`, `reward_errors`, `reward_timeouts` (`explorl.integrations.verl.reward`);
        without it a response is correct when its reward exceeds `task.correct_threshold`. `keep` `[N]` bool: the real responses (verl pads a batch
        with no-op rows). `temperatures` `[N]`: each response's request temperature (None: 1). Raises
        `guards.RunStopped` when more than `task.max_reward_failure_frac` of the responses failed to score."""
        n = len(batch.rewards)
        rows = torch.as_tensor(np.ones(n, dtype=bool) if keep is None else np.asarray(keep, dtype=bool))
        idx = torch.nonzero(rows).flatten()
        infos = data.non_tensor_batch.get(REWARD_INFO) if hasattr(data, "non_tensor_batch") else None
        infos = [dict(infos[i] or {}) for i in idx.tolist()] if infos is not None else [{} for _ in idx.tolist()]
        rewards = batch.shaped_rewards[idx]
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
                              by_function={name: [float(i[metric_key(name)]) for i in infos]
                                           for name in self.reward_names
                                           if infos and all(metric_key(name) in i for i in infos)})
        real = batch.select(idx)
        temps = None if temperatures is None else temperatures[idx].float()[:, None].expand_as(real.mask)
        real = real.replace(group=torch.unique(real.group, return_inverse=True)[1], temperatures=temps)
        return step_record(step, real, correct, reward_result=result, extra={**batch.stats, **(extra or {})})

    def write(self, step: int, data, batch: RolloutBatch, **kwargs) -> dict:
        """`record`, appended to the run's metrics.jsonl; returns it."""
        record = self.record(step, data, batch, **kwargs)
        self.open(step).append_metrics(record)
        return record
