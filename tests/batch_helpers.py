"""Comparing two `RolloutBatch`es field by field (the sampler's outputs of two paths, two seeds, two forms)."""

from __future__ import annotations

import dataclasses

import torch

from explorl.algos.batch import RolloutBatch


def assert_same_batch(got: RolloutBatch, want: RolloutBatch, what: object = "") -> None:
    """Every field of `got` equal to `want`'s: tensors bit for bit (`torch.equal`), the rest (None, ints, the stats
    dict) by `==`."""
    for f in dataclasses.fields(RolloutBatch):
        x, y = getattr(got, f.name), getattr(want, f.name)
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            same = isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and torch.equal(x, y)
        else:
            same = x == y
        assert same, (what, f.name)
