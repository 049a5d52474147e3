"""The `explorl` command's former home, kept for compatibility: the commands now live in `explorl.commands`, one
module each (their flags beside the function that runs them).

Re-exported here: `main` and `build_parser` (`explorl.commands`), `console` (the console every command prints to,
`explorl.commands.common.console`: reading `explorl.cli.console` gives that object and assigning it replaces it for
every command, as a test recording the output does), the `cmd_*` functions and the former helpers.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path  # noqa: F401  (re-exported: callers reached it as explorl.cli.Path)

import explorl.commands.common as _common
from explorl.commands import build_parser, main
from explorl.commands.analyze import analyze_completions, cmd_analyze
from explorl.commands.bootstrap import cmd_bootstrap
from explorl.commands.common import (_parse_ks, _parse_list, _print_checks, _print_html_table, _print_table,
                                     _run_config, _show_report, _task_opts, _unused_path)
from explorl.commands.compare import cmd_compare
from explorl.commands.config import cmd_config
from explorl.commands.curves import cmd_curves
from explorl.commands.demo import cmd_demo
from explorl.commands.eval import _eval_sets, _fingerprints, cmd_eval
from explorl.commands.export import cmd_export
from explorl.commands.probe import cmd_probe
from explorl.commands.rft import cmd_rft
from explorl.commands.sft import cmd_sft
from explorl.commands.train import cmd_train
from explorl.commands.venn import cmd_venn
from explorl.evaluation.settings import eval_split as _eval_split
from explorl.evaluation.settings import inference_schedule as _inference_schedule

__all__ = ["build_parser", "main", "console", "cmd_analyze", "cmd_bootstrap", "cmd_compare", "cmd_config",
           "cmd_curves", "cmd_demo", "cmd_eval", "cmd_export", "cmd_probe", "cmd_rft", "cmd_sft", "cmd_train",
           "cmd_venn", "analyze_completions", "_parse_ks", "_parse_list", "_print_checks", "_print_html_table",
           "_print_table", "_run_config", "_show_report", "_task_opts", "_unused_path", "_eval_sets",
           "_fingerprints", "_eval_split", "_inference_schedule"]


class _CliModule(types.ModuleType):
    """This module, with `console` standing for `explorl.commands.common.console` (read and assigned)."""

    @property
    def console(self):
        return _common.console

    @console.setter
    def console(self, value) -> None:
        _common.console = value


sys.modules[__name__].__class__ = _CliModule

if __name__ == "__main__":
    sys.exit(main())
