"""The statistics of bench/cw_weights.py (bench/ is scripts, not a package: loaded from its path)."""

import importlib.util
import math
from pathlib import Path

import pytest
import torch

from explorl.algos.advantages import ErpoOptions, cov_weights


def _load(name: str):
    path = Path(__file__).resolve().parents[1] / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _scored(correct: dict[str, int], **curve) -> dict:
    """A testbed record with 4 samples per problem (so pass@1 = c / 4); `curve` adds to its pass@k curve."""
    problems = {"id": list(correct), "n": [4] * len(correct), "correct": list(correct.values())}
    return {"curve": {"problems": problems, **curve}}


def test_cw_weight_stats_on_the_hand_example():
    # tests/algos/test_advantages_methods.py::test_cov_weighted_drifts_toward_the_common_outcome: one correct
    # response (A = 3) and three wrong ones (A = -1), log-probs [0, -2] each -> w~ = 0.3230756 on the correct
    # response, 1.2256415 on the wrong ones. Every statistic follows: w+ = w+lo = kept+ = 0.3230756 (one weight on
    # all positive tokens), w- = w-lo = kept- = 1.2256415, mean w~A = (6 * 0.3230756 - 6 * 1.2256415) / 8.
    stats = _load("cw_weights").weight_stats
    adv = torch.tensor([[3.0, 3.0], [-1.0, -1.0], [-1.0, -1.0], [-1.0, -1.0]])
    lp = torch.tensor([[0.0, -2.0]] * 4)
    mask = torch.ones(4, 2)
    correct = torch.tensor([True, False, False, False])
    out = stats(cov_weights(adv, lp, mask), adv, lp, correct, mask)
    total = 2 * math.exp(-1.5) + 6 * math.exp(-1 / 6)
    rare, common = 8 * math.exp(-1.5) / total, 8 * math.exp(-1 / 6) / total
    for key in ("w+", "w+lo", "kept+"):
        assert out[key] == pytest.approx(rare, abs=1e-9)
    for key in ("w-", "w-lo", "kept-"):
        assert out[key] == pytest.approx(common, abs=1e-9)
    assert out["mean w~A"] == pytest.approx((6 * rare - 6 * common) / 8, abs=1e-9)
    # padding is ignored and a side with no tokens gives NaN, not a crash
    out = stats(torch.ones(1, 3, dtype=torch.float64), torch.tensor([[1.0, 1.0, 5.0]]), torch.zeros(1, 3),
                torch.tensor([True]), torch.tensor([[1.0, 1.0, 0.0]]))
    assert out["w+"] == 1.0 and out["kept+"] == 1.0 and math.isnan(out["w-"]) and math.isnan(out["kept-"])


def test_learning_pairs_each_method_with_the_grpo_baseline_of_its_objective():
    learning = _load("learning")
    assert learning.objective("grpo") == ("seq-mean-token-mean", 0.2, 0.2, 1)
    # recipes on GRPO's own objective compare with `grpo` (E3's per-question aggregation is GRPO's with equal
    # groups); the others with GRPO at their aggregation, clip and number of policy updates per rollout batch
    assert [learning.baseline(m) for m in ("grpo", "e3", "e3_ts", "cw_grpo")] == ["grpo"] * 4
    assert learning.baseline("dapo") == learning.baseline("forking_tokens") == "grpo__token-mean__0.2-0.28__u16"
    assert learning.baseline("ead") == learning.baseline("ead_tis") == "grpo__token-mean__0.2-0.28__u4"
    assert learning.baseline("clip_cov") == "grpo__token-mean__1-1__u8"
    assert learning.baseline("kl_cov") == "grpo__token-mean__0.2-0.2__u8"
    assert learning.baseline("erpo") == learning.baseline("still_ppl") == "grpo__token-mean__0.2-0.2"
    # a baseline run is GRPO with exactly that objective, and is its own baseline
    assert learning.spec("grpo__token-mean__0.2-0.28") == (
        "grpo", ["algo.loss_agg=token-mean", "algo.eps_low=0.2", "algo.eps_high=0.28"])
    assert learning.spec("grpo__token-mean__0.2-0.28__u16") == (
        "grpo", ["algo.loss_agg=token-mean", "algo.eps_low=0.2", "algo.eps_high=0.28", "algo.mini_batches=16"])
    assert learning.objective("grpo__token-mean__0.2-0.28__u16") == ("token-mean", 0.2, 0.28, 16)
    assert learning.baseline("grpo__token-mean__0.2-0.28__u4") == "grpo__token-mean__0.2-0.28__u4"
    assert learning.with_baselines(["ead", "e3", "ead_tis"]) == ["grpo__token-mean__0.2-0.28__u4", "grpo", "ead",
                                                                 "e3", "ead_tis"]


