"""One registry for every pluggable kind of explorl, from advantage estimators to tasks (`KINDS` lists them).

    @dataclass
    class MyAdvOptions:
        scale: float = 1.0   # (with its docstring below it, as in the core config)
    @register("estimator", "my_adv", options=MyAdvOptions)
    def my_adv(batch, cfg, *, options: MyAdvOptions): ...   # `algo.advantage: my_adv`, `algo.my_adv.scale: 2`

Each kind has its entry type (`ENTRY_TYPES`): frozen, with documented fields for what a method needs (`needs_ref`)
and what an engine must support (`per_token`, `resamples`), read by the loop, the validation and the engines instead
of method names (an engine's spellings live in its integration); `register` refuses a taken name and an undeclared
field. Options reach every kind one way: a dataclass (`options=`, a docstring and default per field) under the kind's
section and the entry's name (`algo.erpo.gamma`; `SECTIONS`), validated when selected, passed as the keyword
`options` (`Entry.bind`). `KINDS`: each kind's calling convention; `SELECTED_BY`: its config field; `ACTS_AT`: where
the step calls it (`explorl methods NAME` shows them with `file:line`). Imports nothing of explorl."""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass, field, is_dataclass
from typing import Any, Callable

KINDS: dict[str, str] = {
    "estimator": "fn(batch: RolloutBatch, cfg: AlgoConfig[, *, options]) -> Tensor[N, T]",
    "shaper": "fn(advantages: Tensor[N, T], batch, cfg, step: int (1-based)[, *, options, state]) -> Tensor[N, T]",
    "policy_loss": "fn(logprobs_new: Tensor[N, T], batch: RolloutBatch (logprobs, advantages, loss_mask, weights), "
                   "cfg: AlgoConfig[, *, generator][, topk: TopK][, options]) -> (loss, stats)",
    "token_filter": "fn(batch, loss_mask: Tensor[N, T], cfg[, *, options]) -> per-token weights Tensor[N, T] | None",
    "reward_shaper": "fn(batch, cfg[, *, options]) -> (rewards: Tensor[N], loss_mask: Tensor[N, T]); in order, "
                     "before the estimator",
    "importance_weights": "fn(batch, loss_mask: Tensor[N, T], cfg[, *, options]) -> (is_weights Tensor[N, T] | "
                          "None, stats: dict[str, float])",
    "aggregation": "fn(token_values: Tensor[N, T], mask: Tensor[N, T], max_response_len: int | None) -> scalar",
    "temperature_schedule": "factory(cfg: Config, vocab_size: int[, *, options]) -> schedule object",
    "budget_policy": "factory(cfg: Config, num_prompts: int[, *, options]) -> budget object",
    "task": "fn(cfg: TaskConfig) -> (train problems, eval problems, default reward, answer extractor)",
}

# the config section that holds the options of each kind (aggregations have none; tasks keep theirs in `task`)
SECTIONS: dict[str, str] = {"estimator": "algo", "shaper": "algo", "policy_loss": "algo", "token_filter": "algo",
                            "reward_shaper": "algo", "importance_weights": "algo",
                            "temperature_schedule": "sampling", "budget_policy": "budget"}

# the config field that selects the entries of each kind (a list for `shaper` and `reward_shaper`)
SELECTED_BY: dict[str, str] = {"estimator": "algo.advantage", "shaper": "algo.shapers", "policy_loss": "algo.loss",
                               "token_filter": "algo.token_filter", "reward_shaper": "algo.reward_shapers",
                               "importance_weights": "algo.importance_weights", "aggregation": "algo.loss_agg",
                               "temperature_schedule": "sampling.schedule", "budget_policy": "budget.policy",
                               "task": "task.name"}

METHOD_KINDS: tuple[str, ...] = tuple(k for k in KINDS if k != "task")
"""The kinds that are methods (`explorl methods` lists them; each cites its paper)."""


