"""FR3E's branching rollouts: First Return, Entropy-Eliciting Explore (Tianyu Zheng, Tianshun Xing, Qingshui Gu et
al., "First Return, Entropy-Eliciting Explore", arXiv 2507.07017; docs/methods.md §5ad), as a budget policy
(`budget.policy: fr3e`, options `budget.fr3e.<field>`) that draws each round itself (`FR3EBranching.draw`).

What was read. The paper's abstract, its Figure 1 caption and the authors' README (Zheng0428/FR3E) give the two
stages; the exact rules are the authors' public code, read at Zheng0428/FR3E 509da70:
`verl/trainer/ppo/ray_trainer.py` (`fit`, `separate_responses_str_by_prob`, `create_new_batch_data`),
`verl/trainer/ppo/core_algos.py` (`compute_srpo_outcome_advantage`, `sharpening_coeff`) and `run_srpo_v6_adv.sh`
(the settings: `first_n=4`, `srpo_correct_sample_max_num=1`, `srpo_wrong_sample_max_num=1`,
`srpo_max_block_num=4`, `n=16`, `use_dynamic_sampling=True`, `adv_no_use_std=True`, `sharpen=True`, clip 0.2/0.3,
token-mean, no KL). The paper's own method section was not available in this workplace's stored copies; where the
summaries and the code agree, that is what is implemented, and each place the code departs from the paper's words is
an option below.

One round, per prompt of the plan:
1. First return. `base_rollouts` responses are sampled and scored; at most `max_correct_bases` correct and
   `max_wrong_bases` wrong ones (in sampling order) become base trajectories. On each, the K = `anchors` positions of
   highest token entropy (the sampler's `behavior_entropy`, at the sampling temperature) are the anchors
   (`select_anchors`: top-K over the whole response, no minimum spacing, ties to the earlier position; a response of
   at most K tokens gets one anchor, as the code). `anchor_by: surprisal` ranks by -log p of the sampled token
   instead, which is what the public code computes (`torch.topk(old_log_probs, K, largest=False)`).
2. Entropy-eliciting explore. The states of a base are S_0 = the prompt alone (`restart`, the code's `[""] +
   prefixes`) and, for each anchor a in increasing order, S_j = prompt + base[:a]: the continuation starts AT the
   anchor and re-draws the uncertain token. Each state gets M = `continuations` (default `sampling.group_size`)
   continuations, each with its own length limit `sampling.max_new_tokens` (as the code, which puts the prefix in
   the prompt). A continuation is scored as the base prefix followed by it.
3. The batch is the continuations only (bases are not trained on). The prefix is part of the row's prompt
   (`prompt_ids` = prompt + base[:a], `response_ids` = the continuation), so only generated tokens carry loss. One
   group per state: the configured estimator (`algo.advantage`; the code's mean-only GRPO is `dr_grpo`) is relative
   within a state. States whose continuations' rewards all agree are dropped (`drop_uniform`, the code's dynamic
   sampling).
4. Adaptive advantage modulation (`modulation`). V(S_j) is the share of S_j's continuations that are correct (the
   task's rule); over a base's states in order, delta_0 = 1 - V(S_0) and delta_j = V(S_j) - V(S_{j-1}); with
   `sharpen: a` the deltas become sign(d)|d|^a / sum|d|^a (the code's `sharpening_coeff`, a = 1.5); a state's
   advantages are multiplied by alpha_j = exp(-delta_j) (the code divides by exp(delta)): a state that raised the
   value is damped, one that lowered it amplified. `RolloutBatch.advantage_scale` carries alpha_j per response.

Where this differs from the public code, deliberately:
- V is computed over all states of a base, before the uniform ones are dropped, as the correct share; the code
  drops first and takes the share of positive advantages among the kept states (equal on a mixed state; it makes
  a dropped all-correct state vanish from its neighbours' deltas).
- One round per step: the code accumulates generation batches until 0.8 x train_batch_size states survive the
  rejection, and trims to a multiple of the GPU count; here the kept states of `run.batch_size` prompts train.
- `sharpen` is off by default (the equation as the README and summaries state it); the script turns it on.
- Engines: only explorl's own sampler (it returns token entropies and samples any prefix); the entry declares
  `branches`, and TRL's trainer, verl's plugin and `sampling.engine: vllm` refuse it by that flag. A per-token
  temperature schedule restarts at the anchor (the continuation's token 0).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch

from explorl.algos.registry import Cite, Site, lookup, register
from explorl.rollout.budget_policies import Drawn

if TYPE_CHECKING:
    from explorl.config.schema import Config

__all__ = ["FR3EBranching", "FR3EOptions", "modulation", "pick_bases", "select_anchors", "state_values"]


@dataclass
class FR3EOptions:
    """FR3E's options, `budget.fr3e.<field>` (docs/methods.md §5ad); defaults are the authors' script's."""

    base_rollouts: int = 4
    """Responses sampled per prompt in the first-return stage (the script's `first_n=4`)."""
    max_correct_bases: int = 1
    """At most this many correct responses of a prompt become base trajectories (`srpo_correct_sample_max_num`)."""
    max_wrong_bases: int = 1
    """At most this many wrong responses of a prompt become base trajectories (`srpo_wrong_sample_max_num`)."""
    anchors: int = 4
    """K: anchors per base trajectory, its K highest-entropy positions (`srpo_max_block_num=4`)."""
    continuations: int | None = None
    """M: continuations sampled from each state; null = sampling.group_size (the script's n = 16)."""
    anchor_by: Literal["entropy", "surprisal"] = "entropy"
    """Rank positions by token entropy (the paper) or by the sampled token's -log p (the public code)."""
    restart: bool = True
    """S_0, the prompt alone, is a state of every base too (the code's empty prefix)."""
    drop_uniform: bool = True
    """States whose continuations' rewards all agree are dropped (the code's dynamic sampling)."""
    sharpen: float | None = None
    """null: alpha_j = exp(-delta_j). a > 0: the deltas sharpened first, sign(d)|d|^a / sum|d|^a over a base's
    states (the authors' script: `sharpen=True`, a = 1.5)."""


