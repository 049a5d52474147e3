"""The `explorl` command: train, eval, bootstrap, demo, config."""

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


def _parse_ks(text: str) -> list[int]:
    try:
        ks = [int(k) for k in text.split(",") if k.strip()]
    except ValueError:
        raise SystemExit(f"--k: expected comma-separated integers such as 1,2,4,8, got {text!r}") from None
    if not ks or any(k < 1 for k in ks):
        raise SystemExit(f"--k: every k must be >= 1, got {text!r}")
    return ks


def cmd_train(args) -> int:
    if args.resume:
        run = Path(args.resume)
        if not (run / "config.yaml").exists():
            raise ConfigError(f"--resume {run}: no config.yaml there; give a run directory made by `explorl train`")
        overrides = list(args.overrides)
        if args.config is not None:  # argparse puts the first override in the CONFIG slot
            if "=" not in args.config:
                raise ConfigError(f"explorl train: give a CONFIG file or --resume RUN, not both "
                                  f"(a resumed run uses {run / 'config.yaml'}; change it with key=value overrides)")
            overrides.insert(0, args.config)
        cfg = load_config(run / "config.yaml", overrides)
    else:
        if args.config is None:
            raise ConfigError("explorl train: give a CONFIG file (e.g. configs/quickstart.yaml) or --resume RUN")
        cfg = load_config(args.config, args.overrides)
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


def cmd_eval(args) -> int:
    from explorl.bootstrap import ensure_embedded
    from explorl.config import ModelConfig, TaskConfig, apply_override, from_dict, to_dict
    from explorl.evaluate import evaluate
    from explorl.models import find_run_output, load_policy, load_run_output
    from explorl.tasks import load_task
    from explorl.tasks.chat import prompt_encoder

    ks = _parse_ks(args.k)
    if max(ks) > args.n:
        raise SystemExit(f"--k: k={max(ks)} exceeds --n={args.n}; pass@k needs at least k samples per problem")
    opts = _task_opts(args.task_opt)
    if not (args.device in ("auto", "cpu") or args.device.startswith("cuda")):
        raise SystemExit(f"--device: {args.device!r} is not one of auto, cpu, cuda, cuda:N")
    model_cfg = from_dict(ModelConfig, {"path": args.model, "device": args.device, "dtype": args.dtype})
    # a run's output (RUN, RUN/final, RUN/checkpoints/step_N): evaluate it as the run did, flags override
    run = find_run_output(args.model)
    run_cfg = load_config(run.config_path) if run is not None else None
    from_run = "run config" if run is not None else ""
    if run_cfg is not None and args.task in (None, run_cfg.task.name):
        data: dict = {"task": to_dict(run_cfg.task)}
        task_from = from_run
    else:
        data = {"task": {"name": args.task or "arith"}}
        task_from = "--task" if args.task else "default"
    for k, v in opts.items():
        apply_override(data, f"task.{k}={v}")
    task_cfg = from_dict(TaskConfig, data["task"], "task.")
    # `--task-opt path=test.jsonl` alone names the file to evaluate on: all of its rows, not a training split
    whole_file = task_cfg.name == "file" and "path" in opts and "eval_path" not in opts
    if whole_file:
        from explorl.tasks.files import count_rows

        task_cfg.eval_path = task_cfg.path
        if "eval_size" not in opts:
            task_cfg.eval_size = max(count_rows(task_cfg.eval_path, "--task-opt path"), 1)

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
    if run is not None:
        if run.kind == "checkpoint":
            ensure_embedded(run_cfg.model.path, console=console)
        model, tok, _ = load_run_output(run, run_cfg, device=model_cfg.device, dtype=model_cfg.dtype)
    else:
        ensure_embedded(model_cfg.path, console=console)
        model, tok, _ = load_policy(model_cfg)
    label = run.label if run is not None else Path(args.model).name
    from rich.progress import Progress

    with Progress(console=console, disable=not console.is_terminal) as bar:
        job = bar.add_task("eval", total=len(problems))
        summary, per_problem = evaluate(model, tok, problems, task, n=args.n, ks=ks, temperature=sampler_temperature,
                                        encode=prompt_encoder(tok, task_cfg),
                                        top_p=top_p, max_new_tokens=max_new_tokens, seed=args.seed,
                                        reward_timeout_s=task_cfg.reward_timeout_s, fast_path=fast_path,
                                        progress=lambda k: bar.advance(job, k), analyze=args.analyze)
    out = {"model": args.model, "label": label, "run_config": str(run.config_path) if run is not None else None,
           "task": task_cfg.name, "temperature": temperature, "schedule": args.schedule,
           "ead_d": args.ead_d if args.schedule != "fixed" else None,
           "settings": {name: {"value": value, "from": where} for name, value, where in settings}, **summary}
    _print_table(f"{task_cfg.name} ({len(problems)} problems, n={args.n})", {label: summary}, ks)
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
    if per_problem_path is not None:
        with open(per_problem_path, "w") as f:
            for r in per_problem:
                f.write(json.dumps(r.__dict__) + "\n")
        console.print(Text(f"wrote {per_problem_path} (one line per problem)"))
    return 0


def cmd_export(args) -> int:
    import os
    import shutil

    from explorl.bootstrap import ensure_embedded
    from explorl.models import (adapter_base, find_run_output, is_adapter_dir, load_causal_lm, load_run_output,
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
            ensure_embedded(run_cfg.model.path, console=console)
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


def cmd_bootstrap(args) -> int:
    from explorl.bootstrap import bootstrap
    from explorl.models import embedded_dir

    target = Path(args.out) if args.out else embedded_dir()
    if (target / "config.json").exists() and not args.force:
        console.print(f"embedded model already at {target} (use --force to retrain)")
        return 0
    bootstrap(target, console=console)
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

    return _show_report(analyze(args.run, out=args.out))


def cmd_compare(args) -> int:
    from explorl.report import compare

    return _show_report(compare(args.runs, out=args.out))


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

    b = sub.add_parser("bootstrap", help="train and cache the embedded tiny default model")
    b.add_argument("--out", help="directory (default: the cache, see EXPLORL_HOME)")
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

    v = sub.add_parser("venn", help="Venn diagram of the k-rollout unsolvable sets of 2-3 models")
    v.add_argument("files", nargs="+", help="per-problem files of `explorl eval --analyze` (MODEL-TASK.problems.jsonl)")
    v.add_argument("--k", type=int, default=8, help="samples per problem that define unsolvable (first k)")
    v.add_argument("--out", default="runs/venn.png", help="PNG path")
    v.set_defaults(fn=cmd_venn)

    c = sub.add_parser("config", help="list every config field with its type, default and meaning")
    c.add_argument("--markdown", action="store_true", help="print a Markdown table (for the README)")
    c.set_defaults(fn=cmd_config)

    a = sub.add_parser("analyze", help="plots and an HTML report of a run directory (written to RUN/report/)")
    a.add_argument("run", help="run directory made by `explorl train`")
    a.add_argument("--out", help="output directory (default RUN/report)")
    a.set_defaults(fn=cmd_analyze)

    cm = sub.add_parser("compare", help="overlay several runs; final pass@k with 95%% CIs across seeds")
    cm.add_argument("runs", nargs="+", metavar="RUN", help="run directories (seeds of one config are pooled)")
    cm.add_argument("--out", default="runs/compare", help="output directory (default runs/compare)")
    cm.set_defaults(fn=cmd_compare)
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
