"""Skywork-OR1's adaptive entropy control (He et al. 2025, "Skywork Open Reasoner 1 Technical Report",
arXiv:2505.22312; TRL 1.16's `use_adaptive_entropy`; docs/methods.md §5aa): the entropy-bonus coefficient follows a
target entropy. Configured by `algo.entropy_control`.

With alpha_0 = `algo.entropy_coef` and e_k the mean token entropy of step k's batch (the one the loop measures
before the update, masked by the response mask), step k's update uses the coefficient
    c_k = alpha_k * 1[e_k <= target]
and then alpha_{k+1} = min(alpha_k + delta, coef_max) if e_k <= target else max(alpha_k - delta, coef_min).
TRL gates and adapts with the entropy of the previous optimizer step (measured in its update's forward); explorl
has step k's entropy before its update and uses it, as the report writes c_k with e_k. The coefficient is the run's
state: `state_dict` goes into every checkpoint and `load_state_dict` restores it on `--resume`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from explorl.config import AlgoConfig


class EntropyCoefficient:
    """The current entropy-bonus coefficient of a run: fixed `algo.entropy_coef`, or adaptive (Skywork-OR1)."""

    def __init__(self, algo: AlgoConfig):
        self.options = algo.entropy_control
        self.alpha = float(algo.entropy_coef)

    @property
    def adaptive(self) -> bool:
        return self.options.enabled

    def step(self, entropy: float) -> float:
        """The coefficient this step's update applies, given its batch entropy; advances alpha for the next step."""
        if not self.adaptive:
            return self.alpha
        o = self.options
        below = entropy <= o.target
        applied = self.alpha if below else 0.0
        self.alpha = min(self.alpha + o.delta, o.coef_max) if below else max(self.alpha - o.delta, o.coef_min)
        return applied

    def algo_for(self, algo: AlgoConfig, applied: float) -> AlgoConfig:
        """`algo` with the coefficient of this step; `algo` itself when the coefficient is fixed."""
        return dataclasses.replace(algo, entropy_coef=applied) if self.adaptive else algo

    def state_dict(self) -> dict:
        return {"alpha": self.alpha}

    def load_state_dict(self, state: Mapping[str, Any] | None) -> None:
        if state is not None and self.adaptive:
            self.alpha = float(state["alpha"])
