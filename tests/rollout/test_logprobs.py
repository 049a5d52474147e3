"""`response_logprobs` (the training forward) against a naive one-sequence-at-a-time computation."""

from __future__ import annotations

import pytest
import torch

from explorl.rollout.logprobs import LogprobOptions, position_ids_from_mask, response_logprobs

PAD = 0
PROMPT_LENS = [3, 7, 1, 5]
RESPONSE_LENS = [6, 2, 4, 0]  # one empty response
T = 6


@pytest.fixture(params=["qwen2", "llama"])
def model(request):
    return request.getfixturevalue("tiny_model" if request.param == "qwen2" else "tiny_llama")


def _batch(vocab: int, seed: int = 0):
    """Left-padded prompts [N, P] and right-padded responses [N, T] of the lengths above, random tokens."""
    g = torch.Generator().manual_seed(seed)
    n, p = len(PROMPT_LENS), max(PROMPT_LENS)
    prompt_ids = torch.full((n, p), PAD)
    prompt_mask = torch.zeros((n, p), dtype=torch.long)
    response_ids = torch.full((n, T), PAD)
    mask = torch.zeros((n, T))
    for i, (lp, lr) in enumerate(zip(PROMPT_LENS, RESPONSE_LENS)):
        prompt_ids[i, p - lp:] = torch.randint(2, vocab, (lp,), generator=g)
        prompt_mask[i, p - lp:] = 1
        response_ids[i, :lr] = torch.randint(2, vocab, (lr,), generator=g)
        mask[i, :lr] = 1
    return prompt_ids, prompt_mask, response_ids, mask


def _naive(model, prompt_ids, prompt_mask, response_ids, mask, temperature):
    """Per sequence, unpadded: model(ids).logits -> log_softmax(logits / T) -> gather; entropy by definition."""
    n, t = response_ids.shape
    temp = torch.as_tensor(temperature, dtype=torch.float32)
    temp = temp.expand(n, t) if temp.dim() == 0 else (temp[:, None].expand(n, t) if temp.dim() == 1 else temp)
    lps, ents = torch.zeros(n, t), torch.zeros(n, t)
    for i in range(n):
        prompt = prompt_ids[i][prompt_mask[i].bool()]
        k = int(mask[i].sum())
        if k == 0:
            continue
        ids = torch.cat([prompt, response_ids[i, :k]])
        logits = model(input_ids=ids[None]).logits[0, len(prompt) - 1:len(prompt) - 1 + k].float()
        logp = torch.log_softmax(logits / temp[i, :k, None], dim=-1)
        lps[i, :k] = logp.gather(-1, response_ids[i, :k, None]).squeeze(-1)
        ents[i, :k] = -(logp.exp() * logp).sum(-1)
    return lps, ents


TEMPERATURES = {
    "float": lambda: 0.7,
    "per-response": lambda: torch.tensor([0.5, 1.0, 1.5, 2.0]),
    "per-token": lambda: 0.5 + torch.rand((4, T), generator=torch.Generator().manual_seed(3)),
}


@pytest.mark.parametrize("temp_kind", list(TEMPERATURES))
def test_matches_naive_per_sequence_computation(model, temp_kind):
    batch = _batch(model.config.vocab_size)
    temperature = TEMPERATURES[temp_kind]()
    with torch.no_grad():
        lp, ent = response_logprobs(model, *batch, temperature)
        want_lp, want_ent = _naive(model, *batch, temperature)
    torch.testing.assert_close(lp, want_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, want_ent, atol=1e-5, rtol=0)
    assert lp.shape == ent.shape == (4, T) and lp.dtype == torch.float32


def test_zero_outside_mask_even_with_zero_temperatures_on_padding(tiny_model):
    # RolloutBatch.temperatures is 0 on padding; passing it back must not turn the padding (or gradients) into NaN
    prompt_ids, prompt_mask, response_ids, mask = _batch(tiny_model.config.vocab_size)
    temps = (0.5 + torch.rand((4, T), generator=torch.Generator().manual_seed(1))) * mask
    lp, ent = response_logprobs(tiny_model, prompt_ids, prompt_mask, response_ids, mask, temps)
    assert torch.isfinite(lp).all() and torch.isfinite(ent).all()
    assert (lp[mask == 0] == 0).all() and (ent[mask == 0] == 0).all()
    assert (lp[mask == 1] < 0).all() and (ent[mask == 1] > 0).all()
    (lp.sum() + ent.sum()).backward()
    assert all(torch.isfinite(p.grad).all() for p in tiny_model.parameters() if p.grad is not None)
    with torch.no_grad():
        want_lp, _ = _naive(tiny_model, prompt_ids, prompt_mask, response_ids, mask, temps + (1 - mask))
    torch.testing.assert_close(lp.detach(), want_lp, atol=1e-5, rtol=0)


