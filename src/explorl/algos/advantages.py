"""Advantage estimators and shapers, by their public names: a thin module re-exporting the built-in methods.

Each method is one file under `explorl.algos.methods` (its paper, equations, options, check, maths and
registration); the shared pieces (`dense_ids`, `segment_stats`, ...) are `explorl.algos.core`. This module keeps
the public API (`from explorl.algos import advantages as A; A.grpo(...)`, docs/api.md) and the helpers to register
and look up shapers.

Notation follows docs/methods.md: N responses padded to T tokens, `mask[N, T]` is 1 on response tokens, `group[N]`
(int64, arbitrary ids, any order) names the prompt of each response, `rewards[N]` one float per response. Every
per-token output is exactly 0.0 where `mask == 0`. Estimators are registered as kind `estimator`
(`fn(batch, cfg[, *, options]) -> Tensor[N, T]`), shapers as kind `shaper` (`fn(advantages, batch, cfg, step[, *,
options])`, applied in the order of `cfg.shapers`). No gradient flows through any of these functions.
"""

from __future__ import annotations

from typing import Callable

from torch import Tensor

from explorl.algos.core import dense_ids, segment_stats
from explorl.algos.methods.cw import (CwOptions, cov_weighted, cov_weights, cov_weights_balanced, cov_weights_grouped,
                                      token_covariance)
from explorl.algos.methods.entropy_adv import EntropyAdvOptions, entropy_shaped
from explorl.algos.methods.erpo import ErpoOptions, erpo
from explorl.algos.methods.grpo import grpo
from explorl.algos.methods.passk import PasskOptions, passk
from explorl.algos.methods.position import PositionOptions, position_shaped
from explorl.algos.methods.ppl import PplOptions, ppl_shaped
from explorl.algos.registry import get, register

__all__ = [
    "dense_ids", "segment_stats", "grpo", "erpo", "cov_weights", "cov_weighted", "ppl_shaped", "position_shaped",
    "entropy_shaped", "passk", "cov_weights_grouped", "cov_weights_balanced", "token_covariance",
    "register_shaper", "get_shaper", "ErpoOptions", "PasskOptions", "CwOptions", "PplOptions", "PositionOptions",
    "EntropyAdvOptions",
]


def register_shaper(name: str, **needs) -> Callable:
    """Register `fn(advantages: Tensor[N, T], batch: RolloutBatch, cfg: AlgoConfig, step: int[, *, options]) ->
    Tensor[N, T]` under `name` (`register("shaper", name, ...)`); `step` is the 1-based training step."""
    return register("shaper", name, **needs)


def get_shaper(name: str) -> Callable[..., Tensor]:
    """The shaper registered under `name`; KeyError listing the valid names otherwise."""
    return get("shaper", name)
