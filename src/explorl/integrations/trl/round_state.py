"""explorl's state of a TRL run that TRL's own checkpoints do not hold, and ProRL's reference reset between rounds.

Each checkpoint folder gets `explorl_schedule.json` (the round, the training temperature, the schedule driver's
state and, when adaptive, Skywork-OR1's entropy coefficient), `explorl_shaper_states.safetensors` where a shaper keeps
a state across steps (the outcome bonus's counts) and, once ProRL's reference has been reset
(`algo.reference_reset.every`, docs/methods.md §5ab), `explorl_reference.safetensors` (the reference's weights), so a
resumed run continues its temperatures, coefficient, counts and KL reference exactly (`save_round_state`,
`load_round_state`). `reset_reference_after_round` does the reset after a round's last optimizer step, as explorl's
loop does it after a step's update (`explorl.train.reference_reset`).
"""

from __future__ import annotations

import json
import os

from safetensors.torch import load_file, save_file

from explorl.config import ConfigError
from explorl.integrations.trl.temperature import set_train_temperature
from explorl.train.reference_reset import load_reference, reference_state, reset_due, reset_reference

__all__ = ["REFERENCE_FILE", "ROUND_STATE_FILE", "SHAPER_STATES_FILE", "check_reference_reset", "load_round_state",
           "reset_reference_after_round", "save_round_state"]

ROUND_STATE_FILE = "explorl_schedule.json"
"""The file in each TRL checkpoint folder holding explorl's round state."""
REFERENCE_FILE = "explorl_reference.safetensors"
"""The reference's weights in a checkpoint folder, after ProRL's first reset."""
SHAPER_STATES_FILE = "explorl_shaper_states.safetensors"
"""The shapers' states (`<shaper>/<tensor>`: the outcome bonus's `keys` and `counts`) in a checkpoint folder."""


def save_round_state(trainer, folder: str) -> None:
    """Write the round, the training temperature, the schedule driver's state, the entropy coefficient's (when
    adaptive), the shapers' states and the reset reference's weights (after a reset) into TRL's checkpoint
    `folder`."""
    coef = trainer.explorl_entropy_coef
    with open(os.path.join(folder, ROUND_STATE_FILE), "w") as f:
        json.dump({"round": trainer._round, "train_tau": trainer._train_tau,
                   "driver": trainer.explorl_driver.state_dict(),
                   **({"entropy_coef": coef.state_dict()} if coef.adaptive else {})}, f)
    ref = None if trainer.ref_model is None else trainer.accelerator.unwrap_model(trainer.ref_model)
    weights = reference_state(trainer.explorl.algo, ref, trainer._round).get("reference")
    if weights is not None:
        save_file({k: v.contiguous() for k, v in weights.items()}, os.path.join(folder, REFERENCE_FILE))
    states = {f"{name}/{k}": v.contiguous() for name, state in trainer.explorl_shaper_states.items()
              for k, v in state.state_dict().items()}
    if states:
        save_file(states, os.path.join(folder, SHAPER_STATES_FILE))


def load_round_state(trainer, checkpoint: str) -> bool:
    """Restore what `save_round_state` wrote into TRL's checkpoint folder `checkpoint`; False (nothing restored)
    for a checkpoint of plain TRL, whose schedule starts afresh."""
    path = os.path.join(checkpoint, ROUND_STATE_FILE)
    if not os.path.exists(path):
        return False
    with open(path) as f:
        state = json.load(f)
    trainer._round = int(state["round"])
    trainer.explorl_driver.load_state_dict(state["driver"])
    trainer.explorl_entropy_coef.load_state_dict(state.get("entropy_coef"))
    set_train_temperature(trainer, float(state["train_tau"]))
    reference = os.path.join(checkpoint, REFERENCE_FILE)
    if os.path.exists(reference) and trainer.ref_model is not None:
        ref = trainer.accelerator.unwrap_model(trainer.ref_model)
        weights = load_file(reference)
        if weights.keys() != dict(ref.named_parameters()).keys():
            raise ConfigError(f"{reference}: the reference's weights do not name the model's parameters; resume the "
                              f"run with the model it was trained with")
        load_reference(ref, {"reference": weights})
    shapers = os.path.join(checkpoint, SHAPER_STATES_FILE)
    flat = load_file(shapers) if os.path.exists(shapers) else {}
    for name, state in trainer.explorl_shaper_states.items():
        mine = {k.split("/", 1)[1]: v for k, v in flat.items() if k.split("/", 1)[0] == name}
        state.load_state_dict(mine or None)
    return True


def check_reference_reset(trainer) -> None:
    """ConfigError, before training, where ProRL's reset cannot run: without a reference model of its own (a PEFT
    model's reference is its base with the adapters off) or with sharded or DeepSpeed-held parameters and optimizer
    state (ZeRO, FSDP), which the reset's copy and optimizer reinitialisation do not reach."""
    if not trainer.explorl.algo.reference_reset.every:
        return
    if trainer.ref_model is None:
        raise ConfigError("algo.reference_reset.every: ProRL's reset copies the policy into a reference model of its "
                          "own, which TRL keeps only for a full model (not a PEFT one); train without PEFT or set "
                          "algo.reference_reset.every=0")
    if trainer.is_deepspeed_enabled or trainer.is_fsdp_enabled:
        raise ConfigError("algo.reference_reset.every: ProRL's reset copies whole parameters and empties the "
                          "optimizer's state, which DeepSpeed and FSDP hold sharded; train with DDP or one process, "
                          "or set algo.reference_reset.every=0")


def reset_reference_after_round(trainer) -> None:
    """ProRL's reset after training round `trainer._round`'s last optimizer step, where due: the policy's weights
    into TRL's reference model and AdamW's state emptied (`explorl.train.reference_reset.reset_reference`), on every
    process alike; `ref/reset` 1 in the round's record, as explorl's loop writes it."""
    if not reset_due(trainer.explorl.algo, trainer._round):
        return
    unwrap = trainer.accelerator.unwrap_model
    reset_reference(unwrap(trainer.model), unwrap(trainer.ref_model),
                    getattr(trainer.optimizer, "optimizer", trainer.optimizer))
    trainer._metrics["train"]["ref/reset"].append(1.0)
    if trainer._record is not None:
        trainer._record.extra["ref/reset"] = 1
