"""The task section of the schema: the data, the prompts and the rewards (`task.*`), also the settings each held-out
set of `run.eval_sets` layers over it (`explorl.config.held_out`). Like `explorl.config.schema`, which re-exports
it, this module imports nothing of explorl; its field docstrings are read from this file's source (`field_docs`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass
class TaskConfig:
    name: str = "arith"
    """`arith` (built-in procedural arithmetic with worked solutions), `file` (question/answer JSONL or
    Parquet at `path`), `hf` (a Hugging Face dataset: `path` a directory or a dataset name), or `rg:<dataset>` for
    a reasoning-gym task such as `rg:chain_sum`."""
    path: str = ""
    """`file` task: training data (.jsonl, .json or .parquet). `hf` task: a directory written by `save_to_disk`
    (a Dataset or a DatasetDict, read by `datasets.load_from_disk`), or anything `datasets.load_dataset` reads: a
    local folder of data files, or a dataset name on the Hub (from its cache when `HF_DATASETS_OFFLINE=1`)."""
    eval_path: str = ""
    """`file` task: held-out data. Empty: the last `eval_size` rows of `path` are held out."""
    split: str = "train"
    """`hf` task: the split training reads (`task.eval_split` the held-out one)."""
    eval_split: str = ""
    """`hf` task: the held-out split (its first `eval_size` rows), e.g. `test`. Empty: the last `eval_size` rows of
    `split` are held out."""
    subset: str = ""
    """`hf` task: the dataset's configuration (`load_dataset`'s `name`, a "subset" on the Hub), e.g. `main` for
    gsm8k. Empty: its default."""
    data_files: list[str] = field(default_factory=list)
    """`hf` task: `load_dataset`'s `data_files` (files or glob patterns inside `path`), e.g. `[train-*.parquet]`.
    Empty: the dataset's own layout."""
    prompt_field: str = "problem"
    """`file` task: the field holding the question."""
    answer_field: str = "answer"
    """`file` task: the field holding the ground-truth answer."""
    solution_field: str = "solution"
    """`file` task: the field holding a worked solution (MATH's `solution`), the target text of `explorl sft`;
    optional for the other commands (rows without it have none)."""
    chat_template: Literal["auto", "on", "off"] = "auto"
    """Prompt through the tokenizer's chat template (instruct and reasoning models): `auto` (on when the tokenizer
    has one; the run's config.yaml records what it resolved to), `on`, `off`. The question (after
    `prompt_template`) or a conversational row's messages become the user turn."""
    system_prompt: str = ""
    """A system message before the user turn (chat template on), or a line before the prompt (off)."""
    prompt_template: str = "{question}"
    """Format string that turns a question into the prompt: `{question}` is replaced by the question (every
    built-in task; `arith`'s question is `7+12-5=?\\n`, the one format the embedded model knows), and in `file` and
    `hf` tasks `{name}` by the row's column `name` (`{context}`, `{problem}`); any other braces stay as written."""
    difficulties: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 5])
    """`arith`: difficulty levels mixed in one dataset (level d has d operations), so some prompts are easy
    and some hard. `rg:` tasks ignore it."""
    operands: list[int] = field(default_factory=lambda: [1, 20])
    """`arith`: the inclusive range [low, high] its operands are drawn from. [1, 20] is the range the embedded model
    was trained on; a range above it (e.g. [21, 30]) tests generalisation to larger numbers."""
    train_size: int = 4096
    """Number of training problems: generated for `arith` and `rg:`, a cap on the rows used for `file`."""
    eval_size: int = 256
    """Number of held-out problems."""
    data_seed: int = 1234
    """Seed of the procedural generators; independent of the training seed so runs share data."""
    reward: str | list[str] = "auto"
    """`auto` (the task's own checker), `math` (math-verify on the last \\boxed{}), `exact` (string match of the
    last \\boxed{}), `verified` (`auto`, but 0 when the response states a false integer equation such as `7+5=13`),
    `chain` (1 when the response's lines are the problem's worked solution, arith; docs/methods.md §8f), or
    `module:function` for your own `fn(completion, answer, **meta) -> float`; or a list of these (`[math,
    my_rewards:fmt]`, TRL's `reward_funcs`): the reward is their weighted sum (`reward_weights`), and each
    function's mean is logged as `reward/<entry>` (`:` written `.`). A function marked `@explorl.rewards.batched`,
    or whose first parameter is named `completions`, is called once per batch as `fn(completions, answers, **meta)
    -> list[float]`, each meta key a list. In `file` and `hf` tasks `meta` holds every column of the row (TRL's
    convention; the columns named completion(s) or answer(s) aside) and `id`."""
    reward_weights: list[float] | None = None
    """Weights of the `reward` functions, one per entry, in order (TRL's `reward_weights`): reward = sum_i w_i * r_i,
    a failed function scoring 0 for that sample. null: every weight is 1."""
    correct_by: str = ""
    """Which `task.reward` entry decides whether a sample is correct (pass@k, maj@k, worst@k, the unsolvable sets,
    `reward/correct_frac`, `entropy/pos`): the entry as written (`math`, `my_rewards:fmt`) or its metric name.
    Empty: the first entry (with `auto`, the task's own checker). Never the weighted sum, so a format bonus cannot
    make a wrong answer correct."""
    correct_threshold: float = 0.5
    """A sample is correct when the `correct_by` entry's own (unweighted) score exceeds this (the built-in checkers
    score 0 or 1)."""
    answer_pattern: str = ""
    """How a completion's final answer is read for maj@k (which answers agree) and the format rate (exactly one
    answer): a regular expression whose first group is the answer, e.g. `Answer: *(-?[0-9]+)`, searched in the
    last 4,000 characters. Empty: the task's own (the last `\\boxed{...}`)."""
    reward_timeout_s: float = 5.0
    """Hard time limit per sample for rewards that run in a worker process; a timeout scores 0 and is counted."""
    reward_workers: int = 0
    """Worker processes that score a batch in parallel (each sample keeps its own time limit, so n hanging samples
    cost about reward_timeout_s * ceil(n / workers)); 0 = one per CPU core, at least 2 and at most 16."""
    max_reward_failure_frac: float = 0.5
    """Stop the run, before the step's update changes the weights, when more than this fraction of a step's
    rewards fail (raise, return something that is not a finite number) or time out; 1 = never stop. Failures
    below it score 0 and are counted; the first one's traceback is printed and each distinct one is logged to
    RUN/reward_errors.log."""