def test_the_testbed_layers_over_every_recipe():
    from explorl.config import load_config

    learning = _load("learning")
    overrides = learning.testbed_overrides()
    assert "task.difficulties=[3, 4, 5, 6, 7]" in overrides and "sampling.group_size=16" in overrides
    recipes = sorted(p.stem for p in learning.RECIPES.glob("*.yaml"))
    for method in recipes + ["grpo__token-mean__0.2-0.28", "grpo__token-mean__0.2-0.28__u16"]:
        recipe, extra = learning.spec(method)
        cfg = load_config(learning.RECIPES / f"{recipe}.yaml", overrides + extra)  # validates
        assert cfg.task.difficulties == [3, 4, 5, 6, 7] and cfg.sampling.max_new_tokens == 96, method
        assert cfg.sampling.group_size == 16 and cfg.optim.lr == 1e-4, method


def test_the_gpu_benchmark_models_have_the_published_qwen25_shapes():
    gpu = _load("gpu")
    # Qwen2.5-0.5B and -1.5B config.json: hidden 896 / 1536, layers 24 / 28, heads 14 / 12, KV heads 2 / 2,
    # MLP 4864 / 8960, vocabulary 151936, tied input and output embeddings
    for name, (hidden, layers, heads, mlp) in {"0.5B": (896, 24, 14, 4864), "1.5B": (1536, 28, 12, 8960)}.items():
        cfg = gpu.qwen_config(name)
        assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads,
                cfg.intermediate_size, cfg.vocab_size, cfg.tie_word_embeddings) == (hidden, layers, heads, 2, mlp,
                                                                                    151936, True), name
    # the smoke run shrinks everything but the vocabulary
    small = gpu.qwen_config("1.5B", smoke=True)
    assert (small.num_hidden_layers, small.hidden_size, small.vocab_size) == (2, 64, 151936)


def test_spread_lengths_end_a_response_at_each_token_with_one_chance_in_a_quarter_of_the_limit():
    # `--spread-lengths`: under a nearly uniform next token over 151,936 ids, 1,187 ending ids stop a response with
    # probability 1187 / 151936 = 1 / 128 per token, a mean length of 128 = 512 / 4 (151936 / 128 = 1187 by hand)
    gpu = _load("gpu")
    eos = gpu.spread_eos(151936, 512)
    assert len(eos) == len(set(eos)) == 1187 and eos[0] == gpu.EOS
    assert gpu.PAD not in eos and max(eos) < 151936
    assert gpu.spread_eos(151936, 2048) == eos[:round(151936 / 512)]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the benchmark would run, not skip")
def test_the_gpu_benchmark_skips_with_its_reason_without_cuda(capsys):
    gpu = _load("gpu")
    assert gpu.main([]) == 0
    out = capsys.readouterr().out
    assert out.strip() == ("bench/gpu.py: skipped: no CUDA device (torch.cuda.is_available() is False): the GPU "
                           "path is unmeasured on this machine")


def test_the_gpu_benchmarks_word_level_tokenizer_round_trips_ids():
    tok = _load("gpu")._id_tokenizer(151936)
    ids = [0, 5, 151935, 77]
    assert tok.decode(ids) == "t0 t5 t151935 t77" and tok(tok.decode(ids))["input_ids"] == ids


def test_grpo_verified_is_grpo_with_the_verified_reward():
    learning = _load("learning")
    assert learning.spec("grpo_verified") == ("grpo", ["task.reward=verified"])
    assert learning.baseline("grpo_verified") == "grpo"  # the reward is not the objective


