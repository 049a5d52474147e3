"""explorl's methods inside TRL's `GRPOTrainer` (`pip install -e ".[trl]"`), on one process or many.

    from explorl.integrations.trl import ExplorlGRPOTrainer
    trainer = ExplorlGRPOTrainer(model, reward_funcs, args=GRPOConfig(...), train_dataset=ds,
                                 algo=AlgoConfig(advantage="grpo", shapers=["cw"]), sampling=SamplingConfig(...))

The advantages come from explorl's estimator and shaper chain (`explorl.algos.compute_advantages`) on the batch
gathered from every process, the loss from explorl's loss variants (`explorl.algos.policy_objective`), the sampling
temperature from explorl's temperature schedule (E3 for TRL's own generation and its vLLM client; EAD's per-token
temperature through a transformers logits processor). The conversions are in `trainer.py`; no method is
re-implemented here.
"""

from explorl.integrations.trl.trainer import (ExplorlGRPOTrainer, PerTokenTemperature, checkpointing_field,
                                              explorl_config, gather_rows)

__all__ = ["ExplorlGRPOTrainer", "PerTokenTemperature", "checkpointing_field", "explorl_config", "gather_rows"]
