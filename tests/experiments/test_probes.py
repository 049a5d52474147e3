"""Probes of the papers' analyses (`explorl.experiments.probes`, `explorl probe`; docs/methods.md §8e): hand-derived
numbers, identities on the tiny models of conftest, and one tiny run of each subcommand."""

from __future__ import annotations

import json
import math

import pytest
import torch

from explorl import commands
from explorl.algos.advantages import grpo, token_covariance
from explorl.experiments import probes as P
from explorl.rollout.logprobs import LogprobOptions, response_logprobs
from explorl.rollout.engines.native import decode_responses, sample
from explorl.rollout.sampler import Sampler

# --- significance tests -------------------------------------------------------------------------------------------


def test_fisher_exact_hand_values():
    # tea tasting [[3, 1], [1, 3]]: margins 4/4/4/4, P(x) = C(4,x) C(4,4-x) / C(8,4) = 1, 16, 36, 16, 1 (/70);
    # two-sided: every x with P(x) <= P(3) = 16/70 -> (1 + 16 + 16 + 1) / 70
    assert P.fisher_exact(3, 1, 1, 3) == pytest.approx(34 / 70)
    # [[5, 0], [0, 5]]: only x = 0 and x = 5 are as extreme, each 1 / C(10, 5) = 1/252
    assert P.fisher_exact(5, 0, 0, 5) == pytest.approx(2 / 252)
    assert P.fisher_exact(1, 0, 0, 1) == 1.0  # x = 0 and x = 1 both have probability 1/2
    assert P.fisher_exact(0, 0, 0, 0) == 1.0


def test_two_proportion_test_hand_values():
    # 8/10 vs 2/10: pooled p = 0.5, se = sqrt(0.25 * (1/10 + 1/10)) = sqrt(0.05); z = 0.6 / 0.2236 = 2.6833
    z, p = P.two_proportion_test(8, 10, 2, 10)
    assert z == pytest.approx(0.6 / math.sqrt(0.05))
    assert p == pytest.approx(math.erfc(z / math.sqrt(2)))
    assert p == pytest.approx(0.00729, abs=1e-5)
    assert P.two_proportion_test(5, 10, 5, 10) == (0.0, 1.0)
    assert P.two_proportion_test(10, 10, 4, 4) == (0.0, 1.0)  # no variation at all
    out = P.compare_proportions(8, 10, 2, 10)
    assert out["rate_1"] == 0.8 and out["rate_2"] == 0.2 and out["difference"] == pytest.approx(0.6)
    assert out["fisher_p"] == pytest.approx(P.fisher_exact(8, 2, 2, 8))


# --- entropy by absolute position ---------------------------------------------------------------------------------


