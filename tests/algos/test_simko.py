"""SimKO (docs/methods.md §5w): the loss's value and gradients by hand, against an independent transcription of the
authors' `compute_policy_loss_simko`; its inputs from explorl's training forward (pi_old's and the current policy's
top-K log-probs, entropies, top-1 flags) against a slow per-response reference on a tiny model's full logits; and
the validation of its options."""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import torch.nn.functional as F

from explorl.algos.batch import MissingInputError, RolloutBatch, TopK
from explorl.algos.methods.simko import SimkoInputs, SimkoOptions, entropy_gate, simko_loss
from explorl.algos.registry import lookup
from explorl.algos.step import compute_advantages, policy_objective, requirements
from explorl.config import AlgoConfig, ConfigError, load_config
from explorl.rollout import logprobs as logprobs_module
from explorl.train import update as update_module
from explorl.train.update import fill_logprobs

F64 = torch.float64


def test_hand_derived_gradients_on_policy():
    # two responses of two tokens, new = old (every ratio 1), tau 0.8, alpha 0.5, K = 2, token-mean over 4 tokens
    # entropies [1, 3]: threshold 1 + 0.8 * (3 - 1) = 2.6, so the second token of each response is gated in
    # response 0 correct, A = +1: value -(1 + 1) / 4 per response; d/d logp_new: token 0 -1/4, token 1
    #   -(1 - 0.5) / 4 = -0.125; each of the K = 2 candidates of token 1: -(0.5 / 2) / 4 = -0.0625
    # response 1 wrong, A = -1, token 1 the policy's top-1 and gated: A' = -1.1 there -> d/d logp_new +1.1 / 4
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.7]], dtype=F64)
    new = logp.clone().requires_grad_(True)
    topk_old = torch.tensor([[[-0.3, -1.5]] * 2, [[-0.2, -2.0]] * 2], dtype=F64)
    topk_new = topk_old.clone().requires_grad_(True)
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]], dtype=F64)
    entropy = torch.tensor([[1.0, 3.0], [1.0, 3.0]], dtype=F64)
    is_top1 = torch.tensor([[False, False], [False, True]])
    inputs = SimkoInputs(logp, topk_old, adv, torch.ones(2, 2), torch.tensor([True, False]), entropy, is_top1)
    loss, stats = simko_loss(new, topk_new, inputs, options=SimkoOptions(alpha=0.5, tau=0.8))
    assert loss.item() == pytest.approx((-1 - 1 + 1 + 1.1) / 4, abs=1e-12)
    loss.backward()
    assert torch.allclose(new.grad, torch.tensor([[-0.25, -0.125], [0.25, 0.275]], dtype=F64), atol=1e-12)
    want_topk = torch.zeros(2, 2, 2, dtype=F64)
    want_topk[0, 1] = -0.0625
    assert torch.allclose(topk_new.grad, want_topk, atol=1e-12)
    assert stats["loss/simko_gate_frac"] == pytest.approx(0.5) and stats["loss/simko_neg_scaled_frac"] == 0.25


