"""Settings only explorl's loop carries out (Skywork-OR1's adaptive entropy coefficient, ProRL's reference reset)
are refused by name by the verl launcher before it converts the task (TRL's refusals: test_trl.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from explorl.config import ConfigError

pytest.importorskip("verl", reason="verl is installed in .venv-verl only: run `make test-verl`")
from explorl.integrations.verl.launch import prepare  # noqa: E402  (the package imports verl)

RECIPES = Path(__file__).resolve().parents[2] / "configs" / "recipes"


@pytest.mark.parametrize("recipe, field", [("adaptive_entropy", r"algo\.entropy_control\.enabled"),
                                           ("prorl_reset", r"algo\.reference_reset\.every=50")])
def test_the_verl_launcher_refuses_loop_only_settings(recipe, field, tmp_path):
    with pytest.raises(ConfigError, match=field + r": .*explorl's loop.*explorl train"):
        prepare(RECIPES / f"{recipe}.yaml", [f"run.out_dir={tmp_path / 'run'}"], write=False, run_dir=False)
