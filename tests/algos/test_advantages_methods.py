"""ERPO, covariance weighting, PPL / position / entropy shaping and pass@k advantages (METHODS.md 3, 4, 5, 7).

Each function gets small hand-derived cases (arithmetic in the comments), a slow Python-loop reference compared
on random batches with variable group sizes and unsorted ids, and the properties the methods promise.
"""

import math
import statistics

import pytest
import torch

from explorl.algos import advantages as A
from explorl.algos.methods import ppl
from explorl.algos import get_advantage
from explorl.algos.batch import RolloutBatch
from explorl.algos.registry import lookup, names
from explorl.config import AlgoConfig, load_config

DELTA = 1e-6


# ------------------------------------------------------------------------------------------------------------
# random batches: variable group sizes, unsorted non-contiguous ids, ragged masks with garbage in the padding


def random_batch(seed, n_groups=5, max_group=6, t_len=9, binary=False, left_pad=False):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randperm(1000, generator=gen)[:n_groups] - 500  # arbitrary, possibly negative ids
    sizes = torch.randint(1, max_group + 1, (n_groups,), generator=gen)
    group = torch.repeat_interleave(ids, sizes)
    group = group[torch.randperm(group.numel(), generator=gen)]  # members of a group are scattered
    n = group.numel()
    lengths = torch.randint(1, t_len + 1, (n,), generator=gen)
    lengths[0] = 0 if n > 3 else lengths[0]  # one response without any valid token
    cols = torch.arange(t_len)[None, :]
    mask = (cols < lengths[:, None]) if not left_pad else (cols >= t_len - lengths[:, None])
    mask = mask.float()
    if binary:
        rewards = (torch.rand(n, generator=gen) > 0.5).float()
    else:
        rewards = torch.randint(0, 3, (n,), generator=gen).float() / 2  # ties and constant groups happen
    garbage = torch.full((n, t_len), float("nan"))
    entropy = torch.where(mask.bool(), torch.rand(n, t_len, generator=gen) * 3, garbage)
    logprobs = torch.where(mask.bool(), -torch.rand(n, t_len, generator=gen) * 4, garbage)
    ref_logprobs = torch.where(mask.bool(), -torch.rand(n, t_len, generator=gen) * 4, garbage)
    adv = torch.where(mask.bool(), torch.randn(n, t_len, generator=gen), garbage)
    return dict(rewards=rewards, group=group, mask=mask, entropy=entropy, logprobs=logprobs,
                ref_logprobs=ref_logprobs, adv=adv)


def rows_by_group(group):
    out = {}
    for i, g in enumerate(group.tolist()):
        out.setdefault(g, []).append(i)
    return out


def valid_positions(mask_row):
    """[(column, 1-based position t)] of the valid tokens of one response."""
    cols = [j for j, v in enumerate(mask_row.tolist()) if v > 0]
    return [(j, t + 1) for t, j in enumerate(cols)]


def pstd(xs):
    return statistics.pstdev(xs) if len(xs) > 0 else 0.0


def mean(xs):
    return sum(xs) / len(xs) if xs else 0.0


def sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


# ------------------------------------------------------------------------------------------------------------
# ERPO


def slow_erpo(rewards, group, mask, entropy, logprobs, ref, beta=0.1, gamma=5.0, eta=0.2, K=10, sigma_t=1.0):
    """Reference: METHODS 3 step by step, one group at a time, plain Python floats."""
    out = torch.zeros(mask.shape, dtype=torch.float64)
    r = rewards.tolist()
    for rows in rows_by_group(group).values():
        rs = [r[i] for i in rows]
        if len(set(rs)) == 1:
            continue
        m = sum(rs) / len(rs)
        sd = math.sqrt(sum((x - m) ** 2 for x in rs) / (len(rs) - 1))
        a_group = {i: (r[i] - m) / (sd + DELTA) for i in rows}
        toks = []  # (i, j, t, length)
        for i in rows:
            pos = valid_positions(mask[i])
            toks += [(i, j, t, len(pos)) for j, t in pos]
        if not toks:
            continue
        h = {(i, j): float(entropy[i, j]) for i, j, _, _ in toks}
        s = {(i, j): beta * (float(logprobs[i, j]) - float(ref[i, j])) for i, j, _, _ in toks}
        hm, hs = mean(list(h.values())), pstd(list(h.values()))
        w = {key: sigmoid(gamma * (v - hm) / (hs + DELTA)) for key, v in h.items()}
        bucket = {(i, j): min(math.floor(t / n * K), K - 1) for i, j, t, n in toks}
        s_tilde = {}
        for b in set(bucket.values()):
            keys = [key for key in bucket if bucket[key] == b]
            vals = [s[key] for key in keys]
            bm, bs = mean(vals), pstd(vals)
            for key in keys:
                s_tilde[key] = (s[key] - bm) / (bs + DELTA)
        sign = {i: (a_group[i] > 0) - (a_group[i] < 0) for i in rows}
        raw = {(i, j): w[(i, j)] * sign[i] * s_tilde[(i, j)] for i, j, _, _ in toks}
        active = [raw[(i, j)] for i, j, _, _ in toks if a_group[i] != 0]
        rs_ = pstd(active)
        x = {(i, j): a_group[i] + eta * sigma_t * raw[(i, j)] / (rs_ + DELTA) for i, j, _, _ in toks}
        xm, xs = mean(list(x.values())), pstd(list(x.values()))
        for (i, j), v in x.items():
            out[i, j] = (v - xm) / (xs + DELTA)
    return out


