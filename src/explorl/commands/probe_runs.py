"""The work of `explorl probe position | covariance | branch | perturb | update` (`explorl.commands.probe` has
the flags and writes the results): load the model and the task as `explorl eval` does (`setup`, a `Context`), then
each probe samples, measures through `explorl.experiments.probes` (docs/methods.md §8e), prints its table and
returns its JSON-ready result. Imported only when a probe runs: it loads torch and the training loop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.progress import Progress
from rich.table import Table
from rich.text import Text

from explorl.algos.step import requirements
from explorl.analysis.measures import entropy_by_position, response_perplexity
from explorl.commands.common import _check_device, _run_code_trust
from explorl.config import ModelConfig, command_task, from_dict, load_config
from explorl.experiments import probes as P
from explorl.models import find_run_output, load_model_under_test, make_reference
from explorl.rollout.engines import native
from explorl.rollout.sampler import Sampler
from explorl.tasks import load_task
from explorl.tasks.chat import prompt_encoder


@dataclass
class Context:
    """What every probe starts from: the model's sampler (its length limit, top-p and decoder), the task's problems,
    how to prompt and score them, and the temperature (`settings` records each value and where it came from)."""

    sampler: Sampler
    tok: object
    task: object
    task_cfg: object
    problems: list
    encode: object
    runner: object
    run_cfg: object
    run_config_path: Path | None
    label: str
    temperature: float
    settings: dict

    def score_fn(self, problem) -> P.Score:
        """Whether each text answering `problem` is correct, as 1.0 / 0.0: the task's judgment (`Task.correct`, the
        judging reward entry above its threshold), never the weighted reward (a length penalty is not wrongness)."""
        def score(texts: list[str]) -> list[float]:
            result = self.runner(texts, [problem.answer] * len(texts), [problem.meta] * len(texts))
            return [float(c) for c in self.task.correct(result)]

        return score

    def generator(self, seed: int) -> torch.Generator:
        return torch.Generator(device=next(self.sampler.model.parameters()).device).manual_seed(seed)

    def sample(self, problems, n: int, generator: torch.Generator):
        """Rollouts of n samples per problem (one `sampler` call), their rewards (the weighted sum training uses)
        and whether each is correct (`Task.correct`)."""
        ro = self.sampler.sample_fixed([self.encode(p) for p in problems], n, self.temperature, generator)
        texts = native.decode_responses(self.tok, ro)
        group = ro.group.tolist()
        result = self.runner(texts, [problems[g].answer for g in group], [problems[g].meta for g in group])
        return ro, result.rewards, self.task.correct(result)


def setup(args, task_opts: dict, console) -> Context:
    """Load the model and the task as `explorl eval` does (run outputs included)."""
    _check_device(args.device)
    for flag in ("limit", "n", "k", "attempts"):
        if getattr(args, flag, 1) is not None and getattr(args, flag, 1) < (0 if flag == "limit" else 1):
            raise SystemExit(f"--{flag}: must be >= {0 if flag == 'limit' else 1}, got {getattr(args, flag)}")
    run = find_run_output(args.model)
    if run is not None:  # the code its config.yaml names runs only when --task-opt names it (config.trust)
        _run_code_trust(args, task_opts, "probe").refuse_untrusted(run.config_path)
    run_cfg = load_config(run.config_path) if run is not None else None
    task_cfg = command_task(run_cfg, args.task, task_opts)
    task = load_task(task_cfg)
    pool = task.eval if args.split == "eval" else task.train
    problems = pool[: args.limit] if args.limit else list(pool)
    if not problems:
        raise SystemExit(f"--split {args.split}: task {task_cfg.name} has no {args.split} problems; use "
                         f"--split {'train' if args.split == 'eval' else 'eval'} or set its size with --task-opt")
    model, tok = load_model_under_test(
        run, run_cfg, from_dict(ModelConfig, {"path": args.model, "device": args.device, "dtype": args.dtype}),
        console)
    model.eval()
    r = run_cfg

    def pick(flag: str, given, from_run, default):
        if given is not None:
            return given, f"--{flag}"
        return (from_run, "run config") if r is not None else (default, "default")

    max_new, max_from = pick("max-new-tokens", args.max_new_tokens, r and r.sampling.max_new_tokens, 64)
    temp, temp_from = pick("temperature", args.temperature, r and r.run.eval_temperature, 1.0)
    top_p, top_p_from = pick("top-p", args.top_p, r and r.sampling.top_p, 1.0)
    settings = {"model": {"value": str(run.model_dir) if run is not None else args.model, "from": "--model"},
                "task": {"value": task_cfg.name, "from": "--task" if args.task else ("run config" if r else "default")},
                "problems": {"value": len(problems), "from": f"{args.split} split, --limit {args.limit or 'all'}"},
                "max_new_tokens": {"value": max_new, "from": max_from},
                "temperature": {"value": temp, "from": temp_from}, "top_p": {"value": top_p, "from": top_p_from},
                "seed": {"value": args.seed, "from": "--seed"}}
    runner = task.reward_runner(task_cfg.reward_timeout_s)
    # eager decoding (the probes never compile), the run's decoder choice
    sampler = Sampler(model, tok.eos_token_id, tok.pad_token_id, max_new, top_p=top_p,
                      fast_path=r.sampling.fast_path if r is not None else True)
    return Context(sampler=sampler, tok=tok, task=task, task_cfg=task_cfg, problems=problems,
                   encode=prompt_encoder(tok, task_cfg), runner=runner, run_cfg=run_cfg,
                   run_config_path=run.config_path if run is not None else None,
                   label=run.label if run is not None else Path(args.model).name, temperature=temp,
                   settings=settings)


def _fmt(x, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def _bar(console):
    return Progress(console=console, disable=not console.is_terminal)


# --- the probes ---------------------------------------------------------------------------------------------------

def _position(args, ctx: Context, console) -> dict:
    gen = ctx.generator(args.seed)
    rows: list[torch.Tensor] = []
    with _bar(console) as bar:
        job = bar.add_task("sampling", total=len(ctx.problems))
        for s in range(0, len(ctx.problems), 32):
            chunk = ctx.problems[s:s + 32]
            ro, _, _ = ctx.sample(chunk, args.n, gen)
            rows += [e[m > 0].cpu() for e, m in zip(ro.behavior_entropy, ro.mask)]
            bar.advance(job, len(chunk))
    width = max(1, max(len(r) for r in rows))
    ent = torch.zeros((len(rows), width))
    mask = torch.zeros((len(rows), width))
    for i, r in enumerate(rows):
        ent[i, :len(r)], mask[i, :len(r)] = r, 1.0
    res = P.entropy_by_absolute_position(ent, mask, bin_size=args.bin_size)
    res["bin_size"] = args.bin_size
    res["relative_10_bins"] = entropy_by_position(ent, mask, bins=10)
    res["responses"] = len(rows)
    table = Table(title=f"entropy by absolute position ({len(rows)} responses, bins of {args.bin_size} tokens)")
    for col in ("positions", "tokens", "mean entropy"):
        table.add_column(col, justify="right")
    nb = len(res["start"])
    for i in sorted({round(j * (nb - 1) / 11) for j in range(12)} if nb > 12 else range(nb)):
        start = res["start"][i]
        table.add_row(f"{start}-{start + args.bin_size - 1}", str(int(res["count"][i])), _fmt(float(res["mean"][i])))
    console.print(table)
    return res


def _covariance(args, ctx: Context, console) -> dict:
    ro, rewards, _ = ctx.sample(ctx.problems, args.n, ctx.generator(args.seed))
    c = P.batch_covariance(ctx.sampler.model, ro, rewards, temperature=ctx.temperature, per_group=args.scope == "group")
    pct = P.covariance_percentiles(c, ro.mask, args.percentiles)
    table_fracs = [p / 100 for p in args.percentiles]
    grid = sorted(set([10 ** (-4 + 4 * i / 120) for i in range(121)] + table_fracs))
    res = {"scope": args.scope, "responses": int(ro.mask.shape[0]), "mean_reward": sum(rewards) / len(rewards),
           "percentiles": pct, "cumulative": P.covariance_cumulative(c, ro.mask, table_fracs),
           "curve": P.covariance_cumulative(c, ro.mask, grid)}
    table = Table(title=f"token covariance c ({pct['n_positive']} positive, {pct['n_negative']} negative, "
                        f"{pct['n_zero']} zero tokens; means per {args.scope})")
    for col in ("percentile", "positive c", "negative c", "share of |c+|", "share of |c-|"):
        table.add_column(col, justify="right")
    cum = res["cumulative"]
    for i, p in enumerate(args.percentiles):
        table.add_row(f"{p:g}%", _fmt(pct["positive"][i], 4), _fmt(pct["negative"][i], 4),
                      _fmt(cum["positive"][i]), _fmt(cum["negative"][i]))
    console.print(table)
    if pct["n_positive"] + pct["n_negative"] == 0:
        console.print("[yellow]every token has c = 0: each group's rewards are all equal (GRPO advantage 0); raise "
                      "--n or choose problems the model solves sometimes[/]")
    return res


def _branch(args, ctx: Context, console) -> dict:
    cuts = sorted(set(args.cuts))
    gen = ctx.generator(args.seed)
    per_problem, records = [], []
    with _bar(console) as bar:
        job = bar.add_task("branching", total=len(ctx.problems))
        for p in ctx.problems:
            ro, base_reward, _ = ctx.sample([p], 1, gen)
            length = int(ro.lengths[0])
            response = ro.response_ids[0, :length].tolist()
            entropy = ro.behavior_entropy[0, :length].tolist()
            continuations = P.ContinuationSampler(ctx.sampler, ctx.tok, args.k, ctx.score_fn(p),
                                                  temperature=ctx.temperature, generator=gen)
            results = P.branch_probe(continuations, ctx.encode(p), response, cuts,
                                     extract_answer=ctx.task.extract_answer, entropy=entropy)
            per_problem.append(results)
            records.append({"id": str(p.meta.get("id", len(records))), "base_reward": base_reward[0],
                            "base_length": length,
                            "cuts": [{k: v for k, v in r.items() if k != "texts"} for r in results]})
            bar.advance(job)
    summary = P.branch_summary(per_problem, cuts)
    table = Table(title=f"branching from a base response ({len(ctx.problems)} problems, k={args.k} continuations)")
    for col in ("cut", "problems", "accuracy", f"maj@{args.k}", "entropy at cut"):
        table.add_column(col, justify="right")
    for r in summary:
        table.add_row(str(r["cut"]), str(r["problems"]), _fmt(r["accuracy"]), _fmt(r["maj"]), _fmt(r["entropy"]))
    console.print(table)
    return {"cuts": cuts, "k": args.k, "summary": summary, "problems": records}


def _perturb(args, ctx: Context, console) -> dict:
    gen = ctx.generator(args.seed)
    token_gen = torch.Generator().manual_seed(args.seed + 1)
    counts = {m: {"high": [0, 0], "low": [0, 0]} for m in args.modes}
    records, skipped = [], 0
    with _bar(console) as bar:
        job = bar.add_task("perturbing", total=len(ctx.problems))
        for p in ctx.problems:
            ro, rewards, correct = ctx.sample([p], args.attempts, gen)
            pick = next((i for i, c in enumerate(correct) if c or args.any_response), None)
            bar.advance(job)
            if pick is None:
                skipped += 1
                continue
            length = int(ro.lengths[pick])
            continuations = P.ContinuationSampler(ctx.sampler, ctx.tok, args.k, ctx.score_fn(p),
                                                  temperature=ctx.temperature, generator=gen)
            res = P.perturb_probe(continuations, ctx.encode(p), ro.response_ids[pick, :length].tolist(),
                                  ro.behavior_entropy[pick, :length].tolist(), frac=args.frac, modes=args.modes,
                                  token_generator=token_gen)
            for mode, sides in res.items():
                for side, got in sides.items():
                    counts[mode][side][0] += sum(r > 0.5 for r in got["rewards"])
                    counts[mode][side][1] += len(got["rewards"])
            records.append({"id": str(p.meta.get("id", len(records))), "base_reward": rewards[pick], **res})
    if not records:
        raise ValueError(f"perturb: no problem had a correct response among --attempts {args.attempts} samples "
                         f"(the paper perturbs responses the model gets right); raise --attempts, choose easier "
                         f"problems, or pass --any-response")
    tests = {}
    for mode, c in counts.items():
        (sh, nh), (sl, nl) = c["high"], c["low"]
        t = P.compare_proportions(sh, nh, sl, nl)
        tests[mode] = {"accuracy_high": t["rate_1"], "n_high": nh, "accuracy_low": t["rate_2"], "n_low": nl,
                       "drop": t["rate_2"] - t["rate_1"], "fisher_p": t["fisher_p"], "z": t["z"], "z_p": t["z_p"]}
    table = Table(title=f"perturbing the top / bottom {args.frac:.0%} entropy tokens ({len(records)} responses, "
                        f"{skipped} problems without a usable response, k={args.k})")
    for col in ("mode", "high-entropy acc", "low-entropy acc", "low - high", "Fisher p", "z-test p"):
        table.add_column(col, justify="right")
    for mode, t in tests.items():
        table.add_row(mode, f"{_fmt(t['accuracy_high'])} ({t['n_high']})", f"{_fmt(t['accuracy_low'])} ({t['n_low']})",
                      _fmt(t["drop"]), f"{t['fisher_p']:.3g}", f"{t['z_p']:.3g}")
    console.print(table)
    return {"frac": args.frac, "k": args.k, "modes": list(args.modes), "skipped": skipped, "tests": tests,
            "responses": records}


def _update(args, ctx: Context, console) -> dict:
    # the step takes the full lr (no warm-up); --set and --lr override the run's config or the defaults
    overrides = ["optim.warmup_steps=0", *args.set] + ([f"optim.lr={args.lr}"] if args.lr is not None else [])
    cfg = load_config(ctx.run_config_path, overrides)  # the run's training config, or the defaults
    ro, rewards, correct = ctx.sample(ctx.problems, args.n, ctx.generator(args.seed))
    ref = make_reference(ctx.sampler.model) if requirements(cfg.algo).ref else None
    eff = P.one_update_effects(ctx.sampler.model, ro, rewards, cfg, temperature=ctx.temperature, ref=ref,
                               seed=args.seed)
    mask = ro.mask
    delta = (eff["logprobs_after"].exp() - eff["logprobs_before"].exp()) * mask
    tokens = [[ctx.tok.decode([i]) for i in row[:int(n)]] for row, n in zip(ro.response_ids.tolist(), ro.lengths)]
    ppl = response_perplexity(eff["logprobs_before"], mask)
    summary = P.update_shift_summary(delta, eff["entropy_before"], mask, correct=correct, tokens=tokens, ppl=ppl,
                                     settings=P.ShiftSummarySettings(top_frac=args.top_frac))
    drops = P.entropy_change_by_token(eff["entropy_before"], eff["entropy_after"], mask, tokens)
    o = summary["overall"]
    console.print(Text(f"one update (lr {cfg.optim.lr:g}, {cfg.algo.advantage}, {len(rewards)} responses, mean "
                       f"reward {sum(rewards) / len(rewards):.3f}): {o['tokens']} tokens, mean |dp| "
                       f"{o['mean_abs_shift']:.3g}, top {args.top_frac:.0%} from |dp| >= {o['top_threshold']:.3g}; "
                       f"mean entropy of the top tokens {o['mean_entropy_top']:.3f} vs {o['mean_entropy_all']:.3f}"))
    table = Table(title="probability shift by outcome (STILL Fig. 4a)")
    for col in ("responses", "tokens", "mean dp", "share raised", "share in top"):
        table.add_column(col, justify="right")
    for name, r in summary["by_outcome"].items():
        table.add_row(name, str(r["tokens"]), _fmt(r["mean_shift"], 4), _fmt(r["share_raised"]),
                      _fmt(r["share_in_top"]))
    console.print(table)
    cats = Table(title="by token category (STILL 3.2.2) and entropy bin (Fig. 4b)")
    for col in ("group", "tokens / range", "mean |dp|", "share in top"):
        cats.add_column(col, justify="right")
    for name, r in summary["by_category"].items():
        cats.add_row(name, str(r["tokens"]), _fmt(r["mean_abs_shift"], 4), _fmt(r["share_in_top"]))
    for i, r in enumerate(summary["by_entropy"]):
        cats.add_row(f"entropy bin {i + 1}", f"{r['low']:.2f}-{r['high']:.2f}", _fmt(r["mean_abs_shift"], 4),
                     _fmt(r["share_in_top"]))
    console.print(cats)
    return {"lr": cfg.optim.lr, "algo": cfg.algo.advantage, "shapers": list(cfg.algo.shapers),
            "responses": len(rewards), "mean_reward": sum(rewards) / len(rewards), "summary": summary,
            "entropy_drop_tokens": drops, "update_stats": eff["stats"]}


RUNS = {"position": _position, "covariance": _covariance, "branch": _branch, "perturb": _perturb, "update": _update}
"""Each probe's function: (args, Context, console) -> its result."""