def _authors(old, old_topk, new, new_topk, entropy, adv, mask, correct, is_top1, alpha, tau, clip):
    """The authors' computation transcribed independently: per-row torch.quantile threshold, the mixed ratio with
    their numerator / (denominator + 1e-8), the 1.1 factor on negative rows' top-1 gated tokens, PPO's clip,
    token-mean."""
    k = new_topk.shape[-1]
    valid = mask > 0
    thr = torch.stack([torch.quantile(entropy[b][valid[b]], tau) for b in range(entropy.shape[0])])[:, None]
    w = (entropy > thr).to(F64)
    diff_k = new_topk - old_topk
    terms = (torch.exp((new - old).detach())[..., None] / (torch.exp(diff_k.detach()) + 1e-8)) * torch.exp(diff_k)
    mix = alpha * w * valid
    ratio = torch.exp(new - old)
    ratio = torch.where(correct[:, None] & valid, (1 - mix) * ratio + mix / k * terms.sum(-1), ratio)
    neg = ((adv * mask).sum(-1) < 0)[:, None] & is_top1 & (entropy > thr)
    a = torch.where(neg, adv * 1.1, adv)
    losses = torch.maximum(-a * ratio, -a * ratio.clamp(1 - clip, 1 + clip))
    return (losses * mask).sum() / mask.sum()


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), alpha=st.sampled_from([0.01, 0.3]), tau=st.sampled_from([0.5, 0.8]))
def test_equals_the_authors_computation(seed, alpha, tau):
    g = torch.Generator().manual_seed(seed)
    n, t, k = 4, 6, 3
    mask = torch.ones(n, t, dtype=F64)
    mask[1, 4:] = 0
    old = -torch.rand(n, t, generator=g, dtype=F64) * 2
    new = (old + 0.3 * torch.randn(n, t, generator=g, dtype=F64)).requires_grad_(True)
    old_topk = -torch.rand(n, t, k, generator=g, dtype=F64) * 2
    new_topk = (old_topk + 0.3 * torch.randn(n, t, k, generator=g, dtype=F64)).requires_grad_(True)
    entropy = torch.rand(n, t, generator=g, dtype=F64) * 3
    adv = torch.tensor([1.0, -0.5, 0.7, -1.2], dtype=F64)[:, None].expand(n, t) * mask
    correct = torch.tensor([True, False, True, False])
    is_top1 = torch.rand(n, t, generator=g) > 0.4
    inputs = SimkoInputs(old, old_topk, adv, mask, correct, entropy, is_top1)
    loss, _ = simko_loss(new, new_topk, inputs, options=SimkoOptions(alpha=alpha, tau=tau))
    ref = _authors(old, old_topk, new, new_topk, entropy, adv, mask, correct, is_top1, alpha, tau, 0.2)
    grads = torch.autograd.grad(loss, (new, new_topk))
    ref_grads = torch.autograd.grad(ref, (new, new_topk))
    assert loss.item() == pytest.approx(ref.item(), abs=1e-6)
    for got, want in zip(grads, ref_grads):
        assert torch.allclose(got * mask[..., None] if got.dim() == 3 else got * mask,
                              want * mask[..., None] if want.dim() == 3 else want * mask, atol=1e-6)