def select_anchors(scores: Sequence[float], k: int) -> list[int]:
    """FR3E first return: the K positions of the highest `scores` (token entropies of one response), ascending.

    Top-K over the whole response with no spacing rule; ties go to the earlier position; a response of at most K
    tokens gets one anchor (the authors' `separate_responses_str_by_prob`); none for an empty response or K = 0."""
    n = len(scores)
    if n == 0 or k <= 0:
        return []
    take = k if n > k else 1
    return sorted(sorted(range(n), key=lambda t: (-float(scores[t]), t))[:take])


def pick_bases(correct: Sequence[bool], max_correct: int, max_wrong: int) -> list[int]:
    """Indices of one prompt's first-return responses kept as bases: the first `max_correct` correct ones and the
    first `max_wrong` wrong ones, in sampling order."""
    kept, seen = [], {True: 0, False: 0}
    for i, c in enumerate(correct):
        cap = max_correct if c else max_wrong
        if seen[bool(c)] < cap:
            seen[bool(c)] += 1
            kept.append(i)
    return kept


def state_values(correct: Sequence[bool], state: Sequence[int], num_states: int) -> list[float]:
    """V(S_s): the share of state s's continuations that are correct (`correct[i]` of continuation i, whose state
    is `state[i]`); NaN for a state without continuations."""
    hits, counts = [0] * num_states, [0] * num_states
    for c, s in zip(correct, state):
        hits[s] += int(bool(c))
        counts[s] += 1
    return [h / n if n else float("nan") for h, n in zip(hits, counts)]