@dataclass(frozen=True)
class Cite:
    """What a registry entry implements of one paper: `Cite("E3", "eq. 4, eq. 5", doc="2b")`."""

    paper: str
    """The paper's short name (`explorl.algos.papers.PAPERS`), or "explorl" for explorl's own additions."""
    where: str = ""
    """The paper's own equations, sections or algorithms, comma-separated (`eq. 4`, `Algorithm 1`); may be empty."""
    doc: str = ""
    """Comma-separated, the sections of docs/methods.md that document them (`"2b"` for `## 2.`'s `### 2b.`)."""

    def __post_init__(self) -> None:
        sections_ok = re.fullmatch(r"([0-9]+[a-z]{0,2}(, *[0-9]+[a-z]{0,2})*)?", self.doc.strip())
        if not self.paper.strip() or not all(self.locators) or not sections_ok:
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
class Site:
    """Where the step acts with an entry: the first line holding `marker` in dotted `function`'s source; `what`."""

    function: str
    marker: str
    what: str = ""


_STEP = "explorl.algos.step"
ACTS_AT: dict[str, tuple[Site, ...]] = {
    "reward_shaper": (Site(f"{_STEP}.compute_advantages", 'lookup("reward_shaper"', "rewards and loss mask"),),
    "estimator": (Site(f"{_STEP}.compute_advantages", 'lookup("estimator"', "the advantages"),),
    "shaper": (Site(f"{_STEP}.compute_advantages", 'lookup("shaper"', "the advantages reshaped"),),
    "token_filter": (Site(f"{_STEP}.compute_advantages", 'lookup("token_filter"', "per-token loss weights"),),
    "importance_weights": (Site(f"{_STEP}.compute_advantages", 'lookup("importance_weights"', "is_weights"),),
    "policy_loss": (Site(f"{_STEP}.policy_objective", "loss, stats = entry.bind(cfg)(", "the token loss"),),
    "aggregation": (Site("explorl.algos.aggregation.aggregate", "entry.fn(token_values", "every loss term reduced"),),
    "temperature_schedule": (Site("explorl.rollout.schedule.ScheduleDriver.begin", "self.schedule.at(step)",
                                  "the step's sampling and training temperatures"),),
    "budget_policy": (Site("explorl.rollout.schedule.ScheduleDriver.plan", "self.budget.budgets(ids)", "rollouts"),),
}  # where the step acts with each kind; an entry adds those of its capabilities (`per_token`) and its `acts_at`


@dataclass(frozen=True, kw_only=True)
class Entry:
    """A registered function and what every kind records of it."""

    kind: str
    name: str
    fn: Callable
    options: type | None = None
    """The dataclass of the entry's own settings (`algo.<name>.<field>`, ...), or None."""
    options_from: str | None = None
    """The entry of the same kind whose options this one reads (`cw_group` reads `cw`'s), or None (its own)."""
    selects: Callable[[Any], dict[str, str]] | None = None
    """`fn(options) -> {option field: entry name}`: further entries of its kind in use with it (`adaptive`'s `base`)."""
    check: Callable[[Any], str | None] | None = None
    """`fn(cfg: Config) -> error message or None`, run by the config validation when the entry is chosen."""
    reads: tuple[str, ...] = ()
    """The core config fields read besides the options: of `AlgoConfig` for the algorithm kinds, of `TaskConfig`
    for tasks, dotted paths of `Config` for schedules and budget policies (documentation; a test checks each)."""
    cites: tuple[Cite, ...] = ()
    """What the entry implements: the papers and their equations (`Cite`); empty for an entry that says nothing."""
    formula: tuple[Callable, ...] = ()
    """The pure functions holding the maths (`explorl methods NAME` shows them); not given: `fn` (or `per_token`)."""
    acts_at: tuple[Site, ...] = ()
    """Where the step acts with the entry: the kind's `ACTS_AT`, the sites of its capabilities, and those given."""

    def __post_init__(self) -> None:
        formula, sites = self._own()
        object.__setattr__(self, "formula", self.formula or formula)
        object.__setattr__(self, "acts_at", tuple(dict.fromkeys(sites + self.acts_at)))

    def _own(self) -> tuple[tuple[Callable, ...], tuple[Site, ...]]:
        """The formula and the sites the entry has without naming them."""
        return (self.fn,), ACTS_AT.get(self.kind, ())

    @property
    def options_owner(self) -> str:
        """The name the options are found under in the config: `options_from`, else the entry's own name."""
        return self.options_from or self.name

    def options_in(self, section: Any) -> Any:
        """This entry's options from the config section's `options` mapping (defaults if absent; None: it has none)."""
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
        """`fn` with its options from the config section as the keyword `options`; `fn` for one without."""
        options = self.options_in(section)
        return self.fn if options is None else functools.partial(self.fn, options=options)


