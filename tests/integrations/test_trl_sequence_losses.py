"""TRL 1.16's `loss_type: luspo` / `vespo` and its `vespo_*` settings against explorl's losses (docs/methods.md §5y):
explorl's TRL trainer runs explorl's loss, so `explorl_config` refuses TRL's loss type without the same
`algo.loss`, and TRL's VESPO kernel settings other than their defaults, naming the explorl field to set."""

from __future__ import annotations

import pytest

pytest.importorskip("trl", reason="TRL is not installed: pip install -e \".[trl]\"")
from trl import GRPOConfig  # noqa: E402

from explorl.config import ConfigError  # noqa: E402
from explorl.integrations.trl import checkpointing_field  # noqa: E402
from explorl.integrations.trl.config import explorl_config  # noqa: E402


def _args(tmp_path, **kw) -> GRPOConfig:
    base = dict(output_dir=str(tmp_path / "trl"), use_cpu=True, bf16=False, per_device_train_batch_size=4,
                num_generations=4, max_completion_length=8, temperature=1.0, top_k=0, seed=0,
                **{checkpointing_field(): False}, report_to=[], save_strategy="no", max_steps=1)
    base.update(kw)
    return GRPOConfig(**base)


@pytest.mark.parametrize("loss", ["luspo", "vespo"])
def test_trls_loss_type_needs_the_same_explorl_loss(loss, tmp_path):
    with pytest.raises(ConfigError, match=rf"GRPOConfig.loss_type={loss}: .*set algo.loss={loss}"):
        explorl_config(_args(tmp_path, loss_type=loss))
    assert explorl_config(_args(tmp_path, loss_type=loss), algo={"loss": loss}).algo.loss == loss


@pytest.mark.parametrize("theirs, ours", [("vespo_k_pos", "k_pos"), ("vespo_lambda_pos", "lambda_pos"),
                                          ("vespo_k_neg", "k_neg"), ("vespo_lambda_neg", "lambda_neg")])
def test_trls_vespo_settings_are_refused_naming_explorls(theirs, ours, tmp_path):
    with pytest.raises(ConfigError, match=rf"GRPOConfig.{theirs}: .*set algo\.vespo\.{ours} \(with algo\.loss=vespo\)"):
        explorl_config(_args(tmp_path, loss_type="vespo", **{theirs: 7.0}), algo={"loss": "vespo"})
