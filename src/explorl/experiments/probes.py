"""Probes of the papers' analyses: small experiments on a model that redraw their figures (docs/methods.md §8e).

- `entropy_by_absolute_position`: mean token entropy at each output position (EAD, Figure 1).
- `covariance_percentiles`, `covariance_cumulative`, `batch_covariance`: the token covariance c of covariance
  weighting and its distribution (CW-GRPO, Figure 3 and Table 1; c is `algos.advantages.token_covariance`).
- `branch_probe`, `branch_summary`: continuations sampled from prefixes cut at several positions of a response,
  success by cut position (EAD, Figure 2: the "forking" experiment).
- `entropy_extremes`, `perturb_probe`, `compare_proportions`: random replacement and truncation at the high- and
  low-entropy positions of correct responses, with a significance test (ERPO, Figure 1(b)).
- `one_update_effects`, `update_shift_summary`, `entropy_change_by_token`: the probability shift of each token
  after one policy update, by outcome, entropy, token category and response PPL (STILL, Figures 3(b),
  4 and 5(a)).

Every function is deterministic given its generators. Readings chosen here (the papers leave them open):
- A continuation is scored on the whole response text, `decode(head + continuation)` without special tokens (as
  `experiments.impact`); a response is correct when its score is > 0.5: `explorl probe` scores a text 1.0 when
  the task judges it correct (`Task.correct`, as `evaluate`) and 0.0 otherwise.
- Cut and perturbation positions index response tokens (0-based). A cut at t keeps `o_<t` and samples the rest,
  so a cut at 0 is sampling from the prompt. "Truncation" (ERPO) is read the same way: the response is cut before
  the chosen token and regenerated from there; "random replacement" puts a token drawn uniformly from the
  vocabulary (never the original token, pad or EOS) at the position and regenerates after it.
- The final EOS of a response is never a perturbation position (perturbing it only ends or extends the text).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from explorl.rollout.engines.native import sample

__all__ = [
    "fisher_exact", "two_proportion_test", "compare_proportions", "continue_prefixes",
    "entropy_by_absolute_position", "batch_covariance", "covariance_percentiles", "covariance_cumulative",
    "branch_probe", "branch_summary", "entropy_extremes", "perturbed_head", "perturb_probe",
    "one_update_effects", "update_shift_summary", "entropy_change_by_token",
]

Score = Callable[[list[str]], list[float]]
"""`fn(texts) -> scores` of one problem's responses (its answer and meta bound), a response correct when its score
is > 0.5; `explorl probe` passes the task's judgment as 1.0 / 0.0."""


# --- significance tests -------------------------------------------------------------------------------------------

def fisher_exact(a: int, b: int, c: int, d: int) -> float:
    """Two-sided Fisher exact test of the 2x2 table `[[a, b], [c, d]]` (rows: groups, columns: success / failure).

    With the margins fixed, the count in cell a is hypergeometric: `P(x) = C(a+b, x) C(c+d, a+c-x) / C(n, a+c)`.
    The p-value sums `P(x)` over every x no more probable than the observed a, with exact integer arithmetic
    (`math.comb`), so ties are never lost to rounding. Tea tasting, `[[3, 1], [1, 3]]`: (16 + 16 + 1 + 1) / 70.
    """
    if min(a, b, c, d) < 0:
        raise ValueError(f"fisher_exact: counts must be >= 0, got {(a, b, c, d)}")
    r1, r2, c1 = a + b, c + d, a + c
    n = r1 + r2
    if n == 0:
        return 1.0
    weight = [math.comb(r1, x) * math.comb(r2, c1 - x) for x in range(max(0, c1 - r2), min(r1, c1) + 1)]
    observed = math.comb(r1, a) * math.comb(r2, c1 - a)
    return min(1.0, sum(w for w in weight if w <= observed) / math.comb(n, c1))


