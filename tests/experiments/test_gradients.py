"""Closed-form token gradient norms (STILL eq. 4) against autograd at the output layer."""

from __future__ import annotations

import pytest
import torch

from explorl.experiments.gradients import logit_gradient_norm, token_gradient_norms

PAD = 0
PROMPTS = [[5, 9, 12], [20, 21, 22, 23, 24], [7]]
RESPONSES = [[30, 31, 32, 1], [40, 41], [50, 51, 52, 53, 54]]


def _batch():
    p = max(map(len, PROMPTS))
    t = max(map(len, RESPONSES))
    n = len(PROMPTS)
    prompt_ids = torch.full((n, p), PAD, dtype=torch.long)
    prompt_mask = torch.zeros((n, p), dtype=torch.long)
    response_ids = torch.full((n, t), PAD, dtype=torch.long)
    response_mask = torch.zeros((n, t))
    for i, (pr, rs) in enumerate(zip(PROMPTS, RESPONSES)):
        prompt_ids[i, p - len(pr):] = torch.tensor(pr)
        prompt_mask[i, p - len(pr):] = 1
        response_ids[i, :len(rs)] = torch.tensor(rs)
        response_mask[i, :len(rs)] = 1
    return prompt_ids, prompt_mask, response_ids, response_mask


def _autograd_norm(model, prompt, response, t, advantage, temperature):
    """||dL/dW||_F for L = A * log_softmax(W h_t / T)[o_t], with h_t the lm_head input at response position t.

    The sequence is scored alone (no padding). h_t is captured by a hook and detached; W is a fresh leaf copy
    of lm_head.weight, so the tied input embedding contributes nothing: only the output-layer path is measured.
    """
    ids = torch.tensor([prompt + response])
    seen = []
    handle = model.get_output_embeddings().register_forward_pre_hook(lambda m, a: seen.append(a[0]))
    with torch.no_grad():
        model(input_ids=ids)
    handle.remove()
    h = seen[0][0, len(prompt) - 1 + t].detach().double()
    w = model.get_output_embeddings().weight.detach().double().clone().requires_grad_(True)
    loss = advantage * torch.log_softmax((w @ h) / temperature, dim=-1)[response[t]]
    (grad,) = torch.autograd.grad(loss, w)
    return grad.norm().item(), grad


@pytest.mark.parametrize("temperature", [1.0, 0.6, 1.7])
def test_matches_autograd_frobenius_norm(tiny_model, temperature):
    prompt_ids, prompt_mask, response_ids, response_mask = _batch()
    adv = torch.tensor([1.5, -0.7, 2.0])
    g = token_gradient_norms(tiny_model, prompt_ids, prompt_mask, response_ids, response_mask,
                             advantages=adv, temperature=temperature)
    assert g.shape == response_ids.shape
    for i, (pr, rs) in enumerate(zip(PROMPTS, RESPONSES)):
        for t in range(len(rs)):
            ref, grad = _autograd_norm(tiny_model, pr, rs, t, adv[i].item(), temperature)
            assert g[i, t].item() == pytest.approx(ref, rel=1e-5, abs=1e-6), (i, t)
            # the gradient really is the rank-1 outer product (A / T)(e - pi) h^T
            assert torch.linalg.matrix_rank(grad).item() == 1
        assert (g[i, len(rs):] == 0).all()


def test_trained_peaked_head_and_per_token_advantages(tiny_llama):
    """An untied head (Llama fixture, wide output init) and [N, T] advantages; zero advantage -> zero norm."""
    prompt_ids, prompt_mask, response_ids, response_mask = _batch()
    adv = torch.randn(response_ids.shape, generator=torch.Generator().manual_seed(0))
    adv[0, 1] = 0.0
    g = token_gradient_norms(tiny_llama, prompt_ids, prompt_mask, response_ids, response_mask, advantages=adv,
                             temperature=0.8)
    for i, (pr, rs) in enumerate(zip(PROMPTS, RESPONSES)):
        for t in range(len(rs)):
            ref, _ = _autograd_norm(tiny_llama, pr, rs, t, adv[i, t].item(), 0.8)
            assert g[i, t].item() == pytest.approx(ref, rel=1e-5, abs=1e-6), (i, t)
    assert g[0, 1] == 0


def test_default_advantage_is_one_and_scales_linearly(tiny_model):
    batch = _batch()
    g1 = token_gradient_norms(tiny_model, *batch)
    g3 = token_gradient_norms(tiny_model, *batch, advantages=-3.0)
    torch.testing.assert_close(g3, 3 * g1)
    assert (g1[batch[3] > 0] > 0).all()


def test_per_response_temperature_matches_scalar_temperature(tiny_model):
    batch = _batch()
    temps = torch.tensor([0.5, 1.0, 2.0])
    g = token_gradient_norms(tiny_model, *batch, temperature=temps)
    for i, temp in enumerate(temps.tolist()):
        gi = token_gradient_norms(tiny_model, *batch, temperature=temp)
        torch.testing.assert_close(g[i], gi[i])
    # per-token [N, T] temperatures, zero on padding (as RolloutBatch.temperatures stores them): finite, 0 off-mask
    per_token = temps[:, None].expand_as(batch[3]) * batch[3]
    gt = token_gradient_norms(tiny_model, *batch, temperature=per_token)
    torch.testing.assert_close(gt, g)


def test_logit_gradient_norm_formula_and_stability():
    gen = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(4, 6, 11, generator=gen, dtype=torch.float64) * 3, dim=-1)
    tokens = torch.randint(0, 11, (4, 6), generator=gen)
    onehot = torch.nn.functional.one_hot(tokens, 11).double()
    direct = (onehot - probs).norm(dim=-1)
    torch.testing.assert_close(logit_gradient_norm(probs, tokens), direct)
    expanded = (1 - 2 * probs.gather(-1, tokens[..., None]).squeeze(-1) + probs.square().sum(-1)).sqrt()
    torch.testing.assert_close(logit_gradient_norm(probs, tokens), expanded)
    # a nearly certain token in float32: 1 - 2 p_o + sum p^2 cancels (most digits lost), the sum of
    # non-negative terms does not
    logits = torch.tensor([12.0, 0.0, -1.0, 0.5])
    p32 = torch.softmax(logits, dim=-1)
    exact = (torch.nn.functional.one_hot(torch.tensor(0), 4).double() - torch.softmax(logits.double(), -1)).norm()
    assert logit_gradient_norm(p32, torch.tensor(0)).item() == pytest.approx(exact.item(), rel=1e-5)
    naive = (1 - 2 * p32[0] + p32.square().sum()).clamp_min(0).sqrt()
    assert abs(naive.item() - exact.item()) > 1e-3 * exact.item()
    # bounds: 0 <= ||e - pi|| <= sqrt(2); a one-hot pi on o gives 0
    assert (logit_gradient_norm(probs, tokens) <= 2 ** 0.5).all()
    assert logit_gradient_norm(torch.tensor([0.0, 1.0, 0.0]), torch.tensor(1)).item() == 0.0
    assert logit_gradient_norm(torch.tensor([0.0, 1.0, 0.0]), torch.tensor(0)).item() == pytest.approx(2 ** 0.5)


def test_bad_advantage_shape_raises(tiny_model):
    with pytest.raises(ValueError, match="advantages"):
        token_gradient_norms(tiny_model, *_batch(), advantages=torch.ones(5))
