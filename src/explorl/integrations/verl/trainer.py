"""explorl's verl trainer: verl's synchronous v1 trainer with explorl's advantage step (`ExplorlTrainer`, in
`trainer_mode.py`, which imports verl; the advantage step and the run writer it calls are `step.py`'s).

verl's estimator call carries rewards and the response mask only. ERPO (entropy, reference log-probs), the
covariance and PPL shapers (pi_old's log-probs), the entropy-based advantage, the forking-token filter (entropies),
truncated importance weights (the rollout engine's log-probs) and step windows (the training step) need more. This
trainer replaces verl's `_compute_advantage` by `explorl_advantages` on everything verl has computed by then, and
hands the per-token loss weights (TIS x token filter) to verl's actor as `rollout_is_weights`, which verl's policy
losses multiply into the token loss, as explorl's `is_weights` and `token_weights` are.

It also drives explorl's schedule driver (`explorl.rollout.schedule.ScheduleDriver`, through `rollout.py`'s
`RolloutControl`) when `algorithm.explorl.sampling.schedule` or `algorithm.explorl.budget.policy` asks for it:
before each batch is generated it gives each prompt its rollout count (`__rollout_n__`, E3's budgets), its request
temperature (E3's tau, per-prompt temperature) and EAD's annealing arguments (sampled through the
`explorl_single_turn` agent loop and, per token, vLLM's `explorl.integrations.vllm:EADLogitsProcessor`), and sets
the actor's training temperature; after the rewards and entropies are in, it ends the step on the driver. Its state
is saved with each verl checkpoint (`explorl_rollout.json`) and restored on resume.

Given `+explorl.config=PATH` (an explorl YAML; `examples/verl/launch.py` sets it), it also writes explorl's run
directory at that config's `run.out_dir` (`explorl.integrations.run_dir`): config.yaml and engine.json before the
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

from explorl.integrations.verl.step import (FIELDS, REWARD_INFO, RUN_KEY, RunWriter, advantage_step,
                                            explorl_advantages, reward_infos)

__all__ = ["FIELDS", "REWARD_INFO", "RUN_KEY", "RunWriter", "advantage_step", "explorl_advantages",
           "register_trainer", "reward_infos"]


def register_trainer() -> bool:
    """Register `ExplorlTrainer` (`trainer_mode.py`) as verl's v1 trainer mode `explorl`; False when verl's v1
    trainer cannot be imported here (it needs TransferQueue and Ray, installed by `explorl[verl]`)."""
    try:
        import explorl.integrations.verl.trainer_mode  # noqa: F401  (defines and registers ExplorlTrainer)
    except ImportError:
        return False
    return True