def test_erpo_hand_values_one_bucket():
    # One group, rewards [1, 0], two tokens each, K = 1, constant entropy -> W = sigmoid(0) = 0.5.
    # A_group = +-0.5 / (std_unbiased + d) = +-0.5 / (sqrt(0.5) + 1e-6) = +-a, a ~ 0.7071058.
    # s = 0.1 * (logp - ref) = [[1, 3], [2, 4]]; bucket stats: mean 2.5, std sqrt(1.25);
    #   s~ = [[-1.5, 0.5], [-0.5, 1.5]] / sqrt(1.25).
    # raw = 0.5 * sign(A) * s~ = (0.5 / sqrt(1.25)) * [[-1.5, 0.5], [0.5, -1.5]];
    #   the bracket has mean -0.5, deviations +-1, std 1 -> Psi = [[-1.5, 0.5], [0.5, -1.5]] (up to the deltas).
    # X = A + 0.2 Psi = [[a - 0.3, a + 0.1], [-a + 0.1, -a - 0.3]], mean -0.1,
    #   X - mean = [[a - 0.2, a + 0.2], [-(a - 0.2), -(a + 0.2)]], var = a^2 + 0.04.
    # A_final = [[a - 0.2, a + 0.2], [0.2 - a, -0.2 - a]] / sqrt(a^2 + 0.04) = [[0.6901, 1.2344], [-0.6901, -1.2344]].
    rewards = torch.tensor([1.0, 0.0])
    group = torch.tensor([7, 7])
    mask = torch.ones(2, 2)
    ent = torch.ones(2, 2)
    lp = torch.tensor([[10.0, 30.0], [20.0, 40.0]])
    out = A.erpo(rewards, group, mask, ent, lp, torch.zeros(2, 2), options=A.ErpoOptions(num_buckets=1))
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    sd = math.sqrt(a * a + 0.04)
    expected = torch.tensor([[a - 0.2, a + 0.2], [0.2 - a, -0.2 - a]]) / sd
    assert torch.allclose(out, expected, atol=1e-5)
    assert out[0, 0].item() == pytest.approx(0.6901, abs=1e-4) and out[0, 1].item() == pytest.approx(1.2344, abs=1e-4)


def test_erpo_bucket_index_and_per_bucket_normalisation():
    # Bucket of token t (1-based) in a response of length L: min(floor(K t / L), K - 1).
    # L = 4, K = 2: t = 1..4 -> floor(0.5), floor(1), floor(1.5), floor(2) -> 0, 1, 1, 2 -> clamp -> [0, 1, 1, 1].
    # s constant within each bucket (5 in bucket 0, -3 in bucket 1) -> s~ = 0 -> Psi = 0, so
    # A_final = Norm_G(A_group): tokens +-a with mean 0 and std a -> +-a / (a + 1e-6) ~ +-1.
    rewards = torch.tensor([1.0, 0.0])
    group = torch.tensor([0, 0])
    mask = torch.ones(2, 4)
    lp = torch.tensor([[50.0, -30.0, -30.0, -30.0]] * 2)  # s = 0.1 * lp: [5, -3, -3, -3]
    ent = torch.tensor([[0.1, 2.0, 0.3, 1.0], [1.5, 0.2, 0.7, 0.0]])
    out = A.erpo(rewards, group, mask, ent, lp, torch.zeros(2, 4), options=A.ErpoOptions(num_buckets=2))
    assert torch.allclose(out, torch.tensor([[1.0] * 4, [-1.0] * 4]), atol=1e-5)
    # With K = 1 the same s is no longer constant in its bucket and the token term moves the advantages.
    out1 = A.erpo(rewards, group, mask, ent, lp, torch.zeros(2, 4), options=A.ErpoOptions(num_buckets=1))
    assert (out1 - out).abs().max() > 1e-2
    # L = 5, K = 10: floor(10 t / 5) = 2, 4, 6, 8, 10 -> [2, 4, 6, 8, 9] (buckets 0, 1, 3, 5, 7 stay empty);
    # the slow reference, which applies the formula literally, agrees.
    b = make_erpo_case(5)
    assert torch.allclose(A.erpo(**b).double(), slow_erpo(*b.values()), atol=1e-5)


def make_erpo_case(t_len):
    gen = torch.Generator().manual_seed(t_len)
    return dict(rewards=torch.tensor([1.0, 0.0, 0.5]), group=torch.tensor([4, 4, 4]), mask=torch.ones(3, t_len),
                entropy=torch.rand(3, t_len, generator=gen), logprobs=-torch.rand(3, t_len, generator=gen),
                ref_logprobs=-torch.rand(3, t_len, generator=gen))


def test_erpo_constant_and_singleton_groups_are_zero():
    # group 3: rewards all 0.1 (their mean rounds); group 9: one response; group 1: informative
    rewards = torch.tensor([0.1, 0.1, 0.1, 1.0, 1.0, 0.0])
    group = torch.tensor([3, 3, 3, 9, 1, 1])
    mask = torch.ones(6, 3)
    gen = torch.Generator().manual_seed(0)
    ent, lp, ref = (torch.rand(6, 3, generator=gen) for _ in range(3))
    out = A.erpo(rewards, group, mask, ent, lp, ref)
    assert torch.all(out[:4] == 0.0)
    assert torch.all(out[4:] != 0.0)


@pytest.mark.parametrize("seed", range(6))
def test_erpo_matches_slow_reference(seed):
    b = random_batch(seed, left_pad=seed % 2 == 1)
    for kw, skw in [({}, {}), (dict(num_buckets=3, gamma=1.0, eta=0.7, sigma_target=2.0, beta_progress=0.5),
                                dict(K=3, gamma=1.0, eta=0.7, sigma_t=2.0, beta=0.5))]:
        fast = A.erpo(b["rewards"], b["group"], b["mask"], b["entropy"], b["logprobs"], b["ref_logprobs"],
                      options=A.ErpoOptions(**kw))
        slow = slow_erpo(b["rewards"], b["group"], b["mask"], b["entropy"], b["logprobs"], b["ref_logprobs"], **skw)
        assert fast.dtype == torch.float32
        assert torch.all(fast[b["mask"] == 0] == 0.0)
        assert torch.allclose(fast.double(), slow, atol=2e-5), (fast.double() - slow).abs().max()


