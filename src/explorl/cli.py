"""The `explorl` command: train, eval, sft, rft, bootstrap, demo, config, ..."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from explorl.config import ConfigError, dump_yaml, load_config, reference

console = Console()


def _parse_list(text: str, flag: str, kind=int, example: str = "0,8,16") -> list:
    """Comma-separated numbers of a flag, e.g. --cuts 0,8,16; SystemExit naming the flag otherwise."""
    try:
        values = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"{flag}: expected comma-separated numbers such as {example}, got {text!r}") from None
    if not values:
        raise SystemExit(f"{flag}: give at least one value")
    return values


def _parse_ks(text: str) -> list[int]:
    ks = _parse_list(text, "--k", example="1,2,4,8")
    if any(k < 1 for k in ks):
        raise SystemExit(f"--k: every k must be >= 1, got {text!r}")
    return ks


def _run_config(args, command: str, example: str):
    """The config of `explorl train` / `explorl sft`: CONFIG with overrides, or with `--resume RUN` the run's own
    config.yaml (overrides still apply)."""
    if args.resume:
        run = Path(args.resume)
        if not (run / "config.yaml").exists():
            raise ConfigError(f"--resume {run}: no config.yaml there; give a run directory made by `explorl {command}`")
        overrides = list(args.overrides)
        if args.config is not None:  # argparse puts the first override in the CONFIG slot
            if "=" not in args.config:
                raise ConfigError(f"explorl {command}: give a CONFIG file or --resume RUN, not both "
                                  f"(a resumed run uses {run / 'config.yaml'}; change it with key=value overrides)")
            overrides.insert(0, args.config)
        return load_config(run / "config.yaml", overrides)
    if args.config is None:
        raise ConfigError(f"explorl {command}: give a CONFIG file (e.g. {example}) or --resume RUN")
    return load_config(args.config, args.overrides)


def cmd_train(args) -> int:
    cfg = _run_config(args, "train", "configs/quickstart.yaml")
    console.rule("resolved config")
    console.print(Syntax(dump_yaml(cfg), "yaml", background_color="default", word_wrap=True))  # never crop
    from explorl.models import check_run_inputs

    checks = check_run_inputs(cfg, resume=args.resume)  # the same checks before a real run as for --dry-run
    if args.dry_run:
        console.print("[green]config is valid[/] (dry run: nothing trained); checked without loading weights:")
        _print_checks(checks)
        return 0
    from explorl.trainer import train

    run_dir = train(cfg, resume=args.resume, console=console)
    result = json.loads((run_dir / "eval.json").read_text())
    _print_table("held-out evaluation", {"trained": result}, cfg.run.eval_k)
    console.print(f"run directory: {run_dir}")
    return 0


def _print_checks(checks) -> None:
    for what, result in checks:
        style = "yellow" if result.startswith("warning:") else "green"
        console.print(Text.assemble(("  ok " if style == "green" else "  !! ", style), f"{what}: {result}"))


def _task_opts(items: list[str]) -> dict[str, str]:
    opts = {}
    for item in items:
        if "=" not in item:
            raise SystemExit(f"--task-opt {item!r}: expected field=value (a task.* field such as path=data.jsonl)")
        k, v = item.split("=", 1)
        opts[k.strip()] = v
    return opts


def _eval_split(task_cfg, count: int, all_rows: bool) -> str:
    """The held-out problems an evaluation uses, in words."""
    if task_cfg.name == "file":
        if all_rows:
            return f"all {count} rows of {task_cfg.eval_path}"
        if task_cfg.eval_path:
            return f"first {count} rows of {task_cfg.eval_path} (task.eval_size={task_cfg.eval_size})"
        return f"last {count} rows of {task_cfg.path} (task.eval_size={task_cfg.eval_size}; the rest trains)"
    return f"{count} held-out problems (task.eval_size={task_cfg.eval_size}, task.data_seed={task_cfg.data_seed})"


def _unused_path(path: Path) -> Path:
    """`path`, or `stem-2.json`, `stem-3.json`, ... beside it if taken (with the .problems.jsonl file of each)."""
    def free(p: Path) -> bool:
        return not p.exists() and not p.with_suffix(".problems.jsonl").exists()

    i = 2
    candidate = path
    while not free(candidate):
        candidate = path.with_name(f"{path.stem}-{i}{path.suffix}")
        i += 1
    return candidate


def _inference_schedule(schedule: str, temperature: float, max_new_tokens: int, d: float):
    """The sampler's temperature for an inference-time schedule (paper 003 section 5.4): `fixed` is `temperature`;
    `ead` / `revead` are the registered training schedules at decay constant `d` (their step-0 table with d0 = d,
    times `temperature`), a function of the generated token's position."""
    if schedule == "fixed":
        return temperature
    import explorl.rollout.controllers  # noqa: F401  (registers the schedules)
    from explorl.algos.registry import lookup
    from explorl.config import Config, SamplingConfig, validate

    cfg = Config(sampling=SamplingConfig(schedule=schedule, temperature=temperature, max_new_tokens=max_new_tokens,
                                         ead_d0=d))
    try:
        validate(cfg)
    except ConfigError as e:
        raise SystemExit(f"--schedule {schedule} / --ead-d {d}: {e}") from None
    sampler_temperature, _, _ = lookup("temperature_schedule", schedule).fn(cfg, 2).at(0)
    return sampler_temperature


