"""Every explorl method inside verl 0.9 (`pip install "explorl[verl]"`), selected from verl's own Hydra config.

Importing this module (verl does, in every process, through the `verl.plugins` entry point that explorl installs)
registers with verl:
- advantage estimators `explorl_<name>` for each explorl estimator (`explorl_grpo`, `explorl_dr_grpo`,
  `explorl_erpo`, `explorl_passk`, and any a plugin registers): `algorithm.adv_estimator=explorl_grpo`, with
  explorl's settings (shapers, overlong shaping, the method's hyperparameters) under `+algorithm.explorl.<field>`;
- policy losses `explorl_<name>` (`explorl_ppo`, `explorl_clip_cov`, `explorl_kl_cov`):
  `actor_rollout_ref.actor.policy_loss.loss_mode=explorl_ppo`, reading verl's own clip and loss fields;
- the trainer mode `explorl` (`trainer.v1.trainer_mode=explorl`), which feeds explorl's advantage step verl's
  entropies and old, reference and rollout log-probs: needed by ERPO, the covariance, PPL and entropy shapers, the
  forking-token filter, truncated importance sampling and step windows.
The conversions are in `adapters.py`; the methods themselves are explorl's (`explorl.algos`), never rewritten.
"""

from explorl.integrations.verl.adapters import PREFIX, algo_config, register_all
from explorl.integrations.verl.trainer import explorl_advantages, register_trainer

REGISTERED = register_all()
TRAINER_REGISTERED = register_trainer()

__all__ = ["PREFIX", "REGISTERED", "TRAINER_REGISTERED", "algo_config", "explorl_advantages", "register_all",
           "register_trainer"]