def two_proportion_test(s1: int, n1: int, s2: int, n2: int) -> tuple[float, float]:
    """Two-proportion z-test with the pooled proportion: `(z, two-sided p)`.

    `p = (s1 + s2) / (n1 + n2)`, `z = (s1/n1 - s2/n2) / sqrt(p (1 - p) (1/n1 + 1/n2))`, `p-value = erfc(|z| / sqrt 2)`.
    A pooled proportion of 0 or 1 (no variation) gives z = 0, p = 1.
    """
    if n1 < 1 or n2 < 1 or not (0 <= s1 <= n1 and 0 <= s2 <= n2):
        raise ValueError(f"two_proportion_test: need 0 <= s <= n and n >= 1, got {s1}/{n1} and {s2}/{n2}")
    p = (s1 + s2) / (n1 + n2)
    se = math.sqrt(p * (1 - p) * (1 / n1 + 1 / n2))
    if se == 0:
        return 0.0, 1.0
    z = (s1 / n1 - s2 / n2) / se
    return z, math.erfc(abs(z) / math.sqrt(2))


def compare_proportions(s1: int, n1: int, s2: int, n2: int) -> dict:
    """Success rates of two groups and both tests: `{"rate_1", "rate_2", "difference", "fisher_p", "z", "z_p"}`
    (rates NaN for an empty group; the tests then are not run and give p = 1)."""
    out = {"rate_1": s1 / n1 if n1 else float("nan"), "rate_2": s2 / n2 if n2 else float("nan")}
    out["difference"] = out["rate_1"] - out["rate_2"]
    if n1 and n2:
        z, zp = two_proportion_test(s1, n1, s2, n2)
        out.update(fisher_p=fisher_exact(s1, n1 - s1, s2, n2 - s2), z=z, z_p=zp)
    else:
        out.update(fisher_p=1.0, z=0.0, z_p=1.0)
    return out


# --- continuations ------------------------------------------------------------------------------------------------

def _ids(x) -> list[int]:
    return [int(x)] if isinstance(x, int) else [int(e) for e in x]


def continue_prefixes(model, prompt_ids: Sequence[int], heads: Sequence[Sequence[int]], k: int, *,
                      eos_token_id: int | Sequence[int], pad_token_id: int, max_new_tokens: int,
                      temperature: float = 1.0, top_p: float = 1.0, generator: torch.Generator | None = None,
                      fast_path: bool = True) -> list[list[list[int]]]:
    """k continuations of each head (response tokens so far) after the prompt, in one `sample` call.

    A head that ends with EOS is complete: its k continuations are empty and it is not sampled. With a single
    empty head this is exactly `sample(model, [prompt_ids], k, ...)` (same generator state, same draws).
    Returns `[len(heads)][k]` token-id lists (EOS included when produced, no padding).
    """
    eos = _ids(eos_token_id)
    out: list[list[list[int]]] = [[[] for _ in range(k)] if h and h[-1] in eos else [] for h in heads]
    open_heads = [i for i, h in enumerate(heads) if not (h and h[-1] in eos)]
    if open_heads and k > 0:
        ro = sample(model, [list(prompt_ids) + list(heads[i]) for i in open_heads], k, eos_token_id=eos,
                    pad_token_id=pad_token_id, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                    generator=generator, fast_path=fast_path)
        for row, (g, length) in enumerate(zip(ro.group.tolist(), ro.lengths.tolist())):
            out[open_heads[g]].append(ro.response_ids[row, :length].tolist())
    return out


# --- entropy by absolute position (EAD, Figure 1) ------------------------------------------------------------

