"""Outcome-based exploration: bonuses by final answer, historical (UCB over the answers seen so far) and batch.

Outcome-based Exploration: Yuda Song, Julia Kempe, Remi Munos 2025, "Outcome-based Exploration for LLM Reasoning"
(arXiv 2509.06941; docs/methods.md §5ac). Implements the paper's two algorithms as one advantage shaper
(`algo.shapers: [outcome_bonus]`, options `algo.outcome_bonus.<field>`, `OutcomeBonusOptions`):
- historical exploration, eq. 1 (UCB) and eq. 2 (UCB with a baseline: UCB-Mean, UCB-Con): each response's final
  answer a to question x gets `b(x, a) = min(1, sqrt(1 / N(x, a)))`, N the number of times a was the answer to x over
  training (`ucb_bonus`), less a baseline (`exploration_advantage`), times `historical`;
- batch exploration: a response whose answer k other responses of its group also gave is penalised by
  `-k / G` (G the group's size; `batch_penalty`), times `batch`.
The exploration term is added to the estimator's group-normalised advantage (the paper puts its bonus beside
GRPO's normalised advantage, not into the reward it normalises: hence a shaper, not a reward shaper), on every token
of the response (`outcome_term`), and is zero on a group whose responses are all correct.

An answer is the task's (`Task.extract_answer`, the last `\\boxed{}` or `task.answer_pattern`), equivalent answers
pooled as maj@k pools them (`metrics.vote_keys`: every correct answer one outcome, wrong ones compared as normalised
text), hashed with the question to one int64 per response: `RolloutBatch.outcomes`, filled by explorl's loop where it
scores the rewards (-1: no answer extracted, which gets no term and is not counted). The counts N(x, a) are the run's
state (`OutcomeCounts`): explorl's loop keeps them, passes them to the shaper and saves them in every checkpoint
(`state_dict`), so a resumed run continues with the same counts; their memory is bounded (`max_outcomes`).

Read: the paper's abstract (arXiv) and a third-party reading of its method section that restates its formulas
(the bonus b, UCB-Mean's leave-one-out mean, UCB-Con's constant with its example 0.5, the gating of all-correct
groups, the masking of the answer's tokens, the batch penalty -1/G sum_{j != i} 1[o_i = o_j]); the paper's own full
text, its hyperparameter table and any public code were not available here. What that leaves open is explorl's
choice and said so in docs/methods.md §5ac: whether N counts the current batch (here not, so an answer new to the
question gets the full 1, as min(1, .) suggests; `include_batch` counts it), the weights `historical` and `batch` (1
and 0 here: historical exploration with UCB-Con on, batch exploration off), the gating of the batch penalty (gated
like the historical term), and the paper's masking of the final-answer tokens from the exploration term (not done:
the batch does not carry where the answer's tokens are).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from explorl.algos.batch import MissingInputError
from explorl.algos.registry import Cite, register

if TYPE_CHECKING:
    from explorl.algos.batch import RolloutBatch

PAPER = "Outcome-based Exploration"
BASELINES = ("none", "mean", "constant")
NO_OUTCOME = -1
"""`RolloutBatch.outcomes` of a response whose answer could not be extracted: no outcome, no term, not counted."""


def ucb_bonus(counts: Tensor) -> Tensor:
    """Historical exploration's bonus, `b(x, a) = min(1, sqrt(1 / N(x, a)))` (eq. 1); 1 where N = 0.

    Args:
        counts: `[N]` how often each response's answer was the answer to its question before (>= 0).
    Returns:
        `[N]` float32 bonuses in (0, 1].
    """
    return counts.to(torch.float32).clamp_min(1.0).rsqrt()  # N >= 1: 1 / sqrt(N) <= 1; N = 0: 1


def _group_index(group: Tensor) -> tuple[Tensor, int]:
    """`group` as 0 .. G-1 (any integer ids) and the number of groups."""
    ids, index = torch.unique(group, return_inverse=True)
    return index, int(ids.numel())


def exploration_advantage(bonus: Tensor, group: Tensor, valid: Tensor, *, baseline: str = "constant",
                          constant: float = 0.5) -> Tensor:
    """The historical term before its weight: the bonus less a baseline (eq. 1: none; eq. 2: UCB-Mean, UCB-Con).

    `none`: `b_i`. `mean` (UCB-Mean): `b_i - 1/(n_g - 1) sum_{j != i} b_j`, the leave-one-out mean over the other
    responses of its group that have an outcome (n_g of them; 0 when it is alone). `constant` (UCB-Con):
    `b_i - constant`. Responses without an outcome get 0 and are no one's baseline.

    Args:
        bonus: `[N]` `ucb_bonus` of each response.
        group: `[N]` int prompt ids (any ids).
        valid: `[N]` bool, the response has an outcome.
        baseline: "none", "mean" or "constant".
        constant: UCB-Con's baseline.
    Returns:
        `[N]` float32.
    """
    b = bonus.to(torch.float32) * valid
    if baseline == "none":
        out = b
    elif baseline == "constant":
        out = b - constant
    elif baseline == "mean":
        index, g = _group_index(group)
        total = torch.zeros(g, device=b.device).index_add_(0, index, b)[index]
        n = torch.zeros(g, device=b.device).index_add_(0, index, valid.to(torch.float32))[index]
        others = torch.where(n > 1, (total - b) / (n - 1).clamp_min(1.0), b)
        out = b - others
    else:
        raise ValueError(f"exploration_advantage: baseline must be one of {BASELINES}, got {baseline!r}")
    return out * valid


def batch_penalty(outcomes: Tensor, group: Tensor) -> Tensor:
    """Batch exploration's penalty `-1/G_g sum_{j != i, j in g} 1[o_i = o_j]`, G_g the size of response i's group.

    Args:
        outcomes: `[N]` int64 outcome keys (`RolloutBatch.outcomes`; `NO_OUTCOME` where none: penalty 0, and no
            one's repetition).
        group: `[N]` int prompt ids.
    Returns:
        `[N]` float32 values in (-1, 0].
    """
    valid = outcomes != NO_OUTCOME
    same = (group[:, None] == group[None, :]) & (outcomes[:, None] == outcomes[None, :]) & valid[:, None]
    repeats = same.sum(-1).to(torch.float32) - valid.to(torch.float32)  # less the response itself
    index, g = _group_index(group)
    size = torch.bincount(index, minlength=g).to(torch.float32)[index]
    return -repeats / size


@dataclass
class OutcomeBonusOptions:
    """Outcome-based exploration's options, `algo.outcome_bonus.<field>` (Song et al. 2025; docs/methods.md §5ac)."""

    historical: float = 1.0
    """Weight c of historical exploration's term c (b(x, a) - baseline), b = min(1, sqrt(1 / N(x, a))) (eq. 1, 2),
    >= 0; 0 turns it off."""
    baseline: str = "constant"
    """What b is compared with (eq. 2): none (UCB, eq. 1: b alone, a positive bonus), mean (UCB-Mean: the mean b of the
    other responses of the group) or constant (UCB-Con: `constant`; the paper's best pass@k frontier in most of its
    settings)."""
    constant: float = 0.5
    """UCB-Con's baseline b_0 (the paper's example 0.5: an answer seen fewer than 4 times gets a positive term)."""
    batch: float = 0.0
    """Weight of batch exploration's penalty -1/G sum_{j != i} 1[o_i = o_j] (a response's repeats within its group),
    >= 0; 0: off (the paper's second algorithm; set e.g. historical 0 and batch 1 to run it alone)."""
    include_batch: bool = False
    """Count this batch's own responses in N(x, a) (an answer new to the question then gets 1 / sqrt(its repeats in
    the batch)); False: N counts the earlier steps only, so an answer never seen gets the full bonus 1."""
    skip_solved: bool = True
    """No exploration term on a group whose responses are all correct (where GRPO's advantage is zero)."""
    max_outcomes: int = 200_000
    """Most (question, answer) counts kept (memory bound, about 100 bytes each); past it the least-seen quarter is
    dropped (those answers count as new again)."""


def outcome_term(outcomes: Tensor, group: Tensor, counts: Tensor, correct: Tensor, *,
                 options: OutcomeBonusOptions = OutcomeBonusOptions()) -> Tensor:
    """Each response's exploration term, added to its advantage on every token:
    `historical * exploration_advantage(ucb_bonus(N)) + batch * batch_penalty`, zero on a group whose responses are
    all correct when `skip_solved` (the paper gates the bonus off where GRPO's advantage is zero because the group is
    solved).

    Args:
        outcomes: `[N]` int64 outcome keys, `NO_OUTCOME` where none.
        group: `[N]` int prompt ids.
        counts: `[N]` N(x, a) of each response's outcome (`OutcomeCounts.observe`).
        correct: `[N]` bool, correct by the task's rule.
        options: `historical`, `baseline`, `constant`, `batch`, `skip_solved` of `OutcomeBonusOptions`.
    Returns:
        `[N]` float32.
    """
    o = options
    valid = outcomes != NO_OUTCOME
    term = torch.zeros(outcomes.shape[0], dtype=torch.float32, device=outcomes.device)
    if o.historical:
        term = term + o.historical * exploration_advantage(ucb_bonus(counts), group, valid, baseline=o.baseline,
                                                           constant=o.constant)
    if o.batch:
        term = term + o.batch * batch_penalty(outcomes, group)
    if o.skip_solved:
        index, g = _group_index(group)
        wrong = torch.zeros(g, device=term.device).index_add_(0, index, (~correct.bool()).to(torch.float32))
        term = term * (wrong[index] > 0)
    return term


def _check(cfg) -> str | None:
    o = cfg.algo.options["outcome_bonus"]
    if o.baseline not in BASELINES:
        return f"algo.outcome_bonus.baseline: must be one of {', '.join(BASELINES)}, got {o.baseline!r}"
    if not (o.historical >= 0 and o.batch >= 0) or not (o.historical > 0 or o.batch > 0):
        return (f"algo.outcome_bonus: historical and batch must be >= 0 and one of them > 0, got historical="
                f"{o.historical}, batch={o.batch}")
    if o.max_outcomes < 1:
        return f"algo.outcome_bonus.max_outcomes: must be >= 1, got {o.max_outcomes}"
    return None


class OutcomeCounts:
    """N(x, a): how often each (question, outcome) key of `RolloutBatch.outcomes` was seen over training, the
    shaper's state across steps (explorl's loop keeps it in every checkpoint). At most `max_outcomes` keys."""

    def __init__(self, options: OutcomeBonusOptions):
        self.options = options
        self.counts: dict[int, int] = {}
        self.stats: dict[str, float] = {}

    def observe(self, outcomes: Tensor) -> Tensor:
        """`[N]` N(x, a) of each response's key (before this batch, or with it when `include_batch`); then the
        batch's keys are counted. `NO_OUTCOME` keys count 0 and are not kept."""
        keys = outcomes.tolist()
        before = [self.counts.get(k, 0) for k in keys]
        for k in keys:
            if k != NO_OUTCOME:
                self.counts[k] = self.counts.get(k, 0) + 1
        if self.options.include_batch:
            before = [self.counts.get(k, 0) if k != NO_OUTCOME else 0 for k in keys]
        if len(self.counts) > self.options.max_outcomes:  # keep the most seen three quarters (ties: the older)
            kept = sorted(self.counts.items(), key=lambda kv: -kv[1])[: self.options.max_outcomes * 3 // 4]
            self.counts = dict(kept)
        return torch.tensor(before, dtype=torch.long, device=outcomes.device)

    def state_dict(self) -> dict[str, Tensor]:
        return {"keys": torch.tensor(list(self.counts), dtype=torch.long),
                "counts": torch.tensor(list(self.counts.values()), dtype=torch.long)}

    def load_state_dict(self, state: Mapping[str, Any] | None) -> None:
        if state is not None:
            self.counts = dict(zip(state["keys"].tolist(), state["counts"].tolist()))


@register("shaper", "outcome_bonus", needs_old_logprobs=False, needs_outcomes=True, state=OutcomeCounts,
          options=OutcomeBonusOptions, check=_check,
          formula=(ucb_bonus, exploration_advantage, batch_penalty, outcome_term),
          cites=(Cite(PAPER, "eq. 1, eq. 2", doc="5ac"),))
def outcome_bonus(advantages: Tensor, batch: RolloutBatch, cfg, step: int, *, options: OutcomeBonusOptions,
                  state: OutcomeCounts | None = None) -> Tensor:
    """Outcome-based exploration: the historical (UCB) and batch terms of each response's final answer added to its
    advantage (`outcome_term`), with the counts N(x, a) of `state` updated by this batch."""
    if state is None:
        raise MissingInputError("shaper outcome_bonus (algo.shapers) keeps its answer counts across steps in explorl's "
                                "loop, which this engine does not run: run it with explorl train")
    batch.require("outcomes", "correct", by="shaper outcome_bonus (algo.shapers; explorl's loop fills them)")
    counts = state.observe(batch.outcomes)
    term = outcome_term(batch.outcomes, batch.group, counts, batch.correct, options=options)
    valid = batch.outcomes != NO_OUTCOME
    n_valid = max(int(valid.sum()), 1)
    state.stats = {"outcome/bonus_mean": float(term.mean()) if term.numel() else 0.0,
                   "outcome/bonus_abs_mean": float(term.abs().mean()) if term.numel() else 0.0,
                   "outcome/new_frac": float(((counts == 0) & valid).sum()) / n_valid,
                   "outcome/answered_frac": float(valid.float().mean()) if valid.numel() else 0.0,
                   "outcome/pairs": float(len(state.counts))}
    return advantages + term.to(advantages.dtype)[:, None] * batch.mask