def _eval_sets(flags: list[str], task_cfg, run_cfg) -> dict:
    """More held-out sets for `explorl eval`: `--eval-set NAME=MAPPING` (task settings as YAML, layered over the
    evaluated task's, `config.held_out_task`), or without flags the evaluated run's `run.eval_sets`."""
    import yaml

    from explorl.config import eval_set_task, held_out_task

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


def cmd_eval(args) -> int:
    from explorl.bootstrap import load_model_under_test
    from explorl.config import DEVICES, ModelConfig, command_task, from_dict, valid_device
    from explorl.evaluate import evaluate
    from explorl.models import find_run_output
    from explorl.tasks import load_task
    from explorl.tasks.chat import prompt_encoder

    ks = _parse_ks(args.k)
    if max(ks) > args.n:
        raise SystemExit(f"--k: k={max(ks)} exceeds --n={args.n}; pass@k needs at least k samples per problem")
    opts = _task_opts(args.task_opt)
    if not valid_device(args.device):
        raise SystemExit(f"--device: {args.device!r} is not one of {DEVICES}")
    model_cfg = from_dict(ModelConfig, {"path": args.model, "device": args.device, "dtype": args.dtype})
    # a run's output (RUN, RUN/final, RUN/checkpoints/step_N): evaluate it as the run did, flags override
    run = find_run_output(args.model)
    run_cfg = load_config(run.config_path) if run is not None else None
    from_run = "run config" if run is not None else ""
    if run_cfg is not None and args.task in (None, run_cfg.task.name):
        task_from = from_run
    else:
        task_from = "--task" if args.task else "default"
    task_cfg = command_task(run_cfg, args.task, opts)
    # `--task-opt path=test.jsonl` alone names the file to evaluate on: all of its rows, not a training split
    whole_file = task_cfg.name == "file" and "path" in opts and "eval_path" not in opts

    def origin(flag_given: bool, flag: str, run_field: str) -> str:
        if flag_given:
            return flag
        return f"{from_run}: {run_field}" if run_cfg is not None else "default"

    def task_origin(*fields: str) -> str:
        given = [f for f in fields if f in opts]
        if given:
            return ", ".join(f"--task-opt {f}" for f in given)
        return f"{from_run}: task.{', task.'.join(fields)}" if task_from == from_run and from_run else "default"

    r = run_cfg
    max_new_tokens = args.max_new_tokens if args.max_new_tokens is not None else (
        r.sampling.max_new_tokens if r is not None else 64)
    temperature = args.temperature if args.temperature is not None else (
        r.run.eval_temperature if r is not None else 1.0)
    top_p = args.top_p if args.top_p is not None else (r.sampling.top_p if r is not None else 1.0)
    sampler_temperature = _inference_schedule(args.schedule, temperature, max_new_tokens, args.ead_d)
    fast_path = r.sampling.fast_path if r is not None else True
    try:
        task = load_task(task_cfg)
    except ValueError as e:
        if run is None:
            raise
        raise ValueError(f"{e} (the task settings come from {run.config_path}; override them with --task-opt "
                         f"FIELD=VALUE or --task)") from None
    # checked before the model loads: more held-out sets (--eval-set, else the run's run.eval_sets)
    extra_sets = _eval_sets(args.eval_set, task_cfg, run_cfg if not args.eval_set else None)
    problems = task.eval[: args.limit] if args.limit else task.eval
    split = _eval_split(task_cfg, len(task.eval), whole_file and "eval_size" not in opts)
    if args.limit and args.limit < len(task.eval):
        split += f"; the first {len(problems)} of them (--limit)"
    settings = [
        ("model", str(run.model_dir) if run is not None else args.model,
         f"{run.kind} of the run {run.run_dir}" if run is not None else "--model"),
        ("task", task_cfg.name, "--task" if args.task else task_origin("name")),
        ("prompt template", task_cfg.prompt_template, task_origin("prompt_template")),
        ("eval split", split, "--task-opt path" if whole_file else task_origin("path", "eval_path", "eval_size")),
        ("reward", task_cfg.reward, task_origin("reward")),
        ("max_new_tokens", max_new_tokens, origin(args.max_new_tokens is not None, "--max-new-tokens",
                                                  "sampling.max_new_tokens")),
        ("temperature", temperature, origin(args.temperature is not None, "--temperature", "run.eval_temperature")),
        ("top_p", top_p, origin(args.top_p is not None, "--top-p", "sampling.top_p")),
        ("schedule", args.schedule if args.schedule == "fixed" else f"{args.schedule}, d = {args.ead_d:g}",
         "--schedule" if args.schedule != "fixed" else "default"),
    ]
    shown = Table(title=Text("eval settings" + (f" (run config: {run.config_path}; flags override it)"
                                                if run is not None else "")))
    for col in ("setting", "value", "from"):
        shown.add_column(col, overflow="fold")
    for name, value, where in settings:
        shown.add_row(Text(name), Text(repr(value) if name == "prompt template" else str(value)), Text(where))
    console.print(shown)
    model, tok = load_model_under_test(run, run_cfg, model_cfg, console)
    label = run.label if run is not None else Path(args.model).name
    from rich.progress import Progress

    with Progress(console=console, disable=not console.is_terminal) as bar:
        job = bar.add_task("eval", total=len(problems))
        summary, per_problem = evaluate(model, tok, problems, task, n=args.n, ks=ks, temperature=sampler_temperature,
                                        encode=prompt_encoder(tok, task_cfg),
                                        top_p=top_p, max_new_tokens=max_new_tokens, seed=args.seed,
                                        reward_timeout_s=task_cfg.reward_timeout_s, fast_path=fast_path,
                                        progress=lambda k: bar.advance(job, k), analyze=args.analyze,
                                        keep_completions=bool(args.save_completions))
        sets = {}  # each extra held-out set reported on its own
        for set_name, set_cfg in extra_sets.items():
            set_task = load_task(set_cfg)
            set_problems = set_task.eval[: args.limit] if args.limit else set_task.eval
            job = bar.add_task(f"eval {set_name}", total=len(set_problems))
            sets[set_name], _ = evaluate(model, tok, set_problems, set_task, n=args.n, ks=ks,
                                         temperature=sampler_temperature, encode=prompt_encoder(tok, set_cfg),
                                         top_p=top_p, max_new_tokens=max_new_tokens, seed=args.seed,
                                         reward_timeout_s=set_cfg.reward_timeout_s, fast_path=fast_path,
                                         progress=lambda k, j=job: bar.advance(j, k))
    if args.curve:
        from explorl.evaluate import k_curves

        summary["curve"] = k_curves(per_problem, seed=args.seed)
    if sets:
        summary["sets"] = sets
    out = {"model": args.model, "label": label, "run_config": str(run.config_path) if run is not None else None,
           **_fingerprints(run, run_cfg, args.model),
           "task": task_cfg.name, "temperature": temperature, "schedule": args.schedule,
           "ead_d": args.ead_d if args.schedule != "fixed" else None,
           "settings": {name: {"value": value, "from": where} for name, value, where in settings}, **summary}
    _print_table(f"{task_cfg.name} ({len(problems)} problems, n={args.n})",
                 {label: summary, **{f"{label} on {k}": v for k, v in sets.items()}}, ks)
    if args.out:
        out_path = Path(args.out)
        if out_path.exists():
            console.print(Text(f"--out {out_path} exists: replacing it"), style="yellow")
    else:  # named after the run and its output; an earlier result is never overwritten
        default = Path(f"runs/eval/{label}-{task_cfg.name.replace(':', '_')}.json")
        out_path = _unused_path(default)
        if out_path != default:
            console.print(Text(f"{default} exists (an earlier evaluation): writing {out_path} instead"),
                          style="yellow")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    per_problem_path = Path(args.per_problem) if args.per_problem else None
    if args.analyze:
        from explorl.analysis.measures import mean_answer_diversity

        unsolvable = sorted(r.id for r in per_problem if not any(r.correct))
        out["unsolvable"] = unsolvable
        out["answer_diversity"] = mean_answer_diversity({r.id: r.answers for r in per_problem})
        per_problem_path = per_problem_path or out_path.with_suffix(".problems.jsonl")
        profile = ", ".join("-" if v is None else f"{v:.3f}" for v in summary["entropy/by_position"])
        console.print(f"unsolvable with n={args.n}: {len(unsolvable)} of {len(per_problem)} problems; "
                      f"mean rollout branching factor {summary['branching']:.3f}; distinct answers per problem "
                      f"{out['answer_diversity']:.2f}\nentropy by relative position (10 bins): {profile}")
    out_path.write_text(json.dumps(out, indent=2))
    console.print(Text(f"wrote {out_path}"))
    if args.save_completions:
        from explorl.analysis.completions import COMPLETION_FIELDS

        completions_path = Path(args.save_completions)
        completions_path.parent.mkdir(parents=True, exist_ok=True)
        with open(completions_path, "w") as f:
            for r in per_problem:
                for i, text in enumerate(r.completions):
                    row = (r.id, i, r.prompt, r.answer, text, r.answers[i], r.rewards[i], r.correct[i])
                    f.write(json.dumps(dict(zip(COMPLETION_FIELDS, row))) + "\n")
        console.print(Text(f"wrote {completions_path} ({sum(len(r.completions) for r in per_problem)} completions; "
                           f"`explorl analyze {completions_path}` reports on them)"))
    if per_problem_path is not None:
        with open(per_problem_path, "w") as f:
            for r in per_problem:
                f.write(json.dumps({k: v for k, v in r.__dict__.items() if k != "completions"}) + "\n")
        console.print(Text(f"wrote {per_problem_path} (one line per problem)"))
    return 0


