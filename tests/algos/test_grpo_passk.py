"""verl's pass@k estimator `grpo_passk` (docs/methods.md §5z): values derived by hand, an independent slow reference
(the paper's leave-one-out difference `max_j r_j - max_{j != i} r_j`, response by response), and the configuration.
verl 0.9.1's own function is compared in tests/integrations/test_verl_estimators.py."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from explorl.algos.batch import RolloutBatch
from explorl.algos.methods.grpo_passk import GrpoPasskOptions, grpo_passk
from explorl.algos.methods.passk import passk
from explorl.algos.registry import lookup
from explorl.config import ConfigError, load_config

F64 = torch.float64


def test_hand_derived_groups():
    # group 7: rewards 1, 0, 0, 0.5: the best is 1 (response 0), the second 0.5: gap 0.5; unbiased std:
    #   mean 0.375, squared deviations 0.390625 + 2 * 0.140625 + 0.015625 = 0.6875, / 3 = 0.229167, std 0.478714:
    #   A = 0.5 / (0.478714 + 1e-6) = 1.044464 for response 0, 0 for the others
    # group 3: rewards 1, 1, 0: two best responses, r_max - r_second_max = 0: all 0
    # group 9: one response: 0 (verl refuses a group of one)
    # group 4: rewards 0, 0: all equal: 0
    # group 5: rewards 0.2, 0.9: the best is 0.9 (response 10), gap 0.7, std 0.7 / sqrt(2) = 0.494975:
    #   A = 0.7 / (0.494975 + 1e-6) = 1.414211
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.5, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.9, 0.2], dtype=F64)
    group = torch.tensor([7, 7, 7, 7, 3, 3, 3, 9, 4, 4, 5, 5])
    mask = torch.ones(12, 3)
    mask[0, 2] = 0
    adv = grpo_passk(rewards, group, mask)
    want = torch.zeros(12, dtype=F64)
    want[0] = 0.5 / (statistics.stdev([1, 0, 0, 0.5]) + 1e-6)
    want[10] = 0.7 / (statistics.stdev([0.9, 0.2]) + 1e-6)
    assert float(want[0]) == pytest.approx(1.044464, abs=1e-6) and float(want[10]) == pytest.approx(1.414211, abs=1e-6)
    torch.testing.assert_close(adv, want[:, None] * mask.to(F64), rtol=0, atol=1e-12)
    assert adv.dtype == F64 and adv[0, 2] == 0  # padding
    # without the division: the gaps themselves
    raw = grpo_passk(rewards, group, mask, scale=False)
    assert float(raw[0, 0]) == pytest.approx(0.5, abs=1e-15) and float(raw[10, 0]) == pytest.approx(0.7, abs=1e-15)
    assert int((raw != 0).any(-1).sum()) == 2


def _leave_one_out(rewards: list[float], groups: list[int], scale: bool, eps: float) -> list[float]:
    """The paper's leave-one-out advantage with k the group size, response by response: the objective max over the
    whole group minus the max over the group without response i (0 for a group of one), over the group's unbiased
    std + eps."""
    out = []
    for i, (r, g) in enumerate(zip(rewards, groups)):
        mates = [rewards[j] for j in range(len(rewards)) if groups[j] == g]
        others = [rewards[j] for j in range(len(rewards)) if groups[j] == g and j != i]
        if not others:
            out.append(0.0)
            continue
        a = max(mates) - max(others)
        out.append(a / (statistics.stdev(mates) + eps) if scale else a)
    return out


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), binary=st.booleans(), scale=st.booleans())
def test_equals_the_leave_one_out_difference_response_by_response(seed, binary, scale):
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, 20, (1,), generator=g))
    group = torch.randint(0, 5, (n,), generator=g) * 11  # arbitrary ids, groups of any size, one included
    rewards = ((torch.rand(n, generator=g) > 0.5).to(F64) if binary
               else torch.randint(0, 4, (n,), generator=g).to(F64) / 4)  # coarse values: ties happen
    mask = torch.ones(n, 2)
    got = grpo_passk(rewards, group, mask, scale=scale, eps=1e-6)[:, 0]
    want = torch.tensor(_leave_one_out(rewards.tolist(), group.tolist(), scale, 1e-6), dtype=F64)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_it_is_not_explorls_analytic_passk():
    # a mixed binary group: passk gives every response an advantage, grpo_passk only a unique best one (none here:
    # two correct responses tie)
    rewards, group, mask = torch.tensor([1.0, 1.0, 0.0, 0.0]), torch.zeros(4, dtype=torch.long), torch.ones(4, 1)
    assert bool((passk(rewards, group, mask, k=2) != 0).all())
    assert bool((grpo_passk(rewards, group, mask) == 0).all())


def test_the_registered_estimator_reads_its_option_and_adv_eps():
    entry = lookup("estimator", "grpo_passk")
    assert entry.options is GrpoPasskOptions and GrpoPasskOptions().norm_adv_by_std and not entry.needs_old_logprobs
    assert set(entry.reads) == {"adv_eps"}
    rewards = torch.tensor([0.0, 1.0, 0.25, 0.5])
    batch = RolloutBatch(mask=torch.ones(4, 2), rewards=rewards, group=torch.tensor([0, 0, 1, 1]),
                         max_response_len=2, lengths=torch.full((4,), 2), truncated=torch.zeros(4, dtype=torch.bool))
    for overrides, scale, eps in ((["algo.adv_eps=0.5"], True, 0.5),
                                  (["algo.grpo_passk.norm_adv_by_std=false"], False, 1e-6)):
        cfg = load_config(None, ["algo.advantage=grpo_passk", *overrides]).algo
        got = entry.bind(cfg)(batch, cfg)
        torch.testing.assert_close(got, grpo_passk(rewards, batch.group, batch.mask, scale=scale, eps=eps))


@pytest.mark.parametrize("overrides, message", [
    (["algo.advantage=grpo_passk", "sampling.group_size=1"], r"sampling.group_size: grpo_passk .*at least 2"),
    (["algo.grpo_passk.norm_adv_by_std=false"], "algo.grpo_passk: options of the estimator 'grpo_passk', which is "
                                                "not selected"),
    (["algo.advantage=grpo_passk", "algo.grpo_passk.k=2"], "algo.grpo_passk.k"),
])
def test_configuration_errors_name_the_field(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_the_recipe_is_verls_estimator():
    cfg = load_config(Path(__file__).resolve().parents[2] / "configs" / "recipes" / "grpo_passk.yaml")
    a = cfg.algo
    assert (a.advantage, a.loss, a.loss_agg, a.kl_coef, cfg.sampling.group_size) == (
        "grpo_passk", "ppo", "token-mean", 0.0, 8)
    assert a.options["grpo_passk"].norm_adv_by_std