@dataclass(frozen=True, kw_only=True)
class AlgoEntry(Entry):
    """What the algorithm step computes before it calls an entry of the algorithm kinds."""

    needs_ref: bool = False
    """A frozen reference policy is kept (its log-probs fill `RolloutBatch.ref_logprobs`)."""
    needs_old_logprobs: bool = True
    """pi_old's log-probs are read before the update, so they cannot be taken from the update's own forward
    (`explorl.algos.step.single_update_shortcut`). An entry that never reads `batch.logprobs` declares False."""
    needs_behavior: bool = False
    """The sampler's behaviour log-probs are read."""
    needs_sum_pi_squared: bool = False
    """pi_old's per-token sum_v pi(v)^2 is read (`RolloutBatch.sum_pi_squared`, from pi_old's forward: OTB)."""


@dataclass(frozen=True, kw_only=True)
class EstimatorEntry(AlgoEntry):
    """An advantage estimator (`algo.advantage`)."""

    needs_greedy_baseline: bool = False
    """Each prompt's greedy response is sampled and scored too (ReMax's `RolloutBatch.baseline_rewards`)."""
    needs_reward_components: bool = False
    """Each reward function's own scores are read (`RolloutBatch.reward_components`: GDPO's components)."""


@dataclass(frozen=True, kw_only=True)
class ShaperEntry(AlgoEntry):
    """An advantage shaper (`algo.shapers`)."""

    needs_step: Callable[[Any], bool] | None = None
    """`fn(options) -> bool`: whether the shaper reads the training step (a step window), which an engine must
    then pass; None: never."""
    needs_outcomes: bool = False
    """It reads `RolloutBatch.outcomes`, which explorl's loop fills; engines refuse it (`integrations.loop_only`)."""
    state: Callable[[Any], Any] | None = None
    """`fn(options) -> state` kept across steps, which explorl's loop holds and checkpoints (`step.shaper_states`)."""


@dataclass(frozen=True, kw_only=True)
class PolicyLossEntry(AlgoEntry):
    """A policy loss (`algo.loss`)."""

    rowwise: bool = False
    """Each response's token loss depends on its own tensors only (no statistic across the batch, as Clip-Cov's
    selection has) and is zero with zero gradient where its advantages are zero, so the update leaves responses with
    all-zero advantages out of the forward and backward (`explorl.algos.step.idle_rows`)."""
    needs_generator: bool = False
    """The loss draws random numbers: it is called with the keyword `generator` (a `torch.Generator`)."""
    old_is_behavior: bool = False
    """pi_old is the sampler's log-probs (verl's bypass mode): the engine fills `logprobs` with them, no forward."""
    needs_topk: Callable[[Any], int] | None = None
    """`fn(options) -> K`: the loss reads the log-probs of each token's K most probable tokens under pi_old
    (`RolloutBatch.topk_logprobs`) and the current policy (keyword `topk`: `TopK`) and `RolloutBatch.correct`."""


@dataclass(frozen=True, kw_only=True)
class TokenFilterEntry(AlgoEntry):
    """A token filter (`algo.token_filter`)."""


@dataclass(frozen=True, kw_only=True)
class RewardShaperEntry(AlgoEntry):
    """A reward shaper (`algo.reward_shapers`)."""

    needs_length_limit: bool = False
    """The shaper reads the length limit the responses were sampled under and their truncation flags
    (`RolloutBatch.max_response_len`, `truncated`), which an engine must then pass."""


