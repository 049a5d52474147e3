"""Sampling temperatures: EAD's per-token schedules and E3's entropy-feedback controller.

Formulas are those of docs/methods.md §2b and §6; this header records the readings chosen where the
papers leave room.

Step numbering (the two schedules differ; each follows its paper's formula):
- EAD: `step` is the **0-based** index of the training step, the trainer's loop variable: `s` in
  `d_s = min(d0 + alpha * s, d_max)` is the number of optimiser steps completed before the batch is sampled,
  so the first batch uses `d0` itself (25 by default, the `d` of the paper's inference-time figures).
- E3: `step` is the **1-based** step number t = 1..t_max (what metrics.jsonl records as `step`). Eq. 5 then
  starts annealing at t = t_anneal = floor(0.6 t_max) and reaches `eta * H_init` exactly at the last step,
  t = t_max, and the update after step t uses `alpha = H_anneal(t) / H_t`, as the paper writes. The public E3
  code applies the target computed one step earlier (its annealing runs one step behind this reading) and
  starts at `t_max - int(0.4 * t_max)` (equal to the floor whenever `0.4 * t_max` is an integer, e.g. 480).

EAD (section 4). Token t (0-based index of the generated token) of a rollout at step s gets
`tau_t = 1.0` for `t < c`, else `max(1 + tau_max - exp(t / (scale * d_s)), tau_min)`. `scale = 1` is the
paper's formula; the public code uses `scale = 20`. The per-token temperatures belong to the behaviour policy
only: the optimised policy stays at the base temperature (docs/methods.md §6a).
Note that with the defaults `1 + tau_max - exp(t/d) > 1` only for `t < d * ln(tau_max) = 0.18 d`, i.e.
t < 4.6 at d = 25: early in training every token after the c-prefix is sampled *below* 1.0 (0.708 at t = c).

RevEAD (EAD, ablation). `tau_t = min(tau_min + exp(t / (scale * d_s)), tau_max)` for `t >= c`, and the
same `tau_t = 1.0` prefix for `t < c`. The paper prints the reverse formula without the prefix, but it introduces
the prefix as a property of the rollout (template tokens), not of the forward schedule, and an ablation should
change only the direction of the schedule. Pass `c=0` for the formula exactly as printed. With the defaults the
reverse schedule lies in [1.1, 1.2] and saturates at tau_max once `t >= d ln(1.1)` (about 0.1 d tokens).

E3 (eqs. 4-5). `e3_update` is the bare eq. 4 (no clamp, may return a non-positive value for a huge
entropy ratio); `E3TemperatureController` adds explorl's deviation from the public code (docs/methods.md §2b):
tau is clamped to `[tau_floor, tau_ceil]` and `temperature/clamped` reports when the clamp acted. An observation
that is not a finite positive entropy (e.g. an all-zero entropy from a collapsed float32 softmax) is ignored: tau
is left as it is and `temperature/skipped` is 1.0 (the public code would produce an infinite temperature).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

__all__ = ["EADOptions", "ead", "revead", "ead_schedule", "revead_schedule", "decay_rate", "e3_update", "e3_target",
           "anneal_start", "E3TemperatureController"]


# ----------------------------------------------------------------------------------------------------------
# EAD and RevEAD


@dataclass(frozen=True)
class EADOptions:
    """EAD's options, `sampling.ead.<field>`, shared by `ead` and `revead` (EAD; docs/methods.md §6): the schedule's
    temperature range, its decay rate `d_s = min(d0 + alpha * s, d_max)` and its prefix. Also what a request's
    annealing arguments (`PromptTemperature.anneal`, less `schedule` and `step`) hold, field by field."""

    tau_max: float = 1.2
    """Starting temperature tau_max."""
    tau_min: float = 0.1
    """Floor tau_min."""
    d0: float = 25.0
    """Initial decay constant d_0."""
    alpha: float = 5.0
    """Growth of the decay constant per training step (d_s = min(d0 + alpha * s, d_max))."""
    d_max: float = 40000.0
    """Cap of the decay constant."""
    c: int = 10
    """The first c generated tokens are sampled at temperature 1."""
    scale: float = 1.0
    """Divisor scale of the exponent (1 = the paper's formula; the public code uses 20)."""


def decay_rate(step: int, *, d0: float = 25.0, alpha: float = 5.0, d_max: float = 40000.0) -> float:
    """Global-step-aware decay rate of EAD: `d_s = min(d0 + alpha * s, d_max)`, s the 0-based step."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if d0 <= 0 or d_max <= 0:
        raise ValueError(f"d0 and d_max must be > 0, got d0={d0}, d_max={d_max}")
    if alpha < 0:
        raise ValueError(f"alpha (growth factor) must be >= 0, got {alpha}")
    return min(d0 + alpha * float(step), d_max)


def _positions(t: int | Tensor) -> Tensor:
    if isinstance(t, Tensor):
        return t.to(torch.float64)
    return torch.tensor(float(t), dtype=torch.float64)


def ead(t: int | Tensor, step: int, options: EADOptions = EADOptions()) -> Tensor:
    """Exploratory annealed decoding temperature (EAD, section 4; docs/methods.md §6a).

    `tau_t = 1.0` for `t < c`, else `max(1 + tau_max - exp(t / (scale * d_s)), tau_min)`,
    `d_s = min(d0 + alpha * step, d_max)`.

    Args:
        t: 0-based position of the generated token: an int, or an integer tensor of positions `[...]`.
        step: 0-based training step s (the number of optimiser steps before this batch was sampled).
        options: the schedule (`EADOptions`): tau_max and tau_min (it starts near tau_max at t = 0 and never goes
            below tau_min); d0, alpha, d_max, the decay rate `d_s` (paper defaults 25, 5, 40000); c (tokens
            `t < c` are sampled at 1.0: template tokens, paper: c = 10); scale, which multiplies the decay rate
            (1.0 = the paper; the public code uses 20).
    Returns:
        float32 tensor of `t`'s shape (0-dim for an int), on `t`'s device.
    """
    o = options
    if o.scale <= 0:
        raise ValueError(f"scale must be > 0, got {o.scale}")
    d = o.scale * decay_rate(step, d0=o.d0, alpha=o.alpha, d_max=o.d_max)
    pos = _positions(t)
    tau = (1.0 + o.tau_max - torch.exp(pos / d)).clamp_min(o.tau_min)  # exp overflow -> -inf -> tau_min
    tau = torch.where(pos < o.c, torch.ones_like(tau), tau)
    return tau.to(torch.float32)


def revead(t: int | Tensor, step: int, options: EADOptions = EADOptions()) -> Tensor:
    """Reverse annealing, the RevEAD ablation of EAD (section 5.5; docs/methods.md §6b).

    `tau_t = 1.0` for `t < c`, else `min(tau_min + exp(t / (scale * d_s)), tau_max)`; same arguments and
    return value as `ead`. The c-prefix is applied as for EAD (see the module docstring); `c=0` gives the
    paper's printed formula.
    """
    o = options
    if o.scale <= 0:
        raise ValueError(f"scale must be > 0, got {o.scale}")
    d = o.scale * decay_rate(step, d0=o.d0, alpha=o.alpha, d_max=o.d_max)
    pos = _positions(t)
    tau = (o.tau_min + torch.exp(pos / d)).clamp_max(o.tau_max)
    tau = torch.where(pos < o.c, torch.ones_like(tau), tau)
    return tau.to(torch.float32)


def ead_schedule(step: int, max_new_tokens: int, options: EADOptions = EADOptions()) -> Tensor:
    """`ead` at positions 0..max_new_tokens-1: a float32 `Tensor[max_new_tokens]`.

    Give it to the sampler as `temperature=schedule[None].expand(N, -1)` (per token, all responses alike)
    or as the callable `schedule.__getitem__` (t -> 0-dim tensor, broadcast over the responses).
    """
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    return ead(torch.arange(max_new_tokens), step, options)


def revead_schedule(step: int, max_new_tokens: int, options: EADOptions = EADOptions()) -> Tensor:
    """`revead` at positions 0..max_new_tokens-1 (see `ead_schedule`)."""
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    return revead(torch.arange(max_new_tokens), step, options)


# ----------------------------------------------------------------------------------------------------------
# E3 temperature scheduler


def e3_update(tau: float, h_target: float, h_now: float, vocab_size: int) -> float:
    """One step of the E3 temperature scheduler (E3, eq. 4; docs/methods.md §2b).

    `tau_next = tau * (1 + tau * ln(alpha) / (ln V + ln ln V))`, `alpha = h_target / h_now`.
    No clamp: the result may be <= 0 when `h_now` is many times `h_target` (the controller clamps).

    Args:
        tau: the temperature the batch was sampled at.
        h_target: the entropy to steer towards (H_init, or eq. 5's annealed value).
        h_now: the batch's mean token entropy at temperature `tau`.
        vocab_size: V, the model's vocabulary size (`config.vocab_size`), at least 2.
    """
    if not (tau > 0 and math.isfinite(tau)):
        raise ValueError(f"tau must be a finite positive number, got {tau}")
    if not (h_target > 0 and math.isfinite(h_target) and h_now > 0 and math.isfinite(h_now)):
        raise ValueError(f"entropies must be finite and > 0, got h_target={h_target}, h_now={h_now}")
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
    log_v = math.log(vocab_size)
    return tau * (1.0 + tau * math.log(h_target / h_now) / (log_v + math.log(log_v)))


def anneal_start(t_max: int, anneal_frac: float = 0.6) -> int:
    """`t_anneal = floor(anneal_frac * t_max)` (E3, section 5.2), robust to float rounding (0.6 * 10)."""
    return math.floor(round(anneal_frac * t_max, 9))


def e3_target(step: int, h_init: float, *, t_max: int, eta: float = 0.9, anneal_frac: float = 0.6) -> float:
    """Annealed entropy target (E3, eq. 5; docs/methods.md §2b).

    `H_init` before `t_anneal = floor(anneal_frac * t_max)`; from it on
    `H_init * (eta + (1 - eta) * 0.5 * (1 + cos(pi * (step - t_anneal) / (t_max - t_anneal))))`,
    which falls from H_init at t_anneal to `eta * H_init` at t_max and is held there for `step > t_max`.

    Args:
        step: the 1-based training step t (1..t_max; see the module docstring).
        h_init: the mean entropy of the first batch.
        t_max: total number of training steps.
    """
    if t_max < 0:
        raise ValueError(f"t_max must be >= 0, got {t_max}")
    t_anneal = anneal_start(t_max, anneal_frac)
    if step < t_anneal:
        return float(h_init)
    if t_max <= t_anneal:
        return eta * h_init
    progress = min((step - t_anneal) / (t_max - t_anneal), 1.0)
    return h_init * (eta + (1.0 - eta) * 0.5 * (1.0 + math.cos(math.pi * progress)))


class E3TemperatureController:
    """Feeds the measured entropy back each step (E3 eqs. 4-5; docs/methods.md §2b).

    Protocol, per training step t = 1..t_max (1-based, as metrics.jsonl numbers steps): sample and train the batch
    at `self.tau`, measure the batch's mean token entropy `H` over response tokens at that temperature, then call
    `observe(t, H)`, which sets `self.tau` for step t + 1. The first observation sets `H_init` (and leaves tau
    alone); updates start with the second. The target is `H_init`, or eq. 5 evaluated at `step` when `anneal=True`.
    The updated tau is clamped to `[tau_floor, tau_ceil]` (a deviation from the public code, which has no bounds).
    """

    def __init__(self, tau0: float, vocab_size: int, *, t_max: int, anneal: bool = False, eta: float = 0.9,
                 anneal_frac: float = 0.6, tau_floor: float = 0.05, tau_ceil: float = 4.0):
        if not 0 < tau_floor <= tau_ceil:
            raise ValueError(f"need 0 < tau_floor <= tau_ceil, got {tau_floor}, {tau_ceil}")
        if not tau_floor <= tau0 <= tau_ceil:
            raise ValueError(f"tau0={tau0} lies outside [tau_floor, tau_ceil] = [{tau_floor}, {tau_ceil}]")
        if vocab_size < 2:
            raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
        if not 0 <= eta <= 1:
            raise ValueError(f"eta must lie in [0, 1], got {eta}")
        self.vocab_size = int(vocab_size)
        self.t_max = int(t_max)
        self.anneal = bool(anneal)
        self.eta = float(eta)
        self.anneal_frac = float(anneal_frac)
        self.tau_floor = float(tau_floor)
        self.tau_ceil = float(tau_ceil)
        self.tau: float = float(tau0)  # the temperature to sample (and train) the next batch at
        self.h_init: float | None = None
        self.h_target: float | None = None
        self.clamped = False
        self.skipped = False
        self.updates = 0
        self.clamp_count = 0

    def target(self, step: int) -> float:
        """The entropy target at 1-based step `step` (H_init, or eq. 5 when annealing). Needs H_init."""
        if self.h_init is None:
            raise RuntimeError("no entropy observed yet: H_init is unknown")
        if not self.anneal:
            return self.h_init
        return e3_target(step, self.h_init, t_max=self.t_max, eta=self.eta, anneal_frac=self.anneal_frac)

    def observe(self, step: int, h_now: float) -> None:
        """Record step `step`'s (1-based) mean token entropy at the temperature it was sampled at; set the next tau."""
        h_now = float(h_now)
        self.clamped = False
        self.skipped = not (h_now > 0 and math.isfinite(h_now))
        if self.skipped:
            return
        if self.h_init is None:
            self.h_init = h_now
            self.h_target = self.target(step)
            return
        self.h_target = self.target(step)
        raw = e3_update(self.tau, self.h_target, h_now, self.vocab_size)
        new = min(max(raw, self.tau_floor), self.tau_ceil)
        self.clamped = new != raw
        self.clamp_count += int(self.clamped)
        self.updates += 1
        self.tau = new

    def stats(self) -> dict[str, float]:
        """Namespaced metrics: tau for the next batch, target and H_init (once known), clamp and skip flags."""
        out = {"temperature/tau": self.tau, "temperature/clamped": float(self.clamped),
               "temperature/clamp_count": float(self.clamp_count), "temperature/skipped": float(self.skipped)}
        if self.h_init is not None:
            out["temperature/h_init"] = self.h_init
            out["temperature/h_target"] = self.h_target
        return out

    def state_dict(self) -> dict:
        """Plain Python values (JSON- and torch.save-safe); restoring them reproduces every later tau exactly."""
        return {"tau": self.tau, "h_init": self.h_init, "h_target": self.h_target, "clamped": self.clamped,
                "skipped": self.skipped, "updates": self.updates, "clamp_count": self.clamp_count,
                "vocab_size": self.vocab_size, "t_max": self.t_max, "anneal": self.anneal, "eta": self.eta,
                "anneal_frac": self.anneal_frac, "tau_floor": self.tau_floor, "tau_ceil": self.tau_ceil}

    def load_state_dict(self, d: dict) -> None:
        """Restore the running state. The hyperparameters stay those given to the constructor."""
        self.tau = float(d["tau"])
        self.h_init = None if d["h_init"] is None else float(d["h_init"])
        self.h_target = None if d["h_target"] is None else float(d["h_target"])
        self.clamped = bool(d["clamped"])
        self.skipped = bool(d.get("skipped", False))
        self.updates = int(d["updates"])
        self.clamp_count = int(d["clamp_count"])


def adaptive_factor(success: Sequence[float | None], *, gamma: float = 0.5, target: float = 0.5) -> Tensor:
    """Per-prompt temperature multiplier by difficulty: `1 + gamma * (target - p_i)` (explorl's, not a paper's).

    E3 (conclusion) and EAD (limitations) name a per-prompt temperature by difficulty as future work and
    give no formula; this is explorl's (docs/methods.md §2c). `p_i` is prompt i's running success rate: a prompt
    solved less often than `target` is sampled hotter, one solved more often cooler; linear in `p_i`, so with the
    defaults the multiplier runs from 1.25 (never solved) to 0.75 (always solved). An unseen prompt (None) gets 1.

    Args:
        success: `[B]` running success rates in [0, 1], or None for prompts without rollouts yet.
        gamma: slope (>= 0; 0 = off).
        target: the success rate that keeps the base temperature.
    Returns:
        `[B]` float32 multipliers (> 0 for gamma < 1 / max(target, 1 - target)).
    """
    if gamma < 0:
        raise ValueError(f"adaptive_factor: gamma must be >= 0, got {gamma}")
    return torch.tensor([1.0 if p is None else 1.0 + gamma * (target - float(p)) for p in success],
                        dtype=torch.float32)
