"""The README documents every config field and every per-step metric (they are generated from the code)."""

from pathlib import Path

from explorl.config import reference
from explorl.runlog import STEP_METRICS

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_readme_lists_every_config_field():
    missing = [name for name, *_ in reference() if f"`{name}`" not in README]
    assert not missing, f"README config reference lacks {missing}; regenerate with `explorl config --markdown`"


def test_readme_lists_every_step_metric():
    missing = [k for k in STEP_METRICS if f"`{k}`" not in README]
    assert not missing, f"README metrics table lacks {missing}"


def test_readme_quickstart_is_the_two_make_commands():
    assert "make demo" in README and "make test" in README


def test_readme_config_table_is_the_generated_one(capsys):
    from explorl.cli import main

    assert main(["config", "--markdown"]) == 0
    table = capsys.readouterr().out.strip()
    assert table in README, "README's config table is stale: paste the output of `explorl config --markdown`"