def test_entropy_by_absolute_position_hand_means():
    entropy = torch.tensor([[1.0, 2.0, 3.0, 9.0], [4.0, 5.0, 9.0, 9.0], [9.0, 6.0, 7.0, 8.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [0, 1, 1, 1]])  # the last row is left-padded
    res = P.entropy_by_absolute_position(entropy, mask)
    # position 0: 1, 4, 6 -> 11/3; position 1: 2, 5, 7 -> 14/3; position 2: 3, 8 -> 5.5
    assert res["start"] == [0, 1, 2]
    assert res["mean"].tolist() == pytest.approx([11 / 3, 14 / 3, 5.5])
    assert res["count"].tolist() == [3, 3, 2]
    binned = P.entropy_by_absolute_position(entropy, mask, bin_size=2)
    # bin 0 holds positions 0 and 1 (six tokens, sum 25); bin 1 position 2 (3 + 8)
    assert binned["start"] == [0, 2]
    assert binned["mean"].tolist() == pytest.approx([25 / 6, 5.5])
    assert binned["count"].tolist() == [6, 2]


def test_entropy_by_absolute_position_rejects_bad_input():
    with pytest.raises(ValueError, match="bin_size"):
        P.entropy_by_absolute_position(torch.zeros(1, 2), torch.ones(1, 2), bin_size=0)
    with pytest.raises(ValueError, match=r"\[N, T\]"):
        P.entropy_by_absolute_position(torch.zeros(2), torch.ones(2))


# --- token covariance -----------------------------------------------------------------------------------------------


def test_covariance_percentiles_and_cumulative_hand_values():
    c = torch.tensor([[3.0, 1.0, -2.0, 99.0], [2.0, -1.0, -5.0, 7.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])  # 99 is padding
    # positive, largest first: 7, 3, 2, 1; negative, most negative first: -5, -2, -1
    res = P.covariance_percentiles(c, mask, (25, 50, 100))
    # 25%: the ceil(0.25 * 4) = 1st largest positive, the ceil(0.25 * 3) = 1st most negative; 50%: 2nd; 100%: last
    assert res["positive"] == [7.0, 3.0, 1.0]
    assert res["negative"] == [-5.0, -2.0, -1.0]
    assert (res["n_positive"], res["n_negative"], res["n_zero"]) == (4, 3, 0)
    cum = P.covariance_cumulative(c, mask, (0.25, 0.5, 1.0))
    # |c+| total 13: top 1 -> 7/13, top 2 -> 10/13; |c-| total 8: top 1 -> 5/8, top 2 -> 7/8
    assert cum["positive"] == pytest.approx([7 / 13, 10 / 13, 1.0])
    assert cum["negative"] == pytest.approx([5 / 8, 7 / 8, 1.0])


def test_covariance_percentiles_match_a_direct_computation():
    g = torch.Generator().manual_seed(0)
    c = torch.randn(16, 40, generator=g, dtype=torch.float64)
    mask = (torch.rand(16, 40, generator=g) > 0.3).long()
    vals = c[mask.bool()]
    pos = sorted(vals[vals > 0].tolist(), reverse=True)
    neg = sorted(vals[vals < 0].tolist())
    ps = (0.01, 1.0, 20.0, 40.0, 100.0)
    res = P.covariance_percentiles(c, mask, ps)
    assert res["positive"] == [pos[max(1, math.ceil(p / 100 * len(pos))) - 1] for p in ps]
    assert res["negative"] == [neg[max(1, math.ceil(p / 100 * len(neg))) - 1] for p in ps]
    assert res["positive"][-1] == min(pos) and res["negative"][-1] == max(neg)


def test_token_covariance_is_the_centred_product():
    lp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -1.5, 0.0]])
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    # batch means over the 5 valid tokens: lp -8/5 = -1.6, A 1/5 = 0.2
    want = [[(-1 + 1.6) * 0.8, (-2 + 1.6) * 0.8, (-3 + 1.6) * 0.8], [(-0.5 + 1.6) * -1.2, (-1.5 + 1.6) * -1.2, 0.0]]
    assert torch.allclose(token_covariance(adv, lp, mask), torch.tensor(want, dtype=torch.float64))
    # per group (rows 0 and 1 apart): A is constant within each group, so c = 0
    assert token_covariance(adv, lp, mask, torch.tensor([0, 1])).abs().max() == 0


def test_batch_covariance_uses_grpo_and_the_training_forward(tiny_model, char_tokenizer):
    tok = char_tokenizer
    prompts = [tok.encode("1+2=", add_special_tokens=False), tok.encode("3*3=", add_special_tokens=False)]
    ro = sample(Sampler(tiny_model, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, max_new_tokens=6),
                prompts, 3, generator=torch.Generator().manual_seed(0))
    rewards = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0]
    c = P.batch_covariance(tiny_model, ro, rewards, temperature=0.7)
    lp, _ = response_logprobs(tiny_model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.mask, 0.7)
    adv = grpo(torch.tensor(rewards), ro.group, ro.mask)
    for g in (0, 1):  # by hand: centre within each group's valid tokens
        rows = ro.group == g
        valid = ro.mask[rows].bool()
        lpg, ag = lp[rows].double(), adv[rows].double()
        want = (lpg - lpg[valid].mean()) * (ag - ag[valid].mean()) * valid
        assert torch.allclose(c[rows], want, atol=1e-9)
    assert c.abs().sum() > 0


