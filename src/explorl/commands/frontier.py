"""`explorl frontier MODEL ...`: pass@k against sampling entropy over a temperature grid, for each model, and each
model minus the first at equal entropy, paired over problems (`explorl.evaluation.frontier`, docs/methods.md §8a)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from rich.progress import Progress
from rich.table import Table
from rich.text import Text

import explorl.commands.common as common
import explorl.evaluation.evaluate as evaluation  # `evaluation.evaluate` looked up at call time: tests replace it
from explorl.commands.common import (_check_device, _check_ks_within_n, _parse_ks, _parse_list, _run_code_trust,
                                     _task_opts, add_overwrite_flag, refuse_to_replace)
from explorl.commands.eval import _fingerprints
from explorl.config import ModelConfig, from_dict
from explorl.evaluation.evaluate import EvalPlan, MixedModelsError, check_same_base
from explorl.evaluation.frontier import FrontierPoint, entropy_grid, paired_frontier_difference, shared_entropy_range
from explorl.evaluation.settings import SamplingFlags, resolve_eval_settings
from explorl.metrics import bootstrap_ci, pass_at_k
from explorl.models import load_model_under_test
from explorl.rewards import reward_versions
from explorl.runs import nofollow
from explorl.tasks.chat import prompt_encoder


def add_parser(sub) -> None:
    f = sub.add_parser("frontier", help="pass@k against sampling entropy over a temperature grid for several models, "
                                        "and each minus the first at equal entropy (coverage at equal entropy)")
    f.add_argument("models", nargs="+", metavar="MODEL",
                   help="model directories, `embedded`, or runs' outputs (RUN, RUN/final, RUN/checkpoints/step_N); "
                        "the first is the reference (e.g. the base model or GRPO)")
    f.add_argument("--labels", help="comma-separated names (default: each model's directory or run label)")
    f.add_argument("--task", default=None, help="arith, file or rg:<name> (default: the first model's run's task, "
                                                "else arith); every model is evaluated on the same split")
    f.add_argument("--task-opt", action="append", default=[], metavar="FIELD=VALUE",
                   help="task.* setting, e.g. --task-opt 'difficulties=[8, 9]' (repeatable)")
    f.add_argument("--temperatures", default="0.6,0.8,1.0,1.2,1.4",
                   help="comma-separated sampling temperatures: one point of each model's frontier each")
    f.add_argument("--n", type=int, default=16, help="samples per problem at each temperature")
    f.add_argument("--k", default=None, help="comma-separated k of pass@k (default 1 and --n)")
    f.add_argument("--grid", type=int, default=7,
                   help="entropies at which the differences are reported: evenly spaced over the range all models "
                        "reach")
    f.add_argument("--max-new-tokens", type=int, default=None,
                   help="length limit (default: the first model's run's sampling.max_new_tokens, else 64)")
    f.add_argument("--top-p", type=float, default=None, help="nucleus mass (default: the first run's, else 1.0)")
    f.add_argument("--limit", type=int, default=0, help="evaluate only the first N problems (0 = all)")
    f.add_argument("--seed", type=int, default=0)
    f.add_argument("--device", default="auto")
    f.add_argument("--dtype", default="auto")
    f.add_argument("--out", default="runs/frontier", help="directory: frontier.json and frontier.png (a frontier's "
                                                          "own directory is continued: its points are reused)")
    add_overwrite_flag(f)
    f.set_defaults(fn=cmd_frontier)


def _temperatures(text: str) -> list[float]:
    temps = sorted(set(_parse_list(text, "--temperatures", float, "0.6,1.0,1.4")))
    if temps[0] <= 0:
        raise SystemExit(f"--temperatures: {text!r}: give one or more temperatures above 0")
    return temps


PARTIAL = "frontier.partial.json"
"""The points evaluated so far, with the setting they were evaluated in (kept after the run, to extend it)."""


def _split_digest(problems) -> str:
    """Which problems were evaluated: a digest of their prompts and answers, in order."""
    text = "\x00".join(f"{p.prompt}\x01{p.answer}" for p in problems)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _point_key(name: str, path: str, temperature: float) -> str:
    return f"{name}\x00{path}\x00{temperature!r}"


def _recorded_points(path: Path, setting: dict, fingerprints: dict) -> dict:
    """The points of `path` evaluated in the same setting (split, n, seed, length, top-p, reward and the versions of
    its checkers) on the same weights (each model's fingerprints); an unreadable file or another setting starts
    over."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        return {}
    if data.get("setting") != setting:
        return {}
    same = {name for name, fp in fingerprints.items() if data.get("fingerprints", {}).get(name) == fp}
    return {key: point for key, point in data.get("points", {}).items() if key.split("\x00", 1)[0] in same}


def _write_partial(path: Path, setting: dict, fingerprints: dict, points: dict) -> None:
    nofollow.write_atomic(path, json.dumps({"setting": setting, "fingerprints": fingerprints, "points": points}))


@dataclass
class _Points:
    """The points evaluated so far (`done`: {point key: its entropy and correct counts}), each new one written to
    `path` (frontier.partial.json) at once with the setting and fingerprints it was evaluated in (`keep`)."""

    path: Path
    """frontier.partial.json in `--out`."""
    setting: dict
    """What the points were evaluated in (split, n, seed, length, top-p, reward and its versions)."""
    fingerprints: dict
    """Each model's weight fingerprints."""
    done: dict
    """{point key (`_point_key`): {"entropy", "correct"}} of every point evaluated so far."""

    def keep(self, key: str, point: FrontierPoint) -> None:
        self.done[key] = {"entropy": point.entropy, "correct": point.correct}
        _write_partial(self.path, self.setting, self.fingerprints, self.done)


def cmd_frontier(args) -> int:
    """Evaluate every model at every temperature (reusing the points of frontier.partial.json), print the points
    and the paired differences at equal entropy, and write frontier.json and frontier.png to `--out`."""
    from explorl.report.eval_plots import plot_frontier  # matplotlib: ~0.3 s, paid only to plot
    console = common.console
    temps, ks, labels = _checked_flags(args)  # everything is checked before the first model loads
    settings = _same_split_settings(args)
    names = _model_names(args.models, labels, settings)
    fingerprints = _checked_fingerprints(names, args.models, settings)
    s0 = settings[0]
    console.print(Text(f"frontier: {len(args.models)} models on {s0.task_cfg.name} ({len(s0.problems)} problems), "
                       f"n={args.n}, temperatures {', '.join(f'{t:g}' for t in temps)}, "
                       f"max_new_tokens {s0.max_new_tokens}, top_p {s0.top_p}"))
    record: dict = {"task": s0.task_cfg.name, "problems": len(s0.problems), "n": args.n, "k": ks,
                    "temperatures": temps, "max_new_tokens": s0.max_new_tokens, "top_p": s0.top_p,
                    "seed": args.seed, "models": {}}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # every finished point is kept in frontier.partial.json: a killed or extended run evaluates only what is missing
    setting = {"task": s0.task_cfg.name, "split": _split_digest(s0.problems), "n": args.n, "seed": args.seed,
               "max_new_tokens": s0.max_new_tokens, "top_p": s0.top_p, "reward": s0.task_cfg.reward,
               "reward_versions": reward_versions(s0.task_cfg.reward)}
    record.update(reward=setting["reward"], reward_versions=setting["reward_versions"])
    partial = out / PARTIAL
    points = _Points(partial, setting, fingerprints, _recorded_points(partial, setting, fingerprints))
    if points.done:
        console.print(Text(f"continuing from {partial}: {len(points.done)} point(s) already evaluated"))

    frontiers: dict[str, list[FrontierPoint]] = {}
    with Progress(console=console, disable=not console.is_terminal) as bar:
        for name, path, s in zip(names, args.models, settings):
            frontiers[name], shown = _model_frontier(args, name, path, s, temps, ks, points, bar)
            record["models"][name] = {"path": path, **fingerprints[name], "points": shown}
    _print_points(record, names, ks, len(s0.problems), args.n)
    paired = _paired_differences(frontiers, names, ks, args.grid, args.seed)
    record["paired"] = {name: {str(k): v for k, v in by_k.items()} for name, by_k in paired.items()}
    nofollow.write_file(out / "frontier.json", json.dumps(record, indent=1) + "\n")
    png = plot_frontier({n: record["models"][n]["points"] for n in names}, ks, paired, out / "frontier.png")
    console.print(f"wrote {out / 'frontier.json'} and {png}")
    return 0


def _checked_flags(args) -> tuple[list[float], list[int], list[str]]:
    """(temperatures, ks, labels) of the command line, each checked; `--out` may be written."""
    temps = _temperatures(args.temperatures)
    ks = _parse_ks(args.k) if args.k is not None else sorted({1, args.n})
    _check_ks_within_n(ks, args.n)
    if args.grid < 1:
        raise SystemExit(f"--grid: {args.grid} must be at least 1")
    _check_device(args.device)
    refuse_to_replace(args.out, "--out", args.overwrite, own=(PARTIAL, "frontier.json"))
    labels = [x.strip() for x in args.labels.split(",")] if args.labels else []
    if labels and len(labels) != len(args.models):
        raise SystemExit(f"--labels: {len(labels)} names for {len(args.models)} models")
    return temps, ks, labels


def _same_split_settings(args) -> list:
    """Each model's evaluation settings (`resolve_eval_settings`). The first model's run fixes the task, length and
    top-p; the others are evaluated on exactly that split and judged by the same reward, or the command stops."""
    opts = _task_opts(args.task_opt)
    trust = _run_code_trust(args, opts, "frontier")  # what a run's config.yaml may run: what --task-opt names
    settings = []
    for path in args.models:
        first = settings[0] if settings else None
        flags = SamplingFlags(max_new_tokens=args.max_new_tokens or (first.max_new_tokens if first else None),
                              temperature=1.0,
                              top_p=args.top_p if args.top_p is not None else (first.top_p if first else None))
        s = resolve_eval_settings(path, args.task or (first.task_cfg.name if first else None), opts, flags=flags,
                                  limit=args.limit, trust=trust)
        if first is not None and [p.prompt for p in s.problems] != [p.prompt for p in first.problems]:
            raise SystemExit(f"{path}: its run evaluates another split than {args.models[0]}'s; pass --task and "
                             f"--task-opt so that every model is evaluated on the same problems")
        if first is not None and s.task_cfg.reward != first.task_cfg.reward:
            raise SystemExit(f"{path}: its run judges by task.reward {s.task_cfg.reward!r}, {args.models[0]}'s by "
                             f"{first.task_cfg.reward!r}; pass --task-opt reward=... so that every model is judged "
                             f"alike")
        settings.append(s)
    return settings


def _model_names(paths: list[str], labels: list[str], settings: list) -> list[str]:
    """`--labels`, else each run's label or the model directory's name; a name taken already gets `-i`."""
    names: list[str] = []
    for i, (path, s) in enumerate(zip(paths, settings)):
        name = labels[i] if labels else (s.run.label if s.run is not None else Path(path).name)
        names.append(name if name not in names else f"{name}-{i}")
    return names


def _checked_fingerprints(names: list[str], paths: list[str], settings: list) -> dict:
    """Each model's fingerprints (`commands.eval._fingerprints`); the command stops when the models do not share a
    base (`evaluate.check_same_base`), and says its warnings."""
    fingerprints = {name: _fingerprints(s.run, s.run_cfg, path) for name, path, s in zip(names, paths, settings)}
    try:
        warnings = check_same_base(fingerprints)
    except MixedModelsError as e:
        raise SystemExit(str(e)) from None
    for warning in warnings:
        common.console.print(Text(f"warning: {warning}"), style="yellow")
    return fingerprints


def _model_frontier(args, name: str, path: str, s, temps: list[float], ks: list[int], recorded: _Points,
                    bar) -> tuple[list, list[dict]]:
    """One model's frontier points at every temperature, and each as recorded in frontier.json (with pass@k's
    bootstrap interval over problems). A point in `recorded.done` is reused; the model loads only when a point is
    missing, and every point evaluated is kept at once (`recorded.keep`)."""
    console = common.console
    points, shown = [], []
    sampler = tok = encode = None
    for t in temps:
        key = _point_key(name, path, t)
        if key in recorded.done:
            entry = recorded.done[key]
            point = FrontierPoint(t, entry["entropy"], args.n, dict(entry["correct"]))
        else:
            if sampler is None:
                model_cfg = from_dict(ModelConfig, {"path": path, "device": args.device, "dtype": args.dtype})
                model, tok = load_model_under_test(s.run, s.run_cfg, model_cfg, console)
                sampler, encode = s.sampler(model, tok), prompt_encoder(tok, s.task_cfg)
            job = bar.add_task(f"{name} T={t:g}", total=len(s.problems))
            plan = EvalPlan(n=args.n, ks=ks, temperature=t, seed=args.seed,
                            reward_timeout_s=s.task_cfg.reward_timeout_s)
            summary, results = evaluation.evaluate(sampler, tok, s.problems, s.task, plan, encode=encode,
                                                   progress=lambda c, j=job: bar.advance(j, c))
            # problem ids as strings, as they read back from the JSON record
            point = FrontierPoint(t, summary["entropy"], args.n, {str(r.id): sum(r.correct) for r in results})
            recorded.keep(key, point)
            if not console.is_terminal:  # a log file gets one line per point instead of the bar
                console.print(Text(f"{name} T={t:g}: entropy {point.entropy:.4f}, "
                                   + ", ".join(f"pass@{k} {summary[f'pass@{k}']:.3f}" for k in ks)))
        points.append(point)
        shown.append({"temperature": t, "entropy": point.entropy, "correct": dict(point.correct),
                      **{f"pass@{k}": list(bootstrap_ci([pass_at_k(args.n, c, k) for c in point.correct.values()],
                                                        seed=args.seed))
                         for k in ks}})
    return points, shown


def _print_points(record: dict, names: list[str], ks: list[int], problems: int, n: int) -> None:
    """Every model's points: temperature, entropy and pass@k with its 95% interval over problems."""
    table = Table(title=f"pass@k against sampling entropy ({problems} problems, n={n}; 95% intervals "
                        f"over problems)")
    for col in ("model", "T", "entropy", *(f"pass@{k}" for k in ks)):
        table.add_column(col, justify="left" if col == "model" else "right")
    for name in names:
        for p in record["models"][name]["points"]:
            table.add_row(Text(name), f"{p['temperature']:g}", f"{p['entropy']:.4f}",
                          *(f"{p[f'pass@{k}'][0]:.3f} [{p[f'pass@{k}'][1]:.3f}, {p[f'pass@{k}'][2]:.3f}]"
                            for k in ks))
    common.console.print(table)


def _paired_differences(frontiers: dict, names: list[str], ks: list[int], grid_size: int, seed: int) -> dict:
    """Each model minus the first at equal sampling entropy, paired over problems, at `grid_size` entropies over
    the range all models reach ({name: {k: rows}}), printed as a table; empty (and said) when the ranges do not
    overlap, or for one model."""
    console = common.console
    low, high = shared_entropy_range(frontiers)
    paired: dict = {}
    if len(names) > 1 and low <= high:
        grid = entropy_grid(low, high, grid_size)
        for name in names[1:]:
            paired[name] = {k: paired_frontier_difference(frontiers[names[0]], frontiers[name], k, grid,
                                                          seed=seed) for k in ks}
        diff = Table(title=f"pass@k minus {names[0]} at equal sampling entropy, paired over problems (95% bootstrap "
                           f"interval)")
        for col in ("model", "entropy", *(f"pass@{k}" for k in ks)):
            diff.add_column(col, justify="left" if col == "model" else "right")
        for name in names[1:]:
            for i, h in enumerate(grid):
                cells = [f"{m:+.3f} [{lo:+.3f}, {hi:+.3f}]" for _, m, lo, hi in (paired[name][k][i] for k in ks)]
                diff.add_row(Text(name), f"{h:.4f}", *cells)
        console.print(diff)
    elif len(names) > 1:
        console.print(Text(f"the models' entropy ranges do not overlap (the largest low end {low:.4f} is above the "
                           f"smallest high end {high:.4f}): no difference at equal entropy; widen --temperatures"),
                      style="yellow")
    return paired
