"""`rollout.sampler.Sampler`: built once, it takes a round's plan (one temperature form: a `PromptTemperature` per
prompt) and samples exactly what explorl's decoder samples given the temperature the way the schedules used to hand
it over (a number, one per prompt, EAD's function of the token position): the same tokens, the same numbers, on
every decoder path."""

from __future__ import annotations

import pytest
import torch
from batch_helpers import assert_same_batch

from explorl.rollout import temperature as Tm
from explorl.rollout.engines.native import sample
from explorl.rollout.sampler import Sampler, per_response_table
from explorl.rollout.schedule import Plan
from explorl.rollout.temperature_schedules import PromptTemperature

TEXTS = ["1+2=?\n", "13-4+17-2=?\n", "5=?\n", "20+20+20-1+3=?\n"]
N_PER = [2, 0, 3, 1]
PAD, MAX_NEW = 0, 12
EOS_MANY = list(range(2, 12))
PATH_KW = {"fused": dict(fast_path=True), "compiled": dict(fast_path=True, compile=True),
           "generic": dict(fast_path=False), "static": dict(fast_path=True, cuda_graph=True)}
EAD = {"schedule": "ead", "step": 3, "tau_max": 1.2, "tau_min": 0.1, "d0": 4.0, "alpha": 1.0, "d_max": 40000.0,
       "c": 2, "scale": 1.0}


def _plan(requests: list[PromptTemperature]) -> Plan:
    return Plan(0, list(range(len(requests))), list(N_PER), 0.8, {}, requests)


def _old_form(kind: str):
    """(the plan's requests, the temperature argument the decoder used to get for the same sampling)."""
    if kind == "fixed":
        return [PromptTemperature(0.8)] * 4, 0.8
    if kind == "per_prompt":  # the adaptive schedule: one temperature per prompt, a list
        temps = (torch.tensor([1.1, 0.7, 0.9, 1.3]) * 0.8).tolist()
        return [PromptTemperature(t) for t in temps], temps
    args = {k: v for k, v in EAD.items() if k not in ("schedule", "step")}  # EAD: a function of the position
    values = (Tm.ead_schedule(EAD["step"], MAX_NEW, Tm.EADOptions(**args)) * 0.8).tolist()
    return [PromptTemperature(0.8, EAD)] * 4, (lambda t: values[t])


@pytest.mark.parametrize("kind", ["fixed", "per_prompt", "ead"])
@pytest.mark.parametrize("path", list(PATH_KW))
def test_the_sampler_samples_what_the_decoder_did_with_the_old_temperature_forms(tiny_model, char_tokenizer, path,
                                                                                 kind):
    prompts = [char_tokenizer.encode(t) for t in TEXTS]
    requests, old = _old_form(kind)
    sampler = Sampler(tiny_model, EOS_MANY, PAD, MAX_NEW, **PATH_KW[path])
    got = sampler.sample(prompts, _plan(requests), torch.Generator().manual_seed(4))
    want = sample(Sampler(tiny_model, eos_token_id=EOS_MANY, pad_token_id=PAD, max_new_tokens=MAX_NEW, **PATH_KW[path]),
                  prompts, N_PER, temperature=old, generator=torch.Generator().manual_seed(4))
    assert_same_batch(got, want)


def test_the_table_repeats_each_prompts_row_over_its_rollouts():
    requests = [PromptTemperature(0.5), PromptTemperature(1.0, EAD), PromptTemperature(2.0)]
    table = per_response_table(requests, [2, 0, 1], 5)
    assert table.shape == (3, 5) and table.dtype == torch.float32
    assert table[:2].eq(0.5).all() and table[2].eq(2.0).all()
    # EAD's factor, evaluated by the registry's per-token function (hand check: t < c = 2 is sampled at 1.0)
    ead = per_response_table(requests[1:2], [1], 5)[0]
    assert ead[:2].tolist() == [1.0, 1.0] and ead[2].item() == pytest.approx(1 + 1.2 - torch.exp(torch.tensor(2 / 7)))
    assert per_response_table([], [], 5).shape == (0, 5)
    with pytest.raises(ValueError, match="2 prompt temperatures for 1 prompts"):
        per_response_table(requests[:2], [1], 5)


def test_the_decoder_is_decided_once(tiny_model):
    assert Sampler(tiny_model, 1, PAD, MAX_NEW, compile=True, cuda_graph=True).fused
    generic = Sampler(tiny_model, 1, PAD, MAX_NEW, fast_path=False, compile=True)
    assert not generic.fused and not generic.compile  # compiling applies to the fused decoder only
    with pytest.warns(RuntimeWarning, match="sampling.cuda_graph needs the fused decoder"):
        assert not Sampler(tiny_model, 1, PAD, MAX_NEW, fast_path=False, cuda_graph=True).cuda_graph


@pytest.mark.parametrize("kind", ["fixed", "ead"])
@pytest.mark.parametrize("path", list(PATH_KW))
def test_sample_fixed_samples_what_the_decoder_did_with_one_temperature(tiny_model, char_tokenizer, path, kind):
    # what the evaluations, the probes and RFT sample (issue 54): every prompt at one temperature, a number or one
    # request (EAD at inference), through the round's code path: the decoder's own draws given it directly
    prompts = [char_tokenizer.encode(t) for t in TEXTS]
    requests, old = _old_form(kind)
    sampler = Sampler(tiny_model, EOS_MANY, PAD, MAX_NEW, **PATH_KW[path])
    for n in (N_PER, 2):
        got = sampler.sample_fixed(prompts, n, 0.8 if kind == "fixed" else requests[0],
                                   torch.Generator().manual_seed(4))
        want = sample(Sampler(tiny_model, eos_token_id=EOS_MANY, pad_token_id=PAD, max_new_tokens=MAX_NEW,
                              **PATH_KW[path]),
                      prompts, n, temperature=old, generator=torch.Generator().manual_seed(4))
        assert_same_batch(got, want, n)


def test_sample_fixed_refuses_counts_for_other_prompts(tiny_model):
    with pytest.raises(ValueError, match="n has 2 entries for 1 prompts"):
        Sampler(tiny_model, 1, PAD, MAX_NEW).sample_fixed([[3, 4]], [1, 2], 1.0, torch.Generator())
