"""ProRL's reference policy reset (Liu et al. 2025, "ProRL: Prolonged Reinforcement Learning Expands Reasoning
Boundaries in Large Language Models", arXiv:2505.24864; docs/methods.md §5ab): the frozen reference of the KL term is
hard-reset to the current policy and the optimizer state is reinitialised, here every `algo.reference_reset.every`
steps, after that step's update (ProRL chose its reset points during its run; a fixed period is explorl's choice).

The reset copies every parameter of the policy into the reference (a full copy: a LoRA reference is refused by the
config's validation) and empties AdamW's per-parameter state, so its next step starts from zero moments and step
count 1, as a newly built AdamW would; the learning-rate schedule keeps its position. After the first reset the
reference's weights are saved in each checkpoint (`reference_state`) and restored on `--resume`
(`load_reference`); before it the reference is the model the run loaded, as it is on resume.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from explorl.config import AlgoConfig


def reset_due(algo: AlgoConfig, step: int) -> bool:
    """Whether the reference is reset after step `step` (1-based)."""
    every = algo.reference_reset.every
    return every > 0 and step % every == 0


@torch.no_grad()
def reset_reference(model: torch.nn.Module, ref: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Copy the policy's weights into the reference and reinitialise the optimizer's state."""
    policy, frozen = dict(model.named_parameters()), dict(ref.named_parameters())
    if policy.keys() != frozen.keys():
        raise RuntimeError("reference reset: the reference's parameters are not the policy's")
    for name, p in policy.items():
        frozen[name].copy_(p)
    optimizer.state.clear()  # AdamW builds fresh moments (zeros) and step counts at its next step


def reference_state(algo: AlgoConfig, ref: torch.nn.Module | None, step: int) -> dict[str, Any]:
    """What a checkpoint after step `step` keeps of the reference: its weights once a reset has happened."""
    every = algo.reference_reset.every
    if ref is None or every <= 0 or step < every:
        return {}
    return {"reference": {n: p.detach().cpu().clone() for n, p in ref.named_parameters()}}


@torch.no_grad()
def load_reference(ref: torch.nn.Module | None, state: Mapping[str, Any]) -> None:
    """Restore the reference's weights from a checkpoint's state, where it has them."""
    weights = state.get("reference")
    if ref is None or weights is None:
        return
    named = dict(ref.named_parameters())
    for name, t in weights.items():
        named[name].copy_(t.to(named[name].device, named[name].dtype))