@pytest.mark.parametrize("seed", range(6))
def test_erpo_group_zero_mean_unit_variance(seed):
    b = random_batch(seed + 100, max_group=8)
    out = A.erpo(b["rewards"], b["group"], b["mask"], b["entropy"], b["logprobs"], b["ref_logprobs"]).double()
    checked = 0
    for rows in rows_by_group(b["group"]).values():
        vals = out[rows][b["mask"][rows].bool()]
        if len(set(b["rewards"][rows].tolist())) == 1:
            assert torch.all(vals == 0.0)
            continue
        if vals.numel() < 2:
            continue
        # eq. 16: sum 0 and variance 1 over the group's valid tokens (population variance; the +delta in the
        # z-score makes it 1 - O(delta / std))
        assert abs(vals.mean().item()) < 1e-6
        assert vals.var(unbiased=False).item() == pytest.approx(1.0, abs=1e-4)
        checked += 1
    assert checked > 0


# ------------------------------------------------------------------------------------------------------------
# covariance weighting


def slow_cov_weights(adv, lp, mask):
    toks = [(i, j) for i in range(mask.shape[0]) for j in range(mask.shape[1]) if mask[i, j] > 0]
    out = torch.zeros(mask.shape, dtype=torch.float64)
    if not toks:
        return out
    lpm = mean([float(lp[t]) for t in toks])
    am = mean([float(adv[t]) for t in toks])
    c = {t: (float(lp[t]) - lpm) * (float(adv[t]) - am) for t in toks}
    sigma = pstd(list(c.values()))
    w = {t: math.exp(-c[t] ** 2 / (2 * sigma**2)) if sigma > 0 else 1.0 for t in toks}
    total = sum(w.values())
    for t in toks:
        out[t] = w[t] * len(toks) / total
    return out