# --- branching ------------------------------------------------------------------------------------------------------


def _score_digits(texts):
    return [1.0 if any(ch.isdigit() for ch in t) else 0.0 for t in texts]


def test_branch_cut_at_zero_is_sampling_from_the_prompt(tiny_model, char_tokenizer):
    tok = char_tokenizer
    prompt = tok.encode("12+7=", add_special_tokens=False)
    response = tok.encode("19", add_special_tokens=False) + [tok.eos_token_id]
    sampler = Sampler(tiny_model, tok.eos_token_id, tok.pad_token_id, 7)
    got = P.branch_probe(P.ContinuationSampler(sampler, tok, 5, _score_digits, temperature=1.3,
                                               generator=torch.Generator().manual_seed(4)), prompt, response, [0])
    ro = sample(Sampler(tiny_model, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, max_new_tokens=7),
                [prompt], 5, temperature=1.3, generator=torch.Generator().manual_seed(4))
    assert [r["cut"] for r in got] == [0]
    assert got[0]["texts"] == decode_responses(tok, ro)
    assert got[0]["rewards"] == _score_digits(got[0]["texts"])
    assert got[0]["accuracy"] == sum(r > 0.5 for r in got[0]["rewards"]) / 5


def test_branch_keeps_the_prefix_and_skips_cuts_past_the_end(tiny_model, char_tokenizer):
    tok = char_tokenizer
    prompt = tok.encode("3+4=", add_special_tokens=False)
    response = tok.encode("abc", add_special_tokens=False) + [tok.eos_token_id]  # 4 tokens, EOS last
    continuations = P.ContinuationSampler(Sampler(tiny_model, tok.eos_token_id, tok.pad_token_id, 5), tok, 3,
                                          _score_digits, generator=torch.Generator().manual_seed(1))
    got = P.branch_probe(continuations, prompt, response, [0, 2, 3, 4, 9], entropy=[0.5, 0.4, 0.3, 0.2],
                         extract_answer=lambda t: t[-1:] or None)
    assert [r["cut"] for r in got] == [0, 2, 3]  # 4 would keep the whole response, EOS included
    assert [r["entropy"] for r in got] == [0.5, 0.3, 0.2]
    for r in got:
        assert all(t.startswith("abc"[:r["cut"]]) for t in r["texts"]) and len(r["texts"]) == 3
        assert r["maj"] is not None and 0.0 <= r["maj"] <= 1.0


def test_branch_summary_hand_means():
    rows = [[{"cut": 0, "accuracy": 1.0, "maj": 1.0, "entropy": 2.0}, {"cut": 4, "accuracy": 0.5, "maj": 0.0,
                                                                        "entropy": 1.0}],
            [{"cut": 0, "accuracy": 0.0, "maj": 0.0, "entropy": 1.0}]]
    out = P.branch_summary(rows, [0, 4, 8])
    assert out[0] == {"cut": 0, "problems": 2, "accuracy": 0.5, "maj": 0.5, "entropy": 1.5}
    assert out[1] == {"cut": 4, "problems": 1, "accuracy": 0.5, "maj": 0.0, "entropy": 1.0}
    assert out[2]["problems"] == 0 and math.isnan(out[2]["accuracy"])


# --- perturbation ---------------------------------------------------------------------------------------------------


