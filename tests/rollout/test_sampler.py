"""Properties of `rollout.engines.native.sample`, checked against independent references on tiny random models.

References are computed here, one unpadded sequence at a time through `model(...).logits`, or through the
training forward `response_logprobs` (the contract: behaviour log-probs equal a full forward's within 1e-4).
Every decoder is covered: the fused Llama-family path (`fast_path=True`, on Qwen2 and Llama), eager and compiled
by torch.compile (`compile=True`), its static-batch decode (`cuda_graph=True`: on the CPU the step the CUDA graph
captures, run as it is; tests/test_gpu.py replays it as a graph), and the generic Hugging Face path
(`fast_path=False`).
"""

from __future__ import annotations

import pytest
import torch
from batch_helpers import assert_same_batch

from explorl.algos.batch import RolloutBatch
from explorl.rollout.logprobs import response_logprobs
from explorl.rollout.engines.native import sample
from explorl.rollout.sampler import Sampler
from explorl.rollout.forward import supports_fused_forward

TEXTS = ["1+2=?\n", "13-4+17-2=?\n", "5=?\n", "20+20+20-1+3=?\n"]  # four lengths: left padding matters
N_PER = [2, 0, 3, 1]  # variable group sizes, one empty
PAD = 0
MAX_NEW = 12
EOS_MANY = list(range(2, 12))  # ten of 98 ids: most rows end early, a few run to the limit
ATOL = 1e-4
PATH_KW = {"fused": dict(fast_path=True), "compiled": dict(fast_path=True, compile=True),
           "generic": dict(fast_path=False), "static": dict(fast_path=True, cuda_graph=True),
           "static-compiled": dict(fast_path=True, compile=True, cuda_graph=True)}
PATHS = pytest.mark.parametrize("path", list(PATH_KW))


@pytest.fixture(params=["qwen2", "llama"])
def model(request):
    return request.getfixturevalue("tiny_model" if request.param == "qwen2" else "tiny_llama")


@pytest.fixture
def prompts(char_tokenizer):
    return [char_tokenizer.encode(t) for t in TEXTS]


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _sharpen(model, scale: float):
    """Scale the final norm so next-token distributions are peaked (random tiny models are nearly uniform)."""
    with torch.no_grad():
        model.model.norm.weight.mul_(scale)
    return model


def _row_logits(model, ro: RolloutBatch) -> list[torch.Tensor]:
    """For each row: the logits [len_i, V] that predicted its response tokens, from one unpadded forward."""
    out = []
    with torch.no_grad():
        for i in range(len(ro.group)):
            prompt = ro.prompt_ids[i][ro.prompt_mask[i].bool()]
            n_resp = int(ro.mask[i].sum())
            ids = torch.cat([prompt, ro.response_ids[i, :n_resp]])
            logits = model(input_ids=ids[None]).logits[0].float()
            out.append(logits[len(prompt) - 1:len(prompt) - 1 + n_resp])
    return out


def _assert_matches_full_forward(model, ro: RolloutBatch, temperature=None):
    temperature = ro.temperatures if temperature is None else temperature
    lp, ent = response_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.mask, temperature)
    assert torch.isfinite(lp).all() and torch.isfinite(ent).all()
    torch.testing.assert_close(ro.behavior_logprobs, lp, atol=ATOL, rtol=0)
    torch.testing.assert_close(ro.behavior_entropy, ent, atol=ATOL, rtol=0)


def _assert_zero_outside_mask(ro: RolloutBatch):
    off = ro.mask == 0
    assert (ro.behavior_logprobs[off] == 0).all()
    assert (ro.behavior_entropy[off] == 0).all()
    assert (ro.temperatures[off] == 0).all()
    assert (ro.response_ids[off] == PAD).all()


# --- agreement with the training forward -------------------------------------------------------------------


