"""Held-out evaluation: n samples per problem, unbiased pass@k, avg@n, maj@k, entropy and length; the sampling
temperature at which a model reaches a given entropy (`match_entropy`).

Shared by `explorl eval`, the trainer's periodic evaluation and `make demo`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from explorl.analysis.measures import entropy_by_position
from explorl.config import eval_set_task
from explorl.evaluation.failures import report_reward_failures, reward_calls
from explorl.metrics import (bootstrap_ci, branching_factor, maj_at_k, pass_at_k, pass_at_k_curve, vote_keys,
                             worst_at_k)
from explorl.rollout.collect import BoundTask
from explorl.rollout.engines.native import decode_responses
from explorl.rollout.logprobs import full_sequences
from explorl.rollout.sampler import Sampler
from explorl.rollout.temperature_schedules import PromptTemperature
from explorl.tasks import load_task
from explorl.tasks.chat import prompt_encoder


@dataclass
class ProblemResult:
    """Per-problem outcome of an evaluation."""

    id: str
    prompt: str
    answer: str
    correct: list[bool]
    answers: list[str | None]
    rewards: list[float]
    mean_entropy: float
    mean_length: float
    mean_branching: float | None = None
    """Mean rollout branching factor of the responses (only with `analyze=True`)."""
    well_formatted: int = 0
    """Responses stating exactly one final answer (`Task.well_formatted`: one `\\boxed{`, STILL's format check,
    or one match of `task.answer_pattern`)."""
    completions: list[str] | None = None
    """The sampled texts (only with `keep_completions=True`)."""


@dataclass
class EvalPlan:
    """What `evaluate` samples and measures: `n` responses per problem at `temperature`, scored for the k of `ks`."""

    n: int
    """Samples per problem."""
    ks: Sequence[int]
    """The k of pass@k, maj@k and worst@k."""
    temperature: float | PromptTemperature = 1.0
    """A number, or a `PromptTemperature`: a per-token schedule at inference."""
    seed: int = 0
    """Seeds the sampling generator and the maj@k tie-breaks."""
    prompts_per_batch: int = 64
    """Problems sampled together in one call of the sampler."""
    reward_timeout_s: float = 5.0
    """The time limit of a reward call (`task.reward_timeout_s`)."""
    analyze: bool = False
    """Also measure `unsolvable@n`, the branching factor and the entropy by position."""
    branching_top_p: float = 0.95
    """The nucleus mass of the branching factor (with `analyze`)."""
    keep_completions: bool = False
    """Keep each problem's sampled texts (`ProblemResult.completions`)."""


def evaluate(sampler: Sampler, tokenizer, problems: Sequence, task, plan: EvalPlan, *, encode=None, progress=None,
             failures: list | None = None) -> tuple[dict, list[ProblemResult]]:
    """Sample `plan.n` responses per problem with `sampler` (its model, length limit, top-p and decoder) at
    `plan.temperature` and score them (`encode(problem)`: the prompt's token ids, e.g. through the chat template,
    `tasks.chat.prompt_encoder`; default the prompt text as it is). E.g.
    `evaluate(sampler, tok, task.eval, task, EvalPlan(n=8, ks=[1, 8]))`.

    A response counts as correct by the task's rule (`Task.correct`: the `task.correct_by` entry's own score above
    `task.correct_threshold`, 0.5 by default), whatever the other reward functions add; its final answer (maj@k) and
    format (`format_rate`) are read as the task says (`task.answer_pattern`, default the last `\\boxed{}`).
    Returns (summary, per_problem). Summary keys: `pass@k`, `maj@k` and `worst@k` for each k of `plan.ks`, `avg@n`
    (mean accuracy), `format_rate` (responses with exactly one `\\boxed{`),
    `entropy` (mean token entropy of the sampled distribution), `length` (mean response tokens), `errors`
    and `timeouts` of the reward function, `problems`, `n`. With `plan.analyze`, also `unsolvable@n` (problems with
    no correct sample, STILL's k-rollout unsolvable set for k = n), `branching` (mean rollout branching factor,
    docs/methods.md §8b) and `entropy/by_position` (mean token entropy in 10 relative-position bins). With
    `plan.keep_completions`, each `ProblemResult` keeps its sampled texts (`completions`). `progress(count)` is
    called after each batch of problems; `failures`, when given, gets every reward failure
    (`rewards.RewardFailure`: what failed, with its traceback) appended.
    """
    gen = torch.Generator(device=next(sampler.model.parameters()).device).manual_seed(plan.seed)
    bound = BoundTask(tokenizer, task, task.reward_runner(plan.reward_timeout_s), encode)
    results: list[ProblemResult] = []
    totals = _Totals()
    for start in range(0, len(problems), plan.prompts_per_batch):
        chunk = problems[start:start + plan.prompts_per_batch]
        ro = sampler.sample_fixed([bound.prompt_ids(p) for p in chunk], plan.n, plan.temperature, gen)
        results += _score_batch(sampler.model, bound, chunk, start, ro, totals, plan, failures)
        if progress is not None:
            progress(len(chunk))
    return _summary(results, totals, n=plan.n, ks=plan.ks, seed=plan.seed, analyze=plan.analyze), results