def modulation(values: Sequence[float], *, sharpen: float | None = None) -> list[float]:
    """FR3E's adaptive advantage modulation: alpha_j = exp(-delta_j) for the states of one base in order, with
    delta_0 = 1 - V_0 and delta_j = V_j - V_{j-1} (the authors' `compute_srpo_outcome_advantage`, which divides a
    state's advantages by exp(delta_j)). `sharpen=a`: delta_j <- sign(delta_j) |delta_j|^a / sum_i |delta_i|^a
    first (their `sharpening_coeff`; all deltas 0 stay 0)."""
    v = [float(x) for x in values]
    if not v:
        return []
    deltas = [1.0 - v[0]] + [v[j] - v[j - 1] for j in range(1, len(v))]
    if sharpen is not None:
        powered = [abs(d) ** sharpen for d in deltas]
        total = sum(powered)
        deltas = [math.copysign(p / total, d) if total > 0 and p > 0 else 0.0 for p, d in zip(powered, deltas)]
    return [math.exp(-d) for d in deltas]


def _check_fr3e(cfg: Config) -> str | None:
    o = cfg.budget.options["fr3e"]
    if o.base_rollouts < 1 or o.max_correct_bases < 1 or o.max_wrong_bases < 1:
        return ("budget.fr3e: base_rollouts, max_correct_bases and max_wrong_bases must be >= 1 (every prompt "
                "keeps a base trajectory)")
    if o.anchors < 0 or (o.anchors == 0 and not o.restart):
        return "budget.fr3e.anchors: must be >= 0, and >= 1 with budget.fr3e.restart=false (no state to explore)"
    if o.continuations is not None and o.continuations < 1:
        return "budget.fr3e.continuations: must be >= 1 (or null: sampling.group_size)"
    if o.sharpen is not None and not o.sharpen > 0:
        return "budget.fr3e.sharpen: must be > 0 (or null: no sharpening)"
    if lookup("estimator", cfg.algo.advantage).needs_greedy_baseline:
        return (f"budget.policy=fr3e: algo.advantage={cfg.algo.advantage} scores each prompt's greedy response as "
                f"its baseline, which FR3E's groups (one per state, from prefixes) do not have; use grpo or dr_grpo")
    return None


@register("budget_policy", "fr3e", options=FR3EOptions, check=_check_fr3e,
          reads=("sampling.group_size", "sampling.max_new_tokens"), branches=True,
          drops_uniform_groups=True, formula=(select_anchors, pick_bases, state_values, modulation),
          acts_at=(Site("explorl.rollout.collect.collect_rollouts", "drawn = draw(", "FR3E samples and scores the "
                        "round: bases, anchors, continuations"),
                   Site("explorl.algos.step.compute_advantages", "batch.advantage_scale is not None",
                        "alpha_j multiplies each state's advantages")),
          cites=(Cite("FR3E", "First Return, Entropy-Eliciting Explore, Adaptive Advantage Modulation",
                      doc="5ad"),))
