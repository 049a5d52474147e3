"""What several `explorl` commands share: the console they print to, flag parsing, and the tables they print.

The commands read `common.console` when they run (never `from ... import console` at import time), so a caller or a
test may replace it, e.g. by a `Console(file=...)` that records the output.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from explorl.config import DEVICES, ConfigError, load_config, valid_device
from explorl.config.explain import explain, format_explanation
from explorl.config.selection import import_plugins, use_python_path
from explorl.config.trust import command_trust, recorded_settings, refuse_resumed_code

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


def _check_ks_within_n(ks: list[int], n: int) -> None:
    """pass@k needs at least k samples per problem: SystemExit naming --k and --n otherwise."""
    if max(ks) > n:
        raise SystemExit(f"--k: k={max(ks)} exceeds --n={n}; pass@k needs at least k samples per problem")


def _check_device(device: str) -> None:
    """SystemExit naming --device when it is not a device explorl knows (`config.DEVICES`)."""
    if not valid_device(device):
        raise SystemExit(f"--device: {device!r} is not one of {DEVICES}")


def _task_opts(items: list[str]) -> dict[str, str]:
    opts = {}
    for item in items:
        if "=" not in item:
            raise SystemExit(f"--task-opt {item!r}: expected field=value (a task.* field such as path=data.jsonl)")
        k, v = item.split("=", 1)
        opts[k.strip()] = v
    return opts


def _run_config(args, command: str, example: str):
    """The config of `explorl train` / `explorl sft`: CONFIG with overrides, or with `--resume RUN` the run's own
    config.yaml (overrides still apply)."""
    return load_config(*_config_source(args, command, example))


def _config_source(args, command: str, example: str) -> tuple[Path | str, list[str]]:
    """(config file, overrides) of `explorl train` / `explorl sft`, as `_run_config` reads them."""
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
        _refuse_remote_code_from_run(run, overrides)
        refuse_resumed_code(run, overrides, f"explorl {command} --resume {run}")  # before anything is imported
        return run / "config.yaml", overrides
    if args.config is None:
        raise ConfigError(f"explorl {command}: give a CONFIG file (e.g. {example}) or --resume RUN")
    return args.config, list(args.overrides)


def _print_config_summary(path, overrides: list[str]):
    """Load and validate the config, print each key that differs from its default with the layer that set it and
    what the chosen methods cost (`explorl.config.explain`), in a few lines; returns the config. The whole resolved
    config is `explorl config FILE --resolved` (and a run's config.yaml)."""
    explained = explain(path, overrides)
    console.rule("config")
    for line in format_explanation(explained, title=f"{path}: the keys that differ from their defaults"):
        console.print(escape(line), highlight=False, soft_wrap=True)
    shown = " ".join([str(path), *overrides])
    console.print(f"[dim]the whole resolved config: explorl config {escape(shown)} --resolved[/]", highlight=False,
                  soft_wrap=True)
    return explained.cfg


def _refuse_remote_code_from_run(run: Path, overrides: list[str]) -> None:
    """A run directory is not trusted to let a model's code run: ConfigError when RUN/config.yaml sets
    `model.trust_remote_code: true` (itself or through a `base:` or `methods:` file) and the command line does not
    say it again."""
    recorded = recorded_settings(run / "config.yaml").get("model")  # {} when unreadable: loading names the problem
    recorded = recorded if isinstance(recorded, dict) else {}
    if recorded.get("trust_remote_code") is True and \
            not any(o.split("=", 1)[0].strip() == "model.trust_remote_code" for o in overrides):
        raise ConfigError(f"model.trust_remote_code: {run / 'config.yaml'} sets it to true, which lets the model "
                          f"directory's Python code run; a run directory alone is not trusted with that. Add "
                          f"model.trust_remote_code=true to the command if you trust {run} and its model")


def _use_code_flags(python_path: list[str], plugins: list[str]) -> None:
    """`--python-path DIR` (each an existing directory, searched first for modules from now on; workers inherit
    sys.path) and `--plugin MODULE` (imported now): code the user names on the command line."""
    missing = [d for d in python_path if not Path(d).expanduser().is_dir()]
    if missing:
        raise SystemExit(f"--python-path: {', '.join(missing)} is not a directory")
    use_python_path([str(Path(d).expanduser().resolve()) for d in python_path])
    import_plugins(plugins)


def _run_code_trust(args, opts: dict, command: str = "eval"):
    """What `explorl eval` (`frontier`, `probe`) was told to trust of an evaluated run's config.yaml
    (`config.trust.command_trust`): the code its `--plugin`, `--python-path` and `--task-opt reward=...` name;
    the run's held-out sets are not read with `--eval-set` (nor by a command without that flag)."""
    flags = tuple(f for f in ("--plugin", "--python-path", "--task-opt", "--eval-set", "--config")
                  if hasattr(args, f[2:].replace("-", "_")))
    sets_read = hasattr(args, "eval_set") and not args.eval_set
    return command_trust(command, flags, plugins=getattr(args, "plugin", []),
                         python_path=getattr(args, "python_path", []), task_opts=opts,
                         unread=set() if sets_read else {"run.eval_sets"})


OVERWRITE_HELP = "replace an output you name that already exists (otherwise the command stops before any work)"


def add_overwrite_flag(parser) -> None:
    """`--overwrite`, the one switch of `refuse_to_replace` on every command that writes where you say."""
    parser.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)


