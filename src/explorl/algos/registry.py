"""One registry for every pluggable kind of explorl: estimators, shapers, policy losses, token filters, temperature
schedules, budget policies and tasks.

    @register("estimator", "my_adv", reads=("adv_eps",))
    def my_adv(batch, cfg): ...          # selected in YAML as `algo.advantage: my_adv`

`register` refuses a name that is already taken and records, beside the function, what the method needs, so the
training loop and the config validation ask the registry instead of naming methods:
- `needs_ref`: a frozen reference policy must be kept (its log-probs fill `RolloutBatch.ref_logprobs`);
- `needs_old_logprobs`: pi_old's log-probs are read before the update (so they cannot be taken from the update's
  own forward; see `explorl.algos.step.single_update_shortcut`). True unless an entry says otherwise: an entry
  that never reads `batch.logprobs` declares False and keeps the shortcut that saves a forward pass;
- `needs_behavior`: the sampler's behaviour log-probs are read;
- `behavior_is_policy` (temperature schedules): the distribution sampled from is the optimised policy itself, so
  the sampler's entropies are the policy's and the one-update shortcut is safe;
- `reads`: the config fields the entry reads: fields of `AlgoConfig` for the algorithm kinds, of `TaskConfig` for
  tasks, dotted paths of `Config` for schedules and budget policies (documentation; a test checks each exists);
- `check` (optional, keyword): `fn(cfg: Config) -> error message or None`, run by the config validation when the
  entry is chosen, so a method validates its own settings before any work starts.

The calling convention of each kind is in `KINDS`. This module imports nothing (it is the bottom of the import
graph): registering happens when the module that defines an entry is imported, and `explorl.algos`,
`explorl.rollout.controllers` and `explorl.tasks` import theirs. A user's own module is imported by naming it in
`run.plugins`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

KINDS: dict[str, str] = {
    "estimator": "fn(batch: RolloutBatch, cfg: AlgoConfig) -> Tensor[N, T]; chosen by `algo.advantage`",
    "shaper": "fn(advantages: Tensor[N, T], batch: RolloutBatch, cfg: AlgoConfig, step: int) -> Tensor[N, T]; "
              "`algo.shapers`, applied in order (step is 1-based)",
    "policy_loss": "fn(logprobs_new, logprobs_old, advantages, mask, *, agg, max_response_len, is_weights, "
                   "token_weights, **kwargs) -> (loss, stats); `algo.loss`; `kwargs` maps keywords to config fields",
    "token_filter": "fn(batch: RolloutBatch, loss_mask: Tensor[N, T], cfg: AlgoConfig) -> Tensor[N, T] | None "
                    "(per-token weights, 1 keeps, 0 drops); `algo.token_filter`",
    "temperature_schedule": "factory(cfg: Config, vocab_size: int) -> schedule object; `sampling.schedule`",
    "budget_policy": "factory(cfg: Config, num_prompts: int) -> budget object; `budget.policy`",
    "task": "fn(cfg: TaskConfig) -> (train problems, eval problems, default reward, answer extractor); "
            "`task.name` (an entry with `takes_argument` is named `name:<argument>`)",
}


@dataclass(frozen=True)
class Entry:
    """A registered function and what it needs."""

    kind: str
    name: str
    fn: Callable
    needs_ref: bool = False
    needs_old_logprobs: bool = True
    needs_behavior: bool = False
    behavior_is_policy: bool = True
    takes_argument: bool = False
    reads: tuple[str, ...] = ()
    kwargs: dict[str, str] = field(default_factory=dict)
    """policy_loss: keyword of the loss function -> the config field that supplies it."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Anything else a kind records (e.g. a policy loss that needs a random generator)."""


_REGISTRY: dict[str, dict[str, Entry]] = {kind: {} for kind in KINDS}


def register(kind: str, name: str, *, needs_ref: bool = False, needs_old_logprobs: bool = True,
             needs_behavior: bool = False, behavior_is_policy: bool = True, takes_argument: bool = False,
             reads: tuple[str, ...] = (), kwargs: dict[str, str] | None = None, **extra: Any) -> Callable:
    """Decorator: register `fn` as `kind` `name`; ValueError if the name is taken or the kind unknown."""
    if kind not in _REGISTRY:
        raise ValueError(f"unknown registry kind {kind!r}; valid: {', '.join(KINDS)}")
    kwargs = dict(kwargs or {})
    reads = tuple(reads) + tuple(f for f in kwargs.values() if f not in reads)

    def wrap(fn: Callable) -> Callable:
        if name in _REGISTRY[kind]:
            raise ValueError(f"{kind} {name!r} registered twice (first by {_REGISTRY[kind][name].fn.__module__})")
        _REGISTRY[kind][name] = Entry(kind, name, fn, needs_ref, needs_old_logprobs, needs_behavior,
                                      behavior_is_policy, takes_argument, reads, kwargs, extra)
        return fn

    return wrap


def lookup(kind: str, name: str) -> Entry:
    """The entry of `kind` called `name` (`rg:chain_sum` finds the `rg` task); KeyError listing the valid names."""
    table = _REGISTRY[kind]
    base, _, argument = name.partition(":")
    entry = table.get(base)
    if entry is not None and entry.takes_argument != bool(argument):
        entry = None  # `rg` alone, `rg:` and `arith:x` name nothing
    if entry is None:
        raise KeyError(f"unknown {kind} {name!r}; valid: {', '.join(names(kind))}")
    return entry


def get(kind: str, name: str) -> Callable:
    """The function registered as `kind` `name`."""
    return lookup(kind, name).fn


def names(kind: str) -> list[str]:
    """Registered names of `kind`, sorted; entries that take an argument are shown as `name:<argument>`."""
    return sorted(f"{n}:<argument>" if e.takes_argument else n for n, e in _REGISTRY[kind].items())


def entries(kind: str) -> dict[str, Entry]:
    """A copy of the table of `kind`."""
    return dict(_REGISTRY[kind])


def table_view(kind: str) -> "RegistryView":
    """A read-only mapping name -> function of `kind` (the old per-kind dicts, e.g. `ADVANTAGES`)."""
    return RegistryView(kind)


class RegistryView:
    """Read-only `Mapping[str, Callable]` over one kind of the registry; it always shows the current entries."""

    def __init__(self, kind: str):
        self.kind = kind

    def __getitem__(self, name: str) -> Callable:
        return get(self.kind, name)

    def __contains__(self, name: object) -> bool:
        return name in _REGISTRY[self.kind]

    def __iter__(self):
        return iter(_REGISTRY[self.kind])

    def __len__(self) -> int:
        return len(_REGISTRY[self.kind])

    def keys(self):
        return _REGISTRY[self.kind].keys()

    def items(self):
        return ((n, e.fn) for n, e in _REGISTRY[self.kind].items())

    def __repr__(self) -> str:
        return f"<{self.kind} registry: {', '.join(sorted(self))}>"