def _fingerprints(run, run_cfg, model_path: str) -> dict:
    """What an evaluation record says about the weights: `model_fingerprint` of the evaluated weights (None for a
    training checkpoint, which holds only the trained tensors) and `base_fingerprint`, the model a run started from
    (its config's `model.fingerprint`) or, for a plain model, the model itself (`evaluate.check_same_base`)."""
    from explorl.models import weights_fingerprint

    if run is None:
        fingerprint = weights_fingerprint(model_path)
        return {"model_fingerprint": fingerprint, "base_fingerprint": fingerprint}
    return {"model_fingerprint": weights_fingerprint(run.model_dir) if run.kind == "final" else None,
            "base_fingerprint": run_cfg.model.fingerprint or None}


def cmd_export(args) -> int:
    import os
    import shutil

    from explorl.models import (adapter_base, check_fingerprint, find_run_output, is_adapter_dir, load_causal_lm, load_run_output,
                                resolve_dtype, resolve_model_path)

    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"--out {out}: already exists and is not an empty directory; export never overwrites, "
                              f"choose a new directory")
    run = find_run_output(args.source)
    if run is not None:
        run_cfg = load_config(run.config_path)
        lora = is_adapter_dir(run.model_dir) or (run.kind == "checkpoint" and run_cfg.model.lora.enabled)
        what = f"{run.kind} of the run {run.run_dir}"
    else:
        path = resolve_model_path(args.source)
        lora = is_adapter_dir(path)
        what = f"LoRA adapter {path} on {adapter_base(path)}" if lora else f"model {path}"
    if lora and not args.merge:
        raise ConfigError(f"{args.source}: holds LoRA adapters, not a standalone model; add --merge to write the base "
                          f"model with the adapters merged into its weights")
    if run is not None:
        if run.kind == "checkpoint":
            check_fingerprint(run_cfg.model)
        model, tok, _ = load_run_output(run, run_cfg, device="cpu", dtype=args.dtype)
    else:
        import torch

        model, tok = load_causal_lm(path, resolve_dtype(args.dtype, torch.device("cpu")))
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp))
    tok.save_pretrained(str(tmp))
    if out.exists():
        out.rmdir()  # empty, checked above
    os.replace(tmp, out)
    merged = " (LoRA adapters merged)" if lora else ""
    console.print(Text(f"wrote {out}: {what}{merged} as a standard Hugging Face model directory, weights and "
                       f"tokenizer (AutoModelForCausalLM.from_pretrained; `model.path` or `--model` of explorl)"))
    return 0