def entropy_by_absolute_position(entropy: Tensor, mask: Tensor, *, bin_size: int = 1) -> dict:
    """Mean token entropy at each absolute output position (EAD, Figure 1: entropy shrinks with the
    position), pooled over responses; `analysis.measures.entropy_by_position` bins relative positions instead.

    The t-th valid token (0-based, counting valid tokens, so padding anywhere is skipped) falls in bin
    `t // bin_size`. There are `ceil(L_max / bin_size)` bins, L_max the longest response.

    Args:
        entropy: `[N, T]` token entropies; mask: `[N, T]` 1 / True on response tokens.
        bin_size: positions per bin (>= 1).
    Returns:
        `{"start": [B] first position of each bin, "mean": [B] float64 (NaN for an empty bin), "count": [B] int64
        tokens per bin}` (tensors on the CPU).
    """
    if entropy.dim() != 2 or entropy.shape != mask.shape:
        raise ValueError(f"entropy_by_absolute_position: need [N, T] entropy and mask, got {tuple(entropy.shape)} "
                         f"and {tuple(mask.shape)}")
    if bin_size < 1:
        raise ValueError(f"bin_size must be >= 1, got {bin_size}")
    valid = (mask > 0).cpu()
    rank = valid.long().cumsum(-1) - 1
    longest = int(valid.sum(-1).max()) if valid.numel() else 0
    bins = -(-longest // bin_size)
    b = (rank // bin_size)[valid]
    vals = entropy.detach().cpu().double()[valid]
    sums = torch.zeros(bins, dtype=torch.float64).index_add_(0, b, vals)
    counts = torch.zeros(bins, dtype=torch.long).index_add_(0, b, torch.ones_like(b))
    mean = torch.where(counts > 0, sums / counts.clamp_min(1), torch.full_like(sums, float("nan")))
    return {"start": (torch.arange(bins) * bin_size).tolist(), "mean": mean, "count": counts}


# --- token covariance (CW-GRPO, Figure 3, Table 1) ---------------------------------------------------------------

@torch.no_grad()
def batch_covariance(model, ro, rewards: Sequence[float], *, temperature: float = 1.0,
                     per_group: bool = True) -> Tensor:
    """Token covariance c `[N, T]` of a sampled batch `ro` (`rollout.sampler.Rollouts`) under GRPO's advantages.

    The log-probs are the training forward's (`rollout.logprobs.response_logprobs` at `temperature`), the
    advantages `algos.advantages.grpo`, and c is `algos.advantages.token_covariance` with the means per prompt
    group (`per_group`, the paper's and `cw_group`'s) or over the batch (`cw`'s). float64, 0 on padding.
    """
    from explorl.algos.advantages import grpo, token_covariance
    from explorl.rollout.logprobs import response_logprobs

    lp, _ = response_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.mask, temperature,
                              with_entropy=False)
    r = torch.as_tensor(list(rewards), dtype=torch.float32, device=ro.mask.device)
    adv = grpo(r, ro.group, ro.mask)
    return token_covariance(adv, lp, ro.mask, ro.group if per_group else None)


def _signed(c: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, int]:
    if c.shape != mask.shape:
        raise ValueError(f"covariance and mask must have one shape, got {tuple(c.shape)} and {tuple(mask.shape)}")
    vals = c.detach().cpu().double()[(mask > 0).cpu()]
    pos = torch.sort(vals[vals > 0], descending=True).values
    neg = torch.sort(vals[vals < 0]).values  # most negative first
    return pos, neg, int((vals == 0).sum())


def covariance_percentiles(c: Tensor, mask: Tensor,
                           percentiles: Sequence[float] = (0.01, 1.0, 20.0, 40.0, 100.0)) -> dict:
    """The covariance at percentile thresholds of its positive and of its negative values (CW-GRPO, Table 1).

    Reading of the table: at p%, the positive column is the smallest of the largest p% of the positive c (the
    `ceil(p / 100 * n_pos)`-th largest), the negative column the largest of the most negative p% of the negative
    c. So 0.01% lies near the extremes and 100% is the positive (negative) value closest to 0.

    Args:
        c: `[N, T]` token covariances (`batch_covariance`); mask: `[N, T]`.
        percentiles: in (0, 100].
    Returns:
        `{"percentiles": [...], "positive": [...], "negative": [...], "n_positive", "n_negative", "n_zero"}`,
        NaN where a sign has no token.
    """
    if any(not 0 < p <= 100 for p in percentiles):
        raise ValueError(f"percentiles must lie in (0, 100], got {list(percentiles)}")
    pos, neg, zero = _signed(c, mask)

    def at(sorted_vals: Tensor, p: float) -> float:
        n = sorted_vals.numel()
        if n == 0:
            return float("nan")
        return float(sorted_vals[min(n, max(1, math.ceil(p / 100 * n - 1e-9))) - 1])

    return {"percentiles": list(percentiles), "positive": [at(pos, p) for p in percentiles],
            "negative": [at(neg, p) for p in percentiles], "n_positive": pos.numel(), "n_negative": neg.numel(),
            "n_zero": zero}


def covariance_cumulative(c: Tensor, mask: Tensor, fractions: Sequence[float]) -> dict:
    """Cumulative contribution of the most extreme covariances (CW-GRPO, Figure 3): for each fraction f, the
    share of the total |c| of one sign carried by the `ceil(f * n)` tokens of that sign with the largest |c|.

    Returns `{"fractions": [...], "positive": [...], "negative": [...]}` (NaN where a sign has no token).
    """
    pos, neg, _ = _signed(c, mask)

    def curve(sorted_abs: Tensor) -> list[float]:
        n = sorted_abs.numel()
        if n == 0:
            return [float("nan")] * len(fractions)
        cum = sorted_abs.cumsum(0)
        return [float(cum[min(n, max(1, math.ceil(f * n - 1e-9))) - 1] / cum[-1]) for f in fractions]

    return {"fractions": list(fractions), "positive": curve(pos), "negative": curve(neg.abs())}


# --- branching (EAD, Figure 2) ------------------------------------------------------------------------------

def _score_heads(tokenizer, heads, conts, score: Score) -> list[tuple[list[str], list[float]]]:
    """Texts and rewards of every head's continuations, scored in one call of `score`."""
    texts = [[tokenizer.decode(list(h) + c, skip_special_tokens=True) for c in cs] for h, cs in zip(heads, conts)]
    flat = [t for ts in texts for t in ts]
    rewards = [float(r) for r in score(flat)] if flat else []
    out, i = [], 0
    for ts in texts:
        out.append((ts, rewards[i:i + len(ts)]))
        i += len(ts)
    return out


def branch_probe(model, tokenizer, prompt_ids: Sequence[int], response_ids: Sequence[int], cuts: Sequence[int], *,
                 k: int, score: Score, max_new_tokens: int, extract_answer: Callable[[str], str | None] | None = None,
                 entropy: Sequence[float] | None = None, temperature: float = 1.0, top_p: float = 1.0,
                 generator: torch.Generator | None = None, fast_path: bool = True) -> list[dict]:
    """The forking experiment on one response (EAD, Figure 2, after Yang & Holtzman 2025): for each cut
    t, keep `o_<t` and sample k continuations; score every completed response.

    Cuts at or beyond the response's length are skipped (no token is left to branch at). All prefixes go to the
    sampler together (`continue_prefixes`); a single cut at 0 is plain sampling from the prompt.

    Args:
        prompt_ids: the prompt's token ids; response_ids: the base response (unpadded; EOS last if it ended).
        cuts: 0-based response positions.
        k: continuations per cut.
        score: scores of a list of response texts of this problem (`Score`).
        extract_answer: final answer of a text, for the majority vote (maj@k over all k); None skips it.
        entropy: the base response's token entropies `[L]`, to record the entropy at each cut.
    Returns:
        One dict per kept cut, in order: `cut`, `entropy` (or None), `texts`, `rewards`, `accuracy` (fraction of
        rewards > 0.5), `maj` (maj@k of the k continuations, or None).
    """
    from explorl.metrics import maj_at_k, vote_keys

    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    response_ids = [int(x) for x in response_ids]
    kept = [int(t) for t in cuts if 0 <= int(t) < max(len(response_ids), 1)]
    heads = [response_ids[:t] for t in kept]
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    conts = continue_prefixes(model, prompt_ids, heads, k, eos_token_id=eos, pad_token_id=pad,
                              max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                              generator=generator, fast_path=fast_path)
    out = []
    for t, (texts, rewards) in zip(kept, _score_heads(tokenizer, heads, conts, score)):
        correct = [r > 0.5 for r in rewards]
        maj = None
        if extract_answer is not None:
            answers = [extract_answer(x) for x in texts]
            maj = maj_at_k(vote_keys(answers, correct), correct, len(texts))
        out.append({"cut": t, "entropy": float(entropy[t]) if entropy is not None and t < len(entropy) else None,
                    "texts": texts, "rewards": rewards, "accuracy": sum(correct) / len(correct), "maj": maj})
    return out


def branch_summary(per_problem: Sequence[Sequence[dict]], cuts: Sequence[int]) -> list[dict]:
    """`branch_probe` results of many problems, averaged per cut: `cut`, `problems` (those whose response reached
    the cut), `accuracy`, `maj` (None without answers) and `entropy` (mean entropy at the cut), the means over
    those problems (NaN when none)."""
    out = []
    for t in cuts:
        rows = [r for results in per_problem for r in results if r["cut"] == t]

        def mean(key: str):
            vals = [r[key] for r in rows if r[key] is not None]
            return sum(vals) / len(vals) if vals else (float("nan") if rows or key == "accuracy" else None)

        out.append({"cut": int(t), "problems": len(rows), "accuracy": mean("accuracy"), "maj": mean("maj"),
                    "entropy": mean("entropy")})
    return out


# --- perturbation at high- and low-entropy positions (ERPO, Figure 1(b)) -------------------------------------

def entropy_extremes(entropy: Sequence[float], frac: float) -> tuple[list[int], list[int]]:
    """Positions of the `m = max(1, round(frac * L))` highest- and lowest-entropy tokens of a response of L
    perturbable tokens (ERPO, Figure 1(b): the top and bottom 5%), m capped at L // 2 so the sets are
    disjoint; ties go to the earlier position. Returns (high, low), each sorted by position; empty when L < 2."""
    if not 0 < frac <= 0.5:
        raise ValueError(f"frac must lie in (0, 0.5], got {frac}")
    ent = [float(x) for x in entropy]
    m = min(max(1, round(frac * len(ent))), len(ent) // 2)
    if m == 0:
        return [], []
    order = sorted(range(len(ent)), key=lambda i: (-ent[i], i))
    low_order = sorted(range(len(ent)), key=lambda i: (ent[i], i))
    return sorted(order[:m]), sorted(low_order[:m])


def perturbed_head(response_ids: Sequence[int], t: int, mode: str, *, vocab_size: int, exclude: Sequence[int] = (),
                   generator: torch.Generator | None = None) -> list[int]:
    """The prefix a perturbation at position t leaves to be continued: `truncate` gives `o_<t`; `replace` gives
    `o_<t + [v]`, v uniform over the ids below `vocab_size` other than `o_t` and `exclude` (drawn with
    `generator`, a CPU generator)."""
    head = [int(x) for x in response_ids[:t]]
    if mode == "truncate":
        return head
    if mode != "replace":
        raise ValueError(f"mode must be 'replace' or 'truncate', got {mode!r}")
    banned = set(int(e) for e in exclude) | {int(response_ids[t])}
    allowed = [v for v in range(vocab_size) if v not in banned]
    if not allowed:
        raise ValueError("perturbed_head: no token is left to replace with")
    return head + [allowed[int(torch.randint(len(allowed), (1,), generator=generator))]]


def perturb_probe(model, tokenizer, prompt_ids: Sequence[int], response_ids: Sequence[int], entropy: Sequence[float],
                  *, k: int, score: Score, max_new_tokens: int, frac: float = 0.05,
                  modes: Sequence[str] = ("replace", "truncate"), temperature: float = 1.0, top_p: float = 1.0,
                  generator: torch.Generator | None = None, token_generator: torch.Generator | None = None,
                  fast_path: bool = True) -> dict:
    """Perturb one response at its highest- and lowest-entropy positions and regenerate (ERPO,
    Figure 1(b)).

    The perturbable positions are the response's tokens less a final EOS; `entropy_extremes` picks them. Each
    (mode, position) prefix (`perturbed_head`; replacements never draw pad or EOS) gets k continuations, all in one
    `sample` call. Returns `{mode: {"high": {"positions", "rewards"}, "low": {...}}}`, the rewards of the
    k continuations of every position, position by position.
    """
    response_ids = [int(x) for x in response_ids]
    eos = _ids(tokenizer.eos_token_id)
    length = len(response_ids) - (1 if response_ids and response_ids[-1] in eos else 0)
    high, low = entropy_extremes(list(entropy)[:length], frac)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    exclude = sorted(set(eos) | {pad})
    keys, heads = [], []
    for mode in modes:
        for side, positions in (("high", high), ("low", low)):
            for t in positions:
                keys.append((mode, side))
                heads.append(perturbed_head(response_ids, t, mode, vocab_size=len(tokenizer), exclude=exclude,
                                            generator=token_generator))
    conts = continue_prefixes(model, prompt_ids, heads, k, eos_token_id=eos, pad_token_id=pad,
                              max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                              generator=generator, fast_path=fast_path)
    out = {m: {"high": {"positions": high, "rewards": []}, "low": {"positions": low, "rewards": []}} for m in modes}
    for (mode, side), (_, rewards) in zip(keys, _score_heads(tokenizer, heads, conts, score)):
        out[mode][side]["rewards"].extend(rewards)
    return out


# --- per-token update effects (STILL, Figures 3(b), 4, 5(a)) -------------------------------------------------

def one_update_effects(model, ro, rewards: Sequence[float], cfg, *, temperature: float = 1.0, ref=None,
                       seed: int = 0) -> dict:
    """Take exactly one policy update on a sampled batch, as `explorl train` takes it, and measure every token
    before and after (STILL, section 3.2.2, Figures 4 and 5(a)).

    The trainer's own pieces: `trainer.rollout_batch` (pi_old's log-probs and entropies by the training forward),
    `algos.step.compute_advantages` (the configured estimator and shapers, step 1), `trainer.make_optimizer` and
    `trainer.update_policy` (`cfg.algo.epochs` x `cfg.algo.mini_batches` optimizer steps on the batch, one with
    the defaults; the first step's lr multiplier is 1 when `cfg.optim.warmup_steps` is 0). The model is updated in
    place. `ref`: the frozen reference when the method needs one (`algos.step.requirements(cfg.algo).ref`).

    Args:
        ro: `Rollouts` of the batch; rewards: `[N]`; cfg: a `Config`; temperature: the training temperature.
    Returns:
        `{"logprobs_before", "logprobs_after", "entropy_before", "entropy_after", "advantages"}` `[N, T]` float32
        (0 on padding, training temperature) and `"stats"` (the update's metrics).
    """
    from explorl.algos.step import compute_advantages
    from explorl.rollout.logprobs import response_logprobs
    from explorl.train.loop import make_optimizer, rollout_batch, update_policy
    from explorl.train.update import fused_compile

    device = ro.mask.device
    batch = rollout_batch(model, ref, ro, list(rewards), temperature, cfg, pi_old_from_update=False)
    prepared = compute_advantages(batch, cfg.algo, 1)
    optimizer, scheduler = make_optimizer(model, cfg, device)
    was_training = model.training
    model.train()
    try:
        shuffle = torch.Generator().manual_seed(seed)
        stats = update_policy(model, optimizer, scheduler, ro, batch, prepared, cfg, shuffle, temperature=temperature)
    finally:
        model.train(was_training)
    optimizer.zero_grad(set_to_none=True)
    with torch.no_grad():
        lp_after, ent_after = response_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.mask,
                                                temperature, compile=fused_compile(cfg))  # the forward of pi_old
    return {"logprobs_before": batch.logprobs, "logprobs_after": lp_after, "entropy_before": batch.entropy,
            "entropy_after": ent_after, "advantages": prepared.advantages, "stats": stats}


def _rank_bins(values: Tensor, bins: int) -> Tensor:
    """Equal-count bins by rank (stable; ties by index): element of rank r of n goes to bin `r * bins // n`."""
    order = torch.sort(values, stable=True).indices
    rank = torch.empty_like(order)
    rank[order] = torch.arange(values.numel())
    return rank * bins // max(values.numel(), 1)


def update_shift_summary(delta_p: Tensor, entropy: Tensor, mask: Tensor, *, correct: Sequence[bool],
                         tokens: Sequence[Sequence[str]] | None = None, ppl: Tensor | Sequence[float] | None = None,
                         top_frac: float = 0.2, bins: int = 5, small: float = 0.06) -> dict:
    """Where one update moved token probabilities (STILL, section 3.2.2 and Figures 4, 5(a)).

    `delta_p = p_after(o_t) - p_before(o_t)` per token; the "top" tokens are the `ceil(top_frac * n)` valid tokens
    with the largest |delta_p| (ties by position, row-major).

    Args:
        delta_p, entropy (before the update), mask: `[N, T]`.
        correct: `[N]` whether each response is correct (positive sample).
        tokens: per response, the decoded text of each valid token, in order (for the token categories of
            `analysis.text.token_category`); None skips `by_category`.
        ppl: `[N]` response perplexities before the update (`analysis.measures.response_perplexity`); None skips
            `by_ppl`.
        bins: equal-count bins of entropy (and of PPL).
        small: the paper's "probability change of less than 0.06".
    Returns:
        `overall` (tokens, mean |dp|, share with |dp| < small, the top threshold, mean entropy of all vs top tokens),
        `by_outcome` (Fig. 4(a): for positive and negative responses, tokens, mean dp, share raised, share in top),
        `by_entropy` (Fig. 4(b): per entropy bin, its range, mean |dp|, share in top), `by_category` (per category:
        tokens, mean |dp|, share of its tokens in the top, share of the top), `by_ppl` (Fig. 5(a): per PPL bin,
        its range, mean |dp|, share in top).
    """
    valid = (mask > 0).cpu()
    dp = delta_p.detach().cpu().double()[valid]
    ent = entropy.detach().cpu().double()[valid]
    row = torch.arange(valid.shape[0])[:, None].expand_as(valid)[valid]
    n = dp.numel()
    if n == 0:
        raise ValueError("update_shift_summary: no valid tokens")
    mag = dp.abs()
    m = max(1, math.ceil(top_frac * n - 1e-9))
    top = torch.zeros(n, dtype=torch.bool)
    top[torch.sort(-mag, stable=True).indices[:m]] = True
    pos = torch.as_tensor(list(correct), dtype=torch.bool)[row]

    def share(sel: Tensor) -> float:
        return float(top[sel].double().mean()) if sel.any() else float("nan")

    out: dict = {"overall": {"tokens": n, "mean_abs_shift": float(mag.mean()), f"share_below_{small:g}":
                             float((mag < small).double().mean()), "top_threshold": float(mag[top].min()),
                             "mean_entropy_all": float(ent.mean()), "mean_entropy_top": float(ent[top].mean())}}
    out["by_outcome"] = {}
    for name, sel in (("positive", pos), ("negative", ~pos)):
        out["by_outcome"][name] = {"tokens": int(sel.sum()),
                                   "mean_shift": float(dp[sel].mean()) if sel.any() else float("nan"),
                                   "share_raised": float((dp[sel] > 0).double().mean()) if sel.any() else float("nan"),
                                   "share_in_top": share(sel)}

    def binned(values: Tensor) -> list[dict]:
        b = _rank_bins(values, min(bins, n))
        return [{"low": float(values[b == i].min()), "high": float(values[b == i].max()),
                 "mean_abs_shift": float(mag[b == i].mean()), "share_in_top": share(b == i)}
                for i in range(min(bins, n))]

    out["by_entropy"] = binned(ent)
    if tokens is not None:
        from explorl.analysis.text import CATEGORIES, token_category

        flat = [t for row_tokens in tokens for t in row_tokens]
        if len(flat) != n:
            raise ValueError(f"update_shift_summary: tokens hold {len(flat)} entries for {n} valid tokens")
        cats = [token_category(t) for t in flat]
        out["by_category"] = {}
        for c in CATEGORIES:
            sel = torch.tensor([x == c for x in cats], dtype=torch.bool)
            out["by_category"][c] = {"tokens": int(sel.sum()),
                                     "mean_abs_shift": float(mag[sel].mean()) if sel.any() else float("nan"),
                                     "share_in_top": share(sel), "share_of_top": float((sel & top).sum()) / m}
    if ppl is not None:
        out["by_ppl"] = binned(torch.as_tensor(ppl, dtype=torch.float64).cpu()[row])
    return out


def entropy_change_by_token(entropy_before: Tensor, entropy_after: Tensor, mask: Tensor,
                            tokens: Sequence[Sequence[str]], *, min_count: int = 2, top: int = 10) -> list[dict]:
    """Token texts whose entropy fell most in the update (STILL, Figure 3(b)): the mean `H_after - H_before`
    over the occurrences of each token text seen at least `min_count` times, most negative first (ties by text).
    `tokens`: per response, the decoded text of each valid token. Returns `top` dicts `{token, count, change}`."""
    valid = (mask > 0).cpu()
    change = (entropy_after.detach().cpu().double() - entropy_before.detach().cpu().double())[valid].tolist()
    flat = [t for row_tokens in tokens for t in row_tokens]
    if len(flat) != len(change):
        raise ValueError(f"entropy_change_by_token: tokens hold {len(flat)} entries for {len(change)} valid tokens")
    sums: dict[str, list[float]] = {}
    for t, d in zip(flat, change):
        sums.setdefault(t, []).append(d)
    rows = [{"token": t, "count": len(v), "change": sum(v) / len(v)} for t, v in sums.items() if len(v) >= min_count]
    return sorted(rows, key=lambda r: (r["change"], r["token"]))[:top]