@PATHS
def test_behaviour_logprobs_and_entropy_equal_full_forward(model, prompts, path):
    ro = sample(Sampler(model, eos_token_id=EOS_MANY, pad_token_id=PAD, max_new_tokens=MAX_NEW, **PATH_KW[path]),
                prompts, N_PER, temperature=0.8, generator=_gen())
    assert ro.response_ids.shape == (sum(N_PER), MAX_NEW)
    lengths = ro.lengths.tolist()
    assert len(set(lengths)) > 2 and ro.truncated.any() and not ro.truncated.all()  # the case is not degenerate
    _assert_matches_full_forward(model, ro)
    _assert_matches_full_forward(model, ro, temperature=0.8)
    _assert_zero_outside_mask(ro)
    # the prompts are left-padded copies of the originals
    for i, g in enumerate(ro.group.tolist()):
        assert ro.prompt_ids[i][ro.prompt_mask[i].bool()].tolist() == prompts[g]
        assert ro.prompt_mask[i, -1] == 1


@PATHS
def test_entropy_is_that_of_the_temperature_scaled_softmax(tiny_model, prompts, path):
    ro = sample(Sampler(tiny_model, eos_token_id=EOS_MANY, pad_token_id=PAD, max_new_tokens=MAX_NEW, **PATH_KW[path]),
                prompts, N_PER, temperature=1.7, generator=_gen(3))
    for i, logits in enumerate(_row_logits(tiny_model, ro)):
        logp = torch.log_softmax(logits / 1.7, dim=-1)
        want = -(logp.exp() * logp).sum(-1)
        torch.testing.assert_close(ro.behavior_entropy[i, :len(want)], want, atol=ATOL, rtol=0)
        got_lp = ro.behavior_logprobs[i, :len(want)]
        torch.testing.assert_close(got_lp, logp.gather(-1, ro.response_ids[i, :len(want), None]).squeeze(-1),
                                   atol=ATOL, rtol=0)


# --- temperature -----------------------------------------------------------------------------------------


@PATHS
def test_near_zero_temperature_is_greedy(model, prompts, path):
    _sharpen(model, 5.0)

    def greedy(prompt: list[int], eos: int | None) -> list[int]:
        ids = list(prompt)
        with torch.no_grad():
            for _ in range(MAX_NEW):
                nxt = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
                ids.append(nxt)
                if nxt == eos:
                    break
        return ids[len(prompt):]

    eos = greedy(prompts[0], None)[4]  # a token greedy decoding emits: prompt 0 ends by step 5
    want = [greedy(p, eos) for p in prompts]
    ro = sample(Sampler(model, eos_token_id=eos, pad_token_id=PAD, max_new_tokens=MAX_NEW, **PATH_KW[path]), prompts,
                N_PER, temperature=1e-5, generator=_gen())
    for i, g in enumerate(ro.group.tolist()):
        n = int(ro.lengths[i])
        assert ro.response_ids[i, :n].tolist() == want[g]
        assert bool(ro.truncated[i]) == (want[g][-1] != eos)
    assert ro.lengths.min() < MAX_NEW
    assert ro.behavior_logprobs.max() <= 0 and ro.behavior_logprobs.min() > -1e-3  # probability ~1 each


@PATHS
def test_per_token_temperature_tensor_is_honoured(model, prompts, path):
    num = sum(N_PER)
    temps = 0.4 + 1.2 * torch.rand((num, MAX_NEW + 3), generator=_gen(7))  # extra columns are allowed
    ro = sample(Sampler(model, eos_token_id=EOS_MANY, pad_token_id=PAD, max_new_tokens=MAX_NEW, **PATH_KW[path]),
                prompts, N_PER, temperature=temps, generator=_gen())
    t = ro.response_ids.shape[1]
    assert torch.equal(ro.temperatures, temps[:, :t] * ro.mask)
    _assert_matches_full_forward(model, ro)  # with ro.temperatures (0 on padding)
    _assert_matches_full_forward(model, ro, temperature=temps[:, :t])
    # and they are not what a fixed temperature would give
    lp1, _ = response_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.mask, 1.0)
    assert (lp1 - ro.behavior_logprobs).abs().max() > 1e-2


