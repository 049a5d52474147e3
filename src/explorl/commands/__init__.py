"""The `explorl` command: one module per subcommand, each declaring its flags (`add_parser(sub)`) next to the
function that runs it (`cmd_*`); `common` holds what several share (the console, flag parsing, result tables).

  train.py    `explorl train`      a policy from a YAML config (`explorl.train.loop`)
  eval.py     `explorl eval`       pass@k / maj@k on a held-out split (settings: `explorl.evaluation.settings`)
  export.py   `explorl export`     a run's model as a standard Hugging Face directory
  bootstrap.py `explorl bootstrap` the tiny default model
  demo.py     `explorl demo`       base eval, GRPO, eval after
  rft.py      `explorl rft`        rejection-sampling fine-tuning;  sft.py  `explorl sft`
  venn.py     `explorl venn`       unsolvable sets of 2-3 models;  curves.py  `explorl curves`  pass@k against k
  frontier.py `explorl frontier`   pass@k against sampling entropy, models compared at equal entropy
  config.py   `explorl config`     every config field
  methods.py  `explorl methods`    the registered methods: papers, equations, options, code
  analyze.py  `explorl analyze`    a run's report, or a completions file's;  compare.py  `explorl compare`
  probe.py    `explorl probe`      the papers' analyses on a model (the work: probe_runs.py)
"""

from __future__ import annotations

import argparse

from rich.markup import escape

import explorl.commands.common as common
from explorl import __version__
from explorl.commands import (analyze, bootstrap, compare, config, curves, demo, export, frontier, methods, probe,
                              rft, sft, train, venn)
from explorl.commands import eval as eval_command  # (a name apart from the builtin eval)
from explorl.config import ConfigError

__all__ = ["build_parser", "main"]

COMMANDS = (train, eval_command, export, bootstrap, demo, rft, sft, venn, curves, frontier, config, methods, analyze,
            compare, probe)
"""The subcommands in the order `explorl --help` lists them."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="explorl", description="RL with verifiable rewards, built around exploration")
    p.add_argument("--version", action="version", version=f"explorl {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    from transformers.utils import logging as hf_logging  # transformers: ~0.4 s that `import explorl.commands` skips

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
        common.console.print(f"[bold red]config error:[/] {escape(str(e))}")
        return 2
    except (FileNotFoundError, FileExistsError, ValueError) as e:
        common.console.print(f"[bold red]error:[/] {escape(str(e))}")
        return 2
    except KeyboardInterrupt:
        common.console.print("[yellow]interrupted[/]; a run continues with `explorl train --resume RUN`")
        return 130