def cmd_venn(args) -> int:
    from explorl.analysis.measures import set_overlaps, unsolvable_set
    from explorl.report.plots import plot_venn

    if not 2 <= len(args.files) <= 3:
        raise SystemExit("explorl venn: give 2 or 3 per-problem files written by `explorl eval --analyze`")
    sets = {}
    for f in args.files:
        path = Path(f)
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such file (write one with `explorl eval --analyze`)")
        results = {}
        for i, line in enumerate(path.read_text().splitlines(), 1):
            try:
                row = json.loads(line)
                results[row["id"]] = row["correct"]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{i}: not a per-problem line of `explorl eval --analyze` ({e})") from None
        name = path.name.removesuffix(".problems.jsonl")
        sets[name] = unsolvable_set(results, args.k)
    out = plot_venn(sets, args.out, title=f"{args.k}-rollout unsolvable problems")
    for region, count in set_overlaps(sets).items():
        console.print(f"{region}: {count}")
    console.print(f"wrote {out}")
    return 0


def cmd_curves(args) -> int:
    from explorl.report.plots import crossings, plot_k_curves

    curves, summaries = {}, {}
    labels = args.labels.split(",") if args.labels else []
    if labels and len(labels) != len(args.files):
        raise SystemExit(f"--labels: {len(labels)} names for {len(args.files)} files")
    for i, f in enumerate(args.files):
        path = Path(f)
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such file (write one with `explorl eval --curve`)")
        summary = json.loads(path.read_text())
        if "curve" not in summary:
            raise ValueError(f"{path}: has no `curve`; evaluate with `explorl eval --curve` (n >= 2k for the "
                             f"largest k you want)")
        name = labels[i] if labels else summary.get("label") or path.stem
        name = name if name not in curves else f"{name}-{i}"
        curves[name], summaries[name] = summary["curve"], summary
    names = list(curves)
    table = Table(title=f"{args.metric} against k")
    table.add_column("k", justify="right")
    for name in names:
        table.add_column(name, justify="right")
    ks = curves[names[0]]["k"]
    for k in ks:
        cells = []
        for name in names:
            c = curves[name]
            if k in c["k"]:
                mean, lo, hi = c[args.metric][c["k"].index(k)]
                cells.append(f"{mean:.3f} [{lo:.3f}, {hi:.3f}]")
            else:
                cells.append("-")
        table.add_row(str(k), *cells)
    console.print(table)
    paired = {}
    if args.metric == "pass@k" and all("problems" in curves[n] for n in names):
        from explorl.evaluate import check_same_base, paired_pass_difference

        for warning in check_same_base(summaries):
            console.print(Text(f"warning: {warning}"), style="yellow")

        base = curves[names[0]]
        paired = {name: paired_pass_difference(base, curves[name]) for name in names[1:]}
        diff = Table(title=f"pass@k minus {names[0]}, paired over the shared problems (95% bootstrap interval)")
        diff.add_column("k", justify="right")
        for name in names[1:]:
            diff.add_column(name, justify="right")
        for k in base["k"]:
            cells = [f"{paired[n][k][0]:+.3f} [{paired[n][k][1]:+.3f}, {paired[n][k][2]:+.3f}]" if k in paired[n]
                     else "-" for n in names[1:]]
            diff.add_row(str(k), *cells)
        console.print(diff)
    for name in names[1:]:
        cross = crossings(curves[names[0]], curves[name], args.metric)
        console.print(f"{name} crosses {names[0]} at k = {', '.join(map(str, cross))}" if cross
                      else f"{name} does not cross {names[0]} at the k evaluated")
    out = plot_k_curves(curves, args.out, args.metric, paired=paired)
    console.print(f"wrote {out}")
    return 0


