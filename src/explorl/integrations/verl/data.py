"""The task's data as verl's parquet: `convert_task` writes the train and held-out problems (`load_task`: the user's
files and field names, chat template, system prompt) to `RUN/verl/{train,val}.parquet` in verl's row format
(`prompt` as chat messages, `data_source`, `reward_model: {ground_truth, style}`, `extra_info: {index, split, meta}`)
and `RUN/verl/explorl.yaml`, the resolved config verl's processes read (`run_config`). `index` is the row, which
E3's budgets and per-prompt temperatures key on; `meta` the problem's meta as JSON, the reward functions' keyword
arguments. With the chat template off, prompts are one user message rendered by a pass-through template
(`CHAT_PASS_THROUGH`), and verl's tokenizer must give explorl's token ids for the first prompts.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from explorl.config import Config, ConfigError, dump_yaml
from explorl.rewards import is_batched, resolve_reward, reward_entries
from explorl.runs import nofollow
from explorl.tasks import load_task
from explorl.tasks.chat import messages_of, prompt_encoder, prompt_text

__all__ = ["CHAT_PASS_THROUGH", "CHECK_PROMPTS", "DataFiles", "VERL_DIR", "convert_task", "data_dir", "run_config",
           "task_rows"]

VERL_DIR = "verl"
"""Subdirectory of `run.out_dir` holding the converted data, explorl.yaml and verl's checkpoints."""
CHAT_PASS_THROUGH = "{% for m in messages %}{{ m.content }}{% endfor %}"
"""verl renders every prompt through a chat template; with `task.chat_template` off, this one passes the text."""
CHECK_PROMPTS = 8
"""Prompts on which verl's tokenizer must give explorl's token ids."""


@dataclass
class DataFiles:
    """The converted task: where it is (or would be) written and what verl needs to know of it."""

    dir: Path
    train: Path
    val: Path
    config: Path
    """explorl.yaml: the resolved explorl config (reward bridge, run directory)."""
    train_rows: int
    val_rows: int
    max_prompt_tokens: int
    chat: bool
    """Whether prompts go through the model's chat template (`task.chat_template` resolved)."""
    batched_rewards: list[str] = field(default_factory=list)


def data_dir(cfg: Config) -> Path:
    return Path(cfg.run.out_dir).expanduser().resolve() / VERL_DIR


def _token_ids(encoded: Any) -> list[int]:
    """`apply_chat_template(..., tokenize=True)`'s result as a flat list of ids (transformers 4 or 5)."""
    if hasattr(encoded, "keys") and "input_ids" in encoded:
        encoded = encoded["input_ids"]
    encoded = list(encoded)
    return list(encoded[0]) if encoded and isinstance(encoded[0], (list, tuple)) else [int(i) for i in encoded]

def task_rows(cfg: Config, tok, task=None) -> tuple[list[dict], list[dict], list[int], bool]:
    """(train rows, val rows, each prompt's explorl token count, chat) of the task in verl's row format."""
    task = task if task is not None else load_task(cfg.task)
    encode = prompt_encoder(tok, cfg.task)
    chat = bool(encode.chat)
    source = f"explorl/{cfg.task.name}"

    def row(p, index: int, split: str) -> dict:
        if chat:
            messages = messages_of(p, cfg.task.system_prompt)
        else:
            messages = [{"role": "user", "content": prompt_text(p, tok, chat=False,
                                                                system_prompt=cfg.task.system_prompt)}]
        return {"data_source": source, "prompt": messages, "ability": "explorl",
                "reward_model": {"ground_truth": str(p.answer), "style": "rule"},
                "extra_info": {"index": index, "split": split, "meta": json.dumps(p.meta, default=str)}}

    train = [row(p, i, "train") for i, p in enumerate(task.train)]
    val = [row(p, i, "val") for i, p in enumerate(task.eval)]
    lengths = [len(encode(p)) for p in [*task.train, *task.eval]]
    return train, val, lengths, chat


def convert_task(cfg: Config, tok, verl_tok, *, write: bool = True) -> DataFiles:
    """The task (`load_task(cfg.task)`) as verl's parquet under `RUN/verl/` (written when `write`), after checking
    that verl's tokenizer `verl_tok` gives the first prompts explorl's token ids (`tok`, `prompt_encoder`)."""
    task = load_task(cfg.task)
    train, val, lengths, chat = task_rows(cfg, tok, task)
    if len(train) < cfg.run.batch_size:
        raise ConfigError(f"run.batch_size: {cfg.run.batch_size} prompts per step, but the task has only "
                          f"{len(train)} training problems; verl needs a full batch per step")
    encode = prompt_encoder(tok, cfg.task)
    if not chat:
        verl_tok.chat_template = CHAT_PASS_THROUGH
    for p, r in list(zip(task.train, train))[:CHECK_PROMPTS]:
        ours = list(encode(p))
        theirs = _token_ids(verl_tok.apply_chat_template(r["prompt"], tokenize=True, add_generation_prompt=True))
        if ours != theirs:
            raise ConfigError(
                f"model.path: verl loads the tokenizer of {cfg.model.path} with AutoTokenizer, which tokenizes the "
                f"prompts differently from explorl (problem {p.meta.get('id', '?')}: {len(theirs)} tokens vs "
                f"explorl's {len(ours)}; e.g. transformers 5 loads the embedded character tokenizer as Qwen2's and "
                f"drops characters). Give a model directory whose tokenizer AutoTokenizer loads as it is")
    batched = []
    for entry in reward_entries(cfg.task.reward):
        if entry != "auto" and is_batched(resolve_reward(entry, (None, False))[0]):
            batched.append(entry)
    out = data_dir(cfg)
    files = DataFiles(dir=out, train=out / "train.parquet", val=out / "val.parquet", config=out / "explorl.yaml",
                      train_rows=len(train), val_rows=len(val), max_prompt_tokens=max(lengths), chat=chat,
                      batched_rewards=batched)
    if write:
        nofollow.make_dirs(out)  # inside a run directory: no link followed (issue 56)
        for table, path in ((train, files.train), (val, files.val)):
            with nofollow.open_new(path, mode="wb") as f:
                pq.write_table(pa.Table.from_pylist(table), f)
        nofollow.write_atomic(files.config, dump_yaml(run_config(cfg, chat)))
    return files


def run_config(cfg: Config, chat: bool) -> Config:
    """The config verl's processes read: `task.chat_template` as it resolved, `run.out_dir` absolute, `model.device`
    auto (verl's trainer process has no GPU; the final evaluation takes one where it runs)."""
    out_dir = str(Path(cfg.run.out_dir).expanduser().resolve())
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, device="auto"),
                               task=dataclasses.replace(cfg.task, chat_template="on" if chat else "off"),
                               run=dataclasses.replace(cfg.run, out_dir=out_dir))