def test_the_long_runs_judge_right_chains_in_distribution_only(tmp_path):
    testbed_long = _load("testbed_long")
    wanted = testbed_long.wanted_records(tmp_path, [500, 1000])
    # per checkpoint: in distribution 4 modes, out of it the 2 answer-judged ones; chains after their answer runs
    assert len(wanted) == 2 * (4 + 2)
    assert [m for s, sp, m in wanted if (s, sp) == (500, "id")] == ["t1", "matched", "t1-chain", "matched-chain"]
    assert [m for s, sp, m in wanted if (s, sp) == (500, "ood")] == ["t1", "matched"]
    assert wanted[(1000, "id", "matched-chain")] == tmp_path / "step1000.id.matched-chain.json"
    table = _load("testbed_long_table")
    assert table.base_mode("matched-chain") == "t1-chain" and table.base_mode("matched") == "t1"
    assert table.is_baseline("grpo") and table.is_baseline("grpo__token-mean__1-1__u8")
    assert not table.is_baseline("grpo_verified")


def test_the_long_runs_pair_seed_with_seed_over_the_problems_all_scored():
    paired = _load("testbed_long_table").paired

    # pass@1 = c / 4. Seed 0: p1 1/4 -> 3/4 (+0.5), p2 2/4 -> 2/4 (0); seed 1: p1 0 -> 1/4 (+0.25), p2 1 -> 1/2
    # (-0.5); p3 is scored in seed 1 only, so it is left out. Per seed: +0.25, -0.125; overall (0.5 + 0 + 0.25 -
    # 0.5) / 4 = +0.0625
    seed0 = (_scored({"p1": 1, "p2": 2}), _scored({"p1": 3, "p2": 2}))
    seed1 = (_scored({"p1": 0, "p2": 4, "p3": 0}), _scored({"p1": 1, "p2": 2, "p3": 4}))
    mean, lo, hi, per_seed = paired([seed0, seed1], k=1)
    assert mean == pytest.approx(0.0625) and per_seed == pytest.approx([0.25, -0.125])
    assert lo <= mean <= hi
    assert paired([], k=1) is None
    assert paired([(_scored({"p1": 1}), _scored({"p2": 1}))], k=1) is None  # no problem in common


def test_the_long_runs_frontier_rows_pair_each_seed_with_its_baseline():
    from explorl.evaluation.frontier import FrontierPoint

    frontier = _load("testbed_long_frontier")

    def model(shift: float, hits: dict[str, int]) -> list:  # two temperatures, entropies 0.2 and 0.6 (+ shift)
        return [FrontierPoint(t, h + shift, 64, hits) for t, h in ((0.7, 0.2), (1.3, 0.6))]

    # seed 0: clip_cov solves p1 32 of 64 against its baseline's 16, p2 alike (0 each): +0.25 at pass@1 at every
    # entropy; seed 1: the same counts, so 0. The baseline of clip_cov is the 8-update GRPO of its objective.
    ref = frontier.baseline("clip_cov")
    frontiers = {0: {ref: model(0.0, {"p1": 16, "p2": 0}), "clip_cov": model(0.0, {"p1": 32, "p2": 0})},
                 1: {ref: model(0.0, {"p1": 16, "p2": 0}), "clip_cov": model(0.0, {"p1": 16, "p2": 0})}}
    rows = frontier.comparison_rows(frontiers, "clip_cov", ref, points=2)
    assert len(rows) == 2 and rows[0].startswith(f"| clip_cov | {ref} | 2 | 0.2000 | ")
    # pass@1: (16/64 + 0) / 2 = +0.125 over problems in seed 0, 0 in seed 1, +0.0625 overall
    assert "+0.062 [" in rows[0] and "(+0.125, +0.000)" in rows[0]
    assert frontier.comparison_rows(frontiers, "kl_cov", ref) == []  # not recorded
    # ranges that do not overlap say so instead of pairing
    apart = {0: {ref: model(0.0, {"p1": 1}), "clip_cov": model(1.0, {"p1": 1})}}
    assert "do not overlap" in frontier.comparison_rows(apart, "clip_cov", ref)[0]
    # the summary: at both entropies +0.0625 (the interval [0, +0.125] touches zero, so neither + nor -)
    row = frontier.summary_row(frontiers, "clip_cov", ref, points=2)
    assert row.startswith(f"| clip_cov | {ref} | 2 | 0.200-0.600 | +0.062 to +0.062 (0+ 0-) |")
    assert "do not overlap" in frontier.summary_row(apart, "clip_cov", ref)
    # the plot: the one comparison recorded in each panel (k = 1, 8, 64); at k = 1 it is +0.0625 at both entropies
    axes = frontier.difference_figure(frontiers, points=2).axes
    assert len(axes) == 3
    (line,) = [x for x in axes[0].get_lines() if not x.get_label().startswith("_")]
    assert line.get_label() == f"clip_cov - {ref} (2 seeds)"
    assert list(line.get_xdata()) == pytest.approx([0.2, 0.6]) and list(line.get_ydata()) == pytest.approx([0.0625] * 2)
    # against the base model (solving nothing): every run recorded, clip_cov at k = 1 (32/64 + 0) / 2 = 0.25
    with_base = {0: {**frontiers[0], "base": model(0.0, {"p1": 0, "p2": 0})}}
    axes = frontier.difference_figure(with_base, points=2, against_base=True).axes
    lines = {x.get_label(): x for x in axes[0].get_lines() if not x.get_label().startswith("_")}
    assert sorted(lines) == sorted([f"{ref} - base (1 seed)", "clip_cov - base (1 seed)"])
    assert list(lines["clip_cov - base (1 seed)"].get_ydata()) == pytest.approx([0.25] * 2)