def test_the_gate_is_per_response_and_tau_one_selects_nothing():
    entropy = torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0], [5.0, 5.0, 0.0, 9.0, 9.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    # row 0: quantile 0.5 of 0..4 is 2 -> tokens 3 and 4; row 1: of [5, 5, 0] is 5 -> none (the 9s are padding)
    assert torch.equal(entropy_gate(entropy, mask, 0.5), torch.tensor([[0, 0, 0, 1, 1], [0, 0, 0, 0, 0]]).bool())
    assert not entropy_gate(entropy, mask, 1.0).any()


def test_accepted_at_validation_with_the_authors_defaults():
    cfg = load_config(None, ["algo.loss=simko"])
    entry = lookup("policy_loss", "simko")
    assert entry.options().top_k == 3 and entry.options().tau == 0.8 and entry.options().alpha == 0.01
    assert entry.options().neg_scale == 1.1
    assert requirements(cfg.algo).topk == 3 and not requirements(cfg.algo).old_logprobs  # the shortcut may serve
    assert requirements(load_config(None, ["algo.loss=simko", "algo.simko.top_k=5"]).algo).topk == 5
    assert requirements(load_config(None, []).algo).topk == 0
    x = torch.zeros(1, 2)
    topk = TopK(logprobs=torch.zeros(1, 2, 3), entropy=x, is_top1=x.bool())
    with pytest.raises(MissingInputError, match=r"algo.loss=simko needs RolloutBatch fields \['topk_logprobs', "
                                                r"'correct'\]"):
        entry.fn(x, RolloutBatch.for_loss(torch.ones(1, 2), x, logprobs=x, max_response_len=2), AlgoConfig(),
                 topk=topk, options=entry.options())


def _naive(model, ro: RolloutBatch, temp: float, k: int):
    """Per response, unpadded, one plain forward of its prompt and response: log_softmax(logits / temp), then the
    sampled tokens' log-probs, `torch.topk`'s K largest log-probs, the entropy by definition and argmax == sampled
    token; zeros (False) on padding. Differentiable in the model's parameters."""
    n, t = ro.response_ids.shape
    lps, tops, ents, firsts = [], [], [], []
    for i in range(n):
        prompt = ro.prompt_ids[i][ro.prompt_mask[i].bool()]
        m = int(ro.mask[i].sum())
        ids = torch.cat([prompt, ro.response_ids[i, :m]])
        logits = model(input_ids=ids[None]).logits[0, len(prompt) - 1:len(prompt) - 1 + m].float()
        logp = torch.log_softmax(logits / temp, dim=-1)
        pad = t - m
        lps.append(F.pad(logp.gather(-1, ro.response_ids[i, :m, None]).squeeze(-1), (0, pad)))
        tops.append(F.pad(torch.topk(logp, k, dim=-1).values, (0, 0, 0, pad)))
        ents.append(F.pad(-(logp.exp() * logp).sum(-1), (0, pad)))
        firsts.append(torch.cat([logp.argmax(-1) == ro.response_ids[i, :m], torch.zeros(pad, dtype=torch.bool)]))
    return torch.stack(lps), torch.stack(tops), torch.stack(ents), torch.stack(firsts)


def _rollout(vocab: int) -> RolloutBatch:
    """Two groups of two responses (one correct, one wrong in each), left-padded prompts, one short response."""
    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1.0] * 5, [1.0, 1.0, 1.0, 0.0, 0.0], [1.0] * 5, [1.0] * 4 + [0.0]])
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    return RolloutBatch(mask=mask, rewards=rewards, group=torch.tensor([0, 0, 1, 1]), max_response_len=5,
                        prompt_ids=torch.randint(2, vocab, (4, 4), generator=g),
                        prompt_mask=torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1], [0, 0, 1, 1], [1, 1, 1, 1]]),
                        response_ids=torch.randint(2, vocab, (4, 5), generator=g),
                        behavior_logprobs=torch.zeros(4, 5), behavior_entropy=torch.zeros(4, 5),
                        temperatures=0.7 * mask, correct=rewards > 0)


@torch.no_grad()
def _half_greedy(model, ro: RolloutBatch) -> RolloutBatch:
    """`ro` with every second response token replaced by the model's most probable next token after its prefix."""
    ids = ro.response_ids.clone()
    for i in range(ids.shape[0]):
        prompt = ro.prompt_ids[i][ro.prompt_mask[i].bool()]
        for j in range(1, int(ro.mask[i].sum()), 2):
            ids[i, j] = model(input_ids=torch.cat([prompt, ids[i, :j]])[None]).logits[0, -1].argmax()
    return ro.replace(response_ids=ids)


