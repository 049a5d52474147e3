"""`RolloutBatch`: the response-side tensors that explorl's methods consume, validated in one place.

Every engine fills one of these from its own tensors (explorl's loop from its sampler, an integration from verl's
`DataProto` or TRL's inputs) and hands it to `explorl.algos.step`. Notation of docs/methods.md: N responses padded
to T tokens.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

TOKEN_FIELDS = ("logprobs", "behavior_logprobs", "ref_logprobs", "entropy", "response_ids")
ROW_FIELDS = ("rewards", "group", "lengths", "truncated")
PROMPT_FIELDS = ("prompt_ids", "prompt_mask")


class MissingInputError(KeyError):
    """A method needs a tensor the batch does not carry (e.g. ERPO without reference log-probs)."""

    def __str__(self) -> str:  # KeyError would print the message with quotes around it
        return str(self.args[0]) if self.args else ""


@dataclass
class RolloutBatch:
    """One batch of scored responses. Optional tensors are None when nothing computed them.

    mask:              [N, T] float, 1.0 on response tokens up to and including EOS, 0.0 on padding.
    rewards:           [N] float, one reward per response.
    group:             [N] int64, the prompt each response answers (any ids; groups may differ in size).
    max_response_len:  the length limit the responses were sampled under (DAPO's overlong penalty, Dr.GRPO's
                       `seq-mean-token-sum-norm` normaliser); None when neither is used.
    logprobs:          [N, T] log-probs of the sampled tokens under pi_old at the training temperature.
    behavior_logprobs: [N, T] the same under the distribution actually sampled from (EAD temperatures, top-p).
    ref_logprobs:      [N, T] the same under the frozen reference policy.
    entropy:           [N, T] token entropy of pi_old at the training temperature.
    lengths:           [N] int64, response lengths in tokens (EOS included); default `mask.sum(-1)`.
    truncated:         [N] bool, the response hit the length limit without EOS; default all False.
    prompt_ids:        [N, P] int64 prompt token ids, left-padded; what the update's forward reads (explorl's loop
                       fills them from its `Rollouts`; an engine whose own trainer runs the forward leaves None).
    prompt_mask:       [N, P] int64, 1 on real prompt tokens.
    response_ids:      [N, T] int64 sampled token ids, padded after EOS.
    """

    mask: Tensor
    rewards: Tensor
    group: Tensor
    max_response_len: int | None = None
    logprobs: Tensor | None = None
    behavior_logprobs: Tensor | None = None
    ref_logprobs: Tensor | None = None
    entropy: Tensor | None = None
    lengths: Tensor | None = None
    truncated: Tensor | None = None
    prompt_ids: Tensor | None = None
    prompt_mask: Tensor | None = None
    response_ids: Tensor | None = None

    def __post_init__(self) -> None:
        if self.mask.dim() != 2:
            raise ValueError(f"RolloutBatch.mask: expected [N, T], got shape {tuple(self.mask.shape)}")
        n, t = self.mask.shape
        if self.lengths is None:
            self.lengths = self.mask.sum(-1).long()
        if self.truncated is None:
            self.truncated = torch.zeros(n, dtype=torch.bool, device=self.mask.device)
        for name in ROW_FIELDS:
            x = getattr(self, name)
            if tuple(x.shape) != (n,):
                raise ValueError(f"RolloutBatch.{name}: expected shape [N] = ({n},), got {tuple(x.shape)}")
        if self.group.dtype.is_floating_point:
            raise ValueError("RolloutBatch.group: expected integer prompt ids, got a floating-point tensor")
        for name in TOKEN_FIELDS:
            x = getattr(self, name)
            if x is not None and tuple(x.shape) != (n, t):
                raise ValueError(f"RolloutBatch.{name}: expected shape [N, T] = ({n}, {t}) like mask, "
                                 f"got {tuple(x.shape)}")
        for name in PROMPT_FIELDS:
            x = getattr(self, name)
            if x is not None and (x.dim() != 2 or x.shape[0] != n):
                raise ValueError(f"RolloutBatch.{name}: expected shape [N, P] with N = {n}, got {tuple(x.shape)}")
        if self.max_response_len is not None and self.max_response_len < 1:
            raise ValueError(f"RolloutBatch.max_response_len: must be >= 1, got {self.max_response_len}")

    def require(self, *names: str, by: str) -> None:
        """MissingInputError naming what method `by` needs and the batch lacks."""
        missing = [n for n in names if getattr(self, n) is None]
        if missing:
            hint = " (keep a frozen reference policy)" if "ref_logprobs" in missing else ""
            raise MissingInputError(f"{by} needs RolloutBatch fields {missing}, which are None{hint}")

    def replace(self, **changes) -> "RolloutBatch":
        return dataclasses.replace(self, **changes)

    def select(self, rows: Tensor, width: int | None = None) -> "RolloutBatch":
        """Rows `rows` (and the first `width` response columns) of every tensor: a micro-batch."""
        def cut(name: str, x):
            if x is None or not isinstance(x, Tensor):
                return x
            x = x[rows]
            return x[:, :width] if width is not None and (name == "mask" or name in TOKEN_FIELDS) else x

        return RolloutBatch(**{f.name: cut(f.name, getattr(self, f.name)) for f in dataclasses.fields(self)})