@dataclass
class _Totals:
    """What an evaluation sums over its batches besides the per-problem results."""

    errors: int = 0
    timeouts: int = 0
    entropy: float = 0.0
    """Token entropy summed over the valid tokens of every response."""
    tokens: float = 0.0
    profile_sum: torch.Tensor = field(default_factory=lambda: torch.zeros(10, dtype=torch.float64))
    """Entropy by relative position (10 bins), each batch's weighted by its valid tokens (with `analyze`)."""
    profile_count: torch.Tensor = field(default_factory=lambda: torch.zeros(10, dtype=torch.float64))


def _score_batch(model, bound: BoundTask, chunk: Sequence, start: int, ro, totals: _Totals, plan: EvalPlan,
                 failures: list | None) -> list[ProblemResult]:
    """The results of the problems `chunk` (the `start`-th of the split on) from their samples `ro`: the responses
    decoded and rewarded (`bound`: the task with its tokenizer and reward runner) and judged; the reward failures
    (onto `failures`), entropy and length (and with `plan.analyze` the branching factor and the entropy profile)
    added to `totals`."""
    task = bound.task
    texts = decode_responses(bound.tok, ro)
    group = ro.group.tolist()
    rr = bound.runner(texts, [chunk[g].answer for g in group], [chunk[g].meta for g in group])
    judged = task.correct(rr)
    totals.errors += rr.errors
    totals.timeouts += rr.timeouts
    if failures is not None:
        failures += rr.failures
    totals.entropy += float((ro.behavior_entropy * ro.mask).sum())
    totals.tokens += float(ro.mask.sum())
    lengths = ro.lengths.tolist()
    ent_rows = ((ro.behavior_entropy * ro.mask).sum(-1) / ro.mask.sum(-1).clamp_min(1)).tolist()
    bf_rows = None
    if plan.analyze:
        bf_rows = response_branching(model, ro, _branching_temperature(plan.temperature, ro),
                                     plan.branching_top_p).tolist()
        prof = entropy_by_position(ro.behavior_entropy, ro.mask, bins=10).double().cpu()
        seen = ~torch.isnan(prof)
        weight = float(ro.mask.sum())
        totals.profile_sum[seen] += prof[seen] * weight
        totals.profile_count[seen] += weight
    results = []
    for j, p in enumerate(chunk):
        rows = [i for i, g in enumerate(group) if g == j]
        rewards = [rr.rewards[i] for i in rows]
        results.append(ProblemResult(
            id=str(p.meta.get("id", start + j)), prompt=p.prompt, answer=p.answer,
            correct=[judged[i] for i in rows], answers=[task.extract_answer(texts[i]) for i in rows],
            rewards=rewards, mean_entropy=sum(ent_rows[i] for i in rows) / len(rows),
            mean_length=sum(lengths[i] for i in rows) / len(rows),
            mean_branching=None if bf_rows is None else sum(bf_rows[i] for i in rows) / len(rows),
            well_formatted=sum(task.well_formatted(texts[i]) for i in rows),
            completions=[texts[i] for i in rows] if plan.keep_completions else None))
    return results


def _branching_temperature(temperature: float | PromptTemperature, ro) -> float | torch.Tensor:
    """The temperature the branching factor of `ro`'s responses is measured at: the number they were sampled at, or
    for a per-token schedule each token's (`ro.temperatures`)."""
    if not isinstance(temperature, PromptTemperature):
        return temperature
    return ro.temperatures if temperature.anneal is not None else temperature.temperature


