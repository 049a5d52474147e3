"""reasoning-gym tasks: `rg:<name>` builds the procedural dataset `name` and scores with its own `score_answer`.

reasoning_gym is imported lazily (it takes a second or two). Scoring runs isolated in the sandbox pool: each
worker rebuilds the dataset's scorer by name once and keeps it.
"""

from __future__ import annotations

import difflib
import functools
from typing import TYPE_CHECKING, Any, Callable

from explorl.algos.registry import register
from explorl.rewards import extract_boxed
from explorl.tasks.base import Problem

if TYPE_CHECKING:
    from explorl.config.schema import TaskConfig

DEFAULT_TEMPLATE = "{question}\n\nPut your final answer within \\boxed{}."
"""Used when `task.prompt_template` is the default "{question}": the reward reads the last \\boxed{}."""


def dataset_names() -> list[str]:
    """Names of all registered reasoning-gym datasets."""
    from reasoning_gym.factory import DATASETS  # reasoning_gym: ~1.3 s at import, paid only for its tasks

    return sorted(DATASETS)


def check_name(name: str) -> None:
    """Raise a ValueError naming `task.name` and some valid choices if `name` is not a reasoning-gym dataset."""
    names = dataset_names()
    if name not in names:
        near = difflib.get_close_matches(name, names, n=3) or _sharing_a_word(name, names)
        hint = f" Did you mean {', '.join('rg:' + n for n in near)}?" if near else ""
        raise ValueError(f"task.name: 'rg:{name}' is not a reasoning-gym dataset.{hint} "
                         f"{len(names)} are available, e.g. {', '.join(names[:8])}, ...")


def _sharing_a_word(name: str, names: list[str], n: int = 3) -> list[str]:
    """Up to `n` of `names` sharing a word of 4 or more letters with `name`, compared by their first 5 letters
    (`countdown_game` -> `countdown`, `prime_counting` -> `count_primes`), the closest first: a second chance when no
    name is close as a whole."""
    def stems(text: str) -> set[str]:
        return {w[:5] for w in text.lower().replace("-", "_").split("_") if len(w) >= 4}

    words = stems(name)
    shared = [x for x in names if words & stems(x)]
    return sorted(shared, key=lambda x: -difflib.SequenceMatcher(None, name, x).ratio())[:n]


def json_safe(x: Any) -> Any:
    """`x` with tuples and sets as lists, numpy scalars as Python numbers and anything else odd as str."""
    if isinstance(x, dict):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, set, frozenset)):
        return [json_safe(v) for v in x]
    if x is None or isinstance(x, (str, bool, int, float)):
        return x
    if hasattr(x, "item") and getattr(x, "shape", None) == ():  # numpy scalar
        return x.item()
    if hasattr(x, "tolist"):  # numpy array
        return json_safe(x.tolist())
    return str(x)


def load_rg_task(cfg: TaskConfig) -> tuple[list[Problem], list[Problem]]:
    """(train, eval) for `cfg.name == "rg:<name>"`: train from seed `data_seed`, eval from `data_seed + 1`.

    Train skips any question that is also in eval, so the splits are disjoint.
    """
    name = cfg.name[3:]
    check_name(name)
    from reasoning_gym import create_dataset  # reasoning_gym: ~1.3 s at import, paid only for its tasks

    template = DEFAULT_TEMPLATE if cfg.prompt_template == "{question}" else cfg.prompt_template
    try:
        eval_ds = create_dataset(name, size=cfg.eval_size, seed=cfg.data_seed + 1)
        # room for more rows (generated lazily) so that dropping eval questions still leaves train_size
        train_ds = create_dataset(name, size=2 * cfg.train_size + cfg.eval_size, seed=cfg.data_seed)
    except Exception as e:
        raise ValueError(f"task.name: reasoning-gym could not build {name!r}: {e}") from None

    def problem(entry: dict, index: int, split: str) -> Problem:
        """A Problem with a JSON-safe copy of the entry and where to regenerate the original."""
        entry = json_safe(entry)
        # str.replace, not str.format: questions are full of braces.
        seed, size = (cfg.data_seed + 1, len(eval_ds)) if split == "eval" else (cfg.data_seed, len(train_ds))
        return Problem(prompt=template.replace("{question}", entry["question"]), answer=str(entry["answer"]),
                       meta={"rg_name": name, "entry": entry, "rg_seed": seed, "rg_size": size, "rg_index": index,
                             "id": f"{name}/{split}/{index}"})

    eval_ = [problem(eval_ds[i], i, "eval") for i in range(len(eval_ds))]
    seen = {p.meta["entry"]["question"] for p in eval_}
    train: list[Problem] = []
    for i in range(len(train_ds)):
        if len(train) == cfg.train_size:
            break
        entry = train_ds[i]
        if entry["question"] not in seen:
            train.append(problem(entry, i, "train"))
    if not train:
        raise ValueError(f"task.name: every training question of rg:{name} is also an eval question")
    return train, eval_


def extract_rg_answer(completion: str) -> str | None:
    """The last \\boxed{} content (up to 20k characters: some answers are long move lists), else the last
    non-empty line, else None."""
    boxed = extract_boxed(completion, max_len=20_000)
    if boxed is not None:
        return boxed.strip()
    tail = completion[-2000:]
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    return lines[-1] if lines else None


@functools.lru_cache(maxsize=64)
def _scorer(name: str) -> Callable[[str | None, dict], float]:
    """The dataset's `score_answer`, built once per worker process."""
    import reasoning_gym  # ~1.3 s at import, paid only for its tasks

    return reasoning_gym.get_score_answer_fn(name)


@functools.lru_cache(maxsize=16)
def _dataset(name: str, seed: int, size: int) -> Any:
    """A reasoning-gym dataset, built once per worker process."""
    import reasoning_gym  # ~1.3 s at import, paid only for its tasks

    return reasoning_gym.create_dataset(name, size=size, seed=seed)


@functools.lru_cache(maxsize=4096)
def _original_entry(name: str, seed: int, size: int, index: int) -> dict:
    """The entry exactly as the dataset generates it (procedural: the same for the same seed and index)."""
    return _dataset(name, seed, size)[index]


def rg_reward(completion: str, answer: str, *, rg_name: str, entry: dict, rg_seed: int | None = None,
              rg_size: int | None = None, rg_index: int | None = None, **meta: Any) -> float:
    """Score `completion` with reasoning-gym's `score_answer` for dataset `rg_name` (run it in the pool).

    Scorers may compare with tuples or other types that the JSON-safe `entry` in meta lost (arc_agi's boards
    do), so the original entry is regenerated from (seed, size, index) when meta has them.
    """
    if rg_seed is not None and rg_size is not None and rg_index is not None:
        original = _original_entry(rg_name, rg_seed, rg_size, rg_index)
        if original["question"] == entry["question"]:  # a guard against a changed reasoning-gym version
            entry = original
    return float(_scorer(rg_name)(extract_rg_answer(completion), entry))


rg_reward.preload = ("reasoning_gym",)  # type: ignore[attr-defined]  # imported when a worker starts


def default_reward() -> tuple[Callable, bool]:
    """(rg_reward, isolated): scorers are third-party code on untrusted output."""
    return rg_reward, True


@register("task", "rg", takes_argument=True, reads=("prompt_template", "train_size", "eval_size", "data_seed"))
def load_rg(cfg: TaskConfig) -> tuple[list[Problem], list[Problem], tuple[Callable, bool], Callable]:
    """The `rg:<name>` task: (train, eval, default reward, answer extractor)."""
    train, eval_ = load_rg_task(cfg)
    return train, eval_, default_reward(), extract_rg_answer