def cmd_rft(args) -> int:
    from explorl.rft import run_rft

    cfg = load_config(args.config, args.overrides)
    console.rule("resolved config")
    console.print(Syntax(dump_yaml(cfg), "yaml", background_color="default", word_wrap=True))
    from explorl.models import check_run_inputs

    checks = [c for c in check_run_inputs(cfg) if c[0] != "run.out_dir"]  # rft keeps its own output layout
    if args.dry_run:
        console.print("[green]config is valid[/] (dry run: nothing trained); checked without loading weights:")
        _print_checks(checks)
        return 0
    run_dir = run_rft(cfg, console=console)
    console.print(f"run directory: {run_dir} (per-iteration results in rft.json)")
    return 0


def cmd_sft(args) -> int:
    cfg = _run_config(args, "sft", "configs/sft.yaml")
    console.rule("resolved config")
    console.print(Syntax(dump_yaml(cfg), "yaml", background_color="default", word_wrap=True))
    from explorl.models import check_run_inputs

    checks = check_run_inputs(cfg)
    if args.dry_run:
        from explorl.sft import worked_solutions
        from explorl.tasks import load_task

        with_solution, missing = worked_solutions(load_task(cfg.task), cfg.task.name, cfg.task.solution_field)
        checks.append(("sft data", f"{len(with_solution)} training problems with a worked solution"
                                   + (f" ({missing} without one are skipped)" if missing else "")))
        console.print("[green]config is valid[/] (dry run: nothing trained); checked without loading weights:")
        _print_checks(checks)
        return 0
    from explorl.sft import run_sft

    run_dir = run_sft(cfg, console=console, resume=args.resume)
    result = json.loads((run_dir / "eval.json").read_text())
    _print_table("held-out evaluation", {"sft": result}, cfg.run.eval_k)
    console.print(f"run directory: {run_dir} (evaluate it with `explorl eval --model {run_dir / 'final'}`)")
    return 0


def cmd_bootstrap(args) -> int:
    from explorl.bootstrap import bootstrap

    target = Path(args.out)
    if (target / "config.json").exists() and not args.force:
        console.print(f"a model is already at {target} (use --force to retrain)")
        return 0
    bootstrap(target, console=console)
    console.print(Text(f"use it with EXPLORL_EMBEDDED={target} (model.path=embedded) or model.path={target}; the "
                       f"embedded default that ships with explorl is unchanged"))
    return 0


def cmd_config(args) -> int:
    table = Table(title="explorl configuration", show_lines=False)
    for col in ("field", "type", "default", "meaning"):
        table.add_column(col, overflow="fold")
    for row in reference():
        table.add_row(*row)
    if args.markdown:
        print("| field | type | default | meaning |\n|---|---|---|---|")
        for name, tp, default, doc in reference():
            tp = tp.replace("|", "\\|")  # Literal choices are written `'a' | 'b'`; a bare | splits the cell
            print(f"| `{name}` | {tp} | `{default}` | {doc.replace('|', '/')} |")
    else:
        console.print(table)
        from explorl.algos.registry import KINDS, names

        load_config()  # its validation imports every module that registers
        for kind in KINDS:
            console.print(f"[bold]{kind}[/]: {', '.join(names(kind))}")
    return 0


def cmd_demo(args) -> int:
    from explorl.demo import run_demo

    run_demo(args.config, args.overrides, console=console)
    return 0


def _print_html_table(t) -> None:
    table = Table(title=t.caption)
    for i, h in enumerate(t.headers):
        table.add_column(h, justify="left" if i == 0 else "right", overflow="fold")
    for row in t.rows:
        table.add_row(*row)
    console.print(table)
    if t.note:
        console.print(f"[dim]{t.note}[/]")


def _show_report(report) -> int:
    for plot in report.plots:
        if plot.note:
            console.print(f"[yellow]{plot.title}[/]: {plot.note}")
    for t in report.tables:
        _print_html_table(t)
    console.print(f"report: {report.html}")
    return 0


def cmd_analyze(args) -> int:
    from explorl.report import analyze

    if Path(args.run).is_file():
        return analyze_completions(Path(args.run), Path(args.out) if args.out else None)

    return _show_report(analyze(args.run, out=args.out, smooth=args.smooth))