def _summary(results: list[ProblemResult], totals: _Totals, *, n: int, ks: Sequence[int], seed: int,
             analyze: bool) -> dict:
    """The summary `evaluate` returns (its keys in this order), from the per-problem results and the totals."""
    summary: dict = {"problems": len(results), "n": n}
    for k in ks:
        summary[f"pass@{k}"] = sum(pass_at_k(n, sum(r.correct), k) for r in results) / max(len(results), 1)
    summary[f"avg@{n}"] = sum(sum(r.correct) / n for r in results) / max(len(results), 1)
    for k in ks:
        summary[f"maj@{k}"] = sum(maj_at_k(vote_keys(r.answers, r.correct), r.correct, k, seed=seed)
                                  for r in results) / max(len(results), 1)
    for k in ks:  # all k of k samples correct, unbiased (EAD's worst@k, EAD Figs. 4-5)
        summary[f"worst@{k}"] = sum(worst_at_k(n, sum(r.correct), k) for r in results) / max(len(results), 1)
    summary["format_rate"] = sum(r.well_formatted for r in results) / max(len(results) * n, 1)
    summary["entropy"] = totals.entropy / max(totals.tokens, 1.0)
    summary["length"] = totals.tokens / max(len(results) * n, 1)
    if analyze:
        summary[f"unsolvable@{n}"] = sum(not any(r.correct) for r in results)
        summary["branching"] = sum(r.mean_branching for r in results) / max(len(results), 1)
        summary["entropy/by_position"] = [float(x) if c > 0 else None for x, c in
                                          zip(totals.profile_sum / totals.profile_count.clamp_min(1),
                                              totals.profile_count)]
    summary["errors"] = totals.errors
    summary["timeouts"] = totals.timeouts
    return summary


@dataclass
class EntropyMatch:
    """The sampling temperature at which a model's mean token entropy reaches a target (`match_entropy`)."""

    target: float
    temperature: float
    entropy: float
    """The mean token entropy reached at `temperature` on the calibration problems."""
    problems: int
    """Calibration problems (the first ones of the evaluated split)."""
    n: int
    """Samples per calibration problem."""
    iterations: int


@torch.no_grad()
def sampled_entropy(sampler: Sampler, tokenizer, problems: Sequence, temperature: float, *, n: int, seed: int = 0,
                    encode=None) -> float:
    """Mean token entropy of the distribution `sampler` samples at `temperature` (the logits divided by it), over the
    valid tokens of `n` responses to each problem; the same seed every call, so the curve in `temperature` is nearly
    smooth (the samples themselves still change with it)."""
    gen = torch.Generator(device=next(sampler.model.parameters()).device).manual_seed(seed)
    ids = [encode(p) if encode else tokenizer.encode(p.prompt, add_special_tokens=False) for p in problems]
    ro = sampler.sample_fixed(ids, n, temperature, gen)
    return float((ro.behavior_entropy * ro.mask).sum() / ro.mask.sum().clamp_min(1))


@dataclass(frozen=True)
class EntropySearch:
    """The bisection of `match_entropy`: the temperatures it searches and when it stops."""

    tol: float = 0.002
    """Stop when the entropy reached is within this many nats of the target."""
    lo: float = 0.05
    """The lowest temperature searched."""
    hi: float = 4.0
    """The highest temperature searched."""
    max_iter: int = 24
    """Stop after this many halvings."""


def match_entropy(sampler: Sampler, tokenizer, problems: Sequence, target: float, *, n: int = 4, seed: int = 0,
                  encode=None, search: EntropySearch = EntropySearch()) -> EntropyMatch:
    """The temperature in [search.lo, search.hi] at which the mean token entropy of `sampler`'s model on `problems`
    (the calibration set) equals `target`, by bisection on log T (entropy rises with the temperature), to within
    `search.tol` nats or after `search.max_iter` halvings; the ends when the target lies beyond them. For comparing
    models at equal sampling entropy: a model that covers more only because it samples hotter loses that edge
    here."""
    tol, lo, hi, max_iter = search.tol, search.lo, search.hi, search.max_iter

    def h(t: float) -> float:
        return sampled_entropy(sampler, tokenizer, problems, t, n=n, seed=seed, encode=encode)

    a, b = math.log(lo), math.log(hi)
    h_lo, h_hi = h(lo), h(hi)
    if target <= h_lo:
        return EntropyMatch(target, lo, h_lo, len(problems), n, 0)
    if target >= h_hi:
        return EntropyMatch(target, hi, h_hi, len(problems), n, 0)
    t, got = 1.0, h_lo
    for it in range(1, max_iter + 1):
        t = math.exp((a + b) / 2)
        got = h(t)
        if abs(got - target) <= tol:
            return EntropyMatch(target, t, got, len(problems), n, it)
        a, b = (math.log(t), b) if got < target else (a, math.log(t))
    return EntropyMatch(target, t, got, len(problems), n, max_iter)


