"""explorl's rollout controllers inside verl: E3's temperature and budgets, EAD, per-prompt temperature.

explorl's own loop asks its temperature schedule and budget policy (`explorl.rollout.controllers`) what to sample
at each step and tells them what came back, through the schedule driver every engine uses
(`explorl.rollout.schedule.ScheduleDriver`). `RolloutControl` drives it for verl's v1 trainer (`ExplorlTrainer` in
`trainer.py`), in verl's terms:
- before a batch is generated: per prompt, the rollout count (verl's agent loop reads `__rollout_n__`), the
  request temperature and, for EAD / RevEAD, the annealing arguments that `explorl.integrations.vllm`'s logits
  processor evaluates per token; and the training temperature the actor's log-probs use (E3 trains at the tau it
  sampled at; EAD and per-prompt temperatures leave the optimised policy at the base temperature,
  docs/methods.md §6a, §2c);
- after rewards and entropies are known: each prompt's rewards (E3's difficulty ranks, per-prompt success rates)
  and the batch's mean token entropy (E3's controller).

The settings are explorl's `SamplingConfig` and `BudgetConfig` fields under `algorithm.explorl.sampling` and
`algorithm.explorl.budget`; what verl already sets (the base temperature, `n`, the response length, the number of
steps) is taken from verl's config and may not be set twice.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

from explorl.algos.registry import lookup
from explorl.config import BudgetConfig, Config, ConfigError, RunConfig, SamplingConfig, from_dict, validate
from explorl.config.validation import fill_registry
from explorl.integrations.loop_only import refuse_branching
from explorl.integrations.vllm import EAD_ARG
from explorl.rollout.schedule import Plan, ScheduleDriver

SAMPLING_KEY, BUDGET_KEY = "sampling", "budget"
"""The sub-mappings of `algorithm.explorl` holding explorl's sampling and budget fields."""
AGENT_LOOP = "explorl_single_turn"
"""verl agent loop that applies the per-prompt temperature and annealing (`agent_loop.py`)."""
TEMPERATURE_FIELD = "__explorl_temperature__"
ANNEAL_FIELD = "__explorl_anneal__"
"""Per-prompt fields of the batch verl hands its agent loop workers."""
VERL_OWNED = {"temperature": "actor_rollout_ref.rollout.temperature", "group_size": "actor_rollout_ref.rollout.n",
              "max_new_tokens": "actor_rollout_ref.rollout.response_length",
              "top_p": "actor_rollout_ref.rollout.top_p"}
"""explorl sampling fields whose value is verl's, and the verl key a user sets instead."""


def plain(section: Any) -> dict:
    """A mapping from verl's config (OmegaConf DictConfig, a dataclass or a dict) as a plain dict."""
    if section is None:
        return {}
    try:
        from omegaconf import DictConfig, OmegaConf  # verl's: its own venv only

        if isinstance(section, DictConfig):
            return OmegaConf.to_container(section, resolve=True)
    except ImportError:  # omegaconf comes with verl; plain dicts work without it
        pass
    if dataclasses.is_dataclass(section):
        return dataclasses.asdict(section)
    return dict(section)


def rollout_config(settings: Mapping | None, *, temperature: float, group_size: int, max_new_tokens: int,
                   top_p: float, total_steps: int, prefix: str = "algorithm.explorl.") -> Config:
    """An explorl `Config` whose sampling and budget sections come from `settings` (verl's `algorithm.explorl`:
    its `sampling` and `budget` mappings) and verl's own values, validated by explorl's rules; errors name the
    verl key (`algorithm.explorl.sampling.e3.eta`)."""
    settings = plain(settings)
    sampling = dict(settings.get(SAMPLING_KEY) or {})
    for field, verl_key in VERL_OWNED.items():
        if field in sampling:
            raise ConfigError(f"{prefix}{SAMPLING_KEY}.{field}: verl sets this; set `{verl_key}` instead")
    budget = dict(settings.get(BUDGET_KEY) or {})
    try:
        cfg = Config(sampling=from_dict(SamplingConfig, sampling, f"{SAMPLING_KEY}."),
                     budget=from_dict(BudgetConfig, budget, f"{BUDGET_KEY}."),
                     run=dataclasses.replace(RunConfig(), steps=max(int(total_steps), 1)))
        cfg.sampling = dataclasses.replace(cfg.sampling, temperature=float(temperature), group_size=int(group_size),
                                           max_new_tokens=int(max_new_tokens), top_p=float(top_p))
        validate(cfg)
        refuse_branching(cfg.budget.policy, "verl's rollout", f"{BUDGET_KEY}.policy")
        if lookup("budget_policy", cfg.budget.policy).resamples:
            raise ConfigError(f"{BUDGET_KEY}.policy={cfg.budget.policy}: this budget policy re-samples prompts until "
                              f"a batch is full, which explorl's rollout control cannot ask of verl's trainer; for "
                              f"DAPO's dynamic sampling use verl's own `algorithm.filter_groups.enable=true` "
                              f"(examples/verl/launch.py maps budget.policy=dapo to it), or explorl's own loop "
                              f"(`explorl train`)")
    except ConfigError as e:
        raise ConfigError(_rename(str(e), prefix)) from None
    return cfg


def _rename(message: str, prefix: str) -> str:
    """explorl's field names in a validation message as a verl user writes them."""
    for field, verl_key in VERL_OWNED.items():
        message = message.replace(f"{SAMPLING_KEY}.{field}", verl_key)
    return re.sub(rf"(?<![\w.])({SAMPLING_KEY}|{BUDGET_KEY})(?=[.:])", lambda m: prefix + m.group(1), message)


