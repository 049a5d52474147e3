"""The chunked output layer never holds the float32 [N, T, V] logits, forward or backward."""

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from explorl.rollout.logprobs import LogprobOptions, response_logprobs


class LargestVocabTensor(TorchDispatchMode):
    """Records the largest tensor with last dimension V produced by any operator (counted in elements)."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab, self.largest = vocab, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.dim() >= 2 and t.shape[-1] == self.vocab:
                self.largest = max(self.largest, t.numel())
        return out


def _model(vocab):
    from explorl.models import TinyQwen2Sizes, tiny_qwen2

    return tiny_qwen2(vocab, TinyQwen2Sizes(hidden=16, layers=1, heads=2, kv_heads=1, intermediate=32), seed=0)


def test_chunked_path_peak_is_one_block_forward_and_backward():
    vocab, n, p, t, chunk = 4096, 2, 3, 64, 32
    model = _model(vocab)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(2, vocab, (n, p), generator=gen)
    resp = torch.randint(2, vocab, (n, t), generator=gen)
    mask = torch.ones(n, t)
    with LargestVocabTensor(vocab) as probe:
        lp, ent = response_logprobs(model, prompt, torch.ones_like(prompt), resp, mask, 1.0,
                                    options=LogprobOptions(chunk_size=chunk))
        (lp.sum() + ent.sum()).backward()
    assert probe.largest == chunk * vocab  # one block of 2 rows x 16 positions, never n * t * vocab
    # the chunked result equals the one-shot computation from the model's own logits
    with torch.no_grad():
        ids = torch.cat([prompt, resp], 1)
        logits = model(input_ids=ids).logits[:, p - 1:p + t - 1].float()
        want = torch.log_softmax(logits, -1).gather(-1, resp[..., None]).squeeze(-1)
    assert torch.allclose(lp.detach(), want, atol=1e-5)


def test_chunked_gradients_equal_the_unchunked_ones():
    vocab, n, p, t = 512, 2, 3, 20
    grads = []
    for chunk in (4, 1024):
        model = _model(vocab)
        gen = torch.Generator().manual_seed(0)
        prompt = torch.randint(2, vocab, (n, p), generator=gen)
        resp = torch.randint(2, vocab, (n, t), generator=gen)
        lp, ent = response_logprobs(model, prompt, torch.ones_like(prompt), resp, torch.ones(n, t), 0.7,
                                    options=LogprobOptions(chunk_size=chunk))
        (lp.sum() - 0.1 * ent.sum()).backward()
        grads.append({k: v.grad.clone() for k, v in model.named_parameters()})
    for k in grads[0]:
        assert torch.allclose(grads[0][k], grads[1][k], atol=1e-5), k
