"""How TRL 1.16 spells the options of explorl's policy losses: for each loss and option, the `GRPOConfig` field that
holds TRL's own. An engine's spellings live in its integration (docs/design.md), as verl's do
(`explorl.integrations.verl.loss_fields`): explorl's loss replaces TRL's, so `config._check_against_trl` refuses a
`GRPOConfig` that sets one of these fields and names the explorl option to set instead."""

from __future__ import annotations

__all__ = ["TRL_LOSS_FIELDS"]

TRL_LOSS_FIELDS: dict[str, dict[str, str]] = {
    "sapo": {"tau_pos": "sapo_temperature_pos", "tau_neg": "sapo_temperature_neg"},
    "vespo": {"k_pos": "vespo_k_pos", "lambda_pos": "vespo_lambda_pos", "k_neg": "vespo_k_neg",
              "lambda_neg": "vespo_lambda_neg"},
}
"""loss -> {explorl option (`algo.<loss>.<option>`): TRL's `GRPOConfig` field}."""