@pytest.mark.parametrize("completion, expected", [
    ("2-11=-9\n-9+5=-4\n-4-3=-7\n\\boxed{-7}", (None, 3)),
    ("2-11=-8\n-8+5=-3\n-3-3=-6\n\\boxed{-6}", ("arith", 0)),  # 2-11 is -9
    ("2-11=-9\n-9-3=-12\n\\boxed{-12}", ("copy", 1)),  # +5 skipped
    ("2-11=-9\n-8+5=-3\n\\boxed{-3}", ("carry", 1)),  # does not start from -9
    ("2-11=-9\n-9+5=-4\n\\boxed{-4}", ("stop", 2)),  # boxed before the last operation
    ("2-11=-9\nso -9", ("format", 1)),
    ("2-11=-9\n-9+5=-4\n-4-3=-7\n\\boxed{-7}}}", (None, 3)),  # stray braces after the answer: not work
    ("2-11=-9\n-9+5=-4\n-4-3=-7\n\\boxed{-7}\\boxed{1}", ("format", 3)),  # the answer read is 1
])
def test_coverage_where_finds_the_first_mistake(completion, expected):
    first_mistake = _load("coverage_where").first_mistake
    assert first_mistake("2-11+5-3=?\n", completion) == expected


@pytest.mark.parametrize("moved", ["wrong", "right"])
def test_erpo_pull_signs_the_token_term_against_where_the_policy_moved(moved):
    # One group of 4 two-token responses, the first right. The responses named `moved` have s = log pi_old -
    # log pi_ref = (+0.5, -0.5), the others s = 0; equal entropies (gate 0.5 everywhere). ERPO pushes a wrong
    # response's raised token down and its lowered one up (towards the reference: share x s < 0 on both), a right
    # response's the other way (> 0). Tokens with s = 0 add exactly 0, and the parts of the share common to a
    # response's tokens (the group z-score's shift and rescaling of A_group) cancel over s = (+0.5, -0.5).
    pull = _load("erpo_pull").pull
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
    rows = rewards > 0.5 if moved == "right" else rewards <= 0.5
    s = torch.where(rows[:, None], torch.tensor([[0.5, -0.5]]), torch.zeros(4, 2))
    call = {"rewards": rewards, "group": torch.zeros(4, dtype=torch.long), "mask": torch.ones(4, 2),
            "entropy": torch.ones(4, 2), "logprobs": s - 1.0, "ref_logprobs": torch.full((4, 2), -1.0),
            "options": ErpoOptions(beta_progress=0.1, gamma=5.0, eta=0.2, num_buckets=10, sigma_target=1.0)}
    found = pull([call])
    assert found["wrong"][1] == 6 and found["right"][1] == 2
    other = "right" if moved == "wrong" else "wrong"
    assert found[other][0] == 0.0
    assert found[moved][0] < -1e-3 if moved == "wrong" else found[moved][0] > 1e-3
    # an all-wrong group gets no advantage and is not counted
    assert pull([{**call, "rewards": torch.zeros(4)}]) == {"wrong": (0.0, 0), "right": (0.0, 0)}