@dataclass(frozen=True, kw_only=True)
class ImportanceWeightsEntry(AlgoEntry):
    """Importance weights (`algo.importance_weights`)."""


@dataclass(frozen=True, kw_only=True)
class AggregationEntry(Entry):
    """A loss aggregation (`algo.loss_agg`): how token values become one number."""

    count: Callable[[Any], float] | None = None
    """`fn(mask: Tensor[N, T]) -> float`, what the aggregation divides a batch's summed values by, so micro-batches
    can be weighted by their share of it (`explorl.algos.aggregation.micro_batch_share`)."""
    per_question: bool = False
    """The step weights each response's token losses by `question_weights` (E3 eq. 1 with a group size per
    question) and hands them to the loss as token weights."""

    def _own(self) -> tuple[tuple[Callable, ...], tuple[Site, ...]]:
        formula, sites = super()._own()
        weights = Site(f"{_STEP}.compute_advantages", ".per_question:", "question weights as token weights")
        return formula, sites + ((weights,) if self.per_question else ())


@dataclass(frozen=True, kw_only=True)
class TemperatureScheduleEntry(Entry):
    """A temperature schedule (`sampling.schedule`)."""

    behavior_is_policy: bool = True
    """The distribution sampled from is the optimised policy itself, so the sampler's entropies are the policy's
    and the one-update shortcut is safe. False for a schedule of the behaviour policy only (EAD)."""
    static: bool = False
    """The same sampling every step and prompt (`fixed`): an engine may sample at its own fixed temperature."""
    per_token: Callable | None = None
    """The temperature varies with the output position: the pure `fn(t, step, options) -> factor` that an engine
    evaluates per token (`options` built from the schedule's `per_prompt(...).anneal`, `explorl.integrations.vllm`)."""
    per_prompt_temperature: bool = False
    """Each prompt of a batch gets its own temperature."""

    def _own(self) -> tuple[tuple[Callable, ...], tuple[Site, ...]]:
        formula, sites = super()._own()
        if self.per_token is None:
            return formula, sites
        return (self.per_token,), sites + (Site("explorl.rollout.engines.native._decode", "temp_at(t)",
                                                "the sampler takes token t's temperature from the table"),)


@dataclass(frozen=True, kw_only=True)
class BudgetPolicyEntry(Entry):
    """A budget policy (`budget.policy`)."""

    static: bool = False
    """The same number of responses for every prompt and step (`uniform`)."""
    per_prompt_budget: bool = False
    """Each prompt gets its own number of responses."""
    resamples: bool = False
    """Further generation rounds refill the batch after groups are dropped."""
    drops_uniform_groups: bool = False
    """The groups dropped are those whose rewards all agree (DAPO's dynamic sampling, verl's `filter_groups`)."""
    branches: bool = False
    """A prompt's rollouts continue prefixes of its own sampled responses (FR3E): explorl's own sampler only."""

    def _own(self) -> tuple[tuple[Callable, ...], tuple[Site, ...]]:
        formula, sites = super()._own()
        rounds = Site("explorl.rollout.collect.collect_rollouts", "budget.keep(", "the groups kept each round")
        return formula, sites + ((rounds,) if self.resamples else ())


@dataclass(frozen=True, kw_only=True)
class TaskEntry(Entry):
    """A task (`task.name`)."""

    takes_argument: bool = False
    """The task is named `name:<argument>` (`rg:chain_sum`)."""
    preflight: Callable[[Any], str] | None = None
    """`fn(cfg: TaskConfig) -> summary line`: checks the task's data without building it (the `file` task streams
    every row); None: the preflight builds the task."""
    preflight_sample: Callable[[Any], tuple] | None = None
    """`fn(cfg: TaskConfig) -> (problems, default reward)`: a few problems for the preflight's reward check, unbuilt."""


