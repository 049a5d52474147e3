"""Algorithm zoo: advantage estimators and policy losses as pure tensor functions, registered by name.

`ADVANTAGES[name](batch, cfg)` adapts a registered estimator to the trainer's batch dict (keys of
METHODS.md notation: rewards, group, mask, entropy, logprobs, ref_logprobs) and `AlgoConfig`.
The pure functions themselves (`advantages.grpo`, `losses.policy_loss`, ...) are the public API.
"""

from __future__ import annotations

from typing import Callable

import torch

ADVANTAGES: dict[str, Callable[..., torch.Tensor]] = {}


def register_advantage(name: str) -> Callable:
    """Register `fn(batch: dict[str, Tensor], cfg: AlgoConfig) -> Tensor[N, T]` under `name`."""

    def wrap(fn: Callable) -> Callable:
        if name in ADVANTAGES:
            raise ValueError(f"advantage estimator {name!r} registered twice")
        ADVANTAGES[name] = fn
        return fn

    return wrap


def get_advantage(name: str) -> Callable[..., torch.Tensor]:
    if name not in ADVANTAGES:
        raise KeyError(f"unknown advantage estimator {name!r}; valid: {', '.join(sorted(ADVANTAGES))}")
    return ADVANTAGES[name]


from explorl.algos import advantages, losses  # noqa: E402,F401  (fills the registries)