def test_the_long_runs_figures_compare_each_methods_last_common_step_with_the_base(tmp_path):
    figures = _load("testbed_long_figures")

    def record(correct: dict[str, int]) -> dict:  # a pass@k curve at k = 1, 4
        mean1 = sum(correct.values()) / (4 * len(correct))
        return _scored(correct, k=[1, 4], **{"pass@k": [[mean1, 0, 1], [0.5, 0, 1]]})

    base = record({"p1": 1, "p2": 0})
    # grpo: seed 0 has steps 500 and 1000, seed 1 only 500, so its last common step is 500; clip_cov: one seed
    records = {("base", 0, 0, "ood", "t1-chain"): base,
               ("grpo", 0, 500, "ood", "matched-chain"): record({"p1": 2, "p2": 0}),
               ("grpo", 0, 1000, "ood", "matched-chain"): record({"p1": 4, "p2": 4}),
               ("grpo", 1, 500, "ood", "matched-chain"): record({"p1": 0, "p2": 0}),
               ("clip_cov", 0, 1000, "ood", "matched-chain"): record({"p1": 1, "p2": 2})}
    assert figures.last_step(records, "grpo", "ood", "matched-chain") == 500
    assert figures.last_step(records, "grpo", "id", "matched-chain") is None
    rows = figures.forest_rows(records, 1, "ood", "matched-chain")
    # pass@1 = c / 4 against the base's (1/4, 0): grpo seed 0 (+1/4, 0), seed 1 (-1/4, 0): mean 0; clip_cov (0,
    # +1/2): +1/4
    assert [(m, s, n) for m, s, n, _ in rows] == [("grpo", 500, 2), ("clip_cov", 1000, 1)]
    assert rows[0][3][0] == pytest.approx(0.0) and rows[1][3][0] == pytest.approx(0.25)
    assert rows[0][3][3] == pytest.approx([0.125, -0.125])
    figures.forest(records, 1, tmp_path / "forest.png")
    figures.curves(records, tmp_path / "curves.png")
    assert (tmp_path / "forest.png").stat().st_size > 10_000 and (tmp_path / "curves.png").stat().st_size > 10_000
    # per problem at each method's last common step: grpo at 500 in seeds 0 and 1, clip_cov at 1000 in seed 0
    assert figures.problem_points(records, "grpo", "ood", "matched-chain") == [("p1", 1, [2, 0]), ("p2", 0, [0, 0])]
    assert figures.problem_points(records, "clip_cov", "ood", "matched-chain") == [("p1", 1, [1]), ("p2", 0, [2])]
    assert figures.problem_points(records, "grpo", "id", "matched-chain") == []  # not recorded there
    for r in records.values():
        r["n"] = 4  # samples per problem, the axes' extent
    figures.problems(records, tmp_path / "problems.png", min_hits=1)
    assert (tmp_path / "problems.png").stat().st_size > 10_000