@PATHS
def test_callable_temperature_schedule(tiny_model, prompts, path):
    def schedule(t: int) -> float:
        return 1.5 - 0.1 * t

    ro = sample(Sampler(tiny_model, eos_token_id=EOS_MANY, pad_token_id=PAD, max_new_tokens=MAX_NEW, **PATH_KW[path]),
                prompts, N_PER, temperature=schedule, generator=_gen())
    t = ro.response_ids.shape[1]
    want = torch.tensor([schedule(j) for j in range(t)])[None].expand_as(ro.mask) * ro.mask
    torch.testing.assert_close(ro.temperatures, want, atol=0, rtol=0)
    _assert_matches_full_forward(tiny_model, ro)

    # a callable may also return one temperature per response
    per_row = torch.linspace(0.5, 2.0, sum(N_PER))
    ro = sample(Sampler(tiny_model, eos_token_id=EOS_MANY, pad_token_id=PAD, max_new_tokens=MAX_NEW, **PATH_KW[path]),
                prompts, N_PER, temperature=lambda step: per_row * (1 + 0.01 * step), generator=_gen())
    t = ro.response_ids.shape[1]
    want = per_row[:, None] * (1 + 0.01 * torch.arange(t))[None] * ro.mask
    torch.testing.assert_close(ro.temperatures, want)
    _assert_matches_full_forward(tiny_model, ro)


def test_per_prompt_temperature_list_expands_to_its_rows(tiny_model, prompts):
    per_prompt = [0.5, 9.0, 1.0, 2.0]  # prompt 1 has no samples
    for temperature in (per_prompt, torch.tensor(per_prompt)):
        ro = sample(Sampler(tiny_model, eos_token_id=EOS_MANY, pad_token_id=PAD, max_new_tokens=MAX_NEW), prompts,
                    N_PER, temperature=temperature, generator=_gen())
        want = torch.tensor([per_prompt[g] for g in ro.group.tolist()])
        assert torch.equal(ro.temperatures, want[:, None] * ro.mask)
        _assert_matches_full_forward(tiny_model, ro)
    # [N] is per response
    per_row = [0.5, 0.6, 0.7, 0.8, 0.9, 1.1]
    ro = sample(Sampler(tiny_model, eos_token_id=EOS_MANY, pad_token_id=PAD, max_new_tokens=MAX_NEW), prompts, N_PER,
                temperature=per_row, generator=_gen())
    assert torch.equal(ro.temperatures, torch.tensor(per_row)[:, None] * ro.mask)
    _assert_matches_full_forward(tiny_model, ro, temperature=torch.tensor(per_row))


def test_temperature_of_length_b_equal_to_n_is_ambiguous(tiny_model, prompts):
    # 4 prompts with n = [2, 0, 1, 1]: 4 responses, so a length-4 temperature could be either per prompt or per row
    with pytest.raises(ValueError, match="ambiguous"):
        sample(Sampler(tiny_model, eos_token_id=EOS_MANY, pad_token_id=PAD, max_new_tokens=MAX_NEW), prompts,
               [2, 0, 1, 1], temperature=[0.5, 1.0, 1.5, 2.0])


@pytest.mark.parametrize("bad", [
    torch.ones(6, MAX_NEW - 1),  # too few columns
    torch.ones(5, MAX_NEW),  # wrong N
    torch.ones(5),  # neither B=4 nor N=6
    [1.0, 1.0, 1.0],
    torch.ones(6, MAX_NEW, 1),  # 3-d
], ids=["short", "rows", "1d", "list", "3d"])
def test_wrong_temperature_shape_raises(tiny_model, prompts, bad):
    with pytest.raises(ValueError, match="temperature"):
        sample(Sampler(tiny_model, eos_token_id=EOS_MANY, pad_token_id=PAD, max_new_tokens=MAX_NEW), prompts, N_PER,
               temperature=bad)


def test_wrong_sample_counts_raise(tiny_model, prompts):
    with pytest.raises(ValueError, match="n has 3 entries for 4 prompts"):
        sample(Sampler(tiny_model, eos_token_id=1, pad_token_id=PAD, max_new_tokens=4), prompts, [1, 1, 1])
    with pytest.raises(ValueError, match=">= 0"):
        sample(Sampler(tiny_model, eos_token_id=1, pad_token_id=PAD, max_new_tokens=4), prompts, [1, -1, 1, 1])


# --- top-p ---------------------------------------------------------------------------------------------------


