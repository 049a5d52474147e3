"""One registry for every pluggable kind of explorl: estimators, shapers, policy losses, token filters, reward
shapers, importance weights, temperature schedules, budget policies and tasks.

    @dataclass
    class MyAdvOptions:
        scale: float = 1.0   # (with its docstring below it, as in the core config)

    @register("estimator", "my_adv", options=MyAdvOptions)
    def my_adv(batch, cfg, *, options: MyAdvOptions): ...   # `algo.advantage: my_adv`, `algo.my_adv.scale: 2`

`register` refuses a name that is already taken and records, beside the function, what the method needs, so the
training loop, the config validation and the engines (TRL, verl, vLLM) ask the registry instead of naming methods:
- `options`: a dataclass of the entry's own settings (a docstring and one default per field, as the core config
  has). They live in the config under the section of the entry's kind and the entry's name (`algo.erpo.gamma`,
  `sampling.ead.tau_max`, `budget.e3.g_step`; `SECTIONS`), are validated and filled with their defaults when the
  entry is selected, and reach the function as the keyword `options` (`Entry.bind`). `options_from="cw"`: the
  entry reads the options of entry `cw` of its kind (one owns shared options, the other says so).
- `selects` (optional): `fn(options) -> {option field: entry name}`, other entries of the same kind that the
  entry's options select and whose options are then in use too (the `adaptive` schedule's `base`);
- `needs_ref`: a frozen reference policy must be kept (its log-probs fill `RolloutBatch.ref_logprobs`);
- `needs_old_logprobs`: pi_old's log-probs are read before the update (so they cannot be taken from the update's
  own forward; see `explorl.algos.step.single_update_shortcut`). True unless an entry says otherwise: an entry
  that never reads `batch.logprobs` declares False and keeps the shortcut that saves a forward pass;
- `needs_behavior`: the sampler's behaviour log-probs are read;
- `behavior_is_policy` (temperature schedules): the distribution sampled from is the optimised policy itself, so
  the sampler's entropies are the policy's and the one-update shortcut is safe;
- `reads`: the core config fields the entry reads besides its options: fields of `AlgoConfig` for the algorithm
  kinds, of `TaskConfig` for tasks, dotted paths of `Config` for schedules and budget policies (documentation; a
  test checks each exists);
- `kwargs` (policy losses): keyword of the loss function -> the option or core field that supplies it;
- `check` (optional, keyword): `fn(cfg: Config) -> error message or None`, run by the config validation when the
  entry is chosen, so a method validates its own settings before any work starts;
- `needs_step` (shapers, optional): `fn(options) -> bool`, whether the entry reads the training step (a step
  window), which an engine must then pass;
- `needs_length_limit` (reward shapers, optional): the entry reads the length limit the responses were sampled
  under and their truncation flags (`RolloutBatch.max_response_len`, `truncated`), which an engine must then pass;
- `verl_fields` (policy losses, optional): option -> (key of verl's actor config, factor, verl's default), how
  verl spells the option, so the verl adapter reads it without naming the method.
- `cites`: what the entry implements, a tuple of `Cite(paper, where, doc)`: the paper's short name
  (`explorl.algos.papers.PAPERS`; "explorl" for explorl's own additions), comma-separated, the paper's own
  equations, sections or algorithms (`eq. 4`, `section 4.2`, `Algorithm 1`; may be empty), and the sections of
  docs/methods.md that document them (`Cite("E3", "eq. 4, eq. 5", doc="2b")` is docs/methods.md §2b).
  `explorl methods` lists them; a test checks each against docs/methods.md. A user's entry may leave it empty.
- `rowwise` (policy losses, optional): each response's token loss depends on that response's tensors only (no
  statistic across the batch, as Clip-Cov's and KL-Cov's token selections are) and is zero with zero gradient
  where its advantages are zero, so the update leaves responses with all-zero advantages out of the forward and
  backward with grad (`explorl.algos.step.idle_rows`). Absent = False: a loss that does not declare it is
  computed on every response.

What an engine (TRL, verl, vLLM, the CLI) must be able to do for an entry, so that it asks instead of naming
methods (`CAPABILITIES`; each is an `extra` keyword of `register`, absent = False):
- `static` (schedules, budget policies): nothing changes from step to step or prompt to prompt (`fixed`,
  `uniform`): an engine can sample with its own fixed temperature and group size;
- `per_token` (schedules): the temperature varies with the output position; the value is the pure function
  `fn(t, step, **anneal) -> factor` that an engine evaluates per token (the keyword arguments come from the
  schedule's `per_prompt(...).anneal`, `explorl.integrations.vllm`);
- `per_prompt_temperature` (schedules): each prompt of a batch gets its own temperature;
- `per_prompt_budget` (budget policies): each prompt gets its own number of responses;
- `resamples` (budget policies): the batch is filled by further generation rounds that drop groups;
- `drops_uniform_groups` (budget policies that resample): the groups dropped are those whose rewards all agree
  (DAPO's dynamic sampling), which verl runs as its own `algorithm.filter_groups`.

The calling convention of each kind is in `KINDS`. This module imports nothing of explorl (it is the bottom of the
import graph): registering happens when the module that defines an entry is imported, and `explorl.algos`,
`explorl.rollout.controllers` and `explorl.tasks` import theirs. A user's own module is imported by naming it in
`run.plugins`.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field, is_dataclass
from typing import Any, Callable

KINDS: dict[str, str] = {
    "estimator": "fn(batch: RolloutBatch, cfg: AlgoConfig[, *, options]) -> Tensor[N, T]; chosen by "
                 "`algo.advantage`",
    "shaper": "fn(advantages: Tensor[N, T], batch: RolloutBatch, cfg: AlgoConfig, step: int[, *, options]) -> "
              "Tensor[N, T]; `algo.shapers`, applied in order (step is 1-based)",
    "policy_loss": "fn(logprobs_new, logprobs_old, advantages, mask, *, agg, max_response_len, is_weights, "
                   "token_weights, **kwargs) -> (loss, stats); `algo.loss`; `kwargs` maps keywords to option or "
                   "core fields",
    "token_filter": "fn(batch: RolloutBatch, loss_mask: Tensor[N, T], cfg: AlgoConfig[, *, options]) -> "
                    "Tensor[N, T] | None (per-token weights, 1 keeps, 0 drops); `algo.token_filter`",
    "reward_shaper": "fn(batch: RolloutBatch, cfg: AlgoConfig[, *, options]) -> (rewards: Tensor[N], loss_mask: "
                     "Tensor[N, T]); `algo.reward_shapers`, applied in order before the estimator (each sees the "
                     "rewards and mask the previous one returned)",
    "importance_weights": "fn(batch: RolloutBatch, loss_mask: Tensor[N, T], cfg: AlgoConfig[, *, options]) -> "
                          "(Tensor[N, T] | None, stats: dict[str, float]) (per-token weights that multiply the token "
                          "loss as `is_weights`, and their statistics); `algo.importance_weights`",
    "temperature_schedule": "factory(cfg: Config, vocab_size: int[, *, options]) -> schedule object; "
                            "`sampling.schedule`",
    "budget_policy": "factory(cfg: Config, num_prompts: int[, *, options]) -> budget object; `budget.policy`",
    "task": "fn(cfg: TaskConfig) -> (train problems, eval problems, default reward, answer extractor); "
            "`task.name` (an entry with `takes_argument` is named `name:<argument>`)",
}

# what an engine must support for an entry (see the module docstring); each an `extra` keyword of `register`
CAPABILITIES: dict[str, str] = {
    "static": "the same sampling every step and prompt", "per_token": "a per-token temperature (fn(t, step, **anneal))",
    "per_prompt_temperature": "a temperature per prompt", "per_prompt_budget": "a number of responses per prompt",
    "resamples": "further generation rounds that refill the batch",
    "drops_uniform_groups": "the groups dropped are those whose rewards all agree (DAPO's dynamic sampling)",
}

# the config section that holds the selection and the options of each kind (tasks keep theirs in `task`)
SECTIONS: dict[str, str] = {"estimator": "algo", "shaper": "algo", "policy_loss": "algo", "token_filter": "algo",
                            "reward_shaper": "algo", "importance_weights": "algo",
                            "temperature_schedule": "sampling", "budget_policy": "budget"}

# the config field that selects the entries of each kind (a list for `shaper` and `reward_shaper`)
SELECTED_BY: dict[str, str] = {"estimator": "algo.advantage", "shaper": "algo.shapers", "policy_loss": "algo.loss",
                               "token_filter": "algo.token_filter", "reward_shaper": "algo.reward_shapers",
                               "importance_weights": "algo.importance_weights",
                               "temperature_schedule": "sampling.schedule", "budget_policy": "budget.policy"}


@dataclass(frozen=True)
class Cite:
    """What a registry entry implements of one paper: `Cite("E3", "eq. 4, eq. 5", doc="2b")`."""

    paper: str
    """The paper's short name (`explorl.algos.papers.PAPERS`), or "explorl" for explorl's own additions."""
    where: str = ""
    """Comma-separated, the paper's own equations, sections or algorithms (`eq. 4`, `section 4.2`, `Algorithm 1`);
    empty where docs/methods.md names none."""
    doc: str = ""
    """Comma-separated, the sections of docs/methods.md that document them (`"2b"` for `## 2.`'s `### 2b.`)."""

    def __post_init__(self) -> None:
        locators = [p.strip() for p in self.where.split(",")] if self.where.strip() else []
        sections_ok = re.fullmatch(r"([0-9]+[a-z]?(, *[0-9]+[a-z]?)*)?", self.doc.strip())
        if not self.paper.strip() or not all(locators) or not sections_ok:
            raise ValueError(f"Cite({self.paper!r}, {self.where!r}, doc={self.doc!r}): give the paper's short name, "
                             f"its equations comma-separated ('eq. 4, eq. 5') and docs/methods.md's sections "
                             f"('2b' or '1, 1a')")

    @property
    def locators(self) -> tuple[str, ...]:
        """The paper's own equations, sections and algorithms cited (`("eq. 4", "eq. 5")`)."""
        return tuple(p.strip() for p in self.where.split(",")) if self.where.strip() else ()

    @property
    def sections(self) -> tuple[str, ...]:
        """The docs/methods.md sections cited (`("2b",)`)."""
        return tuple(p.strip() for p in self.doc.split(",")) if self.doc.strip() else ()


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
    """policy_loss: keyword of the loss function -> the option (first) or core field that supplies it."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Anything else a kind records (e.g. a policy loss that needs a random generator)."""
    options: type | None = None
    """The dataclass of the entry's own settings (`algo.<name>.<field>`, ...), or None."""
    options_from: str | None = None
    """The entry of the same kind whose options this one reads (`cw_group` reads `cw`'s), or None (its own)."""
    selects: Callable[[Any], dict[str, str]] | None = None
    """`fn(options) -> {option field: entry name}`: further entries of the same kind in use with this one."""
    cites: tuple[Cite, ...] = ()
    """What the entry implements: the papers and their equations (`Cite`); empty for an entry that says nothing."""

    @property
    def options_owner(self) -> str:
        """The name the options are found under in the config: `options_from`, else the entry's own name."""
        return self.options_from or self.name

    def options_in(self, section: Any) -> Any:
        """This entry's options as the config section (`algo`, `sampling`, `budget`) holds them in its `options`
        mapping, or their defaults when it holds none; None for an entry without options."""
        owner = lookup(self.kind, self.options_owner) if self.options_from else self
        if owner.options is None:
            return None
        value = (getattr(section, "options", None) or {}).get(owner.name)
        if value is None:
            return owner.options()
        if not isinstance(value, owner.options):  # a raw mapping: the config was not validated (`validate`)
            raise TypeError(f"{SECTIONS.get(self.kind, self.kind)}.{owner.name}: options not validated yet "
                            f"({type(value).__name__}); build the config with load_config / validate")
        return value

    def bind(self, section: Any) -> Callable:
        """`fn` with its options taken from the config section as the keyword `options`; `fn` itself for an
        entry without options."""
        options = self.options_in(section)
        return self.fn if options is None else functools.partial(self.fn, options=options)

    def can(self, capability: str) -> Any:
        """The entry's value of `capability` (`CAPABILITIES`; False when it does not declare it)."""
        if capability not in CAPABILITIES:
            raise KeyError(f"unknown capability {capability!r}; valid: {', '.join(CAPABILITIES)}")
        return self.extra.get(capability, False)

    def keyword_values(self, section: Any) -> dict[str, Any]:
        """policy_loss: the values of `kwargs`, each from the entry's options when they have the field, else
        from the core section."""
        options = self.options_in(section)
        return {kw: getattr(options, name) if options is not None and hasattr(options, name)
                else getattr(section, name) for kw, name in self.kwargs.items()}


_REGISTRY: dict[str, dict[str, Entry]] = {kind: {} for kind in KINDS}


def register(kind: str, name: str, *, needs_ref: bool = False, needs_old_logprobs: bool = True,
             needs_behavior: bool = False, behavior_is_policy: bool = True, takes_argument: bool = False,
             reads: tuple[str, ...] = (), kwargs: dict[str, str] | None = None, options: type | None = None,
             options_from: str | None = None, selects: Callable | None = None, cites: tuple[Cite, ...] = (),
             **extra: Any) -> Callable:
    """Decorator: register `fn` as `kind` `name`; ValueError if the name is taken, the kind unknown, `options` not a
    dataclass, `options_from` names no entry with options, or `cites` holds anything but `Cite`s."""
    if kind not in _REGISTRY:
        raise ValueError(f"unknown registry kind {kind!r}; valid: {', '.join(KINDS)}")
    cites = (cites,) if isinstance(cites, Cite) else tuple(cites)
    if not all(isinstance(c, Cite) for c in cites):
        raise ValueError(f"{kind} {name!r}: cites must be Cite(paper, where, doc) values, e.g. "
                         f"Cite('E3', 'eq. 4', doc='2b'); got {cites!r}")
    if options is not None and not (isinstance(options, type) and is_dataclass(options)):
        raise ValueError(f"{kind} {name!r}: options must be a dataclass type, got {options!r}")
    if options is not None and options_from is not None:
        raise ValueError(f"{kind} {name!r}: declare options or options_from, not both")
    if options_from is not None and getattr(_REGISTRY[kind].get(options_from), "options", None) is None:
        raise ValueError(f"{kind} {name!r}: options_from={options_from!r} names no {kind} with options")
    section = SECTIONS.get(kind)
    clash = [k for k, sec in SECTIONS.items() if sec == section and k != kind and name in _REGISTRY[k]
             and (options or options_from) and (_REGISTRY[k][name].options or _REGISTRY[k][name].options_from)]
    if clash:  # both would keep their options under `<section>.<name>`
        raise ValueError(f"{kind} {name!r}: the {clash[0]} {name!r} already keeps options under {section}.{name}; "
                         f"choose another name")
    kwargs = dict(kwargs or {})
    option_fields = set(getattr(options, "__dataclass_fields__", {}))
    reads = tuple(reads) + tuple(f for f in kwargs.values() if f not in reads and f not in option_fields)

    def wrap(fn: Callable) -> Callable:
        if name in _REGISTRY[kind]:
            raise ValueError(f"{kind} {name!r} registered twice (first by {_REGISTRY[kind][name].fn.__module__})")
        _REGISTRY[kind][name] = Entry(kind, name, fn, needs_ref, needs_old_logprobs, needs_behavior,
                                      behavior_is_policy, takes_argument, reads, kwargs, extra, options,
                                      options_from, selects, cites)
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
