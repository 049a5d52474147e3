"""Token impact by replacement (STILL eq. 5-6) on the tiny random Qwen2 with deterministic rewards."""

from __future__ import annotations

import pytest
import torch

import explorl.experiments.impact as impact_mod
from explorl.experiments.impact import ImpactSampling, alternative_tokens, token_impact

PROMPT = "Q: 12+34=?\nA: "
RESPONSE = "46, so \\boxed{46}"


def _ids(tok, text):
    return tok.encode(text, add_special_tokens=False)


def _expected_alternative(model, tok, prompt_ids, response_ids, t):
    """Eq. 5 from a full forward: the argmax of the distribution at t over the vocabulary minus o_t (and pad)."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt_ids + response_ids])).logits[0, len(prompt_ids) - 1 + t]
    logits = logits.clone()
    logits[response_ids[t]] = float("-inf")
    logits[tok.pad_token_id] = float("-inf")
    return int(logits.argmax()), logits


class Recorder:
    """Wraps the sampler and the reward function to count what token_impact asks of them."""

    def __init__(self, monkeypatch, answer_fn):
        self.sample_calls = []
        self.texts = []
        self.answer_fn = answer_fn
        real = impact_mod.sample

        def wrapped(model, prompts, n, **kw):
            ro = real(model, prompts, n, **kw)
            self.sample_calls.append(dict(prompts=[list(p) for p in prompts], n=n, rows=ro.response_ids.shape[0]))
            return ro

        monkeypatch.setattr(impact_mod, "sample", wrapped)

    def reward(self, text, answer):
        self.texts.append(text)
        return self.answer_fn(text, answer)


@pytest.mark.parametrize("t", [0, 3, 9, len(RESPONSE) - 1])
def test_impact_is_exact_for_a_prefix_reward(tiny_model, char_tokenizer, monkeypatch, t):
    """reward = 1 iff the response's character t is the original one: acc(original) = 1, acc(replaced) = 0."""
    tok = char_tokenizer
    response_ids = _ids(tok, RESPONSE)
    rec = Recorder(monkeypatch, lambda text, ans: float(len(text) > t and text[t] == RESPONSE[t]))
    k = 4
    (res,) = token_impact(tiny_model, tok, PROMPT, response_ids, [t], reward_fn=rec.reward, answer="46",
                          sampling=ImpactSampling(k=k, max_new_tokens=5, generator=torch.Generator().manual_seed(t)))
    alt, _ = _expected_alternative(tiny_model, tok, _ids(tok, PROMPT), response_ids, t)
    assert res == dict(position=t, token=response_ids[t], alternative=alt, acc_original=1.0, acc_replaced=0.0,
                       impact=1.0)
    assert len(rec.sample_calls) == 1 and rec.sample_calls[0]["rows"] == 2 * k
    assert len(rec.texts) == 2 * k


def test_one_sample_call_for_all_positions_k_continuations_each(tiny_model, char_tokenizer, monkeypatch):
    tok = char_tokenizer
    prompt_ids, response_ids = _ids(tok, PROMPT), _ids(tok, RESPONSE)
    positions = [0, 2, 5, 11]
    k = 3
    rec = Recorder(monkeypatch, lambda text, ans: float(ans in text))
    sampling = ImpactSampling(k=k, max_new_tokens=6, temperature=0.9, generator=torch.Generator().manual_seed(0))
    res = token_impact(tiny_model, tok, PROMPT, response_ids, positions, reward_fn=rec.reward, answer="4",
                       sampling=sampling)
    assert [r["position"] for r in res] == positions
    (call,) = rec.sample_calls  # every prefix of every position in one batch
    assert call["n"] == k and call["rows"] == 2 * k * len(positions)
    expected_prompts = []
    for r, t in zip(res, positions):
        alt, logits = _expected_alternative(tiny_model, tok, prompt_ids, response_ids, t)
        assert r["token"] == response_ids[t]
        assert r["alternative"] == alt != response_ids[t]
        assert logits[alt] == logits.max()  # the most probable of the others
        expected_prompts += [prompt_ids + response_ids[:t + 1], prompt_ids + response_ids[:t] + [alt]]
        for key in ("acc_original", "acc_replaced"):
            assert r[key] * k == pytest.approx(round(r[key] * k))  # a mean of k binary scores
        assert r["impact"] == pytest.approx(r["acc_original"] - r["acc_replaced"])
    assert call["prompts"] == expected_prompts
    # k scored texts per prefix, each the response part (not the prompt) followed by its continuation
    assert len(rec.texts) == 2 * k * len(positions)
    for j, t in enumerate(positions):
        alt_char = tok.decode([res[j]["alternative"]], skip_special_tokens=True)
        original = rec.texts[2 * j * k:(2 * j + 1) * k]
        replaced = rec.texts[(2 * j + 1) * k:(2 * j + 2) * k]
        assert all(s.startswith(RESPONSE[:t + 1]) for s in original)
        assert all(s.startswith(RESPONSE[:t] + alt_char) for s in replaced)
        assert all(len(s) <= t + 1 + 6 for s in original + replaced)


