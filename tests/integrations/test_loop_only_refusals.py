"""Settings verl cannot carry out are refused by name by the verl launcher before it converts the task: those of
explorl's loop alone (FR3E's branching rollouts, SimKO's top-K log-probs; TRL's refusals: test_trl.py) and those
explorl's loop and TRL's trainer run (Skywork-OR1's adaptive entropy coefficient, ProRL's reference reset, the
line-start KL); SimKO's loss is also refused where verl calls it."""

from __future__ import annotations

from pathlib import Path

import pytest

from explorl.config import ConfigError

pytest.importorskip("verl", reason="verl is installed in .venv-verl only: run `make test-verl`")
from explorl.integrations.verl.launch import prepare  # noqa: E402  (the package imports verl)

RECIPES = Path(__file__).resolve().parents[2] / "configs" / "recipes"


@pytest.mark.parametrize("recipe, field", [("adaptive_entropy", r"algo\.entropy_control\.enabled"),
                                           ("prorl_reset", r"algo\.reference_reset\.every=50"),
                                           ("fr3e", r"budget\.policy=fr3e"),
                                           ("simko", r"algo\.loss=simko"),
                                           ("line_start_kl", r"algo\.kl_tokens=line_starts")])
def test_the_verl_launcher_refuses_loop_only_settings(recipe, field, tmp_path):
    with pytest.raises(ConfigError, match=field + r": .*explorl's loop.*explorl train"):
        prepare(RECIPES / f"{recipe}.yaml", [f"run.out_dir={tmp_path / 'run'}"], write=False, run_dir=False)


def test_verls_loss_call_refuses_a_loss_that_reads_the_top_k_log_probs():
    """Selected in verl's own config (no launcher), SimKO's loss is refused where verl calls it: verl hands a loss
    only the sampled tokens' old and new log-probs (docs/methods.md §5w)."""
    import torch

    from explorl.integrations.verl.adapters import policy_loss_for

    x = torch.zeros(2, 3)
    with pytest.raises(ConfigError, match=r"loss_mode=explorl_simko \(algo\.loss=simko\): .*top-K log-probs.*"
                                          r"explorl's loop \(explorl train\)"):
        policy_loss_for("simko")(x, x, x, torch.ones(2, 3), config={})