def analyze_completions(path: Path, out: Path | None) -> int:
    from explorl.analysis.completions import completions_report, read_completions

    report = completions_report(read_completions(path))
    table = Table(title=f"{path.name}: {report['n']} completions, accuracy {report['accuracy']:.3f}, "
                        f"format rate {report['format_rate']:.3f}")
    table.add_column("responses")
    for col in ("n", "format issue", "repetition", "language mixing", "any issue"):
        table.add_column(col, justify="right")
    for name, q in report["quality"].items():
        if q is not None:
            table.add_row(name, str(q["n"]), *[f"{q[k]:.3f}" for k in ("format", "repetition", "language_mixing",
                                                                        "any")])
    console.print(table)
    cats = Table(title="word categories (share of words)")
    cats.add_column("responses")
    for c in report["categories"]["correct"]:
        cats.add_column(c, justify="right")
    for name, counts in report["categories"].items():
        cats.add_row(name, *[f"{v['share']:.3f}" for v in counts.values()])
    console.print(cats)
    for issue, examples in report["cases"].items():
        for ex in examples[:1]:
            console.print(Text(f"case ({issue}): problem {ex['problem']}, sample {ex['sample']}, reward "
                               f"{ex['reward']}: {ex['excerpt'][:200]!r}"))
    out = out or path.with_name(path.name.removesuffix(".jsonl") + ".report.json")
    out.write_text(json.dumps(report, indent=2))
    console.print(Text(f"wrote {out}"))
    return 0


def cmd_compare(args) -> int:
    from explorl.report import compare

    return _show_report(compare(args.runs, out=args.out, smooth=args.smooth, band=args.band, diff=args.diff))


def cmd_probe(args) -> int:
    """`explorl probe PROBE`: the papers' analyses on a model (`explorl.probe_commands`; docs/methods.md §8e)."""
    from explorl.probe_commands import run

    if args.probe == "branch":
        args.cuts = _parse_list(args.cuts, "--cuts")
        if any(t < 0 for t in args.cuts):
            raise SystemExit(f"--cuts: positions must be >= 0, got {args.cuts}")
    if args.probe == "covariance":
        args.percentiles = _parse_list(args.percentiles, "--percentiles", float)
        if any(not 0 < x <= 100 for x in args.percentiles):
            raise SystemExit(f"--percentiles: each must lie in (0, 100], got {args.percentiles}")
    if args.probe == "perturb":
        args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
        if not args.modes or any(m not in ("replace", "truncate") for m in args.modes):
            raise SystemExit(f"--modes: comma-separated replace and/or truncate, got {args.modes}")
        if not 0 < args.frac <= 0.5:
            raise SystemExit(f"--frac: the share of tokens perturbed on each side must lie in (0, 0.5], got "
                             f"{args.frac}")
    if args.probe == "update" and not 0 < args.top_frac <= 1:
        raise SystemExit(f"--top-frac: must lie in (0, 1], got {args.top_frac}")
    return run(args, _task_opts(args.task_opt), console)


def _print_table(title: str, rows: dict[str, dict], ks) -> None:
    table = Table(title=title)
    table.add_column("model")
    cols = [f"pass@{k}" for k in ks] + [f"maj@{k}" for k in ks if k > 1] + ["entropy", "length"]
    for c in cols:
        table.add_column(c, justify="right")
    for name, summary in rows.items():
        table.add_row(name, *[f"{summary[c]:.3f}" if c in summary else "-" for c in cols])
    console.print(table)


