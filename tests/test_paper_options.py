"""Options the papers vary (issue 14, item 6), each checked against numbers derived by hand in the comments, with its
default reproducing the paper / the behaviour before the option existed, and its validation naming the field:
the covariance-weighting kernel bandwidth (CW-GRPO), the position bonus's centre shift n (STILL), E3's budget
curriculum off and its starting bounds (E3), RFT's fixed sample count and its evaluation's top-p (STILL)."""

from __future__ import annotations

import io
import json
import math
import random

import pytest
import torch
from rich.console import Console

from explorl.algos import advantages as A
from explorl.algos.batch import RolloutBatch
from explorl.algos.registry import lookup
from explorl.config import AlgoConfig, ConfigError, load_config
from explorl.rollout import budget as B
from explorl.rollout.schedule import ScheduleDriver


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


# ----------------------------------------------------------------------------------------------------------------
# covariance weighting: algo.cw.bandwidth (docs/methods.md §4)

# The batch of test_cov_weighted_hand_values: valid tokens A = [[1, 1], [-1, -1]], logp = [[0, -2], [-1, -1]]
# (third column padding). mean logp = -1, mean A = 0 -> c = (logp + 1) * A = [[1, -1], [0, 0]], sigma^2 = 0.5.
ADV = torch.tensor([[1.0, 1.0, 9.0], [-1.0, -1.0, float("nan")]])
LP = torch.tensor([[0.0, -2.0, float("nan")], [-1.0, -1.0, 5.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])


def _hand_weights(bandwidth: float) -> tuple[float, float]:
    """(w~ at |c| = 1, w~ at c = 0) for the batch above: w = exp(-c^2 / (2 b^2 0.5)) = exp(-c^2 / b^2), so
    w(|c|=1) = e^(-1/b^2), w(0) = 1; w~ = 4 w / (2 e^(-1/b^2) + 2) = 2 w / (1 + e^(-1/b^2))."""
    e = math.exp(-1.0 / bandwidth**2)
    return 2 * e / (1 + e), 2 / (1 + e)


def test_cw_bandwidth_hand_values():
    # b = 2: e^(-1/4) = 0.7788008 -> w~ = 0.8756... and 1.1243...;  b = 0.5: e^-4 = 0.0183156 -> 0.0359724, 1.9640276
    assert _hand_weights(2.0)[0] == pytest.approx(0.8756, abs=1e-4)
    assert _hand_weights(0.5) == pytest.approx((0.0359724, 1.9640276), abs=1e-7)
    for b in (2.0, 0.5):
        lo, hi = _hand_weights(b)
        w = A.cov_weights(ADV, LP, MASK, bandwidth=b)
        assert torch.allclose(w, torch.tensor([[lo, lo, 0.0], [hi, hi, 0.0]], dtype=torch.float64), atol=1e-12)
        out = A.cov_weighted(ADV, LP, MASK, bandwidth=b)
        assert torch.allclose(out, torch.tensor([[lo, lo, 0.0], [-hi, -hi, 0.0]]), atol=1e-6)
        # the per-group form with one group is the same set of tokens, so the same weights
        grouped = A.cov_weights_grouped(ADV, LP, torch.zeros(2, dtype=torch.long), MASK, bandwidth=b)
        assert torch.allclose(grouped, w, atol=1e-12)


def test_cw_bandwidth_default_is_the_papers_kernel():
    # bandwidth 1 (CW-GRPO: the bandwidth is sigma): e^-1 -> w~ = 2/e / (1 + 1/e) = 0.5378828, 1.4621172 -- the
    # numbers of test_cov_weighted_hand_values; the registered shapers with the default config give them exactly as
    # the functions without the keyword do
    assert A.CwOptions().bandwidth == 1.0
    assert _hand_weights(1.0) == pytest.approx((0.5378828, 1.4621172), abs=1e-7)
    lo, hi = _hand_weights(1.0)
    assert torch.allclose(A.cov_weights(ADV, LP, MASK), torch.tensor([[lo, lo, 0.0], [hi, hi, 0.0]],
                                                                     dtype=torch.float64), atol=1e-12)
    g = torch.Generator().manual_seed(3)
    mask = (torch.rand(6, 5, generator=g) > 0.2).float()
    adv = torch.randn(6, 1, generator=g).expand(6, 5) * mask
    lp = -torch.rand(6, 5, generator=g) * 3
    group = torch.tensor([0, 0, 0, 4, 4, 4])
    batch = RolloutBatch(mask=mask, rewards=torch.zeros(6), group=group, logprobs=lp)
    def shaper(name: str, *options: str):  # the shaper as the step calls it: options from a loaded config
        algo = load_config(None, [f"algo.shapers=[{name}]", *options]).algo
        return lambda: lookup("shaper", name).bind(algo)(adv, batch, algo, 1)

    assert torch.equal(shaper("cw")(), A.cov_weighted(adv, lp, mask))
    for name, fn in (("cw_group", A.cov_weights_grouped), ("cw_balanced", A.cov_weights_balanced)):
        plain = torch.where(mask.bool(), (fn(adv, lp, group, mask) * adv.double()).float(), 0.0)
        assert torch.equal(shaper(name)(), plain), name
        # and the shaper passes the configured bandwidth (algo.cw.bandwidth, cw's options) on
        shaped = torch.where(mask.bool(), (fn(adv, lp, group, mask, bandwidth=3.0) * adv.double()).float(), 0.0)
        assert torch.equal(shaper(name, "algo.cw.bandwidth=3.0")(), shaped), name
        assert not torch.allclose(shaped, plain), name
    assert torch.equal(shaper("cw", "algo.cw.bandwidth=3.0")(), A.cov_weighted(adv, lp, mask, bandwidth=3.0))


def test_cw_bandwidth_wide_kernel_tends_to_plain_grpo():
    # b -> inf: every w -> 1, so w~ -> 1 and the shaped advantage -> A (the kernel suppresses nothing)
    w = A.cov_weights(ADV, LP, MASK, bandwidth=1e6)
    assert torch.allclose(w, MASK.double(), atol=1e-10)


# ----------------------------------------------------------------------------------------------------------------
# position shaping: algo.position.n (docs/methods.md §7b)


def test_position_n_hand_values():
    # one response of 3 tokens, A = 1: l = (t - 1) / 3 = 0, 1/3, 2/3; b = 0.1 * sigmoid(15 * (l - n)).
    # n = -0.5 (as STILL prints it): sigmoid(7.5), sigmoid(12.5), sigmoid(17.5) = 0.99944722, 0.99999627,
    #   0.99999997: every token gets about the full gamma = 0.1 (the saturation docs/methods.md §7b describes).
    # n = 0: sigmoid(0), sigmoid(5), sigmoid(10) = 0.5, 0.99330715, 0.99995460.
    adv, mask = torch.ones(1, 3), torch.ones(1, 3)
    printed = A.position_shaped(adv, mask, n=-0.5)
    assert torch.allclose(printed, torch.tensor([[1.099944722, 1.099999627, 1.099999997]]), atol=1e-7)
    zero = A.position_shaped(adv, mask, n=0.0)
    assert torch.allclose(zero, torch.tensor([[1.05, 1.099330715, 1.099995460]]), atol=1e-7)
    batch = RolloutBatch(mask=mask, rewards=torch.zeros(1), group=torch.zeros(1, dtype=torch.long))
    assert torch.equal(A.get_shaper("position")(adv, batch, AlgoConfig(), 1, options=A.PositionOptions(n=-0.5)),
                       printed)


def test_position_n_default_is_the_public_codes_centre():
    # default n = 0.5: b = 0.1 * sigmoid(15 (l - 0.5)) = 0.1 * sigmoid(-7.5, -2.5, 2.5) (test_position_hand_values)
    assert A.PositionOptions().n == 0.5
    adv, mask = torch.ones(1, 3), torch.ones(1, 3)
    expected = [1 + 0.1 * sigmoid(-7.5), 1 + 0.1 * sigmoid(-2.5), 1 + 0.1 * sigmoid(2.5)]
    assert torch.allclose(A.position_shaped(adv, mask), torch.tensor([expected]), atol=1e-7)
    batch = RolloutBatch(mask=mask, rewards=torch.zeros(1), group=torch.zeros(1, dtype=torch.long))
    options = load_config(None, ["algo.shapers=[position]"]).algo.options["position"]
    assert torch.equal(A.get_shaper("position")(adv, batch, AlgoConfig(), 1, options=options),
                       A.position_shaped(adv, mask))


# ----------------------------------------------------------------------------------------------------------------
# E3 budget curriculum: budget.e3.curriculum, budget.e3.g_min_start, budget.e3.g_max_start (docs/methods.md §2a)


def test_curriculum_starting_bounds():
    # G = 8, limits 4 / 12, step 2, starting at 6 / 10: 6/10 -> 4/12 -> 4/12
    cur = B.BudgetCurriculum(8, 4, 12, 2, g_min_start=6, g_max_start=10)
    seen = [cur.bounds()]
    for _ in range(2):
        cur.end_of_pass()
        seen.append(cur.bounds())
    assert seen == [(6, 10), (4, 12), (4, 12)]
    # asymmetric: start 7 / 8 -> 5 / 10 -> 4 / 12
    cur = B.BudgetCurriculum(8, 4, 12, 2, g_min_start=7, g_max_start=8)
    cur.end_of_pass()
    assert cur.bounds() == (5, 10)
    cur.end_of_pass()
    assert cur.bounds() == (4, 12)
    with pytest.raises(ValueError, match="g_min_start"):
        B.BudgetCurriculum(8, 4, 12, 2, g_min_start=9)
    with pytest.raises(ValueError, match="g_max_start"):
        B.BudgetCurriculum(8, 4, 12, 2, g_max_start=13)


def _budgets_after_one_pass(overrides: list[str]) -> tuple[list[int], list[int], tuple[int, int]]:
    """(budgets in the first pass, budgets after it, bounds after it) of two prompts: prompt 0 always right,
    prompt 1 always wrong, G = 8."""
    cfg = load_config(None, ["budget.policy=e3", "sampling.group_size=8", *overrides])
    policy = ScheduleDriver(cfg, vocab_size=10, num_prompts=2).budget
    first = policy.budgets([0, 1])
    policy.observe_rewards([0, 1], [[1.0] * 8, [0.0] * 8])
    policy.end_of_pass()
    return first, policy.budgets([0, 1]), policy.curriculum.bounds()


def test_curriculum_off_uses_the_limits_from_the_start():
    # After one pass: prompt 0 (mean 1) has rank 1, prompt 1 (mean 0) rank 2, |D| = 2 -> k = [0.5, 1.0], sum 1.5.
    # Curriculum off, bounds 4 / 12: N_rem = 16 - 8 = 8; G = 4 + floor(8 * 0.5 / 1.5) = 4 + 2 = 6 and
    #   4 + floor(8 / 1.5) = 4 + 5 = 9; one rollout left goes to the harder prompt -> [6, 10].
    cfg = load_config(None, ["budget.policy=e3", "budget.e3.curriculum=false"])
    assert ScheduleDriver(cfg, vocab_size=10, num_prompts=2).budget.curriculum.bounds() == (4, 12)  # from step 1
    first, after, bounds = _budgets_after_one_pass(["budget.e3.curriculum=false"])
    assert first == [8, 8]  # no ranks during the first pass (sum k = 0): everyone gets G, curriculum or not
    assert (after, bounds) == ([6, 10], (4, 12))
    # the default (the paper's curriculum) after one pass: bounds 6 / 10, N_rem = 16 - 12 = 4;
    #   G = 6 + floor(4 * 0.5 / 1.5) = 7 and 6 + floor(4 / 1.5) = 8; one left to the harder prompt -> [7, 9]
    assert _budgets_after_one_pass([]) == ([8, 8], [7, 9], (6, 10))
    # starting bounds 5 / 11 widen to the limits 4 / 12 after a pass, so the result equals the curriculum off here
    budgets = _budgets_after_one_pass(["budget.e3.g_min_start=5", "budget.e3.g_max_start=11"])
    assert budgets == ([8, 8], [6, 10], (4, 12))


@pytest.mark.parametrize("overrides, field", [
    (["budget.e3.g_min_start=9"], "budget.e3.g_min_start"),  # above G = 8
    (["budget.e3.g_min_start=3"], "budget.e3.g_min_start"),  # below g_min_limit = 4
    (["budget.e3.g_max_start=7"], "budget.e3.g_max_start"),  # below G
    (["budget.e3.g_max_start=13"], "budget.e3.g_max_start"),  # above g_max_limit = 12
    (["budget.e3.curriculum=false", "budget.e3.g_max_start=10"], "budget.e3.g_max_start"),  # no curriculum to start
    (["budget.e3.curriculum=maybe"], "budget.e3.curriculum"),
])
def test_budget_options_are_validated(overrides, field):
    with pytest.raises(ConfigError, match=f"^{field}"):
        load_config(None, ["budget.policy=e3", *overrides])


# ----------------------------------------------------------------------------------------------------------------
# RFT: rft.select_count, rft.eval_top_p (docs/methods.md §8c)


def _cand(i, correct, passes=True, entropy=0.0, branching=0.0):
    return {"id": i, "correct": correct, "passes_filter": passes, "entropy": entropy, "branching": branching}


def test_rft_select_count_hand_values():
    from explorl.finetune.rft import select_samples

    cands = ([_cand(i, True, entropy=i, branching=10 - i) for i in range(10)]
             + [_cand(10, True, passes=False, entropy=99)]  # fails the rule filters: never chosen
             + [_cand(20 + i, False) for i in range(30)])
    ids = lambda chosen: sorted(c["id"] for c in chosen)  # noqa: E731
    kw = dict(noisy_frac=0.05, select_frac=0.5)
    # entropy: the top 3 by entropy (= id) are 9, 8, 7, in place of select_frac's 5
    assert ids(select_samples(cands, ["entropy"], rng=random.Random(0), select_count=3, **kw)) == [7, 8, 9]
    # branching = 10 - id: the top 3 are ids 0, 1, 2
    assert ids(select_samples(cands, ["branching"], rng=random.Random(0), select_count=3, **kw)) == [0, 1, 2]
    # rule filters only: 3 distinct filtered correct samples, at random
    plain = ids(select_samples(cands, [], rng=random.Random(0), select_count=3, **kw))
    assert len(plain) == 3 and set(plain) <= set(range(10))
    # a count above the 10 that pass keeps all 10
    assert ids(select_samples(cands, [], rng=random.Random(0), select_count=50, **kw)) == list(range(10))
    # noisy adds round(0.2 * 5) = 1 incorrect sample to the 5 counted correct ones
    noisy = select_samples(cands, ["noisy"], noisy_frac=0.2, select_frac=0.5, rng=random.Random(0), select_count=5)
    assert sum(c["correct"] for c in noisy) == 5 and sum(not c["correct"] for c in noisy) == 1
    # select_count 0 (the default) is the selection without a count, drawing the same random numbers
    for strategies in ([], ["noisy"], ["entropy", "noisy"]):
        a = select_samples(cands, strategies, rng=random.Random(1), **kw)
        b = select_samples(cands, strategies, rng=random.Random(1), select_count=0, **kw)
        assert ids(a) == ids(b)
    assert ids(select_samples(cands, ["entropy"], rng=random.Random(0), **kw)) == [5, 6, 7, 8, 9]


@pytest.mark.parametrize("top_p", [None, 0.95])
def test_rft_evaluates_at_its_top_p(tiny_model_dir, tmp_path, monkeypatch, top_p):
    import explorl.finetune.rft as rft

    seen = []

    def fake_evaluate(sampler, *args, **kwargs):
        seen.append(sampler.top_p)
        return {"pass@1": 0.0, "pass@2": 0.0, "entropy": 0.0}, []

    monkeypatch.setattr(rft, "evaluate", fake_evaluate)
    extra = [] if top_p is None else [f"rft.eval_top_p={top_p}"]
    cfg = load_config(None, [f"model.path={tiny_model_dir}", f"run.out_dir={tmp_path / 'rft'}",
                             "task.reward=rewards_for_tests:contains_digit", "task.eval_size=2", "task.train_size=4",
                             "sampling.max_new_tokens=4", "run.eval_n=2", "run.eval_k=[1,2]", "rft.iterations=1",
                             "rft.prompts=2", "rft.samples_per_prompt=2", *extra])
    out = rft.run_rft(cfg, console=Console(file=io.StringIO()))
    assert seen == [1.0 if top_p is None else top_p] * 2  # base model and iteration 1
    assert len(json.loads((out / "rft.json").read_text())) == 2


@pytest.mark.parametrize("override, field", [
    ("rft.select_count=-1", "rft.select_count"),
    ("rft.eval_top_p=0", "rft.eval_top_p"),
    ("rft.eval_top_p=1.5", "rft.eval_top_p"),
    ("algo.shapers=[cw] algo.cw.bandwidth=0", "algo.cw.bandwidth"),
    ("algo.shapers=[cw_group] algo.cw.bandwidth=-1", "algo.cw.bandwidth"),
    ("algo.shapers=[position] algo.position.n=.inf", "algo.position.n"),
    ("algo.shapers=[position] algo.position.n=x", "algo.position.n"),
])
def test_options_are_validated(override, field):
    with pytest.raises(ConfigError, match=f"^{field}"):
        load_config(None, override.split())