@torch.no_grad()
def response_branching(model, ro, temperature: float | torch.Tensor, top_p: float = 0.95,
                       chunk: int = 16) -> torch.Tensor:
    """Mean rollout branching factor of each response [N] (docs/methods.md §8b), one forward pass per chunk of rows.
    `temperature`: a float, or [N, T] per-token temperatures (e.g. `ro.temperatures` of an EAD schedule)."""
    out = []
    t = ro.response_ids.shape[1]
    for s in range(0, ro.mask.shape[0], chunk):
        rows = slice(s, s + chunk)
        ids, attn, pos = full_sequences(ro.prompt_ids[rows], ro.prompt_mask[rows], ro.response_ids[rows])
        logits = model(input_ids=ids, attention_mask=attn, position_ids=pos, logits_to_keep=t + 1).logits
        logits = logits[:, :-1].float()
        mask = ro.mask[rows]
        temp = temperature
        if isinstance(temperature, torch.Tensor):  # per token; padding holds 0, which is never used
            temp = temperature[rows].to(logits.device).masked_fill(mask.to(logits.device) == 0, 1.0)[..., None]
        bf = branching_factor(torch.softmax(logits / temp, dim=-1), top_p=top_p).float()
        out.append((bf * mask).sum(-1) / mask.sum(-1).clamp_min(1))
    return torch.cat(out) if out else torch.zeros(0)


def curve_ks(n: int) -> list[int]:
    """The k of a pass@k / maj@k curve from n samples per problem: powers of two below n, and n."""
    ks, k = [], 1
    while k < n:
        ks.append(k)
        k *= 2
    return ks + [n]


def k_curves(results: Sequence[ProblemResult], *, seed: int = 0, n_boot: int = 1000) -> dict:
    """pass@k and maj@k against k (`curve_ks(n)`) with 95% percentile-bootstrap intervals over problems
    (`metrics.bootstrap_ci`; STILL Fig. 1a, EAD Fig. 9, E3 Fig. 8).

    pass@k is the unbiased estimator from all n samples (Chen et al.; `metrics.pass_at_k_curve`); maj@k votes over
    k-subsets (`maj_at_k`), equivalent answers pooled (`metrics.vote_keys`).
    Returns `{"k": [...], "pass@k": [[mean, lo, hi], ...], "maj@k": [[mean, lo, hi], ...], "problems": {"id",
    "n", "correct"}}`, the last with each problem's sample and correct counts, so that two curves on the same
    problems can be compared pairwise (`paired_pass_difference`).
    """
    if not results:
        raise ValueError("k_curves: no problems")
    n = min(len(r.correct) for r in results)
    ks = curve_ks(n)
    out: dict = {"k": ks, "pass@k": [], "maj@k": [],
                 "problems": {"id": [r.id for r in results], "n": [len(r.correct) for r in results],
                              "correct": [sum(r.correct) for r in results]}}
    passes = pass_at_k_curve({i: r.correct for i, r in enumerate(results)}, ks, n_boot=n_boot, seed=seed)
    votes_of = [vote_keys(r.answers, r.correct) for r in results]
    for k in ks:
        majs = [maj_at_k(votes, r.correct, k, seed=seed) for r, votes in zip(results, votes_of)]
        out["pass@k"].append(list(passes[k]))
        out["maj@k"].append(list(bootstrap_ci(majs, n_boot=n_boot, seed=seed)))
    return out


class MixedModelsError(ValueError):
    """Evaluation records of models that come from different base weights, asked to be paired or pooled."""