def test_cov_weighted_hand_values():
    # valid tokens: A = [[1, 1], [-1, -1]], logp = [[0, -2], [-1, -1]] (third column is padding, garbage).
    # mean logp = -1, mean A = 0 -> c = (logp + 1) * A = [[1, -1], [0, 0]]; mean c = 0, var c = 2 / 4 = 0.5.
    # w = exp(-c^2 / (2 * 0.5)) = exp(-c^2) = [[1/e, 1/e], [1, 1]]; sum = 2 + 2/e = 2.7357589.
    # w~ = 4 w / sum: |c| = 1 -> 4 / e / 2.7357589 = 0.5378828; c = 0 -> 4 / 2.7357589 = 1.4621172.
    adv = torch.tensor([[1.0, 1.0, 9.0], [-1.0, -1.0, float("nan")]])
    lp = torch.tensor([[0.0, -2.0, float("nan")], [-1.0, -1.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    lo, hi = 4 / math.e / (2 + 2 / math.e), 4 / (2 + 2 / math.e)
    assert lo == pytest.approx(0.5378828, abs=1e-7) and hi == pytest.approx(1.4621172, abs=1e-7)
    w = A.cov_weights(adv, lp, mask)
    assert torch.allclose(w, torch.tensor([[lo, lo, 0.0], [hi, hi, 0.0]], dtype=torch.float64), atol=1e-7)
    out = A.cov_weighted(adv, lp, mask)
    assert torch.allclose(out, torch.tensor([[lo, lo, 0.0], [-hi, -hi, 0.0]]), atol=1e-6)
    assert out.dtype == torch.float32


def test_cov_weighted_sigma_zero_gives_unit_weights():
    # A constant over the valid tokens -> A - mean(A) = 0 -> c = 0 everywhere -> sigma = 0 -> w = 1 -> output A
    adv = torch.full((2, 3), 0.7)
    lp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.1, -9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert torch.equal(A.cov_weights(adv, lp, mask), mask.double())
    assert torch.allclose(A.cov_weighted(adv, lp, mask), adv * mask)
    assert torch.equal(A.cov_weighted(adv, lp, torch.zeros(2, 3)), torch.zeros(2, 3))  # no valid token


@pytest.mark.parametrize("seed", range(5))
def test_cov_weights_match_slow_reference_and_average_one(seed):
    b = random_batch(seed + 200)
    w = A.cov_weights(b["adv"], b["logprobs"], b["mask"])
    assert torch.allclose(w, slow_cov_weights(b["adv"], b["logprobs"], b["mask"]), atol=1e-10)
    valid = b["mask"].bool()
    assert w[valid].mean().item() == pytest.approx(1.0, abs=1e-12)
    assert torch.all(w[~valid] == 0.0) and torch.all(w[valid] > 0) and torch.all(w[valid] <= w[valid].max())
    out = A.cov_weighted(b["adv"], b["logprobs"], b["mask"])
    assert torch.all(out[~valid] == 0.0)
    nz = valid & (b["adv"].abs() > 1e-3)
    # w~ recovered from the output where A != 0
    assert torch.allclose((out[nz].double() / b["adv"][nz].double()), w[nz], rtol=1e-5)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_cov_weighted_drifts_toward_the_common_outcome(sign):
    # The property behind CW-GRPO's divergence on the embedded default (bench/RESULTS.md): the kernel depends on
    # c^2, c scales with A - mean(A), so the rare outcome's tokens (largest |A|) are down-weighted and the
    # advantages no longer sum to zero. One group of 4 responses x 2 tokens, one rare outcome with A = 3 * sign,
    # three common ones with A = -sign (sum 0); each response has log-probs [0, -2].
    # mean logp = -1, mean A = 0 -> c = (logp + 1) * A: rare row [3, -3] * sign, common rows [-1, 1] * sign.
    # mean c = 0, sigma^2 = (9 + 9 + 6 * 1) / 8 = 3 -> w = exp(-c^2 / 6): rare exp(-1.5), common exp(-1/6).
    # sum w = 2 exp(-1.5) + 6 exp(-1/6) = 5.5251507; w~ = 8 w / sum: rare 0.3230756, common 1.2256415.
    # sum of w~ A = 2 * 3 * 0.3230756 - 6 * 1.2256415 = -5.4153953 (times sign): the common outcome wins.
    adv = sign * torch.tensor([[3.0, 3.0], [-1.0, -1.0], [-1.0, -1.0], [-1.0, -1.0]])
    lp = torch.tensor([[0.0, -2.0]] * 4)
    mask = torch.ones(4, 2)
    total = 2 * math.exp(-1.5) + 6 * math.exp(-1 / 6)
    rare, common = 8 * math.exp(-1.5) / total, 8 * math.exp(-1 / 6) / total
    assert (rare, common) == (pytest.approx(0.3230756, abs=1e-7), pytest.approx(1.2256415, abs=1e-7))
    w = A.cov_weights(adv, lp, mask)
    assert torch.allclose(w, torch.tensor([[rare] * 2] + [[common] * 2] * 3, dtype=torch.float64), atol=1e-7)
    assert float(adv.sum()) == 0.0
    assert float(A.cov_weighted(adv, lp, mask).double().sum()) == pytest.approx(-5.4153953 * sign, abs=1e-5)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_cw_balanced_keeps_each_signs_mass_where_the_paper_form_drifts(sign):
    # The example above: within each sign the kernel is constant (rare row exp(-1.5), common rows exp(-1/6)), so
    # normalising per (group, sign) gives weights exactly 1 and w~ A = A: sum 0, where cw gives -5.4153953 * sign.
    adv = sign * torch.tensor([[3.0, 3.0], [-1.0, -1.0], [-1.0, -1.0], [-1.0, -1.0]])
    lp = torch.tensor([[0.0, -2.0]] * 4)
    w = A.cov_weights_balanced(adv, lp, torch.zeros(4, dtype=torch.long), torch.ones(4, 2))
    assert torch.allclose(w, torch.ones(4, 2, dtype=torch.float64), atol=1e-12)


def slow_cw_balanced(adv, lp, group, mask):
    """Reference by loops: CW-GRPO's kernel per group, then w / mean(w) over each (group, sign of A)."""
    n, t = mask.shape
    out = torch.zeros(n, t, dtype=torch.float64)
    for g in set(group.tolist()):
        cells = [(i, j) for i in range(n) for j in range(t) if group[i] == g and mask[i, j] > 0]
        if not cells:
            continue
        lps = [float(lp[i, j]) for i, j in cells]
        advs = [float(adv[i, j]) for i, j in cells]
        m_lp, m_a = statistics.fmean(lps), statistics.fmean(advs)
        cs = [(x - m_lp) * (a - m_a) for x, a in zip(lps, advs)]
        var = statistics.pvariance(cs)
        ws = [math.exp(-c * c / (2 * var)) if var > 0 else 1.0 for c in cs]
        for sgn in (-1, 0, 1):
            idx = [k for k, a in enumerate(advs) if (a > 0) - (a < 0) == sgn]
            if idx:
                mean = statistics.fmean(ws[k] for k in idx)
                for k in idx:
                    out[cells[k]] = ws[k] / mean
    return out


@pytest.mark.parametrize("seed", range(5))
def test_cw_balanced_matches_slow_reference_and_conserves_mass_per_group_and_sign(seed):
    b = random_batch(seed + 900, binary=True)
    adv = A.grpo(b["rewards"], b["group"], b["mask"])
    w = A.cov_weights_balanced(adv, b["logprobs"], b["group"], b["mask"])
    assert torch.allclose(w, slow_cw_balanced(adv, b["logprobs"], b["group"], b["mask"]), atol=1e-9)
    assert torch.all(w[b["mask"] == 0] == 0)
    shaped = A.get_shaper("cw_balanced")(adv, RolloutBatch(mask=b["mask"], rewards=b["rewards"], group=b["group"],
                                                          logprobs=b["logprobs"]), AlgoConfig(), 1,
                                              options=A.CwOptions()).double()
    for rows in rows_by_group(b["group"]).values():
        for positive in (True, False):
            sel = (adv[rows] > 0) if positive else (adv[rows] < 0)
            # binary rewards: A is constant per (group, sign), so the weighted mass equals the unweighted one
            assert float(shaped[rows][sel].sum()) == pytest.approx(float(adv[rows][sel].double().sum()), abs=1e-5)


# ------------------------------------------------------------------------------------------------------------
# PPL shaping


def torch_quantile_list(xs, q):
    return torch.quantile(torch.tensor(xs, dtype=torch.float64), q).item()


def slow_ppl(adv, lp, group, mask, alpha=0.01, iqr_filter=False, clamp=None):
    out = torch.zeros(mask.shape, dtype=torch.float64)
    log_ppl = {}
    for i in range(mask.shape[0]):
        vals = [float(lp[i, j]) for j in range(mask.shape[1]) if mask[i, j] > 0]
        if vals:
            log_ppl[i] = -sum(vals) / len(vals)
    for rows in rows_by_group(group).values():
        members = [i for i in rows if i in log_ppl]
        xs = [log_ppl[i] for i in members]
        if not xs:
            continue
        stats_xs = xs
        if iqr_filter:
            q1, q3 = torch_quantile_list(xs, 0.25), torch_quantile_list(xs, 0.75)
            stats_xs = [x for x in xs if q1 - 1.5 * (q3 - q1) <= x <= q3 + 1.5 * (q3 - q1)]
        m, sd = mean(stats_xs), pstd(stats_xs)
        for i in members:
            w = 0.0 if len(set(stats_xs)) == 1 else (log_ppl[i] - m) / sd
            f = 1 - alpha * w
            if clamp is not None:
                f = min(max(f, clamp[0]), clamp[1])
            for j in range(mask.shape[1]):
                if mask[i, j] > 0:
                    out[i, j] = float(adv[i, j]) * f
    return out


def test_ppl_hand_values():
    # group 5: log_ppl = -mean(logp) = 1, 2, 3 (padding ignored); mean 2, population std sqrt(2/3) = 0.8164966
    #   w = [-1.2247449, 0, 1.2247449]; alpha = 0.1 -> factor 1 - 0.1 w = [1.1224745, 1, 0.8775255].
    # group 8: log_ppl = 0.1, 0.1, 0.1 (mean may round) -> std 0 -> w = 0 -> factor 1.
    lp = torch.tensor([[-1.0, -1.0, float("nan")], [-2.0, -2.0, -2.0], [-3.0, -3.0, 0.0],
                       [-0.1, -0.1, -0.1], [-0.1, -0.1, -0.1], [-0.1, -0.1, -0.1]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0] * 3, [1.0] * 3, [1.0] * 3])
    group = torch.tensor([5, 5, 5, 8, 8, 8])
    adv = torch.tensor([[1.0], [1.0], [-2.0], [1.0], [-1.0], [0.5]]).expand(6, 3)
    out = A.ppl_shaped(adv, lp, group, mask, alpha=0.1)
    f = [1 + 0.1 * math.sqrt(1.5), 1.0, 1 - 0.1 * math.sqrt(1.5)]  # 1.2247449 = sqrt(1.5)
    assert f[0] == pytest.approx(1.1224745, abs=1e-7)
    expected = torch.tensor([[f[0], f[0], 0.0], [f[1]] * 3, [-2 * f[2], -2 * f[2], 0.0],
                             [1.0] * 3, [-1.0] * 3, [0.5] * 3])
    assert torch.allclose(out, expected, atol=1e-6)
    # clamp=(0.9, 1.1): factors [1.1, 1, 0.9]
    out_c = A.ppl_shaped(adv, lp, group, mask, alpha=0.1, clamp=(0.9, 1.1))
    assert torch.allclose(out_c[:3, 0], torch.tensor([1.1, 1.0, -1.8]), atol=1e-6)


def test_ppl_iqr_filter_hand_values():
    # one group, log_ppl = 1, 2, 3, 4, 100. Quantiles (linear): Q1 at position 0.25 * 4 = 1 -> 2, Q3 at 3 -> 4;
    # IQR = 2, bounds [2 - 3, 4 + 3] = [-1, 7] -> 100 is an outlier. Inliers 1..4: mean 2.5, std sqrt(1.25).
    # w = (x - 2.5) / 1.1180340: 1 -> -1.3416408, 100 -> 87.2066511. alpha 0.01: factors 1.0134164 ... 0.1279335;
    # with clamp (0.8, 1.2) the outlier's factor is 0.8.
    xs = [1.0, 2.0, 3.0, 4.0, 100.0]
    lp = -torch.tensor(xs)[:, None].expand(5, 2)
    mask = torch.ones(5, 2)
    group = torch.tensor([2, 2, 2, 2, 2])
    adv = torch.ones(5, 2)
    sd = math.sqrt(1.25)
    out = A.ppl_shaped(adv, lp, group, mask, iqr_filter=True)
    expected = [1 - 0.01 * (x - 2.5) / sd for x in xs]
    assert expected[0] == pytest.approx(1.0134164, abs=1e-7) and expected[4] == pytest.approx(0.1279335, abs=1e-7)
    assert torch.allclose(out[:, 0], torch.tensor(expected), atol=1e-6)
    out_c = A.ppl_shaped(adv, lp, group, mask, iqr_filter=True, clamp=(0.8, 1.2))
    assert out_c[4, 0].item() == pytest.approx(0.8)
    # without the filter, 100 drags the mean to 22 and the std to 39.0 -> all factors differ
    assert not torch.allclose(A.ppl_shaped(adv, lp, group, mask), out)
    # fences are 1.5 IQR and inclusive: with 6.5 or exactly 7 (= Q3 + 1.5 IQR) in place of 100 nothing is dropped
    for last in (6.5, 7.0):
        lp2 = -torch.tensor(xs[:4] + [last])[:, None].expand(5, 2)
        assert torch.equal(A.ppl_shaped(adv, lp2, group, mask, iqr_filter=True), A.ppl_shaped(adv, lp2, group, mask))
    lp3 = -torch.tensor(xs[:4] + [7.01])[:, None].expand(5, 2)  # just outside: dropped from the statistics
    assert not torch.allclose(A.ppl_shaped(adv, lp3, group, mask, iqr_filter=True), A.ppl_shaped(adv, lp3, group, mask))


def test_segment_quantile_matches_torch_quantile():
    gen = torch.Generator().manual_seed(3)
    group = torch.tensor([5, -1, 5, 5, 9, -1, 5, 9, 9, 9, 5, 2])
    vals = torch.randn(12, generator=gen, dtype=torch.float64)
    counted = torch.ones(12, dtype=torch.bool)
    counted[3] = False  # an uncounted member of group 5
    dense, s = A.dense_ids(group)
    for q in (0.25, 0.5, 0.75):
        got = ppl._segment_quantile(vals, dense, s, counted, q)
        for g in group.unique().tolist():
            sel = (group == g) & counted
            assert torch.allclose(got[group == g], torch.quantile(vals[sel], q).expand(int((group == g).sum())))


@pytest.mark.parametrize("seed", range(5))
def test_ppl_matches_slow_reference(seed):
    b = random_batch(seed + 300, max_group=9)
    b["logprobs"][torch.randperm(b["logprobs"].shape[0])[:3]] *= 25  # a few far outliers for the IQR filter
    for kw in [{}, dict(alpha=0.3), dict(alpha=0.3, iqr_filter=True), dict(alpha=0.5, clamp=(0.8, 1.2))]:
        fast = A.ppl_shaped(b["adv"], b["logprobs"], b["group"], b["mask"], **kw)
        slow = slow_ppl(b["adv"], b["logprobs"], b["group"], b["mask"], **kw)
        assert torch.all(fast[b["mask"] == 0] == 0.0)
        assert torch.allclose(fast.double(), slow, atol=1e-5)


# ------------------------------------------------------------------------------------------------------------
# position shaping


def slow_position(adv, mask, gamma=0.1, m=15.0, d=1.0, cap_frac=None):
    out = torch.zeros(mask.shape, dtype=torch.float64)
    for i in range(mask.shape[0]):
        pos = valid_positions(mask[i])
        for j, t in pos:
            a = float(adv[i, j])
            b = gamma * sigmoid(d * m * ((t - 1) / len(pos) - 0.5))
            if cap_frac is not None:
                b = min(b, cap_frac * abs(a))
            out[i, j] = a + ((a > 0) - (a < 0)) * b
    return out


def test_position_hand_values():
    # length 3: l = (t - 1) / 3 = 0, 1/3, 2/3; b = 0.1 * sigmoid(15 (l - 0.5)) = 0.1 * sigmoid(-7.5, -2.5, 2.5)
    #   = 0.1 * [0.00055278, 0.07585818, 0.92414182] = [5.5278e-5, 0.0075858, 0.0924142].
    # A = +1 -> 1 + b; A = -2 -> -2 - b; A = 0 -> 0; padding -> 0.
    b = [0.1 * sigmoid(-7.5), 0.1 * sigmoid(-2.5), 0.1 * sigmoid(2.5)]
    assert b[2] == pytest.approx(0.0924142, abs=1e-7)
    adv = torch.tensor([[1.0, 1.0, 1.0, 5.0], [-2.0, -2.0, -2.0, float("nan")], [0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]] * 3)
    out = A.position_shaped(adv, mask)
    expected = torch.tensor([[1 + b[0], 1 + b[1], 1 + b[2], 0.0], [-2 - b[0], -2 - b[1], -2 - b[2], 0.0], [0.0] * 4])
    assert torch.allclose(out, expected, atol=1e-6)
    # cap 0.5 |A| with A = 0.1: last bonus min(0.0924, 0.05) = 0.05 -> 0.15; first two are below the cap
    small = A.position_shaped(torch.full((1, 3), 0.1), torch.ones(1, 3), cap_frac=0.5)
    assert torch.allclose(small, torch.tensor([[0.1 + b[0], 0.1 + b[1], 0.15]]), atol=1e-6)
    # left padding: positions count valid tokens, so the result is the same row shifted
    left = A.position_shaped(torch.ones(1, 4), torch.tensor([[0.0, 1.0, 1.0, 1.0]]))
    assert torch.allclose(left, torch.tensor([[0.0, 1 + b[0], 1 + b[1], 1 + b[2]]]), atol=1e-6)


@pytest.mark.parametrize("seed", range(4))
def test_position_matches_slow_reference_and_properties(seed):
    b = random_batch(seed + 400, left_pad=seed % 2 == 0)
    adv = b["adv"].clone()
    adv[1] = torch.where(b["mask"][1].bool(), 0.0, adv[1])  # a zero-advantage response
    for kw in [{}, dict(gamma=0.5, m=5.0, d=-1.0), dict(cap_frac=0.5)]:
        out = A.position_shaped(adv, b["mask"], **kw)
        assert torch.allclose(out.double(), slow_position(adv, b["mask"], **kw), atol=1e-6)
        valid = b["mask"].bool()
        assert torch.all(out[~valid] == 0.0)
        diff = (out - torch.where(valid, adv, 0.0))[valid]
        a = adv[valid]
        assert torch.all(diff * torch.sign(a) >= 0)  # only pushes in the direction of sign(A)
        assert torch.all(diff[a == 0] == 0)  # zero stays zero
    # monotone in position for d = +1: with a constant A per response, |A~| is non-decreasing along the response
    const = torch.where(b["mask"].bool(), torch.sign(torch.randn(adv.shape[0], 1)).expand_as(adv), 0.0)
    out = A.position_shaped(const, b["mask"], d=1.0)
    for i in range(out.shape[0]):
        vals = [abs(out[i, j].item()) for j, _ in valid_positions(b["mask"][i])]
        assert all(x <= y for x, y in zip(vals, vals[1:]))


# ------------------------------------------------------------------------------------------------------------
# entropy-based advantage


def test_entropy_shaped_hand_values():
    # alpha 0.4, kappa 2: A + min(0.4 H, |A| / 2)
    #   A = 1,   H = 0.5 -> min(0.2, 0.5)  = 0.2  -> 1.2
    #   A = -1,  H = 5   -> min(2.0, 0.5)  = 0.5  -> -0.5  (the positive term softens a negative advantage)
    #   A = 0.1, H = 5   -> min(2.0, 0.05) = 0.05 -> 0.15
    #   A = 0,   H = 3   -> min(1.2, 0)    = 0    -> 0
    adv = torch.tensor([[1.0, -1.0, 0.1, 0.0, 7.0]])
    ent = torch.tensor([[0.5, 5.0, 5.0, 3.0, float("nan")]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    out = A.entropy_shaped(adv, ent, mask)
    assert torch.allclose(out, torch.tensor([[1.2, -0.5, 0.15, 0.0, 0.0]]), atol=1e-6)


@pytest.mark.parametrize("seed", range(3))
def test_entropy_shaped_matches_slow_reference(seed):
    b = random_batch(seed + 500)
    out = A.entropy_shaped(b["adv"], b["entropy"], b["mask"], alpha=0.3, kappa=3.0)
    ref = torch.zeros(b["mask"].shape, dtype=torch.float64)
    for i, j in zip(*torch.nonzero(b["mask"], as_tuple=True)):
        a, h = float(b["adv"][i, j]), float(b["entropy"][i, j])
        ref[i, j] = a + min(0.3 * h, abs(a) / 3.0)
    assert torch.allclose(out.double(), ref, atol=1e-6)
    assert torch.all(out[b["mask"] == 0] == 0.0)
    valid = b["mask"].bool()
    assert torch.all(torch.sign(out[valid]) == torch.sign(b["adv"][valid]))  # never flips a sign (kappa > 1)


# ------------------------------------------------------------------------------------------------------------
# pass@k


def slow_passk(rewards, group, mask, k):
    out = torch.zeros(mask.shape, dtype=torch.float64)
    r = rewards.tolist()
    for rows in rows_by_group(group).values():
        n = len(rows)
        c = sum(r[i] > 0.5 for i in rows)
        if c in (0, n):
            continue
        ke = min(k, n)
        rho = 1 - math.comb(n - c, ke) / math.comb(n, ke)
        s = math.sqrt(rho * (1 - rho))
        for i in rows:
            if r[i] > 0.5:
                a = (1 - rho) / (s + 1e-6)
            else:
                a = (1 - rho - math.comb(n - c - 1, ke - 1) / math.comb(n - 1, ke - 1)) / (s + 1e-6)
            out[i] = a * mask[i].double()
    return out


def test_passk_hand_values():
    mask = torch.ones(4, 2)
    g = torch.zeros(4, dtype=torch.long)
    # n = 4, c = 1, k = 2: rho = 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5, s = sqrt(0.25) = 0.5;
    #   correct (1 - 0.5) / 0.5 = 1; wrong (1 - 0.5 - C(2,1)/C(3,1)) / 0.5 = (0.5 - 2/3) / 0.5 = -1/3.
    out = A.passk(torch.tensor([1.0, 0.0, 0.0, 0.0]), g, mask, k=2)
    assert torch.allclose(out[:, 0], torch.tensor([0.5 / 0.500001, -1 / 6 / 0.500001, -1 / 6 / 0.500001,
                                                   -1 / 6 / 0.500001]), atol=1e-7)
    assert out[0, 0].item() == pytest.approx(1.0, abs=1e-5) and out[1, 0].item() == pytest.approx(-1 / 3, abs=1e-5)
    # n = 4, c = 2, k = 2: rho = 1 - C(2,2)/C(4,2) = 5/6, s = sqrt(5/36) = 0.3726780;
    #   correct (1/6) / s = 0.4472136; wrong (1/6 - C(1,1)/C(3,1)) / s = (1/6 - 1/3) / s = -0.4472136.
    out = A.passk(torch.tensor([0.0, 1.0, 1.0, 0.0]), g, mask, k=2)
    v = (1 / 6) / (math.sqrt(5 / 36) + 1e-6)
    assert v == pytest.approx(0.4472136, abs=1e-5)
    assert torch.allclose(out[:, 0], torch.tensor([-v, v, v, -v]), atol=1e-6)
    # n = 4, c = 3, k = 2: every pair holds a correct answer: n - c = 1 < k -> rho = 1, s = 0; correct 0 / 1e-6 = 0,
    #   wrong (0 - C(0,1)/C(3,1)) = 0 -> the whole group gets 0.
    out = A.passk(torch.tensor([1.0, 1.0, 0.0, 1.0]), g, mask, k=2)
    assert torch.all(out == 0.0)
    # k = 1 is GRPO with the population std: n = 4, c = 1: rho = 1/4, s = sqrt(3/16) = 0.4330127;
    #   correct (3/4) / s = 1.7320508; wrong (1 - 1/4 - C(2,0)/C(3,0)) / s = (-1/4) / s = -0.5773503.
    out = A.passk(torch.tensor([0.0, 0.0, 0.9, 0.2]), g, mask, k=1)  # > 0.5 counts as correct
    s = math.sqrt(3 / 16) + 1e-6
    assert torch.allclose(out[:, 0], torch.tensor([-0.25 / s, -0.25 / s, 0.75 / s, -0.25 / s]), atol=1e-6)


def test_passk_degenerate_groups():
    mask = torch.ones(9, 3)
    mask[2, 1:] = 0
    # group 1: all correct; group 2: all wrong; group 3: n = 3 < k = 4 (k_eff = 3 = n: rho = 1 -> 0);
    # group 4: n = 4 = k, c = 1 -> rho = 1 - C(3,4)/C(4,4) = 1 -> 0; group 5: singleton
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0])
    group = torch.tensor([1, 1, 2, 2, 3, 3, 3, 5, 4])
    out = A.passk(rewards, group, mask, k=4)
    assert torch.all(out == 0.0)
    group4 = torch.tensor([4, 4, 4, 4])
    assert torch.all(A.passk(torch.tensor([1.0, 0, 0, 0]), group4, torch.ones(4, 2), k=4) == 0.0)
    with pytest.raises(ValueError, match="k must be"):
        A.passk(rewards, group, mask, k=0)


@pytest.mark.parametrize("seed", range(6))
def test_passk_matches_slow_reference_and_sums_to_zero(seed):
    b = random_batch(seed + 600, n_groups=7, max_group=10, binary=True)
    for k in (1, 2, 3, 5):
        out = A.passk(b["rewards"], b["group"], b["mask"], k=k)
        assert torch.allclose(out.double(), slow_passk(b["rewards"], b["group"], b["mask"], k), atol=1e-6)
        assert torch.all(out[b["mask"] == 0] == 0.0)
        full = A.passk(b["rewards"], b["group"], torch.ones(b["mask"].shape[0], 1), k=k)[:, 0].double()
        for rows in rows_by_group(b["group"]).values():
            assert abs(full[rows].sum().item()) < 1e-4  # sum_i A_i = n(1 - rho) - n(1 - rho) = 0


# ------------------------------------------------------------------------------------------------------------
# registries


def test_advantage_registry_has_erpo_and_passk():
    assert {"grpo", "dr_grpo", "erpo", "passk"} <= set(names("estimator"))
    b = random_batch(7, binary=True)
    keys = ("rewards", "group", "mask", "entropy", "logprobs", "ref_logprobs")
    batch = RolloutBatch(**{k: b[k] for k in keys})
    cfg = AlgoConfig()
    # the options' defaults = METHODS defaults = the functions' defaults
    assert torch.equal(get_advantage("erpo")(batch, cfg, options=A.ErpoOptions()), A.erpo(*(b[k] for k in keys)))
    assert torch.equal(get_advantage("passk")(batch, cfg, options=A.PasskOptions()),
                       A.passk(b["rewards"], b["group"], b["mask"], k=4))
    # options set in a config reach the functions (algo.erpo.*, algo.passk.k)
    erpo = load_config(None, ["algo.advantage=erpo", "algo.erpo.num_buckets=2", "algo.erpo.eta=1.0"]).algo
    passk = load_config(None, ["algo.advantage=passk", "algo.passk.k=2"]).algo
    assert torch.equal(lookup("estimator", "erpo").bind(erpo)(batch, erpo),
                       A.erpo(*(b[k] for k in keys), options=A.ErpoOptions(eta=1.0, num_buckets=2)))
    assert torch.equal(lookup("estimator", "passk").bind(passk)(batch, passk),
                       A.passk(b["rewards"], b["group"], b["mask"], k=2))
    batch = batch.replace(ref_logprobs=None)
    with pytest.raises(KeyError, match="ref_logprobs"):
        get_advantage("erpo")(batch, cfg, options=A.ErpoOptions())


def test_shaper_registry():
    assert set(names("shaper")) >= {"cw", "ppl", "position", "entropy_adv"}
    with pytest.raises(KeyError, match="cw, cw_balanced, cw_group, entropy_adv, .*position, ppl"):
        A.get_shaper("nope")
    with pytest.raises(ValueError, match="twice"):
        A.register_shaper("cw")(lambda *a: None)
    b = random_batch(8)
    batch = RolloutBatch(**{k: b[k] for k in ("rewards", "group", "mask", "entropy", "logprobs")})
    adv, mask = b["adv"], b["mask"]
    def shaper(name: str, *options: str):  # as the step calls it: the options of a loaded config
        algo = load_config(None, [f"algo.shapers=[{name}]", *options]).algo
        return lookup("shaper", name).bind(algo), algo

    fn, cfg = shaper("cw")
    assert torch.equal(fn(adv, batch, cfg, 1), A.cov_weighted(adv, b["logprobs"], mask))
    fn, cfg = shaper("ppl")
    assert torch.equal(fn(adv, batch, cfg, 1), A.ppl_shaped(adv, b["logprobs"], b["group"], mask))
    fn, cfg = shaper("ppl", "algo.ppl.alpha=0.2", "algo.ppl.iqr_filter=true")
    assert torch.equal(fn(adv, batch, cfg, 1),
                       A.ppl_shaped(adv, b["logprobs"], b["group"], mask, alpha=0.2, iqr_filter=True))
    fn, cfg = shaper("entropy_adv", "algo.entropy_adv.alpha=0.1")
    assert torch.equal(fn(adv, batch, cfg, 3), A.entropy_shaped(adv, b["entropy"], mask, alpha=0.1, kappa=2.0))
    # the real config works with every shaper (off_policy_mask reads the sampler's log-probs; a shaper with a state
    # across steps gets a new one, and the outcomes and correctness explorl's loop fills: outcome_bonus)
    loop_fields = {"behavior_logprobs": b["logprobs"], "correct": b["rewards"] > 0, "outcomes": b["group"]}
    for name in names("shaper"):
        fn, cfg = shaper(name)
        entry = lookup("shaper", name)
        state = {"state": entry.state(entry.options_in(cfg))} if entry.state is not None else {}
        fn(adv, batch.replace(**loop_fields), cfg, 1, **state)


def test_position_shaper_step_window():
    b = random_batch(9)
    n = b["mask"].shape[0]
    batch = RolloutBatch(mask=b["mask"], rewards=torch.zeros(n), group=torch.zeros(n, dtype=torch.long))
    adv = torch.where(b["mask"].bool(), b["adv"], 0.0)
    shaped = A.position_shaped(adv, b["mask"], gamma=0.3)
    always = A.PositionOptions(gamma=0.3)  # steps = 0: every step
    for step in (1, 200, 10_000):
        assert torch.equal(A.get_shaper("position")(adv, batch, AlgoConfig(), step, options=always), shaped)
    window = A.PositionOptions(gamma=0.3, start=200, steps=100)  # the paper's recipe
    for step, applied in [(1, False), (199, False), (200, True), (299, True), (300, False)]:
        got = A.get_shaper("position")(adv, batch, AlgoConfig(), step, options=window)
        assert torch.equal(got, shaped if applied else adv), step


def test_cov_weights_grouped_paper_reading():
    """CW-GRPO section 2.3 normalises within each prompt's group: weights average 1 over each group's valid
    tokens, 0 on padding; with one group it equals the batch-wide `cov_weights` of METHODS."""
    from explorl.algos.advantages import cov_weights, cov_weights_grouped

    g = torch.Generator().manual_seed(0)
    n, t = 7, 6
    mask = (torch.rand(n, t, generator=g) > 0.2).float()
    mask[:, 0] = 1.0
    adv = torch.randn(n, 1, generator=g).expand(n, t) * mask
    lp = -torch.rand(n, t, generator=g) * 3 * mask
    group = torch.tensor([5, 5, 2, 2, 2, 9, 9])
    w = cov_weights_grouped(adv, lp, group, mask)
    assert torch.all(w[mask == 0] == 0)
    for gid in group.unique():
        rows = group == gid
        assert float(w[rows][mask[rows] > 0].mean()) == pytest.approx(1.0, abs=1e-12)
    one = torch.zeros(n, dtype=torch.long)
    assert torch.allclose(cov_weights_grouped(adv, lp, one, mask), cov_weights(adv, lp, mask), atol=1e-12)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("bandwidth", [0.5, 1.0, 3.0])
def test_cov_weights_batch_and_one_group_agree_on_random_batches(seed, bandwidth):
    """`cov_weights` (batch statistics, `cw`) and `cov_weights_grouped` (`cw_group`) with every row in one group
    take the same means, sigma and normaliser over the same tokens and share one kernel, so the two entry points
    agree to rounding (they sum in different orders) on ragged batches with nan in the padding."""
    b = random_batch(seed + 300)
    one = torch.zeros(b["mask"].shape[0], dtype=torch.long)
    batch = A.cov_weights(b["adv"], b["logprobs"], b["mask"], bandwidth=bandwidth)
    grouped = A.cov_weights_grouped(b["adv"], b["logprobs"], one, b["mask"], bandwidth=bandwidth)
    assert torch.allclose(grouped, batch, rtol=0, atol=1e-12) and torch.all(batch[b["mask"] == 0] == 0)
