"""Algorithm zoo and the algorithm step: pure tensor functions registered by name, torch only.

- `explorl.algos.methods`: the estimators, shapers, policy losses, token filters, reward shapers and importance
  weights of the papers, one file per method (paper, equations, options, check, maths, registration);
  `explorl.algos.core` and `explorl.algos.aggregation` (the `loss_agg` modes): the pieces they share.
- `explorl.algos.advantages`, `explorl.algos.losses`: the methods' public names (public API: `advantages.grpo`,
  `losses.policy_loss`, ...).
- `explorl.algos.registry`: one registry for every pluggable kind (`register(kind, name, ...)`), at the bottom of
  the import graph: it imports nothing, and this package fills it by importing `explorl.algos.methods`.
- `explorl.algos.batch.RolloutBatch` and `explorl.algos.step`: `compute_advantages` and `policy_objective`,
  the step that explorl's loop and the engine integrations call.
Nothing here imports explorl outside `explorl.algos`, so an engine imports it without the training loop.
"""

from __future__ import annotations

from typing import Callable

import torch

from explorl.algos import methods  # noqa: F401  (fill the registry)
from explorl.algos import advantages, losses  # noqa: F401
from explorl.algos.batch import MissingInputError, RolloutBatch
from explorl.algos.registry import get, register
from explorl.algos.step import (Requirements, compute_advantages, policy_objective, requirements,
                                single_update_shortcut)


def register_advantage(name: str, **needs) -> Callable:
    """Register an estimator `fn(batch: RolloutBatch, cfg: AlgoConfig[, *, options]) -> Tensor[N, T]` under `name`
    (`register("estimator", name, ...)`; see `explorl.algos.registry` for what `needs` may record, and how an
    estimator declares options of its own)."""
    return register("estimator", name, **needs)


def get_advantage(name: str) -> Callable[..., torch.Tensor]:
    """The estimator registered under `name`; KeyError listing the valid names otherwise."""
    return get("estimator", name)


__all__ = ["register_advantage", "get_advantage", "register", "RolloutBatch", "MissingInputError",
           "Requirements", "compute_advantages", "policy_objective", "requirements",
           "single_update_shortcut"]