def test_entropy_extremes_hand_positions():
    ent = [0.1, 0.9, 0.5, 0.9, 0.0, 0.3]
    # m = round(0.34 * 6) = 2: highest 0.9 at 1 and 3; lowest 0.0 at 4 and 0.1 at 0
    assert P.entropy_extremes(ent, 0.34) == ([1, 3], [0, 4])
    assert P.entropy_extremes(ent, 0.05) == ([1], [4])  # at least one on each side; ties to the earlier position
    assert P.entropy_extremes([0.3], 0.5) == ([], [])  # one token cannot be both
    with pytest.raises(ValueError, match="frac"):
        P.entropy_extremes(ent, 0.7)


def test_perturbed_head_modes():
    resp = [5, 6, 7, 8]
    assert P.perturbed_head(resp, 2, "truncate", vocab_size=10) == [5, 6]
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    heads = [P.perturbed_head(resp, 2, "replace", vocab_size=10, exclude=[0, 1], generator=g1) for _ in range(50)]
    assert heads[0] == P.perturbed_head(resp, 2, "replace", vocab_size=10, exclude=[0, 1], generator=g2)
    assert all(h[:2] == [5, 6] and len(h) == 3 and h[2] not in (0, 1, 7) and 0 <= h[2] < 10 for h in heads)
    assert P.perturbed_head([2, 6], 0, "replace", vocab_size=3, exclude=[0], generator=g1) == [1]  # only 1 left
    with pytest.raises(ValueError, match="mode"):
        P.perturbed_head(resp, 0, "swap", vocab_size=10)


def test_perturb_probe_counts_and_determinism(tiny_model, char_tokenizer):
    tok = char_tokenizer
    prompt = tok.encode("2+2=", add_special_tokens=False)
    response = tok.encode("4 is it", add_special_tokens=False) + [tok.eos_token_id]
    entropy = [0.1, 2.0, 0.3, 1.5, 0.2, 0.9, 0.05, 3.0]  # the last one (EOS) is never chosen

    def run():
        continuations = P.ContinuationSampler(Sampler(tiny_model, tok.eos_token_id, tok.pad_token_id, 4), tok, 3,
                                              _score_digits, generator=torch.Generator().manual_seed(0))
        return P.perturb_probe(continuations, prompt, response, entropy, frac=0.3,
                               token_generator=torch.Generator().manual_seed(1))

    out = run()
    # 7 perturbable tokens, m = round(2.1) = 2: high at 1 (2.0) and 3 (1.5), low at 6 (0.05) and 0 (0.1)
    for mode in ("replace", "truncate"):
        assert out[mode]["high"]["positions"] == [1, 3] and out[mode]["low"]["positions"] == [0, 6]
        assert len(out[mode]["high"]["rewards"]) == 6 and len(out[mode]["low"]["rewards"]) == 6
    assert out == run()


# --- one update -----------------------------------------------------------------------------------------------------


def _update_batch(model, tok):
    prompts = [tok.encode("1+1=", add_special_tokens=False), tok.encode("9-3=", add_special_tokens=False)]
    ro = sample(Sampler(model, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, max_new_tokens=6), prompts,
                4, generator=torch.Generator().manual_seed(0))
    return ro, [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]


def test_one_update_with_lr_zero_moves_nothing(tiny_model, char_tokenizer):
    from explorl.config import load_config

    ro, rewards = _update_batch(tiny_model, char_tokenizer)
    cfg = load_config(None)
    cfg.optim.lr = 0.0  # the config refuses lr 0 (a run would learn nothing); the probe takes it
    eff = P.one_update_effects(tiny_model, ro, rewards, cfg, temperature=1.0)
    delta = (eff["logprobs_after"].exp() - eff["logprobs_before"].exp()) * ro.mask
    assert torch.equal(delta, torch.zeros_like(delta))
    assert torch.equal(eff["entropy_after"], eff["entropy_before"])
    lp, _ = response_logprobs(tiny_model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.mask, 1.0,
                              options=LogprobOptions(compile=cfg.model.compile))
    assert torch.equal(eff["logprobs_before"], lp)  # pi_old is the training forward
    assert eff["advantages"].abs().sum() > 0  # the step had something to learn from


