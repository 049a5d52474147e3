"""Dynamic rollout budgets of E3 (section 4.1, Algorithm 1; docs/methods.md §2a).

Three small pieces the trainer wires together:
- `DifficultyTracker` keeps each prompt's cumulative reward and rollout count over the whole run and, at the
  end of each pass over the dataset, ranks prompts by average reward (descending, 1-based, easiest = 1):
  `k_i = rank_i / |D|`, so a larger k is a harder prompt. Prompts never seen keep k = 0 until ranked.
- `BudgetCurriculum` widens `[G_min, G_max]` after each pass: `G_min = G_max = G` during the first pass (or
  configured starting bounds), then `G_min -= step`, `G_max += step` up to configured limits (paper: G = 8,
  limits 4 and 12). A step of 0 with the limits as starting bounds is the allocation without the curriculum.
- `allocate(k, G, G_min, G_max)` turns a batch's k values into rollouts per prompt.

The trainer detects the end of a pass from its prompt stream's epoch counter and then calls
`tracker.end_of_pass()` and `curriculum.end_of_pass()`; the next batch uses the new ranks and bounds.

Readings and deviations from the public E3 code (which this module does not reproduce bit for bit):
- Step 4's `G_min + floor(N_rem * k_i / sum k)` is capped at G_max and the excess re-enters the hand-out, so
  `G_min <= G_i <= G_max` and `sum G_i = B * G` always hold (docs/methods.md §2a). The public code does not cap step 4.
- The rest is handed out one rollout at a time in descending k (ties: lower batch index first), cycling and
  skipping prompts at G_max (docs/methods.md §2a). The public code instead fills the hardest prompt up to G_max before
  moving to the next one.
- `sum(k) == 0` (a batch of never-ranked prompts) gives every prompt G. The public code hands the whole
  remainder to the first prompts of the batch.
- Ranking: prompts with equal average reward get distinct consecutive ranks, the lower prompt id first (the
  paper ranks by a sort and names no tie rule). Only prompts seen so far are ranked (ranks 1..n_seen); the
  divisor stays |D| = `num_prompts`, as in `k = rank / |D|`. Difficulty uses the reward the trainer passes
  (the public code tracks accuracy).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["allocate", "DifficultyTracker", "BudgetCurriculum"]

_SNAP = 1e-9  # relative tolerance for a share that should be an integer but came out of floats as 2.9999999


def _floor_share(x: float) -> int:
    r = round(x)
    if abs(x - r) <= _SNAP * max(1.0, abs(x)):
        return int(r)
    return math.floor(x)


def allocate(ranks: Sequence[float], G: int, G_min: int, G_max: int) -> list[int]:
    """Rollouts per prompt for one batch (E3, Algorithm 1, with the cap of docs/methods.md §2a).

    1. every prompt starts at G_min; `N_rem = B*G - B*G_min`;
    2. `G_i += floor(N_rem * k_i / sum(k))`, then `G_i = min(G_i, G_max)`;
    3. the remaining `B*G - sum(G_i)` rollouts are handed out one at a time in descending k (ties: lower batch
       index first), cycling, skipping prompts already at G_max.
    `sum(k) == 0` gives every prompt G.

    Args:
        ranks: the batch's difficulty values `k_i = rank_i / |D|` (>= 0; 0 for never-ranked prompts), length B.
        G: default rollouts per prompt; G_min, G_max: the current bounds.
    Returns:
        B ints with `G_min <= G_i <= G_max` and `sum == B * G`.
    Raises:
        ValueError: if the bounds are infeasible (`G_min > G` or `G_max < G`), G_min < 0, or a k is negative
        or not finite.
    """
    k = [float(x) for x in ranks]
    B = len(k)
    if G_min < 0:
        raise ValueError(f"G_min must be >= 0, got {G_min}")
    if B * G_min > B * G or B * G_max < B * G or G_min > G_max:
        raise ValueError(f"infeasible budget: need G_min <= G <= G_max, got G_min={G_min}, G={G}, G_max={G_max}")
    if any(not (math.isfinite(x) and x >= 0) for x in k):
        raise ValueError(f"difficulty values must be finite and >= 0, got {k}")
    total = B * G
    k_sum = sum(k)
    if k_sum == 0:
        return [G] * B
    n_rem = total - B * G_min
    alloc = [min(G_min + _floor_share(n_rem * x / k_sum), G_max) for x in k]
    left = total - sum(alloc)  # >= 0: the floors only round down and the cap only removes
    order = sorted(range(B), key=lambda i: (-k[i], i))
    for i in reversed(order):  # only if snapping float shares up overshot (needs ~1e9 prompts): easiest first
        while left < 0 and alloc[i] > G_min:
            alloc[i] -= 1
            left += 1
    while left > 0:  # each pass gives at least one rollout: feasibility guarantees a prompt below G_max
        for i in order:
            if left == 0:
                break
            if alloc[i] < G_max:
                alloc[i] += 1
                left -= 1
    return alloc


class DifficultyTracker:
    """Cumulative reward and rollout count per prompt over the whole run (E3, section 4.1).

    At the end of each pass over the dataset (`end_of_pass`) the prompts seen so far are sorted by average reward,
    descending; rank is 1-based (easiest = 1) and `k = rank / |D|`. Never-seen prompts have k = 0 until ranked.
    Between passes, `k` returns the ranks of the last pass (k = 0 for everyone during the first pass).
    """

    def __init__(self, num_prompts: int):
        if num_prompts < 1:
            raise ValueError(f"num_prompts must be >= 1, got {num_prompts}")
        self.num_prompts = int(num_prompts)
        self.reward_sum = [0.0] * self.num_prompts
        self.count = [0] * self.num_prompts
        self.rank = [0] * self.num_prompts  # 0 = not ranked yet

    def _check(self, pid: int) -> int:
        pid = int(pid)
        if not 0 <= pid < self.num_prompts:
            raise IndexError(f"prompt id {pid} out of range [0, {self.num_prompts})")
        return pid

    def update(self, prompt_ids: Sequence[int], rewards_per_prompt: Sequence[Sequence[float]]) -> None:
        """Add one batch: `rewards_per_prompt[j]` are the rewards of all rollouts of prompt `prompt_ids[j]`."""
        if len(prompt_ids) != len(rewards_per_prompt):
            raise ValueError(f"{len(prompt_ids)} prompt ids but {len(rewards_per_prompt)} reward lists")
        for pid, rewards in zip(prompt_ids, rewards_per_prompt):
            pid = self._check(pid)
            values = [float(r) for r in rewards]
            self.reward_sum[pid] += sum(values)
            self.count[pid] += len(values)

    def mean_reward(self, prompt_ids: Sequence[int]) -> list[float | None]:
        """Average reward so far (None for prompts without rollouts)."""
        out: list[float | None] = []
        for pid in prompt_ids:
            pid = self._check(pid)
            out.append(self.reward_sum[pid] / self.count[pid] if self.count[pid] else None)
        return out

    def end_of_pass(self) -> None:
        """Re-rank every prompt seen so far by average reward (descending; ties: lower prompt id first)."""
        seen = [i for i in range(self.num_prompts) if self.count[i] > 0]
        seen.sort(key=lambda i: (-(self.reward_sum[i] / self.count[i]), i))
        for r, i in enumerate(seen, start=1):
            self.rank[i] = r

    def k(self, prompt_ids: Sequence[int]) -> list[float]:
        """Difficulty `k = rank / |D|` per prompt (0.0 while unranked); feed it to `allocate`."""
        return [self.rank[self._check(pid)] / self.num_prompts for pid in prompt_ids]

    def state_dict(self) -> dict:
        return {"num_prompts": self.num_prompts, "reward_sum": list(self.reward_sum), "count": list(self.count),
                "rank": list(self.rank)}

    def load_state_dict(self, d: dict) -> None:
        if int(d["num_prompts"]) != self.num_prompts:
            raise ValueError(f"checkpoint tracks {d['num_prompts']} prompts, this dataset has {self.num_prompts}")
        self.reward_sum = [float(x) for x in d["reward_sum"]]
        self.count = [int(x) for x in d["count"]]
        self.rank = [int(x) for x in d["rank"]]


class BudgetCurriculum:
    """Bounds `(G_min, G_max)` for `allocate` (E3, section 4.1 and 5.2).

    `G_min = G_max = G` during the first pass (the paper's; `g_min_start` / `g_max_start` start elsewhere); after
    each pass `G_max += step_size` and `G_min -= step_size`, bounded by `g_max_limit` and `g_min_limit` (paper:
    G = 8, step 2, limits 4 and 12: 8/8, 6/10, 4/12, 4/12...). `step_size=0` keeps the starting bounds.
    """

    def __init__(self, G: int, g_min_limit: int = 4, g_max_limit: int = 12, step_size: int = 2,
                 g_min_start: int | None = None, g_max_start: int | None = None):
        if not 1 <= g_min_limit <= G <= g_max_limit:
            raise ValueError(f"need 1 <= g_min_limit <= G <= g_max_limit, got {g_min_limit}, {G}, {g_max_limit}")
        if step_size < 0:
            raise ValueError(f"step_size must be >= 0, got {step_size}")
        start_min = G if g_min_start is None else int(g_min_start)
        start_max = G if g_max_start is None else int(g_max_start)
        if not (g_min_limit <= start_min <= G <= start_max <= g_max_limit):
            raise ValueError(f"need g_min_limit <= g_min_start <= G <= g_max_start <= g_max_limit, got "
                             f"{g_min_limit}, {start_min}, {G}, {start_max}, {g_max_limit}")
        self.G = int(G)
        self.g_min_limit = int(g_min_limit)
        self.g_max_limit = int(g_max_limit)
        self.step_size = int(step_size)
        self.g_min = start_min
        self.g_max = start_max
        self.passes = 0

    def bounds(self) -> tuple[int, int]:
        """The current `(G_min, G_max)`."""
        return self.g_min, self.g_max

    def end_of_pass(self) -> None:
        self.passes += 1
        self.g_min = max(self.g_min - self.step_size, self.g_min_limit)
        self.g_max = min(self.g_max + self.step_size, self.g_max_limit)

    def state_dict(self) -> dict:
        return {"g_min": self.g_min, "g_max": self.g_max, "passes": self.passes}

    def load_state_dict(self, d: dict) -> None:
        self.g_min = int(d["g_min"])
        self.g_max = int(d["g_max"])
        self.passes = int(d["passes"])