def build_parser() -> argparse.ArgumentParser:
    from explorl import __version__

    p = argparse.ArgumentParser(prog="explorl", description="RL with verifiable rewards, built around exploration")
    p.add_argument("--version", action="version", version=f"explorl {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train a policy from a YAML config")
    t.add_argument("config", nargs="?", help="YAML config (e.g. configs/quickstart.yaml)")
    t.add_argument("overrides", nargs="*", help="key.sub=value overrides, e.g. sampling.temperature=0.7")
    t.add_argument("--dry-run", action="store_true", help="validate and print the resolved config, then exit")
    t.add_argument("--resume", metavar="RUN", help="continue a killed run from its last checkpoint")
    t.set_defaults(fn=cmd_train)

    e = sub.add_parser("eval", help="pass@k / maj@k of a model on a task's held-out split")
    e.add_argument("--model", default="embedded",
                   help="model directory, LoRA adapter directory, `embedded`, or a run's output (RUN, RUN/final, "
                        "RUN/checkpoints/step_N: task, template, length limit, eval split, temperature and top_p "
                        "then come from RUN/config.yaml unless given here)")
    e.add_argument("--task", default=None, help="arith, file or rg:<name> (default: the run's task, else arith)")
    e.add_argument("--task-opt", action="append", default=[], metavar="FIELD=VALUE",
                   help="task.* setting, e.g. --task-opt path=test.jsonl (repeatable; `path` alone evaluates on "
                        "every row of that file)")
    e.add_argument("--n", type=int, default=16, help="samples per problem")
    e.add_argument("--k", default="1,2,4,8,16", help="comma-separated k values of pass@k")
    e.add_argument("--temperature", type=float, default=None,
                   help="sampling temperature (default: the run's run.eval_temperature, else 1.0)")
    e.add_argument("--top-p", type=float, default=None, help="nucleus mass (default: the run's, else 1.0)")
    e.add_argument("--max-new-tokens", type=int, default=None,
                   help="length limit (default: the run's sampling.max_new_tokens, else 64)")
    e.add_argument("--schedule", choices=["fixed", "ead", "revead"], default="fixed",
                   help="sampling temperature schedule: fixed (--temperature), or EAD / RevEAD per-token annealing "
                        "at decay constant --ead-d (paper 003 section 5.4: EAD at inference time)")
    e.add_argument("--ead-d", type=float, default=25.0, help="decay constant d of --schedule ead/revead")
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
    e.set_defaults(fn=cmd_eval)

    x = sub.add_parser("export", help="write a run's model (or a LoRA adapter merged into its base) as a standard "
                                      "Hugging Face model directory")
    x.add_argument("source", metavar="RUN_OR_DIR",
                   help="a run directory (its final/), RUN/final, RUN/checkpoints/step_N, or an adapter directory")
    x.add_argument("--out", required=True, help="new directory for the model (weights + tokenizer)")
    x.add_argument("--merge", action="store_true", help="merge LoRA adapters into the base weights (required for "
                                                        "LoRA runs and adapter directories)")
    x.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="dtype of the written weights (auto: float32, as loaded on the CPU)")
    x.set_defaults(fn=cmd_export)

    b = sub.add_parser("bootstrap", help="train a tiny default model as the shipped embedded one was trained")
    b.add_argument("--out", required=True, help="directory to write (the shipped model lies in explorl/embedded/)")
    b.add_argument("--force", action="store_true", help="retrain even if cached")
    b.set_defaults(fn=cmd_bootstrap)

    d = sub.add_parser("demo", help="the main job: base eval, GRPO, eval after, before/after table")
    d.add_argument("config", nargs="?", default=None, help="config (default: configs/quickstart.yaml)")
    d.add_argument("overrides", nargs="*", help="key.sub=value overrides")
    d.set_defaults(fn=cmd_demo)

    f = sub.add_parser("rft", help="rejection-sampling fine-tuning with exploration-aware data selection")
    f.add_argument("config", help="YAML config (e.g. configs/rft.yaml)")
    f.add_argument("overrides", nargs="*", help="key.sub=value overrides, e.g. rft.strategies=[noisy]")
    f.add_argument("--dry-run", action="store_true", help="validate and print the resolved config, then exit")
    f.set_defaults(fn=cmd_rft)

    sf = sub.add_parser("sft", help="supervised fine-tuning on the task's worked solutions (the SFT baselines of "
                                    "papers 001 and 004); writes a run directory like train")
    sf.add_argument("config", nargs="?", help="YAML config (e.g. configs/sft.yaml)")
    sf.add_argument("overrides", nargs="*", help="key.sub=value overrides, e.g. sft.epochs=1 optim.lr=1e-4")
    sf.add_argument("--dry-run", action="store_true", help="validate and print the resolved config, then exit")
    sf.add_argument("--resume", metavar="RUN", help="continue the SFT run in RUN from its last checkpoint")
    sf.set_defaults(fn=cmd_sft)

    v = sub.add_parser("venn", help="Venn diagram of the k-rollout unsolvable sets of 2-3 models")
    v.add_argument("files", nargs="+", help="per-problem files of `explorl eval --analyze` (MODEL-TASK.problems.jsonl)")
    v.add_argument("--k", type=int, default=8, help="samples per problem that define unsolvable (first k)")
    v.add_argument("--out", default="runs/venn.png", help="PNG path")
    v.set_defaults(fn=cmd_venn)

    cv = sub.add_parser("curves", help="plot pass@k (or maj@k) against k of several `explorl eval --curve` "
                                       "summaries, and each minus the first (where they cross)")
    cv.add_argument("files", nargs="+", metavar="EVAL_JSON", help="summaries of `explorl eval --curve`; the first "
                                                                   "is the reference (e.g. the base model)")
    cv.add_argument("--labels", help="comma-separated names (default: each summary's label)")
    cv.add_argument("--metric", choices=["pass@k", "maj@k"], default="pass@k")
    cv.add_argument("--out", default="runs/curves.png", help="PNG path")
    cv.set_defaults(fn=cmd_curves)

    c = sub.add_parser("config", help="list every config field with its type, default and meaning")
    c.add_argument("--markdown", action="store_true", help="print a Markdown table (for the README)")
    c.set_defaults(fn=cmd_config)

    a = sub.add_parser("analyze", help="plots and an HTML report of a run directory (written to RUN/report/), or "
                                       "the quality issues, token categories and case studies of a completions "
                                       "file of `explorl eval --save-completions`")
    a.add_argument("run", help="run directory made by `explorl train`, or a completions JSONL file")
    a.add_argument("--out", help="output directory (default RUN/report), or for a completions file the report "
                                 "JSON (default FILE.report.json)")
    a.add_argument("--smooth", type=float, default=0.0, help="EMA weight of the per-step curves, in [0, 1) "
                                                                "(0 = raw; 0.9 smooths strongly)")
    a.set_defaults(fn=cmd_analyze)

    cm = sub.add_parser("compare", help="overlay several runs; final pass@k with 95%% CIs across seeds")
    cm.add_argument("runs", nargs="+", metavar="RUN", help="run directories (seeds of one config are pooled)")
    cm.add_argument("--out", default="runs/compare", help="output directory (default runs/compare)")
    cm.add_argument("--smooth", type=float, default=0.0, help="EMA weight of the per-step curves, in [0, 1)")
    cm.add_argument("--band", choices=["minmax", "ci95"], default="minmax",
                    help="spread of several seeds of a config: min-max, or the 95%% t-interval of the mean")
    cm.add_argument("--diff", action="append", default=[], metavar="METRIC",
                    help="also plot METRIC of each config minus the first's, e.g. reward/all_wrong_frac "
                         "(paper 000 Fig. 8; repeatable)")
    cm.set_defaults(fn=cmd_compare)

    pr = sub.add_parser("probe", help="the papers' analyses on a model: entropy by position, token covariance, "
                                      "branching, perturbation, one-update token shifts (JSON + PNG + table)")
    prs = pr.add_subparsers(dest="probe", required=True)

    def probe_parser(name: str, help_text: str, n: int | None = None) -> argparse.ArgumentParser:
        q = prs.add_parser(name, help=help_text)
        q.add_argument("--model", default="embedded",
                       help="model directory, `embedded`, or a run's output (RUN, RUN/final, RUN/checkpoints/step_N: "
                            "task, length limit, temperature and top_p then come from RUN/config.yaml)")
        q.add_argument("--task", default=None, help="arith, file or rg:<name> (default: the run's task, else arith)")
        q.add_argument("--task-opt", action="append", default=[], metavar="FIELD=VALUE",
                       help="task.* setting, e.g. --task-opt path=test.jsonl (repeatable)")
        q.add_argument("--split", choices=["eval", "train"], default="eval", help="which problems (default eval)")
        q.add_argument("--limit", type=int, default=16, help="the first N problems of the split (0 = all)")
        if n is not None:
            q.add_argument("--n", type=int, default=n, help=f"samples per problem (default {n})")
        q.add_argument("--temperature", type=float, default=None,
                       help="sampling temperature (default: the run's run.eval_temperature, else 1.0)")
        q.add_argument("--top-p", type=float, default=None, help="nucleus mass (default: the run's, else 1.0)")
        q.add_argument("--max-new-tokens", type=int, default=None,
                       help="length limit (default: the run's sampling.max_new_tokens, else 64)")
        q.add_argument("--seed", type=int, default=0)
        q.add_argument("--device", default="auto")
        q.add_argument("--dtype", default="auto")
        q.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
        q.add_argument("--out", help=f"result JSON (default runs/probe/{name}-MODEL.json; the PNG goes beside it)")
        q.add_argument("--no-plot", action="store_true", help="write no PNG")
        q.set_defaults(fn=cmd_probe)
        return q

    q = probe_parser("position", "mean token entropy at each absolute output position (EAD Fig. 1)", n=8)
    q.add_argument("--bin-size", type=int, default=1, help="positions per bin")
    q = probe_parser("covariance", "percentiles and cumulative share of the token covariance c of covariance "
                                   "weighting (CW Fig. 3, Table 1)", n=8)
    q.add_argument("--scope", choices=["group", "batch"], default="group",
                   help="means of c per prompt group (the paper's, cw_group) or over the batch (cw)")
    q.add_argument("--percentiles", default="0.01,1,20,40,100", help="percentile thresholds (Table 1's rows)")
    q = probe_parser("branch", "continuations from prefixes of a base response cut at several positions: success "
                               "by cut position (EAD Fig. 2, the forking experiment)")
    q.add_argument("--cuts", default="0,4,8,16,32", help="response positions to branch at (tokens kept)")
    q.add_argument("--k", type=int, default=8, help="continuations per cut (maj@k votes over them)")
    q = probe_parser("perturb", "random replacement / truncation at the top and bottom entropy tokens of correct "
                                "responses, with Fisher and z tests (ERPO Fig. 1b)")
    q.add_argument("--frac", type=float, default=0.05, help="share of each response's tokens on each side (5%%)")
    q.add_argument("--k", type=int, default=4, help="continuations per perturbed position")
    q.add_argument("--modes", default="replace,truncate", help="perturbations: replace and/or truncate")
    q.add_argument("--attempts", type=int, default=4,
                   help="samples per problem to find a correct base response (problems without one are skipped)")
    q.add_argument("--any-response", action="store_true",
                   help="perturb the first sampled response whether correct or not")
    q = probe_parser("update", "probability shift of every token after one policy update, by outcome, entropy, "
                               "token category and PPL (STILL Figs. 3b, 4, 5a)", n=8)
    q.add_argument("--lr", type=float, default=None, help="learning rate of the update (default: optim.lr)")
    q.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="training-config override, e.g. --set algo.advantage=dr_grpo (repeatable)")
    q.add_argument("--top-frac", type=float, default=0.2, help="share of tokens with the largest |shift| (20%%)")
    return p


def main(argv: list[str] | None = None) -> int:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # weight loading/saving bars of tiny models are noise beside ours
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # key=value overrides after an option (`train CONFIG --dry-run a=1`) are left over by argparse
    if extra and hasattr(args, "overrides") and all("=" in x and not x.startswith("-") for x in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return args.fn(args)
    except ConfigError as e:  # the message is text, never markup: YAML snippets and lists hold [...]
        console.print(f"[bold red]config error:[/] {escape(str(e))}")
        return 2
    except (FileNotFoundError, FileExistsError, ValueError) as e:
        console.print(f"[bold red]error:[/] {escape(str(e))}")
        return 2
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]; a run continues with `explorl train --resume RUN`")
        return 130


if __name__ == "__main__":
    sys.exit(main())
