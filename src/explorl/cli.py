"""The `explorl` command: train, eval, bootstrap, demo, config."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.syntax import Syntax
from rich.table import Table

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
    if args.dry_run:
        console.print("[green]config is valid[/] (dry run: nothing trained)")
        return 0
    from explorl.trainer import train

    run_dir = train(cfg, resume=args.resume, console=console)
    result = json.loads((run_dir / "eval.json").read_text())
    _print_table("held-out evaluation", {"trained": result}, cfg.run.eval_k)
    console.print(f"run directory: {run_dir}")
    return 0


def cmd_eval(args) -> int:
    from explorl.bootstrap import ensure_embedded
    from explorl.config import ModelConfig, TaskConfig, from_dict
    from explorl.evaluate import evaluate
    from explorl.models import load_policy
    from explorl.tasks import load_task

    ks = _parse_ks(args.k)
    if max(ks) > args.n:
        raise SystemExit(f"--k: k={max(ks)} exceeds --n={args.n}; pass@k needs at least k samples per problem")
    model_cfg = from_dict(ModelConfig, {"path": args.model, "device": args.device, "dtype": args.dtype})
    task_data = {"name": args.task}
    for item in args.task_opt:
        if "=" not in item:
            raise SystemExit(f"--task-opt {item!r}: expected field=value (a task.* field such as path=data.jsonl)")
        k, v = item.split("=", 1)
        task_data[k] = v
    from explorl.config import apply_override
    data: dict = {"task": {}}
    for k, v in task_data.items():
        apply_override(data, f"task.{k}={v}")
    task_cfg = from_dict(TaskConfig, data["task"], "task.")
    ensure_embedded(model_cfg.path, console=console)
    model, tok, _ = load_policy(model_cfg)
    task = load_task(task_cfg)
    problems = task.eval[: args.limit] if args.limit else task.eval
    from rich.progress import Progress

    with Progress(console=console, disable=not console.is_terminal) as bar:
        job = bar.add_task("eval", total=len(problems))
        summary, per_problem = evaluate(model, tok, problems, task, n=args.n, ks=ks, temperature=args.temperature,
                                        top_p=args.top_p, max_new_tokens=args.max_new_tokens, seed=args.seed,
                                        progress=lambda k: bar.advance(job, k), analyze=args.analyze)
    out = {"model": args.model, "task": args.task, "temperature": args.temperature, **summary}
    _print_table(f"{args.task} ({len(problems)} problems, n={args.n})", {Path(args.model).name: summary}, ks)
    out_path = Path(args.out or f"runs/eval/{Path(args.model).name}-{args.task.replace(':', '_')}.json")
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
    console.print(f"wrote {out_path}")
    if per_problem_path is not None:
        with open(per_problem_path, "w") as f:
            for r in per_problem:
                f.write(json.dumps(r.__dict__) + "\n")
        console.print(f"wrote {per_problem_path} (one line per problem)")
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
    if args.dry_run:
        console.print("[green]config is valid[/] (dry run: nothing trained)")
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
    p = argparse.ArgumentParser(prog="explorl", description="RL with verifiable rewards, built around exploration")
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train a policy from a YAML config")
    t.add_argument("config", nargs="?", help="YAML config (e.g. configs/quickstart.yaml)")
    t.add_argument("overrides", nargs="*", help="key.sub=value overrides, e.g. sampling.temperature=0.7")
    t.add_argument("--dry-run", action="store_true", help="validate and print the resolved config, then exit")
    t.add_argument("--resume", metavar="RUN", help="continue a killed run from its last checkpoint")
    t.set_defaults(fn=cmd_train)

    e = sub.add_parser("eval", help="pass@k / maj@k of a model on a task's held-out split")
    e.add_argument("--model", default="embedded", help="model directory, or `embedded`")
    e.add_argument("--task", default="arith", help="arith, file or rg:<name>")
    e.add_argument("--task-opt", action="append", default=[], metavar="FIELD=VALUE",
                   help="task.* setting, e.g. --task-opt path=data.jsonl (repeatable)")
    e.add_argument("--n", type=int, default=16, help="samples per problem")
    e.add_argument("--k", default="1,2,4,8,16", help="comma-separated k values of pass@k")
    e.add_argument("--temperature", type=float, default=1.0)
    e.add_argument("--top-p", type=float, default=1.0)
    e.add_argument("--max-new-tokens", type=int, default=64)
    e.add_argument("--limit", type=int, default=0, help="evaluate only the first N problems (0 = all)")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--device", default="auto")
    e.add_argument("--dtype", default="auto")
    e.add_argument("--out", help="summary JSON path (default runs/eval/MODEL-TASK.json)")
    e.add_argument("--per-problem", help="write one JSON line per problem here")
    e.add_argument("--analyze", action="store_true",
                   help="also the unsolvable set, rollout branching factor, entropy profile, answer diversity, "
                        "and per-problem results (default MODEL-TASK.problems.jsonl beside --out)")
    e.set_defaults(fn=cmd_eval)

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
    except ConfigError as e:
        console.print(f"[bold red]config error:[/] {e}")
        return 2
    except (FileNotFoundError, FileExistsError, ValueError) as e:
        console.print(f"[bold red]error:[/] {e}")
        return 2
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]; a run continues with `explorl train --resume RUN`")
        return 130


if __name__ == "__main__":
    sys.exit(main())
