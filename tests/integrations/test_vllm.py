"""EAD's per-token temperature for vLLM (`explorl.integrations.vllm`): the arithmetic equals explorl's own
sampler table, the persistent-batch bookkeeping follows vLLM's `BatchUpdate` rules, and schedules describe their
sampling per prompt (`per_prompt`) exactly as explorl's sampler samples it (`per_response_table`). vLLM itself is not
installed here; the thin `EADLogitsProcessor` class is tested where it imports."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field, replace

import pytest
import torch

from explorl.config import Config
from explorl.integrations.vllm import EAD_ARG, AnnealedRows, check_anneal_args, token_factors
from explorl.rollout.sampler import per_response_table
from explorl.rollout.controllers import (AdaptiveOptions, AdaptiveTemperature, EADOptions, EADTemperature,
                                         PromptTemperature, RevEADTemperature)


def ead_cfg(temperature: float = 1.0, **ead) -> Config:
    """A config with the EAD schedule (its options `sampling.ead.*` from `ead`)."""
    cfg = Config()
    cfg.sampling = replace(cfg.sampling, schedule="ead", max_new_tokens=48, temperature=temperature,
                           options={"ead": EADOptions(**ead)})
    return cfg


@pytest.mark.parametrize("schedule_cls", [EADTemperature, RevEADTemperature])
@pytest.mark.parametrize("step", [0, 7])
def test_per_token_factors_equal_the_samplers_table(schedule_cls, step):
    # explorl's sampler draws token t at table[t] = ead(t, step) * T; vLLM samples at the request temperature T
    # and the processor divides by token_factors(...)[t]: the same temperature at every position
    cfg = ead_cfg(temperature=0.9, c=3, scale=2.0)
    schedule = schedule_cls(cfg, vocab_size=100, options=cfg.sampling.options["ead"])
    table = schedule.table(step)
    (prompt,) = schedule.per_prompt(step, schedule.at(step)[0], [5])
    positions = list(range(cfg.sampling.max_new_tokens))
    factors = token_factors([prompt.anneal] * len(positions), positions)
    assert prompt.temperature == 0.9
    torch.testing.assert_close(factors * prompt.temperature, table, rtol=1e-6, atol=0)


def test_token_factors_by_hand():
    # ead with c = 0, step 0, d0 = 25 (d = 25): tau(0) = 1 + 1.2 - e^0 = 1.2; tau(10) = 2.2 - e^0.4 = 0.708175;
    # tau(25) = 2.2 - e = -0.518 -> the floor 0.1. A row without annealing keeps factor 1.
    args = {"schedule": "ead", "step": 0, "tau_max": 1.2, "tau_min": 0.1, "d0": 25.0, "c": 0}
    got = token_factors([args, args, args, None], [0, 10, 25, 10])
    expected = torch.tensor([1.2, 2.2 - math.exp(0.4), 0.1, 1.0])
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-7)


def test_bad_annealing_arguments_are_rejected_by_name():
    with pytest.raises(ValueError, match="schedule"):
        check_anneal_args({"schedule": "cosine", "step": 0})
    with pytest.raises(ValueError, match="unknown keys.*tau_maxx"):
        check_anneal_args({"schedule": "ead", "step": 0, "tau_maxx": 1.0})
    with pytest.raises(ValueError, match="step"):
        check_anneal_args({"schedule": "ead", "step": -1})
    with pytest.raises(ValueError, match="must be a dict"):
        check_anneal_args([1, 2])


# a stand-in for vLLM's BatchUpdate / SamplingParams / MoveDirectionality (same field names and tuple layouts)
class Move(enum.Enum):
    UNIDIRECTIONAL = 0
    SWAP = 1


@dataclass
class Params:
    extra_args: dict | None = None


@dataclass
class Update:
    batch_size: int
    removed: list = field(default_factory=list)
    added: list = field(default_factory=list)
    moved: list = field(default_factory=list)


ARGS = {"schedule": "ead", "step": 0, "tau_max": 1.2, "tau_min": 0.1, "d0": 25.0, "c": 0}


def test_rows_follow_the_persistent_batch():
    rows = AnnealedRows()
    out_a, out_b = [], [7, 8]  # live output-token lists: their length is the position of the next token
    rows.update(Update(3, added=[(0, Params({EAD_ARG: ARGS}), [1], out_a), (1, Params(), [1], []),
                                 (2, Params({EAD_ARG: ARGS}), [1], out_b)]))
    logits = torch.ones(3, 4)
    rows.apply(logits)
    # row 0 at position 0 (factor 1.2), row 1 untouched, row 2 at position 2 (2.2 - e^0.08)
    torch.testing.assert_close(logits[:, 0], torch.tensor([1 / 1.2, 1.0, 1 / (2.2 - math.exp(0.08))]))
    out_a.extend([5] * 10)  # row 0 generated 10 tokens: it now samples position 10
    logits = torch.ones(3, 4)
    rows.apply(logits)
    torch.testing.assert_close(logits[0], torch.full((4,), 1 / (2.2 - math.exp(0.4))))

    # swap rows 0 and 1: the annealed request is now row 1, the plain one row 0
    rows.update(Update(3, moved=[(0, 1, Move.SWAP)]))
    logits = torch.ones(3, 4)
    rows.apply(logits)
    assert logits[0, 0] == 1.0 and logits[1, 0] == pytest.approx(1 / (2.2 - math.exp(0.4)))
    # row 2 finishes; row 1 moves down to row 2 (unidirectional: row 1 becomes empty)
    rows.update(Update(2, removed=[2], moved=[(1, 2, Move.UNIDIRECTIONAL)]))
    assert sorted(rows.rows) == [2]
    # a new plain request reusing row 2 clears its annealing
    rows.update(Update(3, added=[(2, Params(), [1], [])]))
    logits = torch.ones(3, 4)
    assert torch.equal(rows.apply(logits), torch.ones(3, 4))


def test_invalid_arguments_on_an_added_request_raise():
    with pytest.raises(ValueError, match="schedule"):
        AnnealedRows().update(Update(1, added=[(0, Params({EAD_ARG: {"schedule": "x", "step": 0}}), [], [])]))


def test_adaptive_per_prompt_equals_its_own_sampling():
    # per-prompt temperature by difficulty: per_prompt gives each prompt what explorl's sampler samples it with
    cfg = Config()
    cfg.sampling = replace(cfg.sampling, schedule="adaptive", temperature=0.8, max_new_tokens=16,
                           options={"adaptive": AdaptiveOptions(base="fixed")})
    schedule = AdaptiveTemperature(cfg, vocab_size=50, options=cfg.sampling.options["adaptive"])
    schedule.observe_rewards([0, 1], [[1.0, 1.0, 0.0], [0.0, 0.0]])
    temp = schedule.at(0)[0]
    described = schedule.per_prompt(0, temp, [0, 1, 2])
    sampled = per_response_table(described, [1, 1, 1], 16)[:, 0].tolist()
    assert [p.temperature for p in described] == pytest.approx(sampled, rel=1e-7)
    assert all(p.anneal is None for p in described)
    # prompt 0 solved 2/3: 0.8 * (1 + 0.5 * (0.5 - 2/3)); prompt 1 never: 0.8 * 1.25; prompt 2 unseen: 0.8
    assert sampled == pytest.approx([0.8 * (1 + 0.5 * (0.5 - 2 / 3)), 0.8 * 1.25, 0.8])


def test_adaptive_over_ead_scales_each_prompts_tau_max():
    cfg = ead_cfg(temperature=1.0)
    cfg.sampling = replace(cfg.sampling, schedule="adaptive",
                           options={**cfg.sampling.options, "adaptive": AdaptiveOptions(base="ead")})
    schedule = AdaptiveTemperature(cfg, vocab_size=50, options=cfg.sampling.options["adaptive"])
    schedule.observe_rewards([3], [[0.0, 0.0, 0.0, 0.0]])
    temp = schedule.at(2)[0]
    described = schedule.per_prompt(2, temp, [3, 4])
    tables = per_response_table(described, [1, 1], cfg.sampling.max_new_tokens)  # [2, max_new_tokens]
    positions = list(range(cfg.sampling.max_new_tokens))
    for p, table in zip(described, tables):
        got = token_factors([p.anneal] * len(positions), positions) * p.temperature
        torch.testing.assert_close(got, table, rtol=1e-6, atol=0)
    assert described[0].anneal["tau_max"] == pytest.approx(1.2 * 1.25)  # never solved: 1 + 0.5 * 0.5
    assert described[1].anneal["tau_max"] == pytest.approx(1.2)


def test_fixed_schedules_describe_one_temperature():
    from explorl.rollout.controllers import FixedTemperature

    cfg = Config()
    schedule = FixedTemperature(cfg, vocab_size=10)
    assert schedule.per_prompt(0, schedule.at(0)[0], [1, 2]) == [PromptTemperature(1.0)] * 2
    with pytest.raises(TypeError, match="per-token"):
        schedule.per_prompt(0, lambda t: 1.0, [1])


def test_the_vllm_processor_class_where_vllm_imports():
    pytest.importorskip("vllm", reason="vLLM is not installed here (it needs a CUDA build); the class is thin")
    from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality
    from vllm import SamplingParams

    from explorl.integrations.vllm import EADLogitsProcessor

    assert issubclass(EADLogitsProcessor, LogitsProcessor)
    proc = EADLogitsProcessor(None, torch.device("cpu"), False)
    assert proc.is_argmax_invariant()
    out: list[int] = [0] * 10
    proc.update_state(BatchUpdate(batch_size=1, removed=[], moved=[],
                                  added=[(0, SamplingParams(extra_args={EAD_ARG: ARGS}), [1], out)]))
    logits = proc.apply(torch.ones(1, 3))
    torch.testing.assert_close(logits, torch.full((1, 3), 1 / (2.2 - math.exp(0.4))))
    assert MoveDirectionality.SWAP.name == "SWAP"  # AnnealedRows reads the direction by name
    with pytest.raises(ValueError):
        EADLogitsProcessor.validate_params(SamplingParams(extra_args={EAD_ARG: {"schedule": "x", "step": 0}}))
