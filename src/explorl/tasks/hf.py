"""Hugging Face datasets as tasks (`task.name: hf`): rows of a `datasets.Dataset`, turned into problems exactly as the
`file` task turns a file's rows (`files.to_problem`: `task.prompt_field`, `task.answer_field`, conversational rows,
`task.prompt_template` with any column, every column passed to the reward).

`task.path` is either a directory written by `save_to_disk` (a Dataset, or a DatasetDict whose `task.split` /
`task.eval_split` are read), loaded with `datasets.load_from_disk`, or anything `datasets.load_dataset(path, name,
split=..., data_files=...)` reads: a local folder of parquet / JSON / CSV files, or a dataset name on the Hub. The
library's offline mode is honoured: with `HF_DATASETS_OFFLINE=1` nothing is fetched, and a name that is not in the
local cache fails naming the setting. explorl itself never downloads anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from explorl.algos.registry import register
from explorl.rewards import extract_boxed
from explorl.tasks.base import Problem, spread
from explorl.tasks.files import default_reward, to_problem

if TYPE_CHECKING:
    from explorl.config.schema import TaskConfig


def _datasets():
    try:
        import datasets  # ~0.5 s at import, paid only for a Hugging Face dataset task
    except ImportError as e:  # pragma: no cover - a dependency; the message is the point
        raise ValueError(f"task.name=hf needs the `datasets` library: pip install datasets ({e})") from None
    return datasets


def is_saved_dataset(path: Path) -> bool:
    """Whether `path` is a directory written by `save_to_disk` (a DatasetDict's `dataset_dict.json`, or a
    Dataset's `state.json` and `dataset_info.json`)."""
    return path.is_dir() and ((path / "dataset_dict.json").is_file() or
                              ((path / "state.json").is_file() and (path / "dataset_info.json").is_file()))


def load_split(cfg: TaskConfig, split: str, config_field: str) -> Any:
    """The `datasets.Dataset` of `split` (named by `config_field` in errors) as `task.path` says; ValueError naming
    the field, the splits there are, or the offline setting."""
    datasets = _datasets()
    if not cfg.path:
        raise ValueError("task.path: the `hf` task needs a dataset: a directory written by save_to_disk, a local "
                         "folder of data files, or a dataset name on the Hub")
    local = Path(cfg.path).expanduser()
    if is_saved_dataset(local):
        saved = datasets.load_from_disk(str(local))
        if isinstance(saved, datasets.DatasetDict):
            if split not in saved:
                raise ValueError(f"{config_field}: {split!r} is not a split of {cfg.path} (saved with save_to_disk); "
                                 f"its splits: {', '.join(saved)}")
            return saved[split]
        if split != "train" or config_field == "task.eval_split":  # one Dataset: no splits to choose from
            raise ValueError(f"{config_field}: {cfg.path} holds one Dataset (saved with save_to_disk), not a "
                             f"DatasetDict, so it has no split {split!r}; leave {config_field} "
                             f"{'empty' if config_field == 'task.eval_split' else 'at train'} (the last "
                             f"task.eval_size rows are held out) or save a DatasetDict")
        return saved
    try:
        return datasets.load_dataset(str(local) if local.exists() else cfg.path, cfg.subset or None, split=split,
                                     data_files=list(cfg.data_files) or None)
    except Exception as e:  # the library's own errors: a missing split, a name not on the Hub or not cached
        offline = bool(getattr(datasets.config, "HF_HUB_OFFLINE", False))
        where = (f"{cfg.path} is a local directory" if local.exists() else
                 f"{cfg.path!r} is no local directory (a relative path is relative to the config file) and "
                 + ("not in the local cache, and HF_DATASETS_OFFLINE=1: nothing is fetched" if offline else
                    "was looked up as a dataset name on the Hub"))
        raise ValueError(f"task.path: datasets.load_dataset could not read {split!r} ({config_field}; "
                         f"task.subset={cfg.subset or None!r}, task.data_files={list(cfg.data_files) or None}): "
                         f"{where}. {type(e).__name__}: {_first_line(e)}") from None


def _first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else ""


def _problems(ds: Any, cfg: TaskConfig, split: str, limit: int | None = None) -> list[Problem]:
    """The rows of `ds` (a `datasets.Dataset`) as problems, `files.to_problem`'s way; errors name the row."""
    name = Path(cfg.path).name or cfg.path
    count = len(ds) if limit is None else min(limit, len(ds))
    rows = ds.select(range(count)) if limit is not None and count < len(ds) else ds
    return [to_problem(row, f"{cfg.path} [{split}] row {i + 1} (index {i})", f"{name}/{split}:{i}", cfg)
            for i, row in enumerate(rows)]


def load_hf_task(cfg: TaskConfig) -> tuple[list[Problem], list[Problem]]:
    """(train, eval): `task.split`'s rows and `task.eval_split`'s first `eval_size`, or without an eval split the last
    `eval_size` rows of `task.split` held out; `train_size` caps the training rows."""
    train_ds = load_split(cfg, cfg.split, "task.split")
    if cfg.eval_split:
        eval_ = _problems(load_split(cfg, cfg.eval_split, "task.eval_split"), cfg, cfg.eval_split, cfg.eval_size)
        train = _problems(train_ds, cfg, cfg.split, cfg.train_size)
    else:
        n = len(train_ds)
        if n <= cfg.eval_size:
            raise ValueError(f"task.eval_size: split {cfg.split!r} of {cfg.path} has {n} rows; holding out the last "
                             f"eval_size={cfg.eval_size} would leave none for training. Lower task.eval_size or give "
                             f"task.eval_split")
        rows = _problems(train_ds, cfg, cfg.split)
        train, eval_ = rows[: n - cfg.eval_size][: cfg.train_size], rows[n - cfg.eval_size:]
    if not train or not eval_:
        raise ValueError(f"task.path: no {'training' if not train else 'held-out'} rows in {cfg.path}")
    return train, eval_


def check_hf_task(cfg: TaskConfig) -> str:
    """What `load_hf_task` needs, checked before a run: the splits load and every row of them parses with the
    configured fields and template. Returns a one-line description; ValueError naming the field or the row."""
    train, eval_ = load_hf_task(cfg)
    held = f"the first {len(eval_)} rows of split {cfg.eval_split!r}" if cfg.eval_split else \
        f"the last {len(eval_)} rows of split {cfg.split!r}"
    return (f"hf {cfg.path}: {len(train)} training rows of split {cfg.split!r}, every one parses with fields "
            f"{cfg.prompt_field!r} and {cfg.answer_field!r}; held out: {held}")


def preflight_sample(cfg: TaskConfig) -> tuple[list[Problem], tuple[Callable, bool]]:
    """(up to 8 training problems spread over the split, default reward): what the checks before a run call
    `task.reward` on."""
    train, _ = load_hf_task(cfg)
    return spread(train), default_reward()


def _check_hf(cfg) -> str | None:
    return None if cfg.task.path else ("task.path: the `hf` task needs a dataset (a save_to_disk directory, a folder "
                                       "of data files, or a Hub dataset name)")


@register("task", "hf", reads=("path", "split", "eval_split", "subset", "data_files", "prompt_field", "answer_field",
                               "solution_field", "prompt_template", "train_size", "eval_size"),
          check=_check_hf, preflight=check_hf_task, preflight_sample=preflight_sample)
def load_hf(cfg: TaskConfig) -> tuple[list[Problem], list[Problem], tuple[Callable, bool], Callable]:
    """The `hf` task: (train, eval, default reward, answer extractor); answers are read from the last \\boxed{}."""
    train, eval_ = load_hf_task(cfg)
    return train, eval_, default_reward(), extract_boxed
