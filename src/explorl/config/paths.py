"""The paths a config names (`model.path`, `task.path`, `task.eval_path`, the held-out sets' paths, the run
directory `run.out_dir`): made absolute relative to the config file that sets them (the command line's: the working
directory), so a config runs from any directory and a run's config.yaml records where its inputs and its outputs
are; `run.python_path` filled in for the modules a file names.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

# the fields that name files or directories a run reads: resolved relative to the config file that sets them
# (command-line overrides: relative to the working directory), so a config runs from any directory
PATH_FIELDS = (("model", "path"), ("task", "path"), ("task", "eval_path"))


HUB_NAME = re.compile(r"[A-Za-z0-9][\w-]*(?:/[A-Za-z0-9][\w.-]*)?")
"""A dataset name as the Hub writes them (`gsm8k`, `openai/gsm8k`, `HuggingFaceH4/MATH-500`)."""


def _hub_name(value: str, base: Path) -> bool:
    """Whether a relative `task.path` is a dataset name rather than a path: shaped like one, with no file suffix,
    and nothing of that name next to the config (a local directory or file always wins, as in `load_dataset`)."""
    return bool(HUB_NAME.fullmatch(value)) and not Path(value).suffix and not (base / value).exists()


def resolve_paths(data: dict, base: Path, modules: bool = True) -> None:
    """Make the paths of one config file's mapping absolute, relative to `base` (its directory): model.path (not
    `embedded`), task.path, task.eval_path, each `run.eval_sets` entry's path and eval_path, and the run directory
    `run.out_dir` (normalised: `../runs/demo` is written without the `..`); and with `modules`,
    when the file names modules (`run.plugins`, a `module:function` in `task.reward`) and says no `run.python_path`
    of its own (a run's recorded config.yaml does), put `base` on `run.python_path`."""
    def resolve(section: Any, key: str) -> None:
        value = section.get(key) if isinstance(section, dict) else None
        shipped = ("embedded", "embedded:testbed")  # the models shipped with explorl, not directories
        if isinstance(value, str) and value and value not in shipped and not Path(value).expanduser().is_absolute():
            if section is data.get("task") and key == "path" and _hub_name(value, base):
                return  # a dataset name for `task.name: hf` (`openai/gsm8k`), kept as written
            section[key] = str(base / value)

    for section, key in PATH_FIELDS:
        resolve(data.get(section), key)
    run = data.get("run") if isinstance(data.get("run"), dict) else None
    if run is not None and isinstance(run.get("out_dir"), str) and run["out_dir"]:  # where the run writes
        run["out_dir"] = os.path.normpath(base / Path(run["out_dir"]).expanduser())
    sets = (run or {}).get("eval_sets")
    for entry in sets.values() if isinstance(sets, dict) else ():
        for key in ("path", "eval_path"):
            resolve(entry, key)
    if not modules or (isinstance(run, dict) and "python_path" in run):
        return
    task = data.get("task") if isinstance(data.get("task"), dict) else {}
    rewards = task.get("reward")
    modules = [r for r in (rewards if isinstance(rewards, list) else [rewards]) if isinstance(r, str) and ":" in r]
    if modules or (run or {}).get("plugins"):
        data.setdefault("run", {})
        if isinstance(data["run"], dict):
            dirs = list(data["run"].get("python_path") or [])
            data["run"]["python_path"] = dirs + [str(base)] if str(base) not in dirs else dirs


def resolve_paths_of_overrides(data: dict) -> None:
    """Paths still relative after the files were read came from the command line (or a config built in code):
    relative to the working directory, made absolute so that config.yaml records where they are."""
    resolve_paths(data, Path.cwd(), modules=False)  # modules named on the command line: found from the cwd
