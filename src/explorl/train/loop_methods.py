"""The methods explorl's loop carries out itself, outside the algorithm step and the registry: Skywork-OR1's adaptive
entropy coefficient (`train/adaptive_entropy.py`) and ProRL's reference reset (`train/reference_reset.py`). A config
section switches each on instead of a name, so neither is registered; this table describes them the way the
registry describes its entries (paper, options, code, formula, where the loop acts), and `explorl methods` lists it
beside the registered kinds. A new loop-level method adds its `LoopEntry` here."""

from __future__ import annotations

from dataclasses import dataclass

from explorl.algos.registry import Cite, Entry, Site
from explorl.config.schema import EntropyControlConfig, ReferenceResetConfig
from explorl.train.adaptive_entropy import EntropyCoefficient
from explorl.train.reference_reset import reset_due, reset_reference

LOOP_KIND = "loop"
"""The kind of a `LoopEntry` (`explorl methods` shows its rows under it)."""


@dataclass(frozen=True, kw_only=True)
class LoopEntry(Entry):
    """A method explorl's loop carries out itself: an `Entry` with `kind` `LOOP_KIND`, `options` the dataclass of
    its config section, and `config` the section's path."""

    config: str
    """The core config section holding its settings and switch (`algo.entropy_control`): `<config>.<field>`."""


_STEP = "explorl.train.loop.train_step"
_SAVED = "explorl.train.loop.TrainState.checkpoint"

LOOP_METHODS = (
    LoopEntry(kind=LOOP_KIND, name="entropy_control", fn=EntropyCoefficient, options=EntropyControlConfig,
              config="algo.entropy_control", formula=(EntropyCoefficient.step,),
              cites=(Cite("Skywork-OR1", doc="5aa"),),
              acts_at=(Site(_STEP, "st.entropy_coef.step(", "the coefficient of the step's update, from its entropy"),
                       Site(_SAVED, "self.entropy_coef.state_dict()", "alpha kept in every checkpoint"))),
    LoopEntry(kind=LOOP_KIND, name="reference_reset", fn=reset_reference, options=ReferenceResetConfig,
              config="algo.reference_reset", formula=(reset_due, reset_reference),
              cites=(Cite("ProRL", doc="5ab"),),
              acts_at=(Site(_STEP, "reset_reference(st.model", "the reference becomes the policy after the update"),
                       Site(_SAVED, "reference_state(", "the reset reference kept in every checkpoint"))),
)
"""Skywork-OR1's adaptive entropy coefficient (`algo.entropy_control`), ProRL's reference reset
(`algo.reference_reset`)."""