def needs_control(settings: Mapping | None) -> bool:
    """Whether `algorithm.explorl` asks for anything beyond verl's fixed temperature and `n`: a temperature schedule
    or a budget policy that is not `static` in the registry (so `fixed` and `uniform` need no control)."""
    fill_registry()
    settings = dict(settings or {})
    schedule = (settings.get(SAMPLING_KEY) or {}).get("schedule", SamplingConfig.schedule)
    policy = (settings.get(BUDGET_KEY) or {}).get("policy", BudgetConfig.policy)
    try:
        return not (lookup("temperature_schedule", schedule).static and lookup("budget_policy", policy).static)
    except KeyError:  # an unknown name: controlled, so that `rollout_config` reports it with explorl's message
        return True


RolloutPlan = Plan
"""What one step samples, per prompt of the batch (`rollout.schedule.Plan`: `rollout_n`, `temperature`, `anneal`,
`train_temperature`, `stats`)."""


class RolloutControl:
    """explorl's schedule driver (`rollout.schedule.ScheduleDriver`: the configured temperature schedule and budget
    policy), driven from verl's trainer.

    `prompt_ids` are dataset row indices in `[0, num_prompts)` (verl's `index` from each row's `extra_info`,
    which verl's data preprocessing scripts write). A new pass over the data (E3's curriculum widens) begins with
    the batch after every `num_prompts` planned prompts, as in explorl's loop (`PromptStream`).
    """

    def __init__(self, cfg: Config, vocab_size: int, num_prompts: int):
        self.cfg, self.num_prompts = cfg, int(num_prompts)
        self.driver = ScheduleDriver(cfg, vocab_size, self.num_prompts)

    @property
    def behavior_is_policy(self) -> bool:
        return self.driver.behavior_is_policy

    def plan(self, step: int, prompt_ids: Sequence[int]) -> Plan:
        """The plan for the batch of 0-based training step `step` (explorl's `collect_rollouts` numbering)."""
        ids = [int(i) for i in prompt_ids]
        bad = [i for i in ids if not 0 <= i < self.num_prompts]
        if bad:
            raise ValueError(f"prompt index {bad[0]} is outside [0, {self.num_prompts}): explorl's budgets and "
                             f"per-prompt temperatures track prompts by their dataset row index (verl's "
                             f"`extra_info.index`); give every row its index")
        if len(ids) > 1 and len(set(ids)) == 1:  # verl's dataset gives index 0 to rows without extra_info.index
            raise ValueError(f"every prompt of the batch has dataset index {ids[0]}: explorl's budgets and per-prompt "
                             f"temperatures need each row's own `extra_info.index` (verl's preprocessing scripts "
                             f"write it)")
        self.driver.begin(step)
        return self.driver.plan(ids)

    def observe(self, step: int, prompt_ids: Sequence[int], rewards_per_prompt: Sequence[Sequence[float]],
                mean_entropy: float) -> None:
        """Tell the driver what the batch of 0-based step `step` gave: each prompt's rewards and the mean token
        entropy of the batch's responses at the training temperature."""
        self.driver.observe_rewards([int(i) for i in prompt_ids], rewards_per_prompt)
        self.driver.end(float(mean_entropy), step=step)

    def state_dict(self) -> dict[str, Any]:
        """The driver's (`schedule`, `budget`, `planned`, ...), saved with each verl checkpoint (`explorl_rollout.json`)."""
        return self.driver.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.driver.load_state_dict(state)


def request_sampling_params(sampling_params: Mapping[str, Any], temperature: float | None,
                            anneal: Mapping | None) -> dict[str, Any]:
    """verl's per-request sampling parameters with a prompt's temperature and annealing arguments (the latter in
    vLLM's `extra_args`, read by `explorl.integrations.vllm.EADLogitsProcessor`)."""
    out = dict(sampling_params)
    if temperature is not None:
        out["temperature"] = float(temperature)
    if anneal is not None:
        out["extra_args"] = {**dict(out.get("extra_args") or {}), EAD_ARG: dict(anneal)}
    return out


def observed_per_prompt(uids: Sequence, prompt_index: dict[str, int], token_level_rewards, entropy,
                        response_mask) -> tuple[list[int], list[list[float]], float]:
    """What the controllers observe from a verl batch: the prompts' dataset indices (in order of first
    appearance), each prompt's response rewards (`token_level_rewards [N, T]` summed over tokens) and the mean token
    entropy over all valid response tokens (`entropy`, `response_mask` `[N, T]`). `prompt_index` maps verl's
    per-prompt `uid` to the dataset index recorded when the batch was planned; observed uids leave it."""
    rewards = token_level_rewards.sum(-1).tolist()
    order: dict[str, list[float]] = {}
    for uid, r in zip((str(u) for u in uids), rewards):
        order.setdefault(uid, []).append(float(r))
    missing = [u for u in order if u not in prompt_index]
    if missing:
        raise KeyError(f"uid {missing[0]!r} was not planned by explorl's rollout control (a batch generated "
                       f"before the trainer started, or by another trainer)")
    ids = [prompt_index.pop(u) for u in order]
    mask = response_mask.to(entropy.dtype)
    mean_entropy = float((entropy * mask).sum() / mask.sum().clamp_min(1))
    return ids, list(order.values()), mean_entropy
