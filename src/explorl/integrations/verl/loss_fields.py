"""How verl 0.9 spells the options of explorl's policy losses: for each loss and option, the key of verl's actor
config that holds it, the factor between the two and verl's default.

An engine's spellings live in its integration (docs/design.md): the method files say what an option means, this
table says where verl keeps it. `adapters.loss_settings` reads verl's actor config back into explorl's options (verl's
own trainer runs `explorl_<loss>`), `overrides._loss_options` writes explorl's options as verl overrides. A loss that
is not in the table (a user's) has no verl field: its options must keep their defaults to run in verl.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["VERL_LOSS_FIELDS", "VerlField", "verl_fields"]


@dataclass(frozen=True)
class VerlField:
    """Where verl keeps one option of a policy loss."""

    key: str
    """The key under verl's actor config (`actor_rollout_ref.actor.<key>`), dotted (`policy_loss.clip_cov_ratio`)."""
    factor: float
    """explorl's value = factor * verl's (KL-Cov's `k_percent` is a percentage, verl's `kl_cov_ratio` a fraction)."""
    default: float | None
    """verl's default, read where its config holds no value; None where verl has none (the option is required)."""


VERL_LOSS_FIELDS: dict[str, dict[str, VerlField]] = {
    # verl applies its dual clip always (`compute_policy_loss_vanilla`), at 3.0 by default; explorl's is off by default
    "ppo": {"dual_clip_c": VerlField("clip_ratio_c", 1.0, 3.0)},
    "clip_cov": {"ratio": VerlField("policy_loss.clip_cov_ratio", 1.0, 2e-4),
                 "lb": VerlField("policy_loss.clip_cov_lb", 1.0, 1.0),
                 "ub": VerlField("policy_loss.clip_cov_ub", 1.0, 5.0)},
    "kl_cov": {"k_percent": VerlField("policy_loss.kl_cov_ratio", 100.0, 2e-3),
               "coef": VerlField("policy_loss.ppo_kl_coef", 1.0, 1.0)},
    # DPPO's truncation cap of the ratio weight is verl's clip_ratio_c (its bounds are clip_ratio_low/high, the core
    # eps_low/eps_high); DRO's beta has no default in verl (None: its `dro` refuses to run, as explorl's check does)
    "dppo_tv": {"ratio_cap": VerlField("clip_ratio_c", 1.0, 3.0)},
    "dppo_kl": {"ratio_cap": VerlField("clip_ratio_c", 1.0, 3.0)},
    "dro": {"beta": VerlField("policy_loss.dro_beta", 1.0, None)},
    # SAPO's gate temperatures sit on the actor itself, not under `policy_loss` (CISPO has no field of its own)
    "sapo": {"tau_pos": VerlField("tau_pos", 1.0, 1.0), "tau_neg": VerlField("tau_neg", 1.0, 1.05)},
}
"""Policy loss name -> its option -> where verl 0.9 keeps it (`verl/workers/config/actor.py`, `policy_loss`)."""


def verl_fields(loss: str) -> dict[str, VerlField]:
    """The options of policy loss `loss` that verl has a field for (none for a loss verl does not know)."""
    return VERL_LOSS_FIELDS.get(loss, {})