ENTRY_TYPES: dict[str, type[Entry]] = {  # the entry type of each kind: the fields `register` accepts for it
    "estimator": EstimatorEntry, "shaper": ShaperEntry, "policy_loss": PolicyLossEntry,
    "token_filter": TokenFilterEntry, "reward_shaper": RewardShaperEntry, "importance_weights": ImportanceWeightsEntry,
    "aggregation": AggregationEntry, "temperature_schedule": TemperatureScheduleEntry,
    "budget_policy": BudgetPolicyEntry, "task": TaskEntry}

_REGISTRY: dict[str, dict[str, Entry]] = {kind: {} for kind in KINDS}


def _check_fields(kind: str, name: str, given: dict[str, Any]) -> None:
    """`cites`, `acts_at`, `formula` made tuples; TypeError for an undeclared keyword, ValueError for a wrong type."""
    for key, one in (("cites", Cite), ("acts_at", Site), ("formula", None)):
        value = given.get(key)
        if value is not None:
            value = (value,) if (isinstance(value, one) if one else callable(value)) else tuple(value)
            if one is not None and not all(isinstance(v, one) for v in value):
                raise ValueError(f"{kind} {name!r}: {key} must be {one.__name__}(...) values, e.g. "
                                 f"Cite('E3', 'eq. 4', doc='2b'); got {value!r}")
            given[key] = value
    valid = [f.name for f in dataclasses.fields(ENTRY_TYPES[kind]) if f.name not in ("kind", "name", "fn")]
    unknown = [k for k in given if k not in valid]
    if unknown:
        raise TypeError(f"register({kind!r}, {name!r}): unknown field {', '.join(map(repr, unknown))} of "
                        f"{ENTRY_TYPES[kind].__name__}; valid for {kind}: {', '.join(valid)}")
    for f in dataclasses.fields(ENTRY_TYPES[kind]):
        if isinstance(f.default, bool) and f.name in given and not isinstance(given[f.name], bool):
            raise ValueError(f"{kind} {name!r}: {f.name} must be True or False, got {given[f.name]!r}")


def register(kind: str, name: str, **fields: Any) -> Callable:
    """Decorator: register `fn` as `kind` `name` with `fields` (those of the kind's entry type, `ENTRY_TYPES`;
    `cites`, `formula` and `acts_at` may be one value or a tuple). TypeError for a field the kind does not declare
    (naming the valid ones); ValueError if the kind is unknown, the name taken, `options` not a dataclass,
    `options_from` names no entry with options, or a value has the wrong type."""
    if kind not in _REGISTRY:
        raise ValueError(f"unknown registry kind {kind!r}; valid: {', '.join(KINDS)}")
    _check_fields(kind, name, fields)
    options, options_from = fields.get("options"), fields.get("options_from")
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

    def wrap(fn: Callable) -> Callable:
        if name in _REGISTRY[kind]:
            raise ValueError(f"{kind} {name!r} registered twice (first by {_REGISTRY[kind][name].fn.__module__})")
        _REGISTRY[kind][name] = ENTRY_TYPES[kind](kind=kind, name=name, fn=fn, **fields)
        return fn

    return wrap


def lookup(kind: str, name: str) -> Any:
    """The entry (`ENTRY_TYPES[kind]`) called `name` (`rg:chain_sum` finds `rg`); KeyError listing the valid names."""
    base, _, argument = name.partition(":")
    entry = _REGISTRY[kind].get(base)
    if entry is not None and (isinstance(entry, TaskEntry) and entry.takes_argument) != bool(argument):
        entry = None  # `rg` alone, `rg:` and `arith:x` name nothing
    if entry is None:
        raise KeyError(f"unknown {kind} {name!r}; valid: {', '.join(names(kind))}")
    return entry


def get(kind: str, name: str) -> Callable:
    """The function registered as `kind` `name`."""
    return lookup(kind, name).fn


def names(kind: str) -> list[str]:
    """Registered names of `kind`, sorted; entries that take an argument are shown as `name:<argument>`."""
    return sorted(f"{n}:<argument>" if isinstance(e, TaskEntry) and e.takes_argument else n
                  for n, e in _REGISTRY[kind].items())


def entries(kind: str) -> dict[str, Any]:
    """A copy of the table of `kind`, in registration order."""
    return dict(_REGISTRY[kind])