def test_gradients_flow_and_match_the_naive_gradient(tiny_model):
    batch = _batch(tiny_model.config.vocab_size)
    params = [p for p in tiny_model.parameters() if p.requires_grad]
    lp, ent = response_logprobs(tiny_model, *batch, 0.8)
    grads = torch.autograd.grad(lp.sum() + 0.1 * ent.sum(), params)
    assert all(torch.isfinite(g).all() for g in grads)
    assert sum(float(g.abs().sum()) for g in grads) > 0
    want_lp, want_ent = _naive(tiny_model, *batch, 0.8)
    want = torch.autograd.grad(want_lp.sum() + 0.1 * want_ent.sum(), params)
    for g, w in zip(grads, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)


def test_chunking_does_not_change_results(tiny_model):
    batch = _batch(tiny_model.config.vocab_size)
    temps = TEMPERATURES["per-token"]()
    with torch.no_grad():
        lp, ent = response_logprobs(tiny_model, *batch, temps)
        for chunk in (1, 4, T - 1):
            lp_c, ent_c = response_logprobs(tiny_model, *batch, temps, options=LogprobOptions(chunk_size=chunk))
            torch.testing.assert_close(lp_c, lp, atol=1e-7, rtol=0)
            torch.testing.assert_close(ent_c, ent, atol=1e-7, rtol=0)


def test_without_entropy(tiny_model):
    batch = _batch(tiny_model.config.vocab_size)
    with torch.no_grad():
        lp, ent = response_logprobs(tiny_model, *batch, options=LogprobOptions(with_entropy=False))
        lp_full, _ = response_logprobs(tiny_model, *batch)
    assert ent is None
    assert torch.equal(lp, lp_full)


def test_padding_does_not_change_a_row(tiny_model):
    # a row scored alone equals the same row scored inside a wider, more padded batch (first PPO ratio = 1)
    batch = _batch(tiny_model.config.vocab_size)
    with torch.no_grad():
        lp, _ = response_logprobs(tiny_model, *batch)
        alone = [x[2:3] for x in batch]  # prompt of length 1 in a batch of width 7
        k = int(alone[1].sum())  # drop the prompt's padding columns
        alone[0], alone[1] = alone[0][:, -k:], alone[1][:, -k:]
        lp_alone, _ = response_logprobs(tiny_model, *alone)
    assert alone[0].shape[1] == 1
    torch.testing.assert_close(lp_alone[0], lp[2], atol=1e-5, rtol=0)


def test_position_ids_skip_left_padding():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1]])
    assert position_ids_from_mask(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4], [0, 0, 0, 0, 0]]


@pytest.mark.parametrize("temp_kind", list(TEMPERATURES))
def test_compiled_fused_forward_gives_the_models_values_and_gradients(model, temp_kind):
    # model.compile: the decoder as `rollout.forward.fused_hidden` under torch.compile against the Hugging Face
    # forward, the same padded batch (left-padded prompts, padded and empty responses, pad tokens of id 0 in both):
    # log-probs, entropies and the gradient of every parameter. The pad row of the embedding gets no gradient in the
    # model (padding_idx); a fused forward that forgot it changed the golden runs' gradient norm by 2%.
    batch = _batch(model.config.vocab_size, seed=4)
    temp = TEMPERATURES[temp_kind]()
    weights = torch.randn((4, T), generator=torch.Generator().manual_seed(5))
    got = {}
    for compile in (False, True):
        model.zero_grad()
        lp, ent = response_logprobs(model, *batch, temp, options=LogprobOptions(compile=compile))
        ((lp * weights).sum() + 0.5 * ent.sum()).backward()
        got[compile] = lp.detach(), ent.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}
    torch.testing.assert_close(got[True][0], got[False][0], atol=1e-5, rtol=0)
    torch.testing.assert_close(got[True][1], got[False][1], atol=1e-5, rtol=0)
    for name, grad in got[False][2].items():
        torch.testing.assert_close(got[True][2][name], grad, atol=1e-4, rtol=1e-4, msg=name)
    assert (batch[0] == PAD).any() and (batch[2] == PAD).any()  # the premise: pad tokens in prompts and responses