@PATHS
def test_top_p_logprobs_are_the_renormalised_nucleus(model, prompts, path):
    _sharpen(model, 3.0)
    top_p, temp = 0.7, 0.9
    ro = sample(Sampler(model, eos_token_id=EOS_MANY, pad_token_id=PAD, max_new_tokens=MAX_NEW, top_p=top_p,
                        **PATH_KW[path]),
                prompts, [4, 0, 6, 3], temperature=temp, generator=_gen(1))
    sizes = []
    for i, logits in enumerate(_row_logits(model, ro)):
        probs = torch.softmax(logits / temp, dim=-1)
        sorted_p, order = probs.sort(-1, descending=True)
        before = sorted_p.cumsum(-1) - sorted_p  # mass strictly above each token
        in_nucleus = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, before < top_p)
        nucleus_mass = (probs * in_nucleus).sum(-1)
        toks = ro.response_ids[i, :len(logits)]
        assert in_nucleus.gather(-1, toks[:, None]).all(), "a token outside the nucleus was sampled"
        want = (probs.gather(-1, toks[:, None]).squeeze(-1) / nucleus_mass).log()
        torch.testing.assert_close(ro.behavior_logprobs[i, :len(logits)], want, atol=ATOL, rtol=0)
        # entropy stays that of the untruncated temperature-scaled distribution
        full_ent = -(probs * probs.clamp_min(1e-30).log()).sum(-1)
        torch.testing.assert_close(ro.behavior_entropy[i, :len(logits)], full_ent, atol=ATOL, rtol=0)
        sizes += in_nucleus.sum(-1).tolist()
    assert min(sizes) >= 1 and max(sizes) > 2  # nuclei of several sizes were exercised
    assert (ro.behavior_logprobs[ro.mask.bool()] > -float("inf")).all()


def test_top_p_never_selects_outside_the_nucleus_even_for_a_zero_uniform(tiny_model, prompts, monkeypatch):
    # regression: the inverse-CDF draw once used u = rand() in [0, 1); u == 0 picked token 0 whatever its mass
    _sharpen(tiny_model, 3.0)
    monkeypatch.setattr(torch, "rand", lambda size, *a, **k: torch.zeros(size))
    ro = sample(Sampler(tiny_model, eos_token_id=1, pad_token_id=PAD, max_new_tokens=6, top_p=0.5), prompts,
                [1, 1, 1, 1])
    monkeypatch.undo()
    assert torch.isfinite(ro.behavior_logprobs).all()
    assert not (ro.response_ids == PAD).any()


# --- EOS, masks, groups --------------------------------------------------------------------------------------


@PATHS
def test_eos_handling(model, prompts, path):
    n_per = [3, 2, 4, 3]
    # a seed where some rows end and some do not (the static decode's stream parts from the others' once a row ends)
    seed = 3 if path.startswith("static") else 2
    ro = sample(Sampler(model, eos_token_id=EOS_MANY, pad_token_id=PAD, max_new_tokens=MAX_NEW, **PATH_KW[path]),
                prompts, n_per, generator=_gen(seed))
    eos = torch.tensor(EOS_MANY)
    ended = 0
    for i in range(len(ro.group)):
        toks, m = ro.response_ids[i], ro.mask[i]
        hits = torch.isin(toks, eos).nonzero().flatten()
        n = int(m.sum())
        assert torch.equal(m, (torch.arange(len(m)) < n).float())  # a prefix of ones
        if len(hits):
            assert hits[0] == n - 1 and len(hits) == 1  # mask ends at the first EOS, inclusive; none after
            assert not ro.truncated[i]
            ended += 1
        else:
            assert n == MAX_NEW and ro.truncated[i]
        assert (toks[n:] == PAD).all()
    assert 0 < ended < len(ro.group)
    assert ro.response_ids.shape[1] == MAX_NEW  # some row ran to the limit
    _assert_zero_outside_mask(ro)


def test_width_trims_to_the_longest_response(tiny_model, prompts):
    ro = sample(Sampler(tiny_model, eos_token_id=list(range(2, 60)), pad_token_id=PAD, max_new_tokens=40), prompts, 3,
                generator=_gen())
    assert not ro.truncated.any()
    assert ro.response_ids.shape[1] == int(ro.lengths.max()) < 40