def check_same_base(records: dict[str, dict]) -> list[str]:
    """Refuse to pair evaluation records (`explorl eval` outputs, keyed by a display name) whose `base_fingerprint`
    differ: two runs started from two different embedded models are two experiments, whatever their configs say.
    Records written before fingerprints were recorded have none; they are not refused, but named in the returned
    warnings, so a caller can print them. Raises `MixedModelsError` naming each record's fingerprint."""
    bases = {name: r.get("base_fingerprint") for name, r in records.items()}
    known = {fp for fp in bases.values() if fp}
    if len(known) > 1:
        listing = ", ".join(f"{name}: {fp or 'not recorded'}" for name, fp in bases.items())
        raise MixedModelsError(f"these evaluations start from different base models ({listing}); paired "
                               f"differences between them would mix two models. Compare runs of one base model.")
    unknown = [name for name, fp in bases.items() if not fp]
    if unknown and known:
        return [f"{', '.join(unknown)}: no base-model fingerprint recorded (written before fingerprints were); "
                f"the others start from {known.pop()}; pairing assumes they are the same model"]
    return []


def paired_pass_difference(base: dict, other: dict, *, n_boot: int = 1000, seed: int = 0) -> dict[int, list[float]]:
    """pass@k of `other` minus `base` on the problems both evaluated, with a 95% paired bootstrap interval: the
    problems are resampled and the mean per-problem difference taken, so the shared difficulty of each problem
    cancels (tighter than comparing two independent intervals). `base` and `other` are `k_curves` results with
    `problems`; returns `{k: [mean, lo, hi]}` for the k both curves have.
    """
    if "problems" not in base or "problems" not in other:
        raise ValueError("paired_pass_difference: both curves need their per-problem counts (explorl eval --curve)")
    b = {pid: (n, c) for pid, n, c in zip(*(base["problems"][f] for f in ("id", "n", "correct")))}
    o = {pid: (n, c) for pid, n, c in zip(*(other["problems"][f] for f in ("id", "n", "correct")))}
    common = [pid for pid in b if pid in o]
    if not common:
        raise ValueError("paired_pass_difference: the two evaluations share no problem")
    out = {}
    for k in (k for k in base["k"] if k in other["k"]):
        diffs = [pass_at_k(*o[pid], k) - pass_at_k(*b[pid], k) for pid in common]
        out[k] = list(bootstrap_ci(diffs, n_boot=n_boot, seed=seed))
    return out


def held_out_evaluator(model, tokenizer, cfg, task, encode, console=None):
    """`step -> summary`: a run's held-out evaluation (`run.eval_n`, `eval_k`, `eval_temperature`, the sampling
    settings, seeded by the step) on the task's own split and on every set of `run.eval_sets` (keys
    `<name>/<metric>`), as `explorl train` and `explorl sft` report it, with explorl's sampler built here from
    `cfg.sampling` (never through `sampling.engine: vllm`). The sets are loaded once, here. With a `console`, reward
    calls that fail during an evaluation are said there as `explorl eval` says them
    (`failures.report_reward_failures`), for each set."""
    r = cfg.run
    sampler = Sampler.from_config(model, tokenizer, cfg.sampling)
    sets = {"": (task, encode, cfg.task)}
    for name in r.eval_sets:
        set_cfg = eval_set_task(cfg, name)
        sets[name] = (load_task(set_cfg), prompt_encoder(tokenizer, set_cfg), set_cfg)

    def run(step: int) -> dict:
        summary = {}
        for name, (t, enc, t_cfg) in sets.items():
            failures: list = []
            plan = EvalPlan(n=r.eval_n, ks=r.eval_k, temperature=r.eval_temperature, seed=r.seed + 10_007 * (step + 1),
                            reward_timeout_s=t_cfg.reward_timeout_s)
            result, _ = evaluate(sampler, tokenizer, t.eval, t, plan, encode=enc, failures=failures)
            if console is not None:
                where = f"held-out evaluation at step {step}" + (f" on run.eval_sets.{name}" if name else "")
                report_reward_failures(console, failures, reward_calls(result, t), repr(t_cfg.reward),
                                       where=f"{where}: ", fix=f"The {where} measures the failures, not the model; "
                                       f"fix the reward and evaluate the run again (explorl eval --model RUN)")
            summary.update({f"{name}/{k}" if name else k: v for k, v in result.items()})
        model.train()
        return summary

    return run
