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
Before registering, the modules named in the environment variable `EXPLORL_PLUGINS` (comma-separated; searched
first in `EXPLORL_PYTHON_PATH`) are imported, so the estimators and losses a user's `run.plugins` register exist in
every verl process (`launch.py` sets both from the explorl config).
An explorl config as a whole verl run (data, rewards, every setting): `launch.py` (`examples/verl/launch.py`);
explorl's rewards as verl's custom reward function: `reward.py`.
"""

import os

from explorl.config import import_plugins
from explorl.config.validation import use_python_path
from explorl.integrations.verl.adapters import PREFIX, algo_config, register_all
from explorl.integrations.verl.trainer import explorl_advantages, register_trainer


def import_env_plugins() -> list[str]:
    """Import the modules of `EXPLORL_PLUGINS` (after putting `EXPLORL_PYTHON_PATH` first on sys.path); returns
    their names."""
    names = [n.strip() for n in os.environ.get("EXPLORL_PLUGINS", "").split(",") if n.strip()]
    if names:
        use_python_path([d for d in os.environ.get("EXPLORL_PYTHON_PATH", "").split(os.pathsep) if d])
        import_plugins(names)
    return names


PLUGINS = import_env_plugins()
REGISTERED = register_all()
TRAINER_REGISTERED = register_trainer()

__all__ = ["PLUGINS", "PREFIX", "REGISTERED", "TRAINER_REGISTERED", "algo_config", "explorl_advantages",
           "import_env_plugins", "register_all", "register_trainer"]