def test_no_eos_truncates_every_row(tiny_model, prompts):
    ro = sample(Sampler(tiny_model, eos_token_id=[], pad_token_id=PAD, max_new_tokens=5), prompts, 2, generator=_gen())
    assert ro.truncated.all() and (ro.mask == 1).all() and ro.response_ids.shape == (8, 5)


def test_group_ids_and_row_order(tiny_model, prompts):
    ro = sample(Sampler(tiny_model, eos_token_id=EOS_MANY, pad_token_id=PAD, max_new_tokens=4), prompts, N_PER,
                generator=_gen())
    assert ro.group.tolist() == [0, 0, 2, 2, 2, 3]
    assert ro.group.dtype == torch.long
    width = max(len(prompts[g]) for g in (0, 2, 3))  # prompt 1 has no rows and does not widen the batch
    assert ro.prompt_ids.shape == ro.prompt_mask.shape == (6, width)
    sub = ro.select(torch.tensor([1, 4]))
    assert sub.group.tolist() == [0, 2] and torch.equal(sub.response_ids, ro.response_ids[[1, 4]])


@pytest.mark.parametrize("n", [0, [0, 0, 0, 0]])
def test_no_samples_returns_empty_rollouts(tiny_model, prompts, n):
    ro = sample(Sampler(tiny_model, eos_token_id=1, pad_token_id=PAD, max_new_tokens=MAX_NEW), prompts, n)
    assert len(ro.group) == 0 and ro.group.shape == (0,)
    for name in ("prompt_ids", "prompt_mask", "response_ids", "mask", "behavior_logprobs", "behavior_entropy",
                     "temperatures"):
        assert getattr(ro, name).shape[0] == 0, name
    assert ro.truncated.shape == (0,) and ro.lengths.shape == (0,)


# --- randomness ----------------------------------------------------------------------------------------------


@PATHS
def test_seeds_reproduce_and_differ(tiny_model, prompts, path):
    sampler = Sampler(tiny_model, EOS_MANY, PAD, MAX_NEW, **PATH_KW[path])
    a = sample(sampler, prompts, N_PER, generator=_gen(11))
    b = sample(sampler, prompts, N_PER, generator=_gen(11))
    c = sample(sampler, prompts, N_PER, generator=_gen(12))
    assert_same_batch(a, b)
    assert a.response_ids.shape != c.response_ids.shape or not torch.equal(a.response_ids, c.response_ids)
    # rows of one group are distinct draws, not copies
    assert not torch.equal(a.response_ids[2], a.response_ids[3])


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_fused_and_generic_paths_draw_the_same_samples(model, prompts, top_p):
    # same math and one uniform per live row per step on both paths, so the same seed gives the same tokens
    assert supports_fused_forward(model)
    temps = 0.5 + torch.rand((sum(N_PER), MAX_NEW), generator=_gen(5))
    fused = sample(Sampler(model, EOS_MANY, PAD, MAX_NEW, top_p, fast_path=True), prompts, N_PER, temps, _gen(4))
    generic = sample(Sampler(model, EOS_MANY, PAD, MAX_NEW, top_p, fast_path=False), prompts, N_PER, temps, _gen(4))
    for name in ("response_ids", "mask", "truncated", "group", "prompt_ids", "prompt_mask", "temperatures"):
        assert torch.equal(getattr(fused, name), getattr(generic, name)), name
    torch.testing.assert_close(fused.behavior_logprobs, generic.behavior_logprobs, atol=1e-5, rtol=0)
    torch.testing.assert_close(fused.behavior_entropy, generic.behavior_entropy, atol=1e-5, rtol=0)