def test_the_fused_forward_declines_models_it_would_change(tiny_model):
    from explorl.rollout.forward import fused_training_params

    assert fused_training_params(tiny_model) is not None
    tiny_model.config.attention_dropout = 0.1  # dropout in training: the model's own forward keeps it
    assert fused_training_params(tiny_model) is None


def test_packed_sequences_put_each_prompt_and_response_side_by_side():
    # left-padded prompts of 3, 1 and 2 tokens (pad 0); responses of 2, 3 and 0 tokens (mask), padded to 3
    from explorl.rollout.logprobs import packed_sequences

    prompt_ids = torch.tensor([[11, 12, 13], [0, 0, 21], [0, 31, 32]])
    prompt_mask = (prompt_ids != 0).long()
    response_ids = torch.tensor([[14, 15, 0], [22, 23, 24], [0, 0, 0]])
    response_mask = torch.tensor([[1.0, 1, 0], [1, 1, 1], [0, 0, 0]])
    ids, prompt_len = packed_sequences(prompt_ids, prompt_mask, response_ids, response_mask)
    assert prompt_len.tolist() == [3, 1, 2]
    # L = max(3 + 2, 1 + 3, 2 + 0) = 5; what follows a row's tokens is padding (repeats of its last column)
    assert ids[0].tolist() == [11, 12, 13, 14, 15]
    assert ids[1].tolist()[:4] == [21, 22, 23, 24]
    assert ids[2].tolist()[:2] == [31, 32]
    assert ids.shape == (3, 5)


def _naive_sum_pi_squared(model, prompt_ids, prompt_mask, response_ids, mask, temperature):
    """Per sequence, unpadded: sum_v softmax(logits / T)(v)^2 over the whole vocabulary, in float64."""
    n, t = response_ids.shape
    temp = temperature.to(torch.float64)
    out = torch.zeros(n, t, dtype=torch.float64)
    for i in range(n):
        prompt = prompt_ids[i][prompt_mask[i].bool()]
        k = int(mask[i].sum())
        if k:
            ids = torch.cat([prompt, response_ids[i, :k]])
            logits = model(input_ids=ids[None]).logits[0, len(prompt) - 1:len(prompt) - 1 + k].double()
            out[i, :k] = (torch.softmax(logits / temp[i, :k, None], dim=-1) ** 2).sum(-1)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bf16"])
@pytest.mark.parametrize("path", ["head_blocks", "compiled_fused", "model_logits"])
def test_sum_pi_squared_matches_a_full_softmax(tiny_model, path, dtype, monkeypatch):
    # the optimal token baseline's sum_v pi(v)^2 (docs/methods.md §5s) at per-token temperatures != 1, from each way
    # the forward computes its blocks: the output layer by blocks (eager or the compiled fused decoder) and the model's
    # own logits (models the head split does not take); the log-probs and entropies are those of the call without it
    with torch.no_grad():  # sharpen the tiny model's near-uniform distributions so sum_pi_squared spans a range
        tiny_model.get_output_embeddings().weight.mul_(30)
    model = tiny_model.to(dtype)
    if path == "model_logits":
        monkeypatch.setattr("explorl.rollout.logprobs._split_head", lambda m: None)
    batch = _batch(model.config.vocab_size, seed=6)
    temp = 0.4 + 1.2 * torch.rand((4, T), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        lp, ent, s2 = response_logprobs(model, *batch, temp,
                                        options=LogprobOptions(compile=path == "compiled_fused", chunk_size=8,
                                                               with_sum_pi_squared=True))
        plain = response_logprobs(model, *batch, temp,
                                  options=LogprobOptions(compile=path == "compiled_fused", chunk_size=8))
        want = _naive_sum_pi_squared(model, *batch, temp)
    assert s2.dtype == torch.float32 and s2.shape == (4, T) and len(plain) == 2
    assert torch.equal(lp, plain[0]) and torch.equal(ent, plain[1])
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(s2.double(), want, atol=tol, rtol=0)
    assert (s2[batch[3] == 0] == 0).all() and float(want.max()) > 0.2  # not all flat
