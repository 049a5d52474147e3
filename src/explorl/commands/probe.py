"""`explorl probe PROBE`: the papers' analyses run on a model (`experiments.probes`; docs/methods.md §8e).

`explorl probe position | covariance | branch | perturb | update`, each reading `--model` and the task flags as
`explorl eval` does (a model directory, `embedded`, or a run's output, whose config then supplies the task, the
length limit, the temperature and top_p unless given), writing a JSON result (default
`runs/probe/PROBE-MODEL.json`) and a PNG beside it, and printing a table. This module holds the flags, their checks
and the output files; `run(args, task_opts, console)` sets up the model and runs each probe through
`explorl.commands.probe_runs`, imported only then (it loads torch and the training loop).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from rich.text import Text

import explorl.commands.common as common
from explorl.commands.common import _parse_list, _task_opts, add_overwrite_flag, refuse_to_replace
from explorl.commands.probe_runs import RUNS, setup
from explorl.runs import nofollow

if TYPE_CHECKING:
    from explorl.commands.probe_runs import Context

__all__ = ["run", "PROBES"]

PROBES = ("position", "covariance", "branch", "perturb", "update")


def add_parser(sub) -> None:
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
        add_overwrite_flag(q)
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


def cmd_probe(args) -> int:
    """`explorl probe PROBE`: check the probe's own flags, then `run` it."""
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
    refuse_to_replace(args.out, "--out", args.overwrite)
    return run(args, _task_opts(args.task_opt), common.console)


def _clean(x):
    """JSON-ready: tensors as lists, NaN as None."""
    if isinstance(x, torch.Tensor):
        return _clean(x.tolist())
    if isinstance(x, float):
        return None if math.isnan(x) else x
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def _write(args, ctx: Context, probe: str, result: dict, console) -> Path:
    out = Path(args.out) if args.out else Path(f"runs/probe/{probe}-{ctx.label}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    nofollow.write_file(out, json.dumps(_clean({"probe": probe, "label": ctx.label, "settings": ctx.settings,
                                                **result}), indent=2))  # a link there is refused, not followed
    console.print(Text(f"wrote {out}"))
    return out


DRAW = {"position": lambda res, path: _draw("plot_position", res, path),
        "covariance": lambda res, path: _draw("plot_covariance", res["curve"], path),
        "branch": lambda res, path: _draw("plot_branch", res["summary"], path),
        "perturb": lambda res, path: _draw("plot_perturb", res["tests"], path),
        "update": lambda res, path: _draw("plot_update", res["summary"], path)}


def _draw(name: str, data, path: Path) -> Path:
    from explorl.experiments import plots  # matplotlib: ~0.3 s, paid only to plot

    return getattr(plots, name)(_clean(data), path)


def run(args, task_opts: dict, console) -> int:
    """Run probe `args.probe`: set up, probe, print, write the JSON and the PNG."""
    fn = RUNS[args.probe]
    ctx = setup(args, task_opts, console)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    result = fn(args, ctx, console)
    out = _write(args, ctx, args.probe, result, console)
    if not args.no_plot:
        png = DRAW[args.probe](result, out.with_suffix(".png"))
        console.print(Text(f"wrote {png}"))
    return 0