@pytest.mark.parametrize("temperature", ["fixed", "per_prompt", "per_token", "schedule"])
@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_compiled_and_eager_fused_paths_draw_the_same_samples(model, prompts, temperature, top_p):
    # the compiled step is the eager one's math in other kernels, fed the same uniforms: the same seed gives the same
    # tokens (a draw could differ only where a uniform falls within float rounding of a cdf boundary) and log-probs
    # and entropies equal within rounding. The schedules: a float, a temperature per prompt (the adaptive schedule),
    # per token (EAD, RevEAD: a [N, T] tensor) and a callable of the step (E3's controller steps the scalar).
    temps = {"fixed": 0.9, "per_prompt": [0.6, 1.0, 1.4, 0.8], "schedule": lambda t: 1.3 - 0.05 * t,
             "per_token": 0.5 + torch.rand((sum(N_PER), MAX_NEW), generator=_gen(5))}[temperature]
    eager = sample(Sampler(model, EOS_MANY, PAD, MAX_NEW, top_p, fast_path=True), prompts, N_PER, temps, _gen(4))
    compiled = sample(Sampler(model, EOS_MANY, PAD, MAX_NEW, top_p, fast_path=True, compile=True), prompts, N_PER,
                      temps, _gen(4))
    for name in ("response_ids", "mask", "truncated", "group", "prompt_ids", "prompt_mask", "temperatures"):
        assert torch.equal(getattr(eager, name), getattr(compiled, name)), name
    assert eager.lengths.min() < eager.lengths.max()  # rows ended at EOS at different steps: finished rows dropped
    torch.testing.assert_close(compiled.behavior_logprobs, eager.behavior_logprobs, atol=1e-5, rtol=0)
    torch.testing.assert_close(compiled.behavior_entropy, eager.behavior_entropy, atol=1e-5, rtol=0)


@pytest.mark.parametrize("temperature", ["fixed", "per_prompt", "per_token", "schedule"])
@pytest.mark.parametrize("top_p", [1.0, 0.8])
@pytest.mark.parametrize("compile", [False, True])
def test_static_decode_draws_the_dynamic_decoders_samples_while_no_row_ends(model, prompts, temperature, top_p,
                                                                          compile):
    # the static decode's uniform table is the dynamic decode's stream while every row is live (`uniforms(N)` per
    # step), and its step the same math over the whole cache, masked: with no EOS reachable the tokens are the same
    # and the log-probs equal within float rounding (the attention sums over more, masked, slots)
    temps = {"fixed": 0.9, "per_prompt": [0.6, 1.0, 1.4, 0.8], "schedule": lambda t: 1.3 - 0.05 * t,
             "per_token": 0.5 + torch.rand((sum(N_PER), MAX_NEW), generator=_gen(5))}[temperature]
    kw = dict(top_p=top_p, fast_path=True, compile=compile)
    dynamic = sample(Sampler(model, [], PAD, MAX_NEW, **kw), prompts, N_PER, temps, _gen(4))
    static = sample(Sampler(model, [], PAD, MAX_NEW, cuda_graph=True, **kw), prompts, N_PER, temps, _gen(4))
    for name in ("response_ids", "mask", "truncated", "group", "prompt_ids", "prompt_mask", "temperatures"):
        assert torch.equal(getattr(dynamic, name), getattr(static, name)), name
    assert static.truncated.all()
    torch.testing.assert_close(static.behavior_logprobs, dynamic.behavior_logprobs, atol=1e-5, rtol=0)
    torch.testing.assert_close(static.behavior_entropy, dynamic.behavior_entropy, atol=1e-5, rtol=0)


def test_static_decode_stops_soon_after_the_last_row_ends(tiny_model, prompts, monkeypatch):
    # every row ends within a few tokens (58 of 98 ids are EOS): the loop checks every CHECK_EVERY steps whether a
    # row is live, so it runs at most that many steps past the last EOS, never all 200
    import explorl.rollout.engines.static as static

    calls = []

    def counted(*args):
        calls.append(1)
        return static_step(*args)

    static_step = static.static_step
    monkeypatch.setattr(static, "static_step", counted)
    ro = sample(Sampler(tiny_model, eos_token_id=list(range(2, 60)), pad_token_id=PAD, max_new_tokens=200,
                        cuda_graph=True),
                prompts, 3, generator=_gen())
    longest = int(ro.lengths.max())
    assert not ro.truncated.any() and ro.response_ids.shape[1] == longest < 200
    assert longest <= len(calls) <= longest + static.CHECK_EVERY


