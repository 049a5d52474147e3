"""`RolloutBatch`: one step's data, from the sampler to the update, validated in one place.

Each stage of a step fills in its own fields of the one object (`replace` returns a new one, the stages before
untouched), and a micro-batch is one `select(rows, width)` of it:

1. the sampler (`explorl.rollout.sampler.Sampler`, the vLLM engine): the token ids, the response mask, the sampled
   tokens' behaviour log-probs, entropies and temperatures; `rewards` None;
2. scoring (`explorl.rollout.collect.collect_rollouts`): `rewards` (and `baseline_rewards` where the estimator
   asks for each prompt's greedy response: ReMax); explorl's loop adds `correct` (`explorl.train.loop.train_step`),
   and `outcomes` and `line_starts` where a method reads them;
3. the forwards (`explorl.train.update.fill_logprobs`): pi_old's `logprobs` and `entropy` (and `sum_pi_squared`,
   `topk_logprobs` where a method needs them), the reference's `ref_logprobs`;
4. the method (`explorl.algos.step.compute_advantages`): `loss_mask`, `shaped_rewards`, `base_advantages`,
   `advantages`, `token_weights`, `is_weights` and the method's `stats`;
5. the update (`explorl.train.update.update_policy`) reads it, one `select` per micro-batch.

An engine integration fills the same object from its own tensors (verl's `DataProto`, TRL's inputs) and leaves what
its own trainer computes None. Notation of docs/methods.md: N responses, prompts left-padded to P, responses
right-padded to T tokens.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

TOKEN_FIELDS = ("logprobs", "behavior_logprobs", "ref_logprobs", "entropy", "behavior_entropy", "response_ids",
                "temperatures", "loss_mask", "advantages", "base_advantages", "token_weights", "is_weights",
                "sum_pi_squared", "line_starts")
ROW_FIELDS = ("rewards", "group", "lengths", "truncated", "shaped_rewards", "baseline_rewards", "correct",
              "advantage_scale", "outcomes")
CANDIDATE_FIELDS = ("topk_logprobs",)  # [N, T, K]: cut and padded by their response columns like TOKEN_FIELDS
PROMPT_FIELDS = ("prompt_ids", "prompt_mask")
PAD_ID_FIELDS = frozenset({"response_ids", "prompt_ids"})  # padded with the tokenizer's pad id; the rest with 0


class MissingInputError(KeyError):
    """A method needs a tensor the batch does not carry (e.g. ERPO without reference log-probs)."""

    def __str__(self) -> str:  # KeyError would print the message with quotes around it
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class TopK:
    """What the update's forward gives a policy loss that declares `needs_topk` (SimKO) besides the sampled tokens'
    log-probs, from the same logits (`explorl.rollout.logprobs.response_logprobs` with `LogprobOptions.top_k`)."""

    logprobs: Tensor
    """`[N, T, K]` log-probs of the current policy's own K most probable tokens, most probable first (differentiable;
    the candidates are chosen on the forward's detached logits, as the authors' `topk_log_probs`)."""
    entropy: Tensor
    """`[N, T]` token entropy of the current policy (detached)."""
    is_top1: Tensor
    """`[N, T]` bool: the sampled token is the current policy's most probable one (the authors' `max_token`)."""


@dataclass
class RolloutBatch:
    """One batch of responses and everything a step computes of them. Optional tensors are None until the stage
    that fills them has run (module docstring), or when nothing computes them.

    Sampled (stage 1):
    mask:              [N, T] float, 1.0 on response tokens up to and including EOS, 0.0 on padding.
    rewards:           [N] float, one reward per response; None until the responses are scored (stage 2).
    group:             [N] int64, the prompt each response answers (any ids; groups may differ in size).
    max_response_len:  the length limit the responses were sampled under (DAPO's overlong penalty, Dr.GRPO's
                       `seq-mean-token-sum-norm` normaliser); None when neither is used.
    prompt_ids:        [N, P] int64 prompt token ids, left-padded; what the update's forward reads (an engine whose
                       own trainer runs the forward leaves None).
    prompt_mask:       [N, P] int64, 1 on real prompt tokens.
    response_ids:      [N, T] int64 sampled token ids, padded after EOS.
    behavior_logprobs: [N, T] log-probs of the sampled tokens under the distribution actually sampled from (EAD
                       temperatures, top-p renormalisation).
    behavior_entropy:  [N, T] entropy of the sampler's temperature-scaled distribution (before top-p truncation);
                       NaN where the engine does not return it (vLLM).
    temperatures:      [N, T] the temperature each token was sampled at (0 on padding).
    lengths:           [N] int64, response lengths in tokens (EOS included); default `mask.sum(-1)`.
    truncated:         [N] bool, the response hit the length limit without EOS; default all False.
    baseline_rewards:  [N] the reward of the greedy response to each response's prompt (ReMax's baseline), scored
                       beside the rollouts where the estimator asks for it (stage 2); else None.
    reward_components: [N, K] each of the task's K > 1 reward functions' own score of each response (unweighted, a
                       failure 0; stage 2), what GDPO normalises one by one; None with one reward function.
    reward_weights:    the K functions' weights (`rewards = components @ weights`), beside `reward_components`.
    advantage_scale:   [N] a multiplier of each response's advantages that its sampler chose (FR3E's adaptive
                       advantage modulation, `explorl.rollout.fr3e`), applied to the estimator's output; else None.
    correct:           [N] bool, the response is correct by the task's rule (`task.correct_by`, `correct_threshold`:
                       one reward entry's own score, never the shaped reward), filled by explorl's loop; None
                       where an engine does not say (a loss that reads it declares `needs_topk`: SimKO).
    outcomes:          [N] int64, each response's outcome: a 63-bit hash of its question and its final answer as the
                       task extracts it (`Task.extract_answer`), equivalent answers pooled (`metrics.vote_keys`: every
                       correct answer is one outcome), -1 where no answer was extracted; equal keys, same question and
                       same outcome (`explorl.rollout.collect.outcome_keys`). Filled by explorl's loop where a shaper
                       declares `needs_outcomes` (the outcome-based exploration bonus); else None.
    line_starts:       [N, T] float, 1.0 on the response tokens that begin a line (the first token, and each token
                       after one that ends with a newline; `explorl.rollout.lines`), 0.0 elsewhere: where the KL term
                       acts under `algo.kl_tokens: line_starts`. Filled by explorl's loop and TRL's trainer then;
                       else None.
    The forwards (stage 3):
    logprobs:          [N, T] log-probs of the sampled tokens under pi_old at the training temperature; None under
                       `single_update_shortcut` (the update's own forward is pi_old).
    entropy:           [N, T] token entropy of pi_old at the training temperature.
    ref_logprobs:      [N, T] the sampled tokens' log-probs under the frozen reference policy.
    sum_pi_squared:    [N, T] sum over the vocabulary of pi_old(v)^2 at the training temperature (verl's
                       `sum_pi_squared`), where a registered entry declares `needs_sum_pi_squared`; else None.
    topk_logprobs:     [N, T, K] log-probs under pi_old of its own K most probable tokens at each position, most
                       probable first (SimKO's `old_log_probs_topk`), where the policy loss declares `needs_topk`
                       and pi_old has its own forward; else None (the update's forward stands in for it).
    The method (stage 4, `compute_advantages`):
    loss_mask:         [N, T] `mask` less what the reward shapers removed (DAPO's overlong filtering).
    shaped_rewards:    [N] the rewards after the reward shapers (DAPO's overlong penalty): what the estimator saw.
    base_advantages:   [N, T] the estimator's output before the shapers.
    advantages:        [N, T] the final per-token advantages (0 outside `loss_mask`).
    token_weights:     [N, T] per-token loss multipliers (the token filter, E3's per-question weights), or None.
    is_weights:        [N, T] importance weights (`algo.importance_weights`), or None.
    stats:             namespaced metrics of what the method did (`tokens/*`, `is/*`, `kl/mean`, `mismatch/*`); a
                       step's, not a row's: `select` keeps it whole.
    """

    mask: Tensor
    rewards: Tensor | None
    group: Tensor
    max_response_len: int | None = None
    prompt_ids: Tensor | None = None
    prompt_mask: Tensor | None = None
    response_ids: Tensor | None = None
    behavior_logprobs: Tensor | None = None
    behavior_entropy: Tensor | None = None
    temperatures: Tensor | None = None
    lengths: Tensor | None = None
    truncated: Tensor | None = None
    baseline_rewards: Tensor | None = None
    reward_components: Tensor | None = None
    reward_weights: tuple[float, ...] | None = None
    advantage_scale: Tensor | None = None
    correct: Tensor | None = None
    outcomes: Tensor | None = None
    line_starts: Tensor | None = None
    logprobs: Tensor | None = None
    entropy: Tensor | None = None
    ref_logprobs: Tensor | None = None
    sum_pi_squared: Tensor | None = None
    topk_logprobs: Tensor | None = None
    loss_mask: Tensor | None = None
    shaped_rewards: Tensor | None = None
    base_advantages: Tensor | None = None
    advantages: Tensor | None = None
    token_weights: Tensor | None = None
    is_weights: Tensor | None = None
    stats: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.mask.dim() != 2:
            raise ValueError(f"RolloutBatch.mask: expected [N, T], got shape {tuple(self.mask.shape)}")
        n, t = self.mask.shape
        if self.lengths is None:
            self.lengths = self.mask.sum(-1).long()
        if self.truncated is None:
            self.truncated = torch.zeros(n, dtype=torch.bool, device=self.mask.device)
        for name in ROW_FIELDS:
            x = getattr(self, name)
            if x is not None and tuple(x.shape) != (n,):
                raise ValueError(f"RolloutBatch.{name}: expected shape [N] = ({n},), got {tuple(x.shape)}")
        if self.group.dtype.is_floating_point:
            raise ValueError("RolloutBatch.group: expected integer prompt ids, got a floating-point tensor")
        for name in TOKEN_FIELDS:
            x = getattr(self, name)
            if x is not None and tuple(x.shape) != (n, t):
                raise ValueError(f"RolloutBatch.{name}: expected shape [N, T] = ({n}, {t}) like mask, "
                                 f"got {tuple(x.shape)}")
        for name in CANDIDATE_FIELDS:
            x = getattr(self, name)
            if x is not None and (x.dim() != 3 or tuple(x.shape[:2]) != (n, t)):
                raise ValueError(f"RolloutBatch.{name}: expected shape [N, T, K] with [N, T] = ({n}, {t}) like mask, "
                                 f"got {tuple(x.shape)}")
        for name in PROMPT_FIELDS:
            x = getattr(self, name)
            if x is not None and (x.dim() != 2 or x.shape[0] != n):
                raise ValueError(f"RolloutBatch.{name}: expected shape [N, P] with N = {n}, got {tuple(x.shape)}")
        if self.reward_components is not None:
            k = len(self.reward_weights or ())
            if tuple(self.reward_components.shape) != (n, k):
                raise ValueError(f"RolloutBatch.reward_components: expected shape [N, K] = ({n}, {k}), K the number "
                                 f"of reward_weights, got {tuple(self.reward_components.shape)}")
        if self.max_response_len is not None and self.max_response_len < 1:
            raise ValueError(f"RolloutBatch.max_response_len: must be >= 1, got {self.max_response_len}")

    def require(self, *names: str, by: str) -> None:
        """MissingInputError naming what method `by` needs and the batch lacks."""
        missing = [n for n in names if getattr(self, n) is None]
        if missing:
            hint = " (keep a frozen reference policy)" if "ref_logprobs" in missing else ""
            raise MissingInputError(f"{by} needs RolloutBatch fields {missing}, which are None{hint}")

    def replace(self, **changes) -> RolloutBatch:
        """A new batch with `changes` (a stage's fields); this one is left as it is."""
        return dataclasses.replace(self, **changes)

    def select(self, rows: Tensor, width: int | None = None) -> RolloutBatch:
        """Rows `rows` (and the first `width` response columns) of every tensor: a micro-batch, or the groups
        dynamic sampling keeps."""
        def cut(name: str, x):
            if not isinstance(x, Tensor):
                return x
            x = x[rows]
            columns = name == "mask" or name in TOKEN_FIELDS + CANDIDATE_FIELDS
            return x[:, :width] if width is not None and columns else x

        return RolloutBatch(**{f.name: cut(f.name, getattr(self, f.name)) for f in dataclasses.fields(self)})

    def to(self, device) -> RolloutBatch:
        """Every tensor on `device` (detached)."""
        return RolloutBatch(**{f.name: (x.detach().to(device) if isinstance(x := getattr(self, f.name), Tensor)
                                        else x) for f in dataclasses.fields(self)})

    @staticmethod
    def no_responses(group: Tensor, max_response_len: int) -> RolloutBatch:
        """What a sampler returns when no response was asked for (every prompt's count 0): N = 0 and T = 0, each
        field a sampler fills present. `group` [0] int64."""
        empty, ids = torch.zeros((0, 0)), torch.zeros((0, 0), dtype=torch.long)
        return RolloutBatch(mask=empty, rewards=None, group=group, max_response_len=max_response_len,
                            prompt_ids=ids, prompt_mask=ids, response_ids=ids, behavior_logprobs=empty,
                            behavior_entropy=empty, temperatures=empty, truncated=torch.zeros(0, dtype=torch.bool))

    @staticmethod
    def for_loss(mask: Tensor, advantages: Tensor, *, logprobs: Tensor | None = None,
                 loss_mask: Tensor | None = None, max_response_len: int | None = None,
                 is_weights: Tensor | None = None, token_weights: Tensor | None = None,
                 ref_logprobs: Tensor | None = None) -> RolloutBatch:
        """The fields a policy loss and `policy_objective` read, for an engine whose own trainer holds the rest
        (verl's loss call, TRL's micro-batches): pi_old's `logprobs`, the `advantages`, the `loss_mask` (default
        `mask`), the weights. Rewards and groups, which no loss reads, are zeros; `base_advantages` are the
        advantages."""
        zeros = torch.zeros(mask.shape[0], device=mask.device)
        return RolloutBatch(mask=mask, rewards=zeros, group=zeros.long(), max_response_len=max_response_len,
                            logprobs=logprobs, ref_logprobs=ref_logprobs,
                            loss_mask=mask if loss_mask is None else loss_mask, shaped_rewards=zeros,
                            base_advantages=advantages, advantages=advantages, token_weights=token_weights,
                            is_weights=is_weights)

    @staticmethod
    def cat(parts: Sequence[RolloutBatch], pad_token_id: int) -> RolloutBatch:
        """Stack the batches of several sampling rounds (DAPO's dynamic sampling): prompts re-left-padded to one
        width, responses re-right-padded to one length. Group ids are kept as they are: make them distinct first.
        A field is stacked where every part has it and None where none has; `stats` are not stacked."""
        width = max(p.prompt_ids.shape[1] for p in parts) if parts[0].prompt_ids is not None else 0
        length = max(p.mask.shape[1] for p in parts)

        def stacked(name: str):
            xs = [getattr(p, name) for p in parts]
            if all(x is None for x in xs):
                return None
            if any(x is None for x in xs):
                raise ValueError(f"RolloutBatch.cat: {name} is None in some parts and not in others")
            if name not in TOKEN_FIELDS + CANDIDATE_FIELDS + PROMPT_FIELDS + ("mask",):
                return torch.cat(xs)
            left = name in PROMPT_FIELDS
            to, value = (width if left else length), (pad_token_id if name in PAD_ID_FIELDS else 0)
            return torch.cat([_pad_columns(x, to, left, value) for x in xs])

        lens, weights = {p.max_response_len for p in parts}, {p.reward_weights for p in parts}
        if len(lens) > 1:
            raise ValueError(f"RolloutBatch.cat: the parts were sampled under different max_response_len {lens}")
        if len(weights) > 1:
            raise ValueError(f"RolloutBatch.cat: the parts were scored with different reward_weights {weights}")
        return RolloutBatch(**{f.name: stacked(f.name) for f in dataclasses.fields(RolloutBatch)
                               if f.name not in ("stats", "max_response_len", "reward_weights")},
                            max_response_len=lens.pop(), reward_weights=weights.pop())


def _pad_columns(x: Tensor, to: int, left: bool, value) -> Tensor:
    """`x` [n, c, ...] padded with `value` to `to` columns, on the left or the right."""
    extra = to - x.shape[1]
    if extra == 0:
        return x
    filler = torch.full((x.shape[0], extra, *x.shape[2:]), value, dtype=x.dtype, device=x.device)
    return torch.cat([filler, x] if left else [x, filler], dim=1)