@pytest.mark.parametrize("path", ["head blocks", "model logits"])
def test_the_training_forward_gives_simko_the_authors_inputs(tiny_model, path, monkeypatch):
    """pi_old's forward (`fill_logprobs`) and, after the weights moved, the update's (`update._logprobs`, the
    registered loss through `policy_objective`) equal `simko_loss` fed by `_naive`: pi_old's top-K log-probs of its
    own K most probable tokens, the current policy's of its own, its entropies and top-1 flags; the loss and its
    gradient in the weights agree."""
    if path == "model logits":  # the path of a model whose output layer cannot be applied block by block
        monkeypatch.setattr(logprobs_module, "_split_head", lambda model: None)
    cfg = load_config(None, ["algo.loss=simko", "algo.simko.alpha=0.5", "algo.simko.tau=0.5", "algo.mini_batches=2",
                             "model.compile=false"])
    old = {k: v.clone() for k, v in tiny_model.state_dict().items()}
    with torch.no_grad():  # the policy after a first mini-batch: its weights moved away from pi_old's
        g = torch.Generator().manual_seed(1)
        moved = {k: v + 0.3 * v.abs().mean() * torch.randn(v.shape, generator=g) for k, v in old.items()}
    tiny_model.load_state_dict(moved)
    ro = _half_greedy(tiny_model, _rollout(tiny_model.config.vocab_size))  # some tokens are its top-1
    tiny_model.load_state_dict(old)
    filled = fill_logprobs(tiny_model, None, ro, 0.7, cfg, pi_old_from_update=False)
    with torch.no_grad():
        old_lp, old_top, _, _ = _naive(tiny_model, ro, 0.7, 3)
    torch.testing.assert_close(filled.logprobs, old_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(filled.topk_logprobs, old_top, atol=1e-5, rtol=0)
    batch = compute_advantages(filled, cfg.algo, step=1)
    tiny_model.load_state_dict(moved)
    params = [p for p in tiny_model.parameters() if p.requires_grad]
    lp, _, topk = update_module._logprobs(tiny_model, batch, batch.mask, 0.7, False, False, 3)
    loss, stats = policy_objective(lp, None, batch, cfg.algo, topk=topk)
    got = torch.autograd.grad(loss, params)
    new_lp, new_top, ent, first = _naive(tiny_model, ro, 0.7, 3)
    torch.testing.assert_close(topk.entropy, ent.detach(), atol=1e-5, rtol=0)
    assert torch.equal(topk.is_top1, first) and first.any()
    inputs = SimkoInputs(batch.logprobs, batch.topk_logprobs, batch.advantages, batch.loss_mask, ro.correct,
                         ent.detach(), first)
    want_loss, want_stats = simko_loss(new_lp, new_top, inputs, options=cfg.algo.options["simko"])
    want = torch.autograd.grad(want_loss, params)
    assert loss.item() == pytest.approx(want_loss.item(), abs=1e-5) and loss.item() != 0
    assert stats["loss/simko_gate_frac"] == want_stats["loss/simko_gate_frac"] > 0
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-3)


def test_with_one_update_the_updates_forward_is_pi_olds_top_k(tiny_model):
    """Under the one-update shortcut pi_old's forward is skipped: its top-K log-probs are the update's, detached
    (the same forward, so the same K tokens), and the loss equals the one with pi_old's own forward."""
    cfg = load_config(None, ["algo.loss=simko", "algo.simko.alpha=0.5", "model.compile=false"])
    ro = _rollout(tiny_model.config.vocab_size)
    assert fill_logprobs(tiny_model, None, ro, 0.7, cfg, pi_old_from_update=True).topk_logprobs is None
    losses = []
    for shortcut in (True, False):
        batch = compute_advantages(fill_logprobs(tiny_model, None, ro, 0.7, cfg, shortcut), cfg.algo, step=1)
        lp, _, topk = update_module._logprobs(tiny_model, batch, batch.mask, 0.7, False, False, 3)
        losses.append(policy_objective(lp, None, batch, cfg.algo, topk=topk)[0].item())
    assert losses[0] == pytest.approx(losses[1], abs=1e-6)


def test_a_batch_carries_the_top_k_log_probs_and_correct_through_select_and_cat():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    top = torch.arange(18, dtype=torch.float32).reshape(2, 3, 3)
    batch = RolloutBatch(mask=mask, rewards=torch.ones(2), group=torch.tensor([0, 1]), topk_logprobs=top,
                         correct=torch.tensor([True, False]))
    part = batch.select(torch.tensor([1]), width=2)
    assert torch.equal(part.topk_logprobs, top[1:, :2]) and part.correct.tolist() == [False]
    both = RolloutBatch.cat([part, batch], pad_token_id=0)
    assert both.topk_logprobs.shape == (3, 3, 3) and both.correct.tolist() == [False, True, False]
    assert torch.equal(both.topk_logprobs[0], F.pad(top[1, :2], (0, 0, 0, 1)))
    with pytest.raises(ValueError, match=r"topk_logprobs: expected shape \[N, T, K\]"):
        batch.replace(topk_logprobs=top[:, :2])


@pytest.mark.parametrize("override, field", [("algo.simko.top_k=0", "algo.simko.top_k"),
                                             ("algo.simko.tau=1.5", "algo.simko.tau"),
                                             ("algo.simko.alpha=-0.1", "algo.simko.alpha"),
                                             ("algo.simko.neg_scale=0", "algo.simko.neg_scale")])
def test_a_bad_option_is_named(override, field):
    with pytest.raises(ConfigError, match=re.escape(field)):
        load_config(None, ["algo.loss=simko", override])