def test_the_cuda_graph_asked_of_a_model_the_fused_decoder_declines_warns_and_decodes_as_before(tiny_model, prompts):
    with pytest.warns(RuntimeWarning, match="sampling.cuda_graph needs the fused decoder"):
        asked = sample(Sampler(tiny_model, EOS_MANY, PAD, MAX_NEW, fast_path=False, cuda_graph=True), prompts, N_PER,
                       generator=_gen())
    plain = sample(Sampler(tiny_model, EOS_MANY, PAD, MAX_NEW, fast_path=False), prompts, N_PER, generator=_gen())
    assert torch.equal(asked.response_ids, plain.response_ids)


def test_a_failed_compilation_falls_back_to_the_eager_sampler_with_a_warning(tiny_model, prompts, monkeypatch):
    import explorl.rollout.forward as forward

    def broken_compile(fn, **_):
        def compiled(*args):
            raise RuntimeError("no C compiler found")
        return compiled

    monkeypatch.setattr(forward, "_COMPILED", {})
    monkeypatch.setattr(forward, "_COMPILE_FAILED", [])
    monkeypatch.setattr(torch, "compile", broken_compile)
    failed = "torch.compile of the sampler failed .*no C compiler found.*sampling.compile"
    with pytest.warns(RuntimeWarning, match=failed):
        fallback = sample(Sampler(tiny_model, EOS_MANY, PAD, MAX_NEW, compile=True), prompts, N_PER,
                          generator=_gen(6))
    eager = sample(Sampler(tiny_model, EOS_MANY, PAD, MAX_NEW), prompts, N_PER, generator=_gen(6))
    assert torch.equal(fallback.response_ids, eager.response_ids)
    # the first step ran the compiled layout (the whole cache under a mask) eagerly: equal up to rounding
    torch.testing.assert_close(fallback.behavior_logprobs, eager.behavior_logprobs, atol=1e-6, rtol=0)
    assert forward.compile_failed()  # later calls go straight to the eager functions


@pytest.mark.parametrize("vocab", [1000, 1025, 5000, 32000])
def test_block_inverse_cdf_is_the_direct_draw(vocab):
    # reference: the direct inverse CDF over the whole row, in float64 so no rounding separates the two; weights
    # with exact zeros (every 7th token) and uniforms at both ends of (0, 1]. 1000 is below the block threshold
    # (4 * CDF_BLOCK), 1025 pads its last block, 5000 and 32000 take many blocks.
    from explorl.rollout.draw import CDF_BLOCK, inverse_cdf

    assert 1000 <= 4 * CDF_BLOCK < 1025
    g = _gen(vocab)
    w = torch.rand(64, vocab, generator=g, dtype=torch.float64) ** 8
    w[:, ::7] = 0
    u = 1 - torch.rand(64, 1, generator=g, dtype=torch.float64)
    u[0], u[1] = 1.0, 1e-12
    cdf = w.cumsum(-1)
    direct = (cdf < u * cdf[:, -1:]).sum(-1)
    drawn = inverse_cdf(w, u)
    assert torch.equal(drawn, direct)
    assert (w.gather(-1, drawn[:, None]) > 0).all()  # never a token of weight 0
    assert drawn[0] == int(w[0].nonzero().max())  # u = 1: the last token of positive weight


def test_large_vocabulary_draws_follow_the_softmax():
    # chi-square goodness of fit of 40,000 draws of `draw_tokens` (the block path: V = 2048 > 4 blocks) against
    # softmax(logits / T) over the 8 likely tokens and the rest pooled (9 cells, 8 degrees of freedom); the 0.999
    # quantile is 26.12, so a correct sampler fails 1 in 1,000 seeds, and a draw off by one token (or ignoring T)
    # puts tens of thousands of draws in the wrong cell
    from explorl.rollout.draw import draw_tokens, uniforms

    v, n, temp = 2048, 40_000, 0.7
    logits = torch.full((v,), -6.0)
    likely = torch.tensor([3, 250, 256, 700, 1023, 1024, 1500, 2047])
    logits[likely] = torch.linspace(0.0, 1.4, 8)
    p = torch.softmax(logits.double() / temp, -1)
    tokens, logp, _ = draw_tokens(logits.expand(n, v), torch.full((n,), temp), 1.0, uniforms(n, "cpu", _gen(11)))
    expected = torch.cat([p[likely], (1 - p[likely].sum())[None]]) * n
    counts = torch.cat([(tokens[:, None] == likely).sum(0), (~torch.isin(tokens, likely)).sum()[None]]).double()
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 26.12, (chi2, counts, expected)
    torch.testing.assert_close(logp.double(), p.log()[tokens], atol=1e-5, rtol=0)


