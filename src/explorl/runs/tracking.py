"""Experiment tracking beside metrics.jsonl: TensorBoard and Weights & Biases (`run.report_to`), through those
libraries (optional extras, imported only when chosen: `pip install "explorl[track]"`).

Every record written to metrics.jsonl (every step's metrics and every evaluation) reaches the chosen trackers as
scalars at its step; list-valued metrics (`entropy/by_position`) go as one scalar per bin. The run's resolved
config is the tracked run's config. A resumed run continues the same tracked run: TensorBoard writes to the same
directory and drops what was logged after the checkpoint (`purge_step`); W&B resumes the run id kept in the run
directory (`wandb_run_id`). W&B honours its own environment (`WANDB_MODE=offline`, `WANDB_API_KEY`, ...).
"""

from __future__ import annotations

import importlib
import math
import uuid
from pathlib import Path

import yaml

from explorl.runs import nofollow

TRACKERS = ("tensorboard", "wandb")


def _import(name: str):
    """The tracker's library, or ImportError saying how to install it."""
    module = {"tensorboard": "torch.utils.tensorboard", "wandb": "wandb"}[name]
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"run.report_to: {name} needs its package ({e}); install it with "
                          f"`pip install \"explorl[track]\"` (or `pip install {name}`)") from None


def check_installed(report_to: list[str]) -> None:
    """Fail before any work when a chosen tracker's package is missing."""
    for name in report_to:
        _import(name)


def scalars(record: dict) -> dict[str, float]:
    """The record's numbers as scalars (lists as one scalar per element; None and non-finite values dropped)."""
    out = {}
    for key, value in record.items():
        if key == "step":
            continue
        values = value if isinstance(value, list) else [value]
        for i, v in enumerate(values):
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                out[f"{key}/{i}" if isinstance(value, list) else key] = float(v)
    return out


class Trackers:
    """The chosen trackers of one run; `log(record)` sends a metrics.jsonl record to each."""

    def __init__(self, report_to: list[str], run_dir: Path, config: dict, *, resume_step: int | None = None,
                 project: str = "explorl"):
        self.tb = self.wandb = None
        run_dir = Path(run_dir)
        if "tensorboard" in report_to:
            tb = _import("tensorboard")
            nofollow.make_dirs(run_dir / "tensorboard")  # a real directory: TensorBoard's own makedirs follows links
            self.tb = tb.SummaryWriter(log_dir=str(run_dir / "tensorboard"),
                                       purge_step=None if resume_step is None else resume_step + 1)
            self.tb.add_text("config", "```\n" + _yaml(config) + "\n```", 0)
        if "wandb" in report_to:
            wandb = _import("wandb")
            id_file = run_dir / "wandb_run_id"
            run_id = id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:8]
            nofollow.write_atomic(id_file, run_id + "\n")
            nofollow.check(run_dir / "wandb")  # where W&B writes its files: never through a link
            self.wandb = wandb.init(project=project, name=run_dir.name, id=run_id, resume="allow", dir=str(run_dir),
                                    config=config)

    def log(self, record: dict) -> None:
        values, step = scalars(record), int(record["step"])
        if self.tb is not None:
            for key, v in values.items():
                self.tb.add_scalar(key, v, step)
            self.tb.flush()
        if self.wandb is not None:
            self.wandb.log(values, step=step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


def _yaml(config: dict) -> str:
    return yaml.safe_dump(config, sort_keys=False)