def refuse_to_replace(path: str | Path | None, flag: str, overwrite: bool, *, own: tuple[str, ...] = ()) -> None:
    """The one rule for what a command writes where you say (`--out`, `--save-completions`, `--per-problem`): a file
    that exists, or a directory that holds anything, is not replaced: FileExistsError naming the flag and the path,
    raised before any work, unless `overwrite` (`--overwrite`). `own`: files that mark a directory as this command's
    own earlier output, which it continues (`explorl frontier`'s points). Paths explorl picks itself are new
    (`_unused_path`) or its own (`runs/...`, RUN/report)."""
    if path is None or overwrite:
        return
    p = Path(path)
    if p.is_dir():
        entries = sorted(x.name for x in p.iterdir())
        if not entries or any((p / f).exists() for f in own):
            return
        shown = ", ".join(entries[:5]) + (f" and {len(entries) - 5} more" if len(entries) > 5 else "")
        raise FileExistsError(f"{flag} {p}: already exists and is not an empty directory (it holds {shown}); a "
                              f"directory you name is written only when empty. Choose a new one, or add --overwrite "
                              f"to replace what the command writes there")
    if p.exists():
        raise FileExistsError(f"{flag} {p}: already exists; a file you name is never replaced. Choose another path, "
                              f"or add --overwrite to replace it")


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


def _print_checks(checks) -> None:
    for what, result in checks:
        style = "yellow" if result.startswith("warning:") else "green"
        console.print(Text.assemble(("  ok " if style == "green" else "  !! ", style), f"{what}: {result}"))


def _print_table(title: str, rows: dict[str, dict], ks) -> None:
    table = Table(title=title)
    table.add_column("model")
    cols = [f"pass@{k}" for k in ks] + [f"maj@{k}" for k in ks if k > 1] + ["entropy", "length"]
    for c in cols:
        table.add_column(c, justify="right")
    for name, summary in rows.items():
        table.add_row(name, *[f"{summary[c]:.3f}" if c in summary else "-" for c in cols])
    console.print(table)


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
    """Print a report's notes and tables (`explorl analyze`, `explorl compare`) and where its page is."""
    for plot in report.plots:
        if plot.note:
            console.print(f"[yellow]{plot.title}[/]: {plot.note}")
    for t in report.tables:
        _print_html_table(t)
    console.print(f"report: {report.html}")
    return 0