def test_one_update_with_lr_moves_probabilities_by_advantage_sign(tiny_model, char_tokenizer):
    from explorl.config import load_config

    ro, rewards = _update_batch(tiny_model, char_tokenizer)
    before = [p.detach().clone() for p in tiny_model.parameters()]
    cfg = load_config(None, ["optim.lr=0.001", "optim.warmup_steps=0"])
    eff = P.one_update_effects(tiny_model, ro, rewards, cfg, temperature=1.0)
    assert any(not torch.equal(a, b) for a, b in zip(before, tiny_model.parameters()))
    delta = (eff["logprobs_after"] - eff["logprobs_before"]) * ro.mask
    adv = eff["advantages"]
    # the sum of A * d log p over the batch is what the step increases: positive after a (small) ascent step
    assert float((adv * delta).sum()) > 0


def test_update_shift_summary_hand_values():
    dp = torch.tensor([[0.5, -0.1, 0.0, 9.0], [0.02, -0.3, 0.04, 0.0]])
    ent = torch.tensor([[2.0, 0.5, 0.1, 9.0], [0.2, 1.5, 0.3, 0.05]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    tokens = [["7", "so", "x"], ["the", "wait", "+", "cat"]]
    out = P.update_shift_summary(dp, ent, mask, correct=[True, False], tokens=tokens, ppl=[1.0, 3.0],
                                 settings=P.ShiftSummarySettings(top_frac=0.3, bins=2))
    o = out["overall"]
    # 7 tokens; top ceil(2.1) = 3 by |dp|: 0.5 (ent 2.0), 0.3 (1.5), 0.1 (0.5)
    assert o["tokens"] == 7 and o["top_threshold"] == pytest.approx(0.1)
    assert o["mean_abs_shift"] == pytest.approx((0.5 + 0.1 + 0 + 0.02 + 0.3 + 0.04 + 0) / 7)
    assert o["share_below_0.06"] == pytest.approx(4 / 7)
    assert o["mean_entropy_top"] == pytest.approx(4.0 / 3)
    pos, neg = out["by_outcome"]["positive"], out["by_outcome"]["negative"]
    assert pos["tokens"] == 3 and pos["mean_shift"] == pytest.approx(0.4 / 3)
    assert pos["share_raised"] == pytest.approx(1 / 3)
    assert pos["share_in_top"] == pytest.approx(2 / 3) and neg["share_in_top"] == pytest.approx(1 / 4)
    # entropy bins by rank r of 7 -> r * 2 // 7: ranks 0-3 (0.05, 0.1, 0.2, 0.3) low, ranks 4-6 (0.5, 1.5, 2.0) high
    low, high = out["by_entropy"]
    assert (low["low"], low["high"], high["low"], high["high"]) == pytest.approx((0.05, 0.3, 0.5, 2.0))
    assert low["share_in_top"] == 0.0 and high["share_in_top"] == 1.0
    cats = out["by_category"]  # '7', 'x', '+' formal; 'so' logical; 'wait' metacognitive; 'the', 'cat' semantic
    assert {c: v["tokens"] for c, v in cats.items()} == {"formal": 3, "logical": 1, "metacognitive": 1, "semantic": 2}
    assert cats["formal"]["share_in_top"] == pytest.approx(1 / 3)
    assert cats["logical"]["share_of_top"] == pytest.approx(1 / 3)
    # PPL per token: 1.0 x 3 (ranks 0-2), 3.0 x 4 (ranks 3-6): bin 0 holds ranks 0-3, bin 1 ranks 4-6
    assert (out["by_ppl"][0]["low"], out["by_ppl"][0]["high"]) == (1.0, 3.0)
    assert (out["by_ppl"][1]["low"], out["by_ppl"][1]["high"]) == (3.0, 3.0)


def test_entropy_change_by_token_hand_values():
    before = torch.tensor([[1.0, 2.0, 1.0], [0.5, 2.0, 0.0]])
    after = torch.tensor([[0.5, 2.5, 0.7], [0.5, 1.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    out = P.entropy_change_by_token(before, after, mask, [["a", "b", "a"], ["c", "b"]], min_count=2)
    # 'a': (-0.5 - 0.3) / 2 = -0.4; 'b': (0.5 - 1.0) / 2 = -0.25; 'c' seen once
    assert [r["token"] for r in out] == ["a", "b"]
    assert out[0]["change"] == pytest.approx(-0.4) and out[1]["change"] == pytest.approx(-0.25)


# --- the command ----------------------------------------------------------------------------------------------------


@pytest.fixture
def out(capsys):
    return lambda: capsys.readouterr().out


TINY = ["--limit", "2", "--max-new-tokens", "6", "--device", "cpu", "--task", "arith", "--task-opt", "train_size=4",
        "--task-opt", "eval_size=4", "--threads", "1"]


@pytest.mark.parametrize("probe, extra, keys", [
    ("position", ["--n", "2"], ("start", "mean", "count", "relative_10_bins")),
    ("covariance", ["--n", "3"], ("percentiles", "cumulative", "curve")),
    ("branch", ["--k", "2", "--cuts", "0,2,50"], ("summary", "problems", "cuts")),
    ("perturb", ["--k", "2", "--frac", "0.2", "--any-response", "--attempts", "1"], ("tests", "responses")),
    ("update", ["--n", "2", "--lr", "0.01"], ("summary", "entropy_drop_tokens", "update_stats")),
])
def test_probe_command(probe, extra, keys, tiny_model_dir, tmp_path, out):
    dest = tmp_path / f"{probe}.json"
    rc = commands.main(["probe", probe, "--model", str(tiny_model_dir), *TINY, *extra, "--out", str(dest)])
    text = out()
    assert rc == 0, text
    result = json.loads(dest.read_text())
    assert result["probe"] == probe and result["settings"]["problems"]["value"] == 2
    for key in keys:
        assert key in result, key
    assert dest.with_suffix(".png").stat().st_size > 0
    assert "wrote" in text
    if probe == "branch":
        assert [r["cut"] for r in result["summary"]] == [0, 2, 50] and result["summary"][2]["problems"] == 0


def test_probe_bad_flags_name_the_fix(tiny_model_dir, out):
    with pytest.raises(SystemExit, match="--cuts"):
        commands.main(["probe", "branch", "--model", str(tiny_model_dir), "--cuts", "0,x"])
    with pytest.raises(SystemExit, match="--modes"):
        commands.main(["probe", "perturb", "--model", str(tiny_model_dir), "--modes", "shuffle"])
    rc = commands.main(["probe", "perturb", "--model", str(tiny_model_dir), *TINY, "--attempts", "1", "--no-plot"])
    assert rc == 2 and "--any-response" in out()  # the random tiny model never answers correctly


def test_probes_score_by_the_tasks_judgment_not_the_weighted_reward():
    # a weighted reward above 0.5 that the judging entry calls wrong, and one below 0.5 that it calls right (a
    # correct answer under a length penalty): the probes must count the second, as `explorl eval` does
    from types import SimpleNamespace

    from explorl.commands.probe_runs import Context
    from explorl.tasks.base import Task

    result = SimpleNamespace(rewards=[0.9, 0.2], judged=[0.0, 1.0])
    task = SimpleNamespace(correct=lambda r: Task.correct(SimpleNamespace(correct_threshold=0.5), r))
    ctx = Context(sampler=None, tok=None, task=task, task_cfg=None, problems=[], encode=None,
                  runner=lambda texts, answers, metas: result, run_cfg=None, run_config_path=None, label="m",
                  temperature=1.0, settings={})
    problem = SimpleNamespace(answer="7", meta={})
    assert ctx.score_fn(problem)(["a", "b"]) == [0.0, 1.0]
