"""Budget policies, registered in `explorl.algos.registry` as `budget.policy` (uniform, E3's dynamic budgets, DAPO's
dynamic sampling); the maths they call is `rollout.budget` (no torch, nothing else of explorl).

Each is a factory `(cfg: Config, num_prompts[, *, options]) -> policy` with its options dataclass
(`budget.<policy>.<field>`). A policy has `budgets(prompt_ids) -> rollouts per prompt`, `observe_rewards`,
`end_of_pass`, `extra_rounds` (generation rounds allowed beyond the first to fill the batch), `keep(per_prompt,
room)` (which groups of a round enter the batch), `stats(rounds, kept_frac)`, and `state_dict` / `load_state_dict`
(plain data). `rollout.schedule.ScheduleDriver` calls the first three for every engine; only explorl's own loop
(`rollout.collect`) re-samples with `extra_rounds` and `keep`. A policy with a `draw` method samples and scores each
round itself and returns a `Drawn` (FR3E's branching rollouts, `rollout.fr3e`; its entry declares `branches`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from explorl.algos.batch import RolloutBatch
from explorl.algos.registry import Cite, register
from explorl.rollout.budget import BudgetCurriculum, DifficultyTracker, allocate

if TYPE_CHECKING:
    from explorl.config.schema import Config

__all__ = ["DAPOBudget", "DAPOBudgetOptions", "Drawn", "E3Budget", "E3BudgetOptions", "UniformBudget"]


@dataclass
class Drawn:
    """One generation round, sampled and scored, as `rollout.collect` stacks it; group g of `batch` answers
    `problems[g]`, the training set's prompt `prompt_ids[g]` (one group per prompt, or per FR3E state)."""

    batch: RolloutBatch
    """The sampled rows (`RolloutBatch` stage 1, `rewards` None; `group` indexes `problems`)."""
    texts: list[str]
    """Per row: the response text the rewards scored."""
    scored: Any
    """The `rewards.RewardResult` of the rows."""
    correct: list[bool]
    """Per row: correct by the task's rule."""
    problems: list
    """Per group: its problem."""
    prompt_ids: list[int]
    """Per group: the training set's index of its prompt."""


@register("budget_policy", "uniform", reads=("sampling.group_size",), static=True,
          cites=(Cite("explorl", doc="9"),))
class UniformBudget:
    """`sampling.group_size` rollouts for every prompt; every sampled group trains."""

    extra_rounds = 0

    def __init__(self, cfg: Config, num_prompts: int):
        self.group_size = cfg.sampling.group_size

    def budgets(self, prompt_ids: Sequence[int]) -> list[int]:
        return [self.group_size] * len(prompt_ids)

    def observe_rewards(self, prompt_ids: Sequence[int], rewards_per_prompt: Sequence[Sequence[float]]) -> None:
        pass

    def end_of_pass(self) -> None:
        pass

    def keep(self, rewards_per_prompt: Sequence[Sequence[float]], room: int) -> list[int]:
        """Indices of the round's groups that enter the batch (`room`: prompts still missing)."""
        return [j for j, r in enumerate(rewards_per_prompt) if r]

    def stats(self, rounds: int, kept_frac: float) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