def test_generator_is_the_only_randomness(tiny_model, prompts):
    torch.manual_seed(0)
    a = sample(Sampler(tiny_model, eos_token_id=EOS_MANY, pad_token_id=PAD, max_new_tokens=6), prompts, 2,
               generator=_gen(9))
    torch.manual_seed(1)
    b = sample(Sampler(tiny_model, eos_token_id=EOS_MANY, pad_token_id=PAD, max_new_tokens=6), prompts, 2,
               generator=_gen(9))
    assert torch.equal(a.response_ids, b.response_ids)


# --- decoders ------------------------------------------------------------------------------------------------


def test_training_mode_is_restored(tiny_model, prompts):
    tiny_model.train()
    sample(Sampler(tiny_model, eos_token_id=1, pad_token_id=PAD, max_new_tokens=3), prompts, 1)
    assert tiny_model.training
    tiny_model.eval()
    sample(Sampler(tiny_model, eos_token_id=1, pad_token_id=PAD, max_new_tokens=3), prompts, 1)
    assert not tiny_model.training


def test_fused_path_declines_mistral_sliding_window_and_stays_exact(prompts):
    # regression: Mistral applies `sliding_window` whenever it is set (no use_sliding_window flag); the fused
    # decoder has full attention, so it must hand such models to the generic path
    from transformers import MistralConfig, MistralForCausalLM

    cfg = MistralConfig(vocab_size=98, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=4,
                        max_position_embeddings=128, pad_token_id=0, eos_token_id=1, bos_token_id=None)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = MistralForCausalLM(cfg).eval()
    assert not supports_fused_forward(model)
    ro = sample(Sampler(model, eos_token_id=1, pad_token_id=PAD, max_new_tokens=8), prompts, 2, generator=_gen())
    _assert_matches_full_forward(model, ro, temperature=1.0)
    cfg_full = MistralConfig(**{**cfg.to_dict(), "sliding_window": None})
    assert supports_fused_forward(MistralForCausalLM(cfg_full))


def test_after_a_failed_compile_the_static_step_uses_the_eager_attention(tiny_model, prompts, monkeypatch):
    """When compiling the static step fails (at its first call), the decode goes on eagerly with the eager form of
    the decode attention (grouped matmuls), not the broadcast-and-sum form written for inductor to fuse, which
    eagerly materialises [n, KV, g, L, D] products in every layer: the form is decided at each step's call."""
    import explorl.rollout.forward as fwd

    monkeypatch.setattr(fwd, "_COMPILED", {})
    monkeypatch.setattr(fwd, "_COMPILE_FAILED", [])

    def fails(*args):
        raise RuntimeError("no compiler here")
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: fails)
    forms = []
    attention = fwd._attention

    def spy(q, k, v, attn_mask, n_kv, reduce_kernel):
        if q.shape[2] == 1:  # a decode step's attention
            forms.append(reduce_kernel)
        return attention(q, k, v, attn_mask, n_kv, reduce_kernel)
    monkeypatch.setattr(fwd, "_attention", spy)
    with pytest.warns(RuntimeWarning, match="torch.compile of the sampler failed"):
        sample(Sampler(tiny_model, [], PAD, MAX_NEW, fast_path=True, compile=True, cuda_graph=True), prompts, N_PER,
               0.9, _gen(4))
    layers = tiny_model.config.num_hidden_layers
    # the first step's call was made before its compile failed; every later step is eager in both senses
    assert forms[layers:] and not any(forms[layers:])
    assert len(forms) == layers * MAX_NEW
