"""Held-out evaluation with the analysis extras: unsolvable set, branching factor, entropy profile."""

import math

import torch

from explorl.config import TaskConfig
import pytest

from explorl.evaluation.evaluate import EvalPlan, evaluate, response_branching
from explorl.evaluation.settings import inference_schedule
from explorl.metrics import branching_factor
from explorl.models import load_policy
from explorl.config import ModelConfig
from explorl.rollout.engines.native import decode_responses, sample
from explorl.rollout.sampler import Sampler
from explorl.tasks import load_task


def test_evaluate_analyze_adds_unsolvable_branching_and_profile(tiny_model_dir):
    model, tok, _ = load_policy(ModelConfig(path=str(tiny_model_dir)))
    task = load_task(TaskConfig(reward="rewards_for_tests:contains_digit", eval_size=6, train_size=8,
                                difficulties=[1]))
    sampler = Sampler(model, tok.eos_token_id, tok.pad_token_id, 10)
    summary, per_problem = evaluate(sampler, tok, task.eval, task, EvalPlan(n=4, ks=[1, 4], analyze=True))
    assert summary["unsolvable@4"] == sum(not any(r.correct) for r in per_problem)
    assert len(summary["entropy/by_position"]) == 10
    assert 1.0 <= summary["branching"] <= len(tok)
    assert all(r.mean_branching is not None and r.mean_branching >= 1.0 for r in per_problem)
    plain, _ = evaluate(sampler, tok, task.eval, task, EvalPlan(n=4, ks=[1, 4]))
    assert "branching" not in plain and plain["pass@1"] == summary["pass@1"]  # same seed, same samples


_EAD = inference_schedule("ead", 0.9, 10, {"d0": 4.0})
_EAD_VALUES = _EAD.table(10).tolist()


@pytest.mark.parametrize("settings, temperature, decoder_temperature", [
    (dict(top_p=0.9), 0.8, 0.8),
    (dict(fast_path=False), 1.3, 1.3),
    (dict(), _EAD, lambda t: _EAD_VALUES[t]),  # EAD at inference: the function of the position it used to be
], ids=["fused-top_p", "generic", "ead"])
def test_evaluate_through_the_sampler_samples_what_the_decoder_does(tiny_model_dir, settings, temperature,
                                                                    decoder_temperature):
    """Issue 54: `evaluate` takes the command's `Sampler` (length limit, top-p, decoder) instead of those settings
    one by one; at a fixed seed it scores exactly what `rollout.engines.native.sample` draws given them directly,
    batch by batch: the same texts, judgments, entropy and lengths."""
    model, tok, _ = load_policy(ModelConfig(path=str(tiny_model_dir)))
    task = load_task(TaskConfig(reward="rewards_for_tests:contains_digit", eval_size=5, train_size=8,
                                difficulties=[1]))
    sampler = Sampler(model, tok.eos_token_id, tok.pad_token_id, 10, **settings)
    plan = EvalPlan(n=3, ks=[1, 3], temperature=temperature, seed=7, prompts_per_batch=2, keep_completions=True)
    summary, per_problem = evaluate(sampler, tok, task.eval, task, plan)
    gen = torch.Generator().manual_seed(7)
    texts, correct, entropy, tokens = [], [], 0.0, 0.0
    for start in range(0, len(task.eval), 2):
        chunk = task.eval[start:start + 2]
        ro = sample(Sampler(model, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, max_new_tokens=10,
                            **settings),
                    [tok.encode(p.prompt, add_special_tokens=False) for p in chunk], 3, temperature=decoder_temperature,
                    generator=gen)
        batch = decode_responses(tok, ro)
        group = ro.group.tolist()
        correct += task.correct(task.reward_runner(5.0)(batch, [chunk[g].answer for g in group],
                                                        [chunk[g].meta for g in group]))
        texts += batch
        entropy += float((ro.behavior_entropy * ro.mask).sum())
        tokens += float(ro.mask.sum())
    assert [t for r in per_problem for t in r.completions] == texts
    assert [c for r in per_problem for c in r.correct] == correct
    assert summary["entropy"] == entropy / tokens and summary["length"] == tokens / (len(task.eval) * 3)


def test_response_branching_matches_a_per_token_reference(tiny_model, char_tokenizer):
    tok = char_tokenizer
    ro = sample(Sampler(tiny_model, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, max_new_tokens=6),
                [tok.encode("1+2=?\n"), tok.encode("10-3+4=?\n")], 2, generator=torch.Generator().manual_seed(0))
    got = response_branching(tiny_model, ro, temperature=1.0, top_p=0.9)
    # reference: one unpadded sequence at a time, full forward, branching factor of each response position
    for i in range(ro.mask.shape[0]):
        prompt = ro.prompt_ids[i][ro.prompt_mask[i].bool()]
        length = int(ro.mask[i].sum())
        ids = torch.cat([prompt, ro.response_ids[i, :length]])[None]
        with torch.no_grad():
            logits = tiny_model(input_ids=ids).logits[0, len(prompt) - 1:len(prompt) - 1 + length]
        want = branching_factor(torch.softmax(logits, -1), top_p=0.9).float().mean()
        assert math.isclose(float(got[i]), float(want), rel_tol=1e-6)


def test_worst_at_k_and_format_rate_by_hand(tiny_model_dir, monkeypatch):
    """Two problems x 4 samples whose texts are fixed (the sampler still runs): problem 0 gets
    [box 1, box 1, box 1, no box], problem 1 [box 1, two boxes, no box, no box]; reward 1 for `\\boxed{1}` alone.
    Correct counts c = 3 and 1 of n = 4. worst@2 = mean(C(3,2)/C(4,2), C(1,2)/C(4,2)) = mean(0.5, 0) = 0.25;
    worst@1 = mean(3/4, 1/4) = 0.5 (= avg@4); exactly one box: 3 + 1 of 8 = 0.5."""
    import explorl.evaluation.evaluate as E

    texts = ["\\boxed{1}", "\\boxed{1}", "\\boxed{1}", "no box", "\\boxed{1}", "\\boxed{1}\\boxed{2}", "x", "y"]
    monkeypatch.setattr(E, "decode_responses", lambda tok, ro: texts[:ro.mask.shape[0]])
    model, tok, _ = load_policy(ModelConfig(path=str(tiny_model_dir)))
    task = load_task(TaskConfig(reward="exact", eval_size=2, train_size=8, difficulties=[1]))
    for p in task.eval:
        p.answer = "1"
    summary, per_problem = evaluate(Sampler(model, tok.eos_token_id, tok.pad_token_id, 4), tok, task.eval, task,
                                    EvalPlan(n=4, ks=[1, 2, 4]))
    assert [sum(r.correct) for r in per_problem] == [3, 1]
    assert summary["worst@1"] == 0.5 and summary["worst@2"] == 0.25 and summary["worst@4"] == 0.0
    assert summary["format_rate"] == 0.5
    assert summary["worst@1"] == summary["avg@4"]