@dataclass
class E3BudgetOptions:
    """E3's dynamic budget options, `budget.e3.<field>` (E3 Algorithm 1; docs/methods.md §2a)."""

    g_min_limit: int | None = None
    """G_min never goes below this. null: sampling.group_size / 2 (rounded down, at least 1), the paper's ratio
    (4 with G = 8), so the policy keeps its paper setting at any group size."""
    g_max_limit: int | None = None
    """G_max never goes above this. null: 3 * sampling.group_size / 2 (rounded down), the paper's 12 with G = 8."""
    g_step: int | None = None
    """G_min decreases and G_max increases by this after each pass over the data. null: sampling.group_size / 4
    (rounded down, at least 1), the paper's 2 with G = 8."""

    def limits(self, group_size: int) -> tuple[int, int, int]:
        """(g_min_limit, g_max_limit, g_step) with the nulls resolved for `group_size`."""
        return (max(group_size // 2, 1) if self.g_min_limit is None else self.g_min_limit,
                3 * group_size // 2 if self.g_max_limit is None else self.g_max_limit,
                max(group_size // 4, 1) if self.g_step is None else self.g_step)
    curriculum: bool = True
    """The curriculum on (E3 section 4.1: the bounds start at G and widen after each pass). false: the
    bounds are g_min_limit / g_max_limit from the first step (Algorithm 1 without the curriculum; as ranks exist
    only after the first pass, that pass still gives every prompt G). docs/methods.md §2a."""
    g_min_start: int | None = None
    """G_min during the first pass; null = sampling.group_size (the paper's). Must lie in [g_min_limit,
    group_size]; only with `curriculum: true`."""
    g_max_start: int | None = None
    """G_max during the first pass; null = sampling.group_size (the paper's). Must lie in [group_size,
    g_max_limit]; only with `curriculum: true`."""


def _check_e3_budget(cfg: Config) -> str | None:
    s, b = cfg.sampling, cfg.budget.options["e3"]
    g_min_limit, g_max_limit, g_step = b.limits(s.group_size)
    if not 1 <= g_min_limit <= s.group_size <= g_max_limit:
        return (f"budget.e3: need 1 <= g_min_limit <= sampling.group_size <= g_max_limit, got {g_min_limit}, "
                f"{s.group_size}, {g_max_limit}")
    for name, value in (("g_min_start", b.g_min_start), ("g_max_start", b.g_max_start)):
        if value is not None and not b.curriculum:
            return (f"budget.e3.{name}: a starting bound needs the curriculum; with budget.e3.curriculum=false the "
                    f"bounds are g_min_limit/g_max_limit throughout. Set budget.e3.{name}=null or "
                    f"budget.e3.curriculum=true")
    if b.g_min_start is not None and not g_min_limit <= b.g_min_start <= s.group_size:
        return (f"budget.e3.g_min_start: must lie in [budget.e3.g_min_limit={g_min_limit}, sampling.group_size="
                f"{s.group_size}], got {b.g_min_start}")
    if b.g_max_start is not None and not s.group_size <= b.g_max_start <= g_max_limit:
        return (f"budget.e3.g_max_start: must lie in [sampling.group_size={s.group_size}, budget.e3.g_max_limit="
                f"{g_max_limit}], got {b.g_max_start}")
    return None if g_step >= 1 else "budget.e3.g_step: must be >= 1"


@register("budget_policy", "e3", check=_check_e3_budget, options=E3BudgetOptions, reads=("sampling.group_size",),
          per_prompt_budget=True, formula=(allocate, BudgetCurriculum),
          cites=(Cite("E3", "Algorithm 1, section 4.1, section 5.2", doc="2a"),))
class E3Budget(UniformBudget):
    """E3 dynamic budgets (E3 Algorithm 1): more rollouts for harder prompts, within a G_min/G_max
    curriculum that widens after each pass over the data (`budget.e3.curriculum: false`: fixed at the limits)."""

    def __init__(self, cfg: Config, num_prompts: int, *, options: E3BudgetOptions):
        super().__init__(cfg, num_prompts)
        b = options
        g_min_limit, g_max_limit, g_step = b.limits(self.group_size)
        self.difficulty = DifficultyTracker(num_prompts)
        if b.curriculum:
            self.curriculum = BudgetCurriculum(self.group_size, g_min_limit, g_max_limit, g_step,
                                               b.g_min_start, b.g_max_start)
        else:  # no curriculum: the limits from the first step, never moved
            self.curriculum = BudgetCurriculum(self.group_size, g_min_limit, g_max_limit, 0, g_min_limit, g_max_limit)

    def budgets(self, prompt_ids: Sequence[int]) -> list[int]:
        g_min, g_max = self.curriculum.bounds()
        return allocate(self.difficulty.k(prompt_ids), self.group_size, g_min, g_max)

    def observe_rewards(self, prompt_ids: Sequence[int], rewards_per_prompt: Sequence[Sequence[float]]) -> None:
        self.difficulty.update(prompt_ids, rewards_per_prompt)

    def end_of_pass(self) -> None:
        self.difficulty.end_of_pass()
        self.curriculum.end_of_pass()

    def state_dict(self) -> dict:
        return {"difficulty": self.difficulty.state_dict(), "curriculum": self.curriculum.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.difficulty.load_state_dict(state["difficulty"])
        self.curriculum.load_state_dict(state["curriculum"])


@dataclass
class DAPOBudgetOptions:
    """DAPO dynamic sampling's options, `budget.dapo.<field>` (docs/methods.md §5)."""

    max_rounds: int = 3
    """Extra generation rounds allowed per step to fill the batch."""


def _check_dapo(cfg: Config) -> str | None:
    if cfg.budget.options["dapo"].max_rounds < 0:
        return "budget.dapo.max_rounds: must be >= 0"
    if cfg.sampling.group_size < 2:
        return "budget.policy=dapo: groups of one response always have zero reward spread"
    return None


@register("budget_policy", "dapo", options=DAPOBudgetOptions, reads=("sampling.group_size",), check=_check_dapo,
          resamples=True, drops_uniform_groups=True, cites=(Cite("DAPO", "section 3.2", doc="5c"),))
class DAPOBudget(UniformBudget):
    """DAPO dynamic sampling: groups whose rewards all agree (zero GRPO advantage) are dropped, and more prompts
    are sampled until the batch is full or `budget.dapo.max_rounds` extra rounds are spent."""

    def __init__(self, cfg: Config, num_prompts: int, *, options: DAPOBudgetOptions):
        super().__init__(cfg, num_prompts)
        self.extra_rounds = options.max_rounds

    def keep(self, rewards_per_prompt: Sequence[Sequence[float]], room: int) -> list[int]:
        return [j for j, r in enumerate(rewards_per_prompt) if r and max(r) > min(r)][:room]

    def stats(self, rounds: int, kept_frac: float) -> dict[str, float]:
        return {"rollouts/dapo_rounds": rounds, "rollouts/dapo_kept_frac": kept_frac}