def test_alternative_tokens_helper(tiny_model, char_tokenizer):
    tok = char_tokenizer
    prompt_ids, response_ids = _ids(tok, PROMPT), _ids(tok, RESPONSE)
    positions = list(range(len(response_ids)))
    alts = alternative_tokens(tiny_model, prompt_ids, response_ids, positions, exclude=[tok.pad_token_id])
    for t, a in zip(positions, alts):
        assert a == _expected_alternative(tiny_model, tok, prompt_ids, response_ids, t)[0]
        assert a != response_ids[t] and a != tok.pad_token_id
    # the original token is excluded even when it is the model's own argmax
    with torch.no_grad():
        top = tiny_model(input_ids=torch.tensor([prompt_ids])).logits[0, -1].argmax().item()
    (alt,) = alternative_tokens(tiny_model, prompt_ids, [top], [0])
    assert alt != top


def test_max_rows_splits_calls_with_same_prefixes(tiny_model, char_tokenizer, monkeypatch):
    tok = char_tokenizer
    response_ids = _ids(tok, RESPONSE)
    positions = [1, 4, 7]
    k = 2
    rec = Recorder(monkeypatch, lambda text, ans: 0.0)
    sampling = ImpactSampling(k=k, max_new_tokens=3, generator=torch.Generator().manual_seed(1), max_rows=2 * k)
    res = token_impact(tiny_model, tok, PROMPT, response_ids, positions, reward_fn=rec.reward, answer="",
                       sampling=sampling)
    assert [c["rows"] for c in rec.sample_calls] == [2 * k] * len(positions)
    assert len(rec.texts) == 2 * k * len(positions)
    assert all(r["impact"] == 0.0 for r in res)


def test_eos_token_prefix_is_scored_once_without_sampling(tiny_model, char_tokenizer, monkeypatch):
    """Replacing the final EOS: the original prefix is a finished response; the alternative continues."""
    tok = char_tokenizer
    response_ids = _ids(tok, "ab") + [tok.eos_token_id]
    k = 3
    rec = Recorder(monkeypatch, lambda text, ans: float(text == ans))
    (res,) = token_impact(tiny_model, tok, PROMPT, response_ids, [2], reward_fn=rec.reward, answer="ab",
                          sampling=ImpactSampling(k=k, max_new_tokens=4, generator=torch.Generator().manual_seed(2)))
    assert res["token"] == tok.eos_token_id and res["alternative"] not in (tok.eos_token_id, tok.pad_token_id)
    assert res["acc_original"] == 1.0 and res["acc_replaced"] == 0.0 and res["impact"] == 1.0
    (call,) = rec.sample_calls
    assert call["rows"] == k and call["prompts"] == [_ids(tok, PROMPT) + _ids(tok, "ab") + [res["alternative"]]]
    assert rec.texts[0] == "ab" and len(rec.texts) == 1 + k


def test_reproducible_with_generator(tiny_model, char_tokenizer):
    tok = char_tokenizer
    response_ids = _ids(tok, RESPONSE)

    def run():
        return token_impact(tiny_model, tok, PROMPT, response_ids, [0, 6],
                            reward_fn=lambda text, ans: float(any(c in text for c in ans)), answer="0123",
                            sampling=ImpactSampling(k=5, max_new_tokens=8,
                                                    generator=torch.Generator().manual_seed(3)))

    assert run() == run()


def test_invalid_arguments(tiny_model, char_tokenizer):
    tok = char_tokenizer
    response_ids = _ids(tok, RESPONSE)
    kw = dict(reward_fn=lambda text, ans: 0.0, answer="")

    def sampling(k: int) -> ImpactSampling:
        return ImpactSampling(k=k, max_new_tokens=2)

    with pytest.raises(ValueError, match="positions"):
        token_impact(tiny_model, tok, PROMPT, response_ids, [len(response_ids)], **kw, sampling=sampling(2))
    with pytest.raises(ValueError, match="k must"):
        token_impact(tiny_model, tok, PROMPT, response_ids, [0], **kw, sampling=sampling(0))
    with pytest.raises(ValueError, match="prompt is empty"):
        token_impact(tiny_model, tok, "", response_ids, [0], **kw, sampling=sampling(1))
    assert token_impact(tiny_model, tok, PROMPT, response_ids, [], **kw, sampling=sampling(2)) == []