def test_the_long_runs_compare_coverage_at_equal_pass1_with_an_interval_over_problems():
    table = _load("testbed_long_table")

    x, y = ("id", "matched-chain"), ("ood", "matched-chain")
    records = {("base", 0, 0, "id", "t1-chain"): _scored({"a": 0, "b": 0}),  # (pass@1 ID, pass@1 OOD) = (0, 1/2)
               ("base", 0, 0, "ood", "t1-chain"): _scored({"c": 2, "d": 2}),
               ("grpo", 0, 500, *x): _scored({"a": 2, "b": 2}),  # (1/2, 1/4)
               ("grpo", 0, 500, *y): _scored({"c": 1, "d": 1}),
               ("grpo_verified", 0, 500, *x): _scored({"a": 1, "b": 1}),  # (1/4, 1/2)
               ("grpo_verified", 0, 500, *y): _scored({"c": 2, "d": 2}),
               ("grpo_verified", 0, 1000, *x): _scored({"a": 4, "b": 4}),  # pass@1 1: beyond grpo's path
               ("grpo_verified", 0, 1000, *y): _scored({"c": 2, "d": 2})}
    # grpo's path runs from (0, 1/2) to (1/2, 1/4): at pass@1 1/4 it is 3/8, so the difference is 1/2 - 3/8. Every
    # problem of a record scores alike, so every resample gives the same value and the interval is that point.
    seeds, p1, cov, ref, diff, lo, hi = table.equal_pass1_difference(records, "grpo_verified", 500, 1, x, y)
    assert (seeds, p1, cov, ref, diff) == (1, pytest.approx(0.25), pytest.approx(0.5), pytest.approx(0.375),
                                           pytest.approx(0.125))
    assert lo == pytest.approx(0.125) and hi == pytest.approx(0.125)
    outside = table.equal_pass1_difference(records, "grpo_verified", 1000, 1, x, y)
    assert math.isnan(outside[4]) and outside[5:] == (None, None)
    rows = table.equal_pass1_table(records, 1, x, y)
    assert "| grpo_verified | 500 | 1 | the method | 0.250 | 0.500 | 0.375 | +0.125 [+0.125, +0.125] |" in rows
    assert "| grpo_verified | 1000 | 1 | the method | 1.000 | 0.500 | - | - |" in rows  # grpo has no step 1000
    # reversed: grpo at 500, (1/2, 1/4), against grpo_verified's path (0, 1/2), (1/4, 1/2), (1, 1/2): at pass@1
    # 1/2 that path is at 1/2, so the method minus its baseline is 1/2 - 1/4
    seeds, p1, cov, ref, diff, lo, hi = table.equal_pass1_difference(records, "grpo_verified", 500, 1, x, y,
                                                                     reverse=True)
    assert (seeds, p1, cov, ref, diff) == (1, pytest.approx(0.5), pytest.approx(0.25), pytest.approx(0.5),
                                           pytest.approx(0.25))
    records[("grpo", 0, 1000, *x)] = _scored({"a": 3, "b": 3})  # grpo at 1000: (3/4, 1/2)
    records[("grpo", 0, 1000, *y)] = _scored({"c": 2, "d": 2})
    # grpo_verified at 1000 (pass@1 1) is beyond grpo's path, so the table compares at grpo's 3/4 on grpo_verified's
    # path, between (1/4, 1/2) and (1, 1/2): 1/2, so 1/2 - 1/2
    assert "| grpo_verified | 1000 | 1 | its baseline | 0.750 | 0.500 | 0.500 | +0.000 [+0.000, +0.000] |" in (
        table.equal_pass1_table(records, 1, x, y))
    del records[("grpo", 0, 1000, *x)], records[("grpo", 0, 1000, *y)]
    # The same mean OOD pass@1 from c: 1 and d: 0. A resample draws (c, c), (c, d) or (d, d) with probability
    # 1/4, 1/2, 1/4: the difference is 1 - 3/8, 1/2 - 3/8 or 0 - 3/8, so the 2.5% and 97.5% quantiles of 2,000
    # resamples are -0.375 and +0.625 (the x problems and the other records do not vary)
    records[("grpo_verified", 0, 500, *y)] = _scored({"c": 4, "d": 0})
    *_, diff, lo, hi = table.equal_pass1_difference(records, "grpo_verified", 500, 1, x, y)
    assert diff == pytest.approx(0.125) and lo == pytest.approx(-0.375) and hi == pytest.approx(0.625)
    assert table.equal_pass1_difference(records, "e3_ts", 500, 1, x, y) is None  # not recorded


