"""`explorl eval --model MODEL`: pass@k / maj@k of a model on a task's held-out split
(`explorl.evaluation.evaluate`), with the settings resolved by `explorl.evaluation.settings` (a run's output is
evaluated as the run did; flags override)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import yaml
from rich.progress import Progress
from rich.table import Table
from rich.text import Text

import explorl.commands.common as common
import explorl.evaluation.evaluate as evaluation  # `evaluation.evaluate` looked up at call time: tests replace it
from explorl.analysis.completions import COMPLETION_FIELDS
from explorl.analysis.measures import mean_answer_diversity
from explorl.commands.common import (_check_device, _check_ks_within_n, _parse_ks, _print_table, _run_code_trust,
                                     _task_opts, _unused_path, _use_code_flags, add_overwrite_flag, refuse_to_replace)
from explorl.config import ModelConfig, eval_set_task, from_dict, held_out_task
from explorl.evaluation.evaluate import EvalPlan, curve_ks, k_curves, match_entropy, sampled_entropy
from explorl.evaluation.failures import report_reward_failures, reward_calls
from explorl.evaluation.settings import SamplingFlags, resolve_eval_settings
from explorl.models import load_model_under_test, weights_fingerprint
from explorl.rewards import reward_versions
from explorl.rollout.temperature_schedules import PromptTemperature
from explorl.runs import nofollow
from explorl.tasks import load_task
from explorl.tasks.chat import prompt_encoder
from explorl.train.preflight import check_eval_prompts


def add_parser(sub) -> None:
    e = sub.add_parser("eval", help="pass@k / maj@k of a model on a task's held-out split")
    e.add_argument("--model", default="embedded",
                   help="model directory, LoRA adapter directory, `embedded`, or a run's output (RUN, RUN/final, "
                        "RUN/checkpoints/step_N: task, template, length limit, eval split, temperature and top_p "
                        "then come from RUN/config.yaml unless given here)")
    e.add_argument("--task", default=None, help="arith, file, hf (a Hugging Face dataset), rg:<name>, or a plugin's "
                                                "task (default: the run's task, else arith)")
    e.add_argument("--task-opt", action="append", default=[], metavar="FIELD=VALUE",
                   help="task.* setting, e.g. --task-opt path=test.jsonl (repeatable; `path` alone evaluates on "
                        "every row of that file)")
    e.add_argument("--n", type=int, default=16, help="samples per problem")
    e.add_argument("--k", default=None, help="comma-separated k values of pass@k (default 1,2,4,8,16; with --curve "
                                             "1, 2, 4, ..., n: the powers of two below --n, and --n)")
    e.add_argument("--temperature", type=float, default=None,
                   help="sampling temperature (default: the run's run.eval_temperature, else 1.0)")
    e.add_argument("--top-p", type=float, default=None, help="nucleus mass (default: the run's, else 1.0)")
    e.add_argument("--max-new-tokens", type=int, default=None,
                   help="length limit (default: the run's sampling.max_new_tokens, else 64)")
    e.add_argument("--schedule", default=None,
                   help="sampling temperature schedule: the default samples at --temperature; a registered schedule "
                        "with a per-token temperature anneals each response as at training step 0, e.g. EAD's "
                        "EAD at inference time (section 5.4) with --schedule-opt d0=D for its decay constant")
    e.add_argument("--schedule-opt", action="append", default=[], metavar="FIELD=VALUE",
                   help="an option of --schedule (its sampling.<schedule>.<field>), e.g. d0=25 (repeatable)")
    e.add_argument("--match-entropy", metavar="VALUE|base", default=None,
                   help="sample at the temperature where the model's mean token entropy on the first --calibration "
                        "problems equals VALUE (nats), or `base`: the base model's at T = 1 (a run's starting model, "
                        "or the model itself), found by bisection; compares models at equal sampling entropy")
    e.add_argument("--calibration", type=int, default=32, metavar="N",
                   help="--match-entropy: calibration problems (the first N of the split) and 4 samples each")
    e.add_argument("--config", metavar="FILE", help="a config file whose task, sampling and held-out sets "
                   "(run.eval_sets) to evaluate with, as a run's config.yaml gives them; flags override it (a run's "
                   "output: its config.yaml then gives only the model)")
    e.add_argument("--python-path", action="append", default=[], metavar="DIR",
                   help="a directory searched first for modules, e.g. of your reward (--task-opt reward=mod:fn) or "
                        "plugins; repeatable (a run's own run.python_path only when named here)")
    e.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                   help="a module to import first (it registers tasks, schedules, ...); repeatable (a run's own "
                        "run.plugins only when named here)")
    e.add_argument("--limit", type=int, default=0, help="evaluate only the first N problems (0 = all)")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--device", default="auto")
    e.add_argument("--dtype", default="auto")
    e.add_argument("--out", help="summary JSON path (default runs/eval/MODEL-TASK.json, MODEL = RUN_final or "
                                 "RUN_step_N for a run's output; a taken name gets -2, -3, ...)")
    e.add_argument("--per-problem", help="write one JSON line per problem here")
    e.add_argument("--eval-set", action="append", default=[], metavar="NAME=MAPPING",
                   help="also evaluate on another held-out set, reported on its own: task settings layered over "
                        "the evaluated task's, e.g. --eval-set 'ood={difficulties: [8, 9]}' or --eval-set "
                        "'math500={name: file, path: math500.jsonl}' (repeatable; default: a run's run.eval_sets)")
    e.add_argument("--save-completions", metavar="FILE",
                   help="write every sampled completion with its problem, reward and extracted answer, one JSON "
                        "line each (read by `explorl analyze FILE`)")
    e.add_argument("--curve", action="store_true",
                   help="also pass@k and maj@k against k = 1, 2, 4, ..., n with 95%% bootstrap intervals over "
                        "problems (the summary's `curve`; plot several with `explorl curves`)")
    e.add_argument("--analyze", action="store_true",
                   help="also the unsolvable set, rollout branching factor, entropy profile, answer diversity, "
                        "and per-problem results (default MODEL-TASK.problems.jsonl beside --out)")
    add_overwrite_flag(e)
    e.set_defaults(fn=cmd_eval)


def _schedule_opts(items: list[str]) -> dict:
    """`--schedule-opt FIELD=VALUE` flags as a mapping, each value read as YAML (`d0=25` is the number 25)."""
    out = {}
    for item in items:
        field, sep, raw = item.partition("=")
        if not sep or not field.strip():
            raise SystemExit(f"--schedule-opt {item!r}: expected FIELD=VALUE, an option of --schedule (e.g. d0=25)")
        try:
            out[field.strip()] = yaml.safe_load(raw)
        except yaml.YAMLError:
            out[field.strip()] = raw
    return out


def _eval_sets(flags: list[str], task_cfg, run_cfg) -> dict:
    """More held-out sets for `explorl eval`: `--eval-set NAME=MAPPING` (task settings as YAML, layered over the
    evaluated task's, `config.held_out_task`), or without flags the evaluated run's `run.eval_sets`."""
    if run_cfg is not None:
        return {name: eval_set_task(run_cfg, name) for name in run_cfg.run.eval_sets}
    out = {}
    for flag in flags:
        name, _, raw = flag.partition("=")
        try:
            fields = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            fields = None
        if not name or not isinstance(fields, dict):
            raise SystemExit(f"--eval-set {flag!r}: expected NAME={{field: value, ...}} (task settings over the "
                             f"evaluated task's), e.g. --eval-set 'ood={{difficulties: [8, 9]}}'")
        out[name] = held_out_task(task_cfg, fields, f"--eval-set {name}: task.")
    return out


def _fingerprints(run, run_cfg, model_path: str) -> dict:
    """What an evaluation record says about the weights: `model_fingerprint` of the evaluated weights (None for a
    training checkpoint, which holds only the trained tensors) and `base_fingerprint`, the model a run started from
    (its config's `model.fingerprint`) or, for a plain model, the model itself (`evaluate.check_same_base`)."""
    if run is None:
        fingerprint = weights_fingerprint(model_path)
        return {"model_fingerprint": fingerprint, "base_fingerprint": fingerprint}
    return {"model_fingerprint": weights_fingerprint(run.model_dir) if run.kind == "final" else None,
            "base_fingerprint": run_cfg.model.fingerprint or None}


def cmd_eval(args) -> int:
    """Check the flags, resolve the settings (a run's own, flags override), load the model, evaluate it on the
    split and on each extra held-out set, print the table and write the summary (and what the flags ask for)."""
    console = common.console
    ks = _eval_ks(args)
    _check_ks_within_n(ks, args.n)
    _use_code_flags(args.python_path, args.plugin)  # before a reward module is imported or a worker starts
    opts = _task_opts(args.task_opt)
    _check_match_entropy_flags(args)  # checked before any model loads
    _check_device(args.device)
    for flag, path in (("--out", args.out), ("--save-completions", args.save_completions),
                       ("--per-problem", args.per_problem)):
        refuse_to_replace(path, flag, args.overwrite)  # before any model loads
    model_cfg = from_dict(ModelConfig, {"path": args.model, "device": args.device, "dtype": args.dtype})
    flags = SamplingFlags(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                          schedule=args.schedule, schedule_options=_schedule_opts(args.schedule_opt))
    s = resolve_eval_settings(args.model, args.task, opts, flags=flags, limit=args.limit, config=args.config,
                              trust=_run_code_trust(args, opts))
    run, run_cfg, task_cfg, problems = s.run, s.run_cfg, s.task_cfg, s.problems
    if args.match_entropy is not None and s.sampler_temperature.anneal is not None:
        raise SystemExit(f"--match-entropy: sets one temperature; it does not combine with the per-token "
                         f"--schedule {s.schedule}; drop one of them")
    # checked before the model loads: more held-out sets (--eval-set, else the run's run.eval_sets)
    extra_sets = _eval_sets(args.eval_set, task_cfg, run_cfg if not args.eval_set else None)
    _print_settings(s)
    model, tok = load_model_under_test(run, run_cfg, model_cfg, console)
    check_eval_prompts(tok, model.config, s, extra_sets, args.limit)  # every prompt fits, before any sampling
    label = run.label if run is not None else Path(args.model).name
    matched = None
    sampler = s.sampler(model, tok)
    if args.match_entropy is not None:
        s, matched = _match_entropy(args, s, sampler, tok, model_cfg)
    failures: list = []
    summary, per_problem, sets = _evaluate_all(args, s, sampler, tok, ks, extra_sets, failures)
    if args.curve:
        summary["curve"] = k_curves(per_problem, seed=args.seed)
    if sets:
        summary["sets"] = sets
    out = {"model": args.model, "label": label, "run_config": str(run.config_path) if run is not None else None,
           **_fingerprints(run, run_cfg, args.model),
           "task": task_cfg.name, "temperature": s.temperature, "schedule": s.schedule,
           "schedule_options": s.schedule_options, "settings": s.record(),
           "reward_versions": reward_versions(task_cfg.reward), **summary}
    if matched is not None:
        out["match_entropy"] = matched
    _print_table(f"{task_cfg.name} ({len(problems)} problems, n={args.n})",
                 {label: summary, **{f"{label} on {k}": v for k, v in sets.items()}}, ks)
    out_path = _out_path(args.out, label, task_cfg.name)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    per_problem_path = Path(args.per_problem) if args.per_problem else None
    if args.analyze:
        _add_analysis(out, summary, per_problem, args.n)
        per_problem_path = per_problem_path or out_path.with_suffix(".problems.jsonl")
    nofollow.write_file(out_path, json.dumps(out, indent=2))  # a symbolic link there is refused, never followed
    console.print(Text(f"wrote {out_path}"))
    failed = _reward_failures(failures, summary, s)
    if failed is not None:
        return failed
    if args.save_completions:
        _write_completions(Path(args.save_completions), per_problem)
    if per_problem_path is not None:
        _write_per_problem(per_problem_path, per_problem)
    return 0


def _eval_ks(args) -> list[int]:
    """`--k`, else with `--curve` the curve's own k (`evaluate.curve_ks`, never beyond n), else 1, 2, 4, 8, 16."""
    if args.k is not None:
        return _parse_ks(args.k)
    if args.curve:
        return curve_ks(args.n)
    return _parse_ks("1,2,4,8,16")


def _check_match_entropy_flags(args) -> None:
    """`--match-entropy` is a number (nats) or `base`, and `--calibration` at least 1 (when it is given)."""
    if args.match_entropy is None:
        return
    if args.match_entropy != "base":
        try:
            float(args.match_entropy)
        except ValueError:
            raise SystemExit(f"--match-entropy: {args.match_entropy!r} is neither a number (nats) nor `base`; "
                             "pass e.g. --match-entropy 0.8 or --match-entropy base") from None
    if args.calibration < 1:
        raise SystemExit(f"--calibration: {args.calibration} must be at least 1 (problems to calibrate on)")


def _print_settings(s) -> None:
    """The settings the evaluation runs with, each with where it came from."""
    shown = Table(title=Text("eval settings" + (f" (config: {s.config_path}; flags override it)"
                                                if s.config_path is not None else "")))
    for col in ("setting", "value", "from"):
        shown.add_column(col, overflow="fold")
    for name, value, where in s.settings:
        shown.add_row(Text(name), Text(repr(value) if name == "prompt template" else str(value)), Text(where))
    common.console.print(shown)


def _evaluate_all(args, s, sampler, tok, ks: list[int], extra_sets: dict, failures: list) -> tuple[dict, list, dict]:
    """(summary, per-problem results) on the evaluated split, and the summary of each extra held-out set, reported
    on its own; every reward failure of the split is appended to `failures`."""
    with Progress(console=common.console, disable=not common.console.is_terminal) as bar:
        job = bar.add_task("eval", total=len(s.problems))
        plan = EvalPlan(n=args.n, ks=ks, temperature=s.sampler_temperature, seed=args.seed,
                        reward_timeout_s=s.task_cfg.reward_timeout_s, analyze=args.analyze,
                        keep_completions=bool(args.save_completions))
        summary, per_problem = evaluation.evaluate(sampler, tok, s.problems, s.task, plan,
                                                   encode=prompt_encoder(tok, s.task_cfg),
                                                   progress=lambda k: bar.advance(job, k), failures=failures)
        sets = {}
        for set_name, set_cfg in extra_sets.items():
            set_task = load_task(set_cfg)
            set_problems = set_task.eval[: args.limit] if args.limit else set_task.eval
            job = bar.add_task(f"eval {set_name}", total=len(set_problems))
            set_plan = EvalPlan(n=args.n, ks=ks, temperature=s.sampler_temperature, seed=args.seed,
                                reward_timeout_s=set_cfg.reward_timeout_s)
            sets[set_name], _ = evaluation.evaluate(sampler, tok, set_problems, set_task, set_plan,
                                                    encode=prompt_encoder(tok, set_cfg),
                                                    progress=lambda k, j=job: bar.advance(j, k))
    return summary, per_problem, sets


def _add_analysis(out: dict, summary: dict, per_problem, n: int) -> None:
    """`--analyze`: the unsolvable problems and the answer diversity added to the record `out`, and said with the
    branching factor and the entropy profile."""
    unsolvable = sorted(r.id for r in per_problem if not any(r.correct))
    out["unsolvable"] = unsolvable
    out["answer_diversity"] = mean_answer_diversity({r.id: r.answers for r in per_problem})
    profile = ", ".join("-" if v is None else f"{v:.3f}" for v in summary["entropy/by_position"])
    common.console.print(f"unsolvable with n={n}: {len(unsolvable)} of {len(per_problem)} problems; "
                         f"mean rollout branching factor {summary['branching']:.3f}; distinct answers per problem "
                         f"{out['answer_diversity']:.2f}\nentropy by relative position (10 bins): {profile}")


def _match_entropy(args, s, sampler, tok, model_cfg):
    """`--match-entropy`: the settings with the temperature at which the model's mean token entropy on the first
    `--calibration` problems equals the target (`evaluate.match_entropy`), and what was found, for the record."""
    calib = s.problems[:args.calibration]
    encode = prompt_encoder(tok, s.task_cfg)
    kw = dict(n=4, seed=args.seed, encode=encode)
    if args.match_entropy == "base":
        base = sampler  # a plain model is its own base; a run's output is measured against its starting model
        if s.run is not None:
            base_cfg = dataclasses.replace(s.run_cfg.model, device=model_cfg.device, dtype=model_cfg.dtype)
            base = s.sampler(load_model_under_test(None, None, base_cfg, common.console)[0], tok)
        target, of = sampled_entropy(base, tok, calib, 1.0, **kw), "base"
    else:
        target, of = float(args.match_entropy), "value"
    m = match_entropy(sampler, tok, calib, target, **kw)
    source = "the base model at T = 1" if of == "base" else "given"
    common.console.print(Text(f"matched entropy: target {m.target:.4f} ({source}), "
                              f"temperature {m.temperature:.4f}, entropy reached {m.entropy:.4f} "
                              f"({m.iterations} bisection steps; calibration: {m.problems} problems x {m.n} samples)"))
    record = {**dataclasses.asdict(m), "of": of}
    settings = [(name, f"{m.temperature:.4f} (--match-entropy {args.match_entropy})" if name == "temperature" else v,
                 "--match-entropy" if name == "temperature" else w) for name, v, w in s.settings]
    return dataclasses.replace(s, temperature=m.temperature, sampler_temperature=PromptTemperature(m.temperature),
                               settings=settings), record


def _reward_failures(failures: list, summary: dict, s) -> int | None:
    """Say on the console when reward calls failed during the evaluation (`evaluation.failures`, the words `explorl
    train` uses for its own evaluations); exit code 1 when most did (pass@k then measures the failures, not the
    model), else None. The reward and where it came from are named."""
    reward = next((f"{value!r} (from {where})" for name, value, where in s.settings if name == "reward"), "")
    most = report_reward_failures(common.console, failures, reward_calls(summary, s.task), reward,
                                  fix="The pass@k above measures the failures, not the model; fix the reward (e.g. "
                                      "--task-opt reward=...) and evaluate again.")
    return 1 if most else None


def _out_path(given: str | None, label: str, task_name: str) -> Path:
    """The summary's path: `--out` (an existing one only with --overwrite: `refuse_to_replace`, checked before the
    evaluation), or runs/eval/LABEL-TASK.json named apart from any earlier evaluation (never overwritten)."""
    if given:
        out_path = Path(given)
        if out_path.exists():
            common.console.print(Text(f"--out {out_path} exists: replacing it (--overwrite)"), style="yellow")
        return out_path
    default = Path(f"runs/eval/{label}-{task_name.replace(':', '_')}.json")
    out_path = _unused_path(default)
    if out_path != default:
        common.console.print(Text(f"{default} exists (an earlier evaluation): writing {out_path} instead"),
                             style="yellow")
    return out_path


def _write_completions(path: Path, per_problem) -> None:
    """Every sampled completion with its problem, reward and extracted answer, one JSON line each."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with nofollow.open_new(path) as f:  # a symbolic link there is refused, never followed
        for r in per_problem:
            for i, text in enumerate(r.completions):
                row = (r.id, i, r.prompt, r.answer, text, r.answers[i], r.rewards[i], r.correct[i])
                f.write(json.dumps(dict(zip(COMPLETION_FIELDS, row))) + "\n")
    common.console.print(Text(f"wrote {path} ({sum(len(r.completions) for r in per_problem)} completions; "
                              f"`explorl analyze {path}` reports on them)"))


def _write_per_problem(path: Path, per_problem) -> None:
    """One JSON line per problem: its results without the sampled texts."""
    with nofollow.open_new(path) as f:  # a symbolic link there is refused, never followed
        for r in per_problem:
            f.write(json.dumps({k: v for k, v in r.__dict__.items() if k != "completions"}) + "\n")
    common.console.print(Text(f"wrote {path} (one line per problem)"))
