"""explorl's methods inside TRL's `GRPOTrainer` (`pip install -e ".[trl]"`), on one process or many.

    from explorl.integrations.trl import ExplorlGRPOTrainer
    trainer = ExplorlGRPOTrainer(model, reward_funcs, args=GRPOConfig(...), train_dataset=ds,
                                 algo=AlgoConfig(advantage="grpo", shapers=["cw"]), sampling=SamplingConfig(...))

The advantages come from explorl's estimator and shaper chain (`explorl.algos.compute_advantages`) on the batch
gathered from every process, the loss from explorl's loss variants (`explorl.algos.policy_objective`), the sampling
temperature from explorl's temperature schedule (E3 for TRL's own generation and its vLLM engine; EAD's per-token
temperature through a transformers logits processor, or vLLM's `explorl.integrations.vllm.EADLogitsProcessor`, which
the colocated engine, `ColocatedVLLM`, loads), driven through explorl's schedule driver
(`explorl.rollout.schedule.ScheduleDriver`) as in explorl's own loop. The class overriding TRL's hooks is in
`trainer.py`, its concerns beside it (`config.py`, `temperature.py`, `generation.py`, `batch.py`, `run.py`); no
method is re-implemented here.

With `run_config=` (an explorl `Config`; `run_options=RunOptions(...)` for what it needs besides) the trainer also
writes `explorl train`'s run directory (`run.py`), so `explorl analyze`, `compare`, `eval RUN` and `curves` read the
run; `TaskReward` scores with an explorl task's own reward and correctness rule.
"""

from explorl.integrations.trl.run import RunOptions, TaskReward, refuse_existing_run
from explorl.integrations.trl.trainer import (
    ExplorlGRPOTrainer,
    PerTokenTemperature,
    checkpointing_field,
    explorl_config,
    gather_rows,
    generation_rounds,
)

__all__ = ["ExplorlGRPOTrainer", "PerTokenTemperature", "RunOptions", "TaskReward", "checkpointing_field",
           "explorl_config", "gather_rows", "generation_rounds", "refuse_existing_run"]