def test_the_long_runs_frontier_adds_the_base_models_low_temperatures_to_every_seed(tmp_path, monkeypatch):
    import json

    from explorl import commands

    frontier = _load("testbed_long_frontier")
    monkeypatch.setattr(frontier, "ROOT", tmp_path)

    def write(path, models: dict[str, list[tuple[float, float]]]) -> None:  # {label: [(temperature, entropy)]}
        path.mkdir(parents=True)
        points = {label: {"points": [{"temperature": t, "entropy": h, "correct": {"p1": 1}} for t, h in pts]}
                  for label, pts in models.items()}
        (path / "frontier.json").write_text(json.dumps({"n": 4, "models": points}))

    write(frontier.frontier_dir("x", 0, "ood"), {"base": [(1.0, 0.2), (0.7, 0.12)], "grpo": [(0.7, 0.03)]})
    write(frontier.frontier_dir("x", 1, "ood"), {"grpo": [(0.7, 0.04)]})
    assert [p.temperature for p in frontier.load_frontiers("x", 2, "ood")[0]["base"]] == [1.0, 0.7]  # as recorded
    write(frontier.base_low_dir("x", "ood"), {"base": [(0.3, 0.03), (0.7, 0.5)]})
    loaded = frontier.load_frontiers("x", 2, "ood")
    # the low point joins in temperature order; the seed's own point at 0.7 is kept, not the low frontier's
    assert [(p.temperature, p.entropy) for p in loaded[0]["base"]] == [(0.3, 0.03), (0.7, 0.12), (1.0, 0.2)]
    assert [p.entropy for p in loaded[0]["grpo"]] == [0.03] and "base" not in loaded[1]
    # run_frontier evaluates the base model's low temperatures once, into the shared directory
    calls = []
    monkeypatch.setattr(commands, "main", lambda argv: calls.append(argv) or 0)
    frontier.run_frontier("x", 1, {"grpo": "runs/x/grpo/seed1/checkpoints/step_0001500"}, 8, "embedded:testbed", "ood")
    assert [c[1:c.index("--labels")] for c in calls] == [["embedded:testbed", "runs/x/grpo/seed1/checkpoints/"
                                                          "step_0001500"], ["embedded:testbed"]]
    assert calls[1][calls[1].index("--temperatures") + 1] == "0.1,0.2,0.3,0.4,0.5,0.6"
    assert calls[1][calls[1].index("--out") + 1] == str(frontier.base_low_dir("x", "ood"))
    calls.clear()
    frontier.run_frontier("x", 1, {}, 8, "embedded", "id")  # in distribution the ranges overlap: no extra call
    assert len(calls) == 1


def test_the_long_runs_narrowing_compares_each_seeds_last_checkpoint_with_its_first():
    table = _load("testbed_long_table")

    def record(correct: dict[str, int], entropy: float) -> dict:
        return {**_scored(correct), "entropy": entropy, "pass@1": 0.0}

    split, mode = "ood", "matched-chain"
    records = {("grpo", 0, 500, split, mode): record({"p1": 2, "p2": 4}, 0.1),
               ("grpo", 0, 1500, split, mode): record({"p1": 1, "p2": 4}, 0.05),
               ("grpo", 1, 500, split, mode): record({"p1": 0, "p2": 2}, 0.2),
               ("grpo", 1, 1000, split, mode): record({"p1": 4, "p2": 4}, 0.2),  # seed 1 only: not common
               ("grpo", 1, 1500, split, mode): record({"p1": 0, "p2": 0}, 0.1),
               ("e3_ts", 0, 500, split, mode): record({"p1": 1, "p2": 1}, 0.1)}  # one checkpoint: no row
    # seed 0: (-1/4 + 0) / 2 = -0.125; seed 1: (0 - 1/2) / 2 = -0.25; both: -0.1875. Entropy: (-0.05 - 0.1) / 2
    rows = [line for line in table.narrowing_table(records, split, mode, 1) if line.startswith("| ")][1:]
    assert len(rows) == 1 and rows[0].startswith("| grpo | 500 to 1500 | 2 | -0.188 [")
    assert rows[0].endswith("(-0.125, -0.250) | -0.075 |")


@pytest.mark.slow
def test_the_gpu_benchmark_prints_each_sampling_round_as_it_finishes(capsys):
    """A part cut by a lent GPU's time limit keeps what finished: one line per method and round (1 warm-up + 1 timed
    in the smoke run), cheapest method first, before the table."""
    _load("gpu").main(["--smoke", "--models", "0.5B", "--skip", "training"])
    out_lines = capsys.readouterr().out.splitlines()
    rounds = [line for line in out_lines if line.startswith("  16 tokens, ")]
    methods = ["HF", "explorl eager CUDA graph", "explorl eager", "explorl", "explorl CUDA graph"]
    # round 0 in this order, round 1 reversed (bench/sampler.py's alternation)
    assert [line.split(", ")[1] for line in rounds] == methods + methods[::-1]
    assert all(" tok/s" in line for line in rounds) and "(warm-up)" in rounds[0] and "(warm-up)" not in rounds[-1]
    # each line says what the graph and the compiler did (on the CPU no graph is captured, none failed)
    assert all(line.endswith("CUDA graphs captured 0, failed 0") for line in rounds)
    assert out_lines.index(rounds[-1]) < next(i for i, line in enumerate(out_lines) if line.startswith("| model"))
