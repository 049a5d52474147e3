"""Token gradient norms at the output layer in closed form (STILL, eq. 4 and appendix A.1; docs/methods.md §8b).

For one response token o_t, the policy-gradient term is L_t = alpha_t * log pi(o_t | h_t), with
pi = softmax(z / T), logits z = W h_t, W the [V, d] output-layer (lm_head) weight and h_t its input (the
final hidden state after the final norm). With s = z / T:

    dL_t/ds = alpha_t * (e(o_t) - pi)            (softmax / log-softmax derivative, appendix A.1)
    dL_t/dz = (alpha_t / T) * (e(o_t) - pi)      (ds/dz = I / T)
    dL_t/dW = (alpha_t / T) * (e(o_t) - pi) h_t^T   (dz/dW: z_k = W_k . h_t)

The Frobenius norm of an outer product u v^T is ||u||_2 ||v||_2 (||u v^T||_F^2 = sum_ij u_i^2 v_j^2), so

    G_t = |alpha_t| / T * ||e(o_t) - pi||_2 * ||h_t||_2

which at T = 1 is the paper's G_t = |alpha_t| * ||e(o_t) - pi||_2 * ||h_t||_2. No [V, d] gradient is formed.
For the clipped GRPO objective, alpha_t = ratio_t * min(A_t, clip(A_t, 1 - eps, 1 + eps)) as the paper writes it;
pass whatever per-token coefficient is wanted as `advantages` (the plain advantage, or alpha_t itself).

Only the weight matrix is covered: an output bias (absent in Qwen2/Llama) or logit soft-capping is not part
of the closed form. With tied embeddings, the tied matrix also gets gradient through the input embedding;
G_t is the output-layer part only, as in the paper.
"""

from __future__ import annotations

import torch

from explorl.rollout.logprobs import per_token_temperature, position_ids_from_mask


def logit_gradient_norm(probs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """||e(o) - pi||_2 for distributions `probs` [..., V] and tokens `tokens` [...] (int64) -> [...].

    Algebraically sqrt(1 - 2 p_o + sum_j p_j^2) = sqrt((1 - p_o)^2 + sum_{j != o} p_j^2). It is computed as
    the latter with 1 - p_o taken as sum_{j != o} p_j (equal for a normalised distribution): a sum of
    non-negative terms, so nothing cancels when p_o is close to 1, where the expanded form (and even 1 - p_o
    itself) is a difference of numbers near 1 and loses most digits in float32. Computed in at least float32.
    """
    if probs.dtype not in (torch.float32, torch.float64):
        probs = probs.float()
    idx = tokens.long().unsqueeze(-1)
    others = probs.scatter(-1, idx, 0.0)
    return (others.sum(-1).square() + others.square().sum(-1)).sqrt()


def _as_advantages(advantages, n: int, t: int, device) -> torch.Tensor:
    """[N, T] coefficients from None (1), a number, [N] (per response) or [N, T] (per token)."""
    if advantages is None:
        return torch.ones((n, t), device=device)
    adv = torch.as_tensor(advantages, dtype=torch.float32, device=device)
    if adv.dim() == 0:
        return adv.expand(n, t)
    if adv.dim() == 1 and adv.shape[0] == n:
        return adv[:, None].expand(n, t)
    if adv.dim() == 2 and adv.shape == (n, t):
        return adv
    raise ValueError(f"advantages of shape {tuple(adv.shape)}: expected a scalar, [N={n}] or [N={n}, T={t}]")


@torch.no_grad()
def token_gradient_norms(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, response_ids: torch.Tensor,
                         response_mask: torch.Tensor, advantages=None, temperature=1.0, *,
                         chunk_size: int = 1024) -> torch.Tensor:
    """Per-token Frobenius norm of the output-layer weight gradient of alpha_t * log pi(o_t), in closed form.

    One forward pass in the layout of `rollout.logprobs.response_logprobs` (left-padded prompts of width P,
    then right-padded responses of width T). The lm_head input h_t is captured with a forward pre-hook on
    `model.get_output_embeddings()`: exactly the vector the logits are computed from, whatever the model
    family reports as its last hidden state.

    Args:
        prompt_ids, prompt_mask: [N, P]; response_ids: [N, T]; response_mask: [N, T] (1 on response tokens).
        advantages: alpha_t: None (1 everywhere), a number, [N] per response or [N, T] per token.
        temperature: a float, [N] or [N, T] (as in `response_logprobs`); pi = softmax(logits / T) and the
            gradient carries the chain-rule factor 1 / T (see the module docstring).
        chunk_size: response tokens per block of the float32 [N, T, V] softmax.
    Returns:
        G [N, T] float32: |alpha_t| / T_t * ||e(o_t) - pi_t||_2 * ||h_t||_2, 0 where response_mask == 0.
    """
    n, t = response_ids.shape
    head = model.get_output_embeddings()
    if head is None:
        raise ValueError("model has no output embeddings (lm_head); the closed form needs one")
    captured: list[torch.Tensor] = []

    def grab(_module, args):
        captured.append(args[0])

    input_ids = torch.cat([prompt_ids, response_ids], dim=1)
    attention_mask = torch.cat([prompt_mask.to(response_mask.dtype), response_mask], dim=1).long()
    attention_mask[:, prompt_ids.shape[1]:] = 1  # as in response_logprobs: padded response rows stay attendable
    handle = head.register_forward_pre_hook(grab)
    try:
        out = model(input_ids=input_ids, attention_mask=attention_mask,
                    position_ids=position_ids_from_mask(attention_mask), logits_to_keep=t + 1, use_cache=False)
    finally:
        handle.remove()
    if len(captured) != 1:
        raise RuntimeError(f"expected one call of the output layer in the forward pass, saw {len(captured)}")
    logits = out.logits[:, -(t + 1):-1]  # the logit at position j predicts token j + 1
    hidden = captured[0][:, -(t + 1):-1]
    if hidden.shape[:2] != (n, t):
        raise RuntimeError(f"lm_head input of shape {tuple(captured[0].shape)} does not match the response width {t}")
    mask = response_mask.to(device=logits.device, dtype=torch.float32)
    temp = per_token_temperature(temperature, n, t, logits.device).masked_fill(mask[..., None] == 0, 1.0)
    alpha = _as_advantages(advantages, n, t, logits.device)
    tokens = response_ids.to(logits.device)
    norms = []
    for s in range(0, t, chunk_size):
        probs = torch.softmax(logits[:, s:s + chunk_size].float() / temp[:, s:s + chunk_size], dim=-1)
        norms.append(logit_gradient_norm(probs, tokens[:, s:s + chunk_size]))
    h_norm = hidden.float().norm(dim=-1)
    return alpha.abs() / temp[..., 0] * torch.cat(norms, dim=1) * h_norm * mask