class FR3EBranching:
    """FR3E: continuations from the highest-entropy positions of each prompt's base trajectories, one group per
    state, each state's advantages scaled by the change of empirical value (module docstring)."""

    extra_rounds = 0

    def __init__(self, cfg: Config, num_prompts: int, *, options: FR3EOptions):
        self.options = options
        self.continuations = options.continuations or cfg.sampling.group_size
        self.last: dict[str, float] = {}

    def budgets(self, prompt_ids: Sequence[int]) -> list[int]:
        """The first-return stage's responses per prompt."""
        return [self.options.base_rollouts] * len(prompt_ids)

    def observe_rewards(self, prompt_ids: Sequence[int], rewards_per_prompt: Sequence[Sequence[float]]) -> None:
        pass

    def end_of_pass(self) -> None:
        pass

    def keep(self, rewards_per_prompt: Sequence[Sequence[float]], room: int) -> list[int]:
        """The states that train: every state, or (`drop_uniform`) those whose rewards differ; `room` is not a cap
        (a prompt yields several states)."""
        uniform_ok = not self.options.drop_uniform
        return [j for j, r in enumerate(rewards_per_prompt) if r and (uniform_ok or max(r) > min(r))]

    def stats(self, rounds: int, kept_frac: float) -> dict[str, float]:
        return {**self.last, "fr3e/kept_states_frac": kept_frac}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def _states(self, base, correct: list[bool], prompts: list) -> list[tuple[int, int, list[int]]]:
        """(prompt j, base number, prefix) of every state, the states of one base in order."""
        o, out = self.options, []
        group = base.group.tolist()
        score = base.behavior_entropy if o.anchor_by == "entropy" else -base.behavior_logprobs
        positions: list[float] = []
        b = 0
        for j in range(len(prompts)):
            rows = [i for i, g in enumerate(group) if g == j]
            for i in (rows[k] for k in pick_bases([correct[i] for i in rows], o.max_correct_bases,
                                                  o.max_wrong_bases)):
                length = int(base.lengths[i])
                response = base.response_ids[i, :length].tolist()
                anchors = select_anchors(score[i, :length].tolist(), o.anchors)
                positions += [a / length for a in anchors]
                out += [(j, b, response[:a]) for a in ([0] if o.restart else []) + anchors]
                b += 1
        self.last["fr3e/anchor_position"] = sum(positions) / max(len(positions), 1)
        return out

    def draw(self, sampler, tok, problems: list, prompts: list, plan, generator: torch.Generator,
             score: Callable) -> Drawn:
        """One FR3E round: bases sampled and scored, anchors, M continuations of every state, scored, with
        alpha_j per continuation (`RolloutBatch.advantage_scale`). Group s of the result is state s."""
        base = sampler.sample(prompts, plan, generator)
        base_texts = _texts(tok, base, [[] for _ in range(len(prompts))])
        _, base_correct = score(base_texts, [problems[g] for g in base.group.tolist()])
        states = self._states(base, base_correct, prompts)
        m = self.continuations
        state_plan = dataclasses.replace(plan, prompt_ids=[plan.prompt_ids[j] for j, _, _ in states],
                                         rollouts=[m] * len(states), requests=[plan.requests[j] for j, _, _ in states])
        cont = sampler.sample([list(prompts[j]) + prefix for j, _, prefix in states], state_plan, generator)
        texts = _texts(tok, cont, [prefix for _, _, prefix in states])
        rr, correct = score(texts, [problems[states[s][0]] for s in cont.group.tolist()])
        values = state_values(correct, cont.group.tolist(), len(states))
        alpha = [0.0] * len(states)
        for b in sorted({b for _, b, _ in states}):
            members = [s for s, (_, sb, _) in enumerate(states) if sb == b]
            for s, a in zip(members, modulation([values[s] for s in members], sharpen=self.options.sharpen)):
                alpha[s] = a
        scale = torch.tensor([alpha[s] for s in cont.group.tolist()], dtype=torch.float32, device=cont.mask.device)
        bases, n = len({b for _, b, _ in states}), max(len(prompts), 1)
        first: dict[int, int] = {}  # with `restart`, a base's first state is S_0, the rest are its anchors'
        anchored = [values[s] for s, (_, b, _) in enumerate(states)
                    if not (self.options.restart and first.setdefault(b, s) == s)]
        self.last.update({"fr3e/bases_per_prompt": bases / n,
                          "fr3e/anchors_per_prompt": (len(states) - bases * int(self.options.restart)) / n,
                          "fr3e/states": float(len(states)),
                          "fr3e/base_correct_frac": sum(base_correct) / max(len(base_correct), 1),
                          "fr3e/value_mean": sum(values) / max(len(values), 1),
                          "fr3e/anchor_value_mean": sum(anchored) / max(len(anchored), 1),
                          "fr3e/alpha_mean": sum(alpha) / max(len(alpha), 1)})
        return Drawn(cont.replace(advantage_scale=scale), texts, rr, correct,
                     [problems[j] for j, _, _ in states], [int(plan.prompt_ids[j]) for j, _, _ in states])


def _texts(tok, ro, prefixes: list[list[int]]) -> list[str]:
    """Each row's prefix (of its group) followed by its response, without padding or a final EOS."""
    out, eos = [], tok.eos_token_id
    for ids, length, g in zip(ro.response_ids.tolist(), ro.lengths.tolist(), ro.group.tolist()):
        ids = prefixes[g] + ids[:length]
        if ids and ids[-1] == eos:
            ids = ids[:-1]
        out.append(tok.decode(ids, skip_special_tokens=True))
    return out
