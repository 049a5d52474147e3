"""Typed configuration: one dataclass per concern, one docstring and one default per field.

The same objects are built from YAML files (`configs/*.yaml`) and from `key.sub=value` command-line
overrides; `load_config` validates everything before any work starts, so a typo or an impossible
combination fails in milliseconds with the field's dotted name, the reason and the valid choices.
Field docstrings are read from this file's source (`field_docs`) for `explorl config` and the README.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping

import yaml


class ConfigError(ValueError):
    """A configuration problem, named by the dotted field it concerns."""


@dataclass
class LoraConfig:
    enabled: bool = False
    """Train low-rank adapters (peft) instead of all weights. The frozen reference is then the base model with
    adapters disabled, not a second copy."""
    rank: int = 8
    """LoRA rank r."""
    alpha: float = 16.0
    """LoRA scaling alpha (the update is scaled by alpha / rank)."""
    dropout: float = 0.0
    """Dropout on the adapter input."""
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    """Names of the linear modules that get adapters (Qwen2/Llama naming)."""


@dataclass
class ModelConfig:
    path: str = "embedded"
    """A local Hugging Face causal-LM directory (config, weights, tokenizer), a LoRA adapter directory (its base
    from `adapter_config.json`, merged on load), or `embedded` for the tiny default model shipped with explorl
    (`explorl bootstrap` regenerates one)."""
    fingerprint: str = ""
    """A hash of `path`'s weights (`explorl.models.weights_fingerprint`). Empty: not checked. A run writes it into its
    config.yaml; when set, a run refuses a model whose weights hash differently (a resumed or replayed run stays on
    the model it was made with), and results with different fingerprints refuse to be paired."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Parameter dtype. `auto`: bfloat16 on a GPU that supports it, float32 on the CPU. Training refuses float16
    (AdamW's moments in float16 round to zero and the first step writes inf); `explorl eval` accepts it."""
    device: str = "auto"
    """`auto` (cuda when available, else cpu), `cpu`, `cuda` or `cuda:N`."""
    attn_implementation: str = "sdpa"
    """Attention kernel passed to `from_pretrained` (`sdpa`, `eager`, `flash_attention_2`)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory on large models."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """Optional LoRA adapters."""


@dataclass
class TaskConfig:
    name: str = "arith"
    """`arith` (built-in procedural arithmetic with worked solutions), `file` (question/answer JSONL or
    Parquet at `path`), or `rg:<dataset>` for a reasoning-gym task such as `rg:chain_sum`."""
    path: str = ""
    """`file` task: training data (.jsonl, .json or .parquet)."""
    eval_path: str = ""
    """`file` task: held-out data. Empty: the last `eval_size` rows of `path` are held out."""
    prompt_field: str = "problem"
    """`file` task: the field holding the question."""
    answer_field: str = "answer"
    """`file` task: the field holding the ground-truth answer."""
    solution_field: str = "solution"
    """`file` task: the field holding a worked solution (MATH's `solution`), the target text of `explorl sft`;
    optional for the other commands (rows without it have none)."""
    chat_template: Literal["auto", "on", "off"] = "auto"
    """Prompt through the tokenizer's chat template (instruct and reasoning models): `auto` (on when the tokenizer
    has one; the run's config.yaml records what it resolved to), `on`, `off`. The question (after
    `prompt_template`) or a conversational row's messages become the user turn."""
    system_prompt: str = ""
    """A system message before the user turn (chat template on), or a line before the prompt (off)."""
    prompt_template: str = "{question}"
    """Format string that turns a question into the prompt; `{question}` is replaced (`file` and `rg:` tasks)."""
    difficulties: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 5])
    """`arith`: difficulty levels mixed in one dataset (level d has d operations), so some prompts are easy
    and some hard. `rg:` tasks ignore it."""
    train_size: int = 4096
    """Number of training problems: generated for `arith` and `rg:`, a cap on the rows used for `file`."""
    eval_size: int = 256
    """Number of held-out problems."""
    data_seed: int = 1234
    """Seed of the procedural generators; independent of the training seed so runs share data."""
    reward: str | list[str] = "auto"
    """`auto` (the task's own checker), `math` (math-verify on the last \\boxed{}), `exact` (string match of the
    last \\boxed{}), or `module:function` for your own `fn(completion, answer, **meta) -> float`; or a list of these
    (`[math, my_rewards:fmt]`, TRL's `reward_funcs`): the reward is their weighted sum (`reward_weights`), and each
    function's mean is logged as `reward/<entry>` (`:` written `.`). A function marked `@explorl.rewards.batched`,
    or whose first parameter is named `completions`, is called once per batch as `fn(completions, answers, **meta)
    -> list[float]`, each meta key a list."""
    reward_weights: list[float] | None = None
    """Weights of the `reward` functions, one per entry, in order (TRL's `reward_weights`): reward = sum_i w_i * r_i,
    a failed function scoring 0 for that sample. null: every weight is 1."""
    reward_timeout_s: float = 5.0
    """Hard time limit per sample for rewards that run in a worker process; a timeout scores 0 and is counted."""
    reward_workers: int = 0
    """Worker processes that score a batch in parallel (each sample keeps its own time limit, so n hanging samples
    cost about reward_timeout_s * ceil(n / workers)); 0 = one per CPU core, at least 2 and at most 16."""
    max_reward_failure_frac: float = 0.5
    """Stop the run, before the step's update changes the weights, when more than this fraction of a step's
    rewards fail (raise, return something that is not a finite number) or time out; 1 = never stop. Failures
    below it score 0 and are counted; the first one's traceback is printed and each distinct one is logged to
    RUN/reward_errors.log."""


@dataclass
class SamplingConfig:
    group_size: int = 8
    """G: responses sampled per prompt (the group of GRPO)."""
    temperature: float = 1.0
    """Sampling temperature; the optimised policy is the logits divided by it as well (docs/methods.md §1)."""
    top_p: float = 1.0
    """Nucleus sampling mass (1.0 = off). Behaviour log-probs are taken under the truncated distribution."""
    max_new_tokens: int = 64
    """Length limit of a response; responses that hit it are flagged truncated."""
    fast_path: bool = True
    """Use the fused decoding path for Llama-family models (Qwen2, Llama) when it applies; otherwise the
    generic path that calls the Hugging Face forward with a KV cache."""
    schedule: str = "fixed"
    """Sampling temperature schedule, by registry name (kind `temperature_schedule`). `fixed`: `temperature`.
    `e3`: the E3 controller (paper 000 eq. 4) adapts tau each step to hold the entropy at its first-step value;
    the optimised policy uses the same tau. `ead`: annealed per-token temperature (paper 003), behaviour policy
    only; `revead`: its reversed ablation. `adaptive`: the `adaptive_base` schedule with a per-prompt multiplier
    by running success rate (explorl's; behaviour policy only)."""
    e3_anneal: bool = False
    """E3 entropy-target annealing (paper 000 eq. 5, the `AN` of TS+AN) from step floor(e3_anneal_frac * steps)."""
    e3_eta: float = 0.9
    """E3 annealing floor: the target ends at eta * H_init."""
    e3_anneal_frac: float = 0.6
    """E3 annealing start as a fraction of run.steps."""
    tau_floor: float = 0.05
    """Lower clamp of the E3 temperature (explorl's safety bound; the public code has none, docs/methods.md §2b)."""
    tau_ceil: float = 4.0
    """Upper clamp of the E3 temperature."""
    ead_tau_max: float = 1.2
    """EAD: starting temperature tau_max (paper 003)."""
    ead_tau_min: float = 0.1
    """EAD: floor tau_min."""
    ead_d0: float = 25.0
    """EAD: initial decay constant d_0."""
    ead_alpha: float = 5.0
    """EAD: growth of the decay constant per training step (d_s = min(d0 + alpha * s, d_max))."""
    ead_d_max: float = 40000.0
    """EAD: cap of the decay constant."""
    ead_c: int = 10
    """EAD: the first c generated tokens are sampled at temperature 1."""
    ead_scale: float = 1.0
    """EAD: divisor scale of the exponent (1 = the paper's formula; the public code uses 20)."""
    adaptive_base: str = "fixed"
    """`schedule: adaptive`: the schedule whose temperature is scaled per prompt (`fixed`, `e3`, `ead`, `revead`;
    with EAD the factor scales each prompt's tau_max). docs/methods.md §2c."""
    adaptive_gamma: float = 0.5
    """`schedule: adaptive`: slope of the per-prompt multiplier 1 + gamma * (target - success rate) (explorl's
    choice; no paper gives a formula): 1.25 for a never-solved prompt, 0.75 for an always-solved one."""
    adaptive_target: float = 0.5
    """`schedule: adaptive`: the running success rate that keeps the base temperature."""


@dataclass
class AlgoConfig:
    advantage: str = "grpo"
    """Advantage estimator by registry name (`grpo`, `dr_grpo`, ...; `explorl config` lists them)."""
    adv_eps: float = 1e-6
    """eps in the GRPO normalisation (r - mean) / (std + eps)."""
    eps_low: float = 0.2
    """PPO clip: lower bound of the ratio is 1 - eps_low."""
    eps_high: float = 0.2
    """PPO clip: upper bound of the ratio is 1 + eps_high (DAPO's clip-higher uses 0.28)."""
    loss_agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = "token-mean"
    """Aggregation of token losses (docs/methods.md §1d): token-mean (DAPO), seq-mean-token-mean (GRPO paper),
    seq-mean-token-sum-norm (Dr.GRPO, divides by N * max_new_tokens)."""
    kl_coef: float = 0.0
    """beta of the k3 KL penalty to the frozen reference model (0 = no reference model is kept)."""
    entropy_coef: float = 0.0
    """lambda of the entropy bonus: subtracts lambda * H per token (paper 000 eq. 3 uses 1e-4)."""
    epochs: int = 1
    """Optimisation passes over each batch of rollouts."""
    mini_batches: int = 1
    """Optimizer steps per epoch: the batch's responses are shuffled and split into this many mini-batches."""
    micro_batch_size: int = 0
    """Responses per forward/backward (gradient accumulation inside a mini-batch); 0 = split by length_buckets."""
    length_buckets: int = 4
    """With micro_batch_size 0: each mini-batch's responses are sorted by length and cut into this many
    micro-batches, each padded only to its own longest row (same gradient, less compute on padding)."""
    shapers: list[str] = field(default_factory=list)
    """Advantage shapers applied in order after the estimator: `cw` (covariance weighting, paper 002, batch-wide
    statistics, explorl's reading, docs/methods.md §4), `cw_group` (the same with paper 002's per-group
    statistics), `cw_balanced` (explorl's sign-balanced variant, not the paper's: the per-group kernel normalised
    per advantage sign), `ppl`, `position` (paper 004 section 4.4.2), `entropy_adv` (Cheng et al.)."""
    cw_bandwidth: float = 1.0
    """Covariance weighting (`cw`, `cw_group`, `cw_balanced`): width of the Gaussian kernel as a multiple of sigma,
    w = exp(-c^2 / (2 (cw_bandwidth * sigma)^2)). 1 = paper 002 (section 2.3 sets the bandwidth to sigma); larger
    suppresses fewer tokens, smaller more (docs/methods.md §4)."""
    loss: str = "ppo"
    """Per-token objective by registry name (kind `policy_loss`): `ppo` (PPO-clip), `clip_cov` or `kl_cov`
    (Cui et al. 2025; docs/methods.md §5a, §5b)."""
    token_filter: str = "none"
    """Token filter by registry name (kind `token_filter`): `none`, or `forking`: only the top `forking_top_frac`
    highest-entropy tokens of the batch train (Wang et al. 80/20)."""
    forking_top_frac: float = 0.2
    """Fraction of valid tokens kept by the forking-token filter."""
    tis: bool = False
    """Truncated importance sampling (paper 003): weight each token loss by min(pi_old / mu, tis_cap), mu the
    distribution actually sampled from (EAD's per-token temperatures, top-p)."""
    tis_cap: float = 2.0
    """Cap C of the truncated importance weights."""
    tis_level: Literal["token", "sequence"] = "token"
    """Level of the truncated importance weights (docs/methods.md §6). `token` (explorl's default): each token's
    own min(pi_old / mu, tis_cap). `sequence`: the truncated ratio of whole sequences that paper 003 writes
    (App. B.2, min(pi_old(y|x) / pi_EAD(y|x), C)), the same weight on every token of a response, computed in log
    space."""
    dual_clip_c: float | None = None
    """Dual-clip PPO as verl 0.9 applies it (its `actor.clip_ratio_c`, default 3.0, always on; Ye et al. 2020): for
    tokens with A < 0 the token loss is min(-A * c, PPO-clip loss), so a huge ratio cannot drive it further.
    Must be > 1. null (explorl's default): off. Only losses that map it (`ppo`; not `clip_cov`, as verl's
    Clip-Cov has none). docs/methods.md §9."""
    kl_clamp: float | None = None
    """Clamp of the per-token k3 KL estimate to [-kl_clamp, kl_clamp], with its log-ratio clamped to [-20, 20]
    before exp, as verl 0.9's `low_var_kl` (`kl_penalty` in verl/trainer/ppo/core_algos.py, clamp 10); no gradient
    where a clamp acts. Acts on the KL term and the `kl/mean` statistic. Must be > 0. null (explorl's default):
    off. docs/methods.md §1, §9."""
    overlong: Literal["none", "mask", "penalty"] = "none"
    """DAPO overlong handling of responses that hit the length limit: drop them from the loss (`mask`) or
    the soft length penalty (`penalty`, DAPO eq. 13) added to the reward."""
    overlong_buffer: int = 16
    """DAPO: tokens before the limit where the soft penalty ramps from 0 to -overlong_penalty."""
    overlong_penalty: float = 1.0
    """DAPO: size of the overlong penalty."""
    erpo_beta_progress: float = 0.1
    """ERPO: beta of the implicit progress signal s = beta * (logp - ref_logp) (paper 001 eq. 7)."""
    erpo_gamma: float = 5.0
    """ERPO: sharpness gamma of the entropy gate (eq. 8)."""
    erpo_eta: float = 0.2
    """ERPO: weight eta of the token-level term in A_group + eta * Psi."""
    erpo_num_buckets: int = 10
    """ERPO: relative-position buckets K of the progress normalisation (eq. 9)."""
    erpo_sigma_target: float = 1.0
    """ERPO: target scale of the token-level term."""
    ppl_alpha: float = 0.01
    """PPL shaping: alpha in A * (1 - alpha * w_ppl) (paper 004 section 4.4.2)."""
    ppl_iqr_filter: bool = False
    """PPL shaping: drop 1.5-IQR outliers from the group statistics (as the public code does)."""
    ppl_clamp: list[float] | None = None
    """PPL shaping: optional [lo, hi] clamp of the factor 1 - alpha * w (the public code uses [0.8, 1.2])."""
    position_gamma: float = 0.1
    """Position shaping: bonus scale gamma."""
    position_m: float = 15.0
    """Position shaping: sigmoid steepness m."""
    position_d: float = 1.0
    """Position shaping: direction d (+1 favours later tokens)."""
    position_n: float = 0.5
    """Position shaping: centre shift n of the sigmoid, r = m * (l - n) (docs/methods.md §7b). 0.5 (explorl and the
    public code) centres it mid-response; -0.5 is the value paper 004 prints (section 4.4.2), which saturates the
    sigmoid so that every token gets about the full bonus gamma."""
    position_start: int = 0
    """Position shaping: first training step (1-based) of its window."""
    position_steps: int = 0
    """Position shaping: length of its window in steps (0 = every step)."""
    position_cap_frac: float | None = None
    """Position shaping: optional cap of the bonus as a fraction of |A| (the public code uses 0.5)."""
    entropy_adv_alpha: float = 0.4
    """Entropy-based advantage: alpha in A + min(alpha * H, |A| / kappa) (Cheng et al.)."""
    entropy_adv_kappa: float = 2.0
    """Entropy-based advantage: kappa."""
    passk_k: int = 4
    """Pass@k training (Chen et al.): the k of the pass@k objective (binary rewards)."""
    clip_cov_ratio: float = 2e-4
    """Clip-Cov: fraction of tokens whose gradient is removed."""
    clip_cov_lb: float = 1.0
    """Clip-Cov: lower covariance bound of the candidates."""
    clip_cov_ub: float = 5.0
    """Clip-Cov: upper covariance bound of the candidates."""
    kl_cov_k_percent: float = 0.2
    """KL-Cov: percentage (not fraction) of tokens with the largest covariance that get the KL penalty."""
    kl_cov_coef: float = 1.0
    """KL-Cov: coefficient of |logp - logp_old| on the selected tokens."""


@dataclass
class BudgetConfig:
    policy: str = "uniform"
    """Rollouts per prompt, by registry name (kind `budget_policy`). `uniform`: sampling.group_size each. `e3`:
    dynamic budgets by difficulty (paper 000 Algorithm 1) with the G_min/G_max curriculum. `dapo`: DAPO dynamic
    sampling: groups whose rewards all agree are dropped and more prompts are sampled until the batch is full or
    `dapo_max_rounds` extra rounds are spent."""
    g_min_limit: int = 4
    """E3 curriculum: G_min never goes below this (paper: 4 with G = 8)."""
    g_max_limit: int = 12
    """E3 curriculum: G_max never goes above this (paper: 12)."""
    g_step: int = 2
    """E3 curriculum: G_min decreases and G_max increases by this after each pass over the data."""
    curriculum: bool = True
    """E3 curriculum on (paper 000 section 4.1: the bounds start at G and widen after each pass). false: the
    bounds are g_min_limit / g_max_limit from the first step (Algorithm 1 without the curriculum; as ranks exist
    only after the first pass, that pass still gives every prompt G). docs/methods.md §2a."""
    g_min_start: int | None = None
    """E3 curriculum: G_min during the first pass; null = sampling.group_size (the paper's). Must lie in
    [g_min_limit, group_size]; only with `curriculum: true`."""
    g_max_start: int | None = None
    """E3 curriculum: G_max during the first pass; null = sampling.group_size (the paper's). Must lie in
    [group_size, g_max_limit]; only with `curriculum: true`."""
    dapo_max_rounds: int = 3
    """DAPO dynamic sampling: extra generation rounds allowed per step to fill the batch."""


@dataclass
class RftConfig:
    iterations: int = 3
    """`explorl rft`: rejection-sampling fine-tuning iterations (paper 004 section 4.4.1)."""
    prompts: int = 256
    """Training prompts sampled per iteration."""
    samples_per_prompt: int = 8
    """Responses sampled per prompt."""
    strategies: list[str] = field(default_factory=list)
    """Exploration-aware data selection on top of the rule filters, any of `noisy` (add incorrect samples),
    `entropy` (highest mean token entropy), `branching` (highest mean rollout branching factor)."""
    noisy_frac: float = 0.05
    """`noisy`: incorrect samples added, as a fraction of the selected correct ones (paper: 5%)."""
    select_frac: float = 0.5
    """`entropy` / `branching`: fraction of the filtered correct samples kept, highest first."""
    select_count: int = 0
    """A fixed number of correct samples fine-tuned on per iteration (paper 004 section 4.4.1 uses 1.1k per
    iteration); 0 = as many as the filters and `select_frac` keep. With `entropy` / `branching` the top
    select_count by score (in place of select_frac), otherwise a random select_count of the filtered correct ones;
    fewer when fewer pass. `noisy` adds its fraction of them on top."""
    branching_top_p: float = 0.95
    """Mass that defines the rollout branching factor (docs/methods.md §8b)."""
    epochs: int = 1
    """Supervised passes over each iteration's selected samples."""
    lr: float = 5e-4
    """AdamW learning rate of the fine-tuning."""
    batch_size: int = 32
    """Sequences per fine-tuning step."""
    eval_top_p: float = 1.0
    """Nucleus mass of the per-iteration held-out evaluation (temperature `run.eval_temperature`); paper 004
    section 4.4.1 evaluates at top-p 0.95, temperature 0.6."""


@dataclass
class SftConfig:
    epochs: int = 3
    """`explorl sft`: passes over the training split's worked solutions (paper 001's SFT baseline: 3 epochs). The
    optimizer is `optim`'s (lr 1e-5 = paper 004's SFT models; warm-up and cosine decay over all sft steps);
    docs/methods.md §8d."""
    batch_size: int = 96
    """Sequences per optimizer step (paper 004 section 2.4: 96)."""
    micro_batch_size: int = 0
    """Sequences per forward/backward (gradient accumulation inside a step, same mean loss); 0 = the whole batch."""
    max_length: int = 0
    """Keep only the first this-many tokens of prompt + solution + EOS (paper 004: a 20,000-token context);
    0 = no limit."""


@dataclass
class OptimConfig:
    lr: float = 1e-5
    """Peak learning rate of AdamW."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    beta1: float = 0.9
    """AdamW beta1."""
    beta2: float = 0.999
    """AdamW beta2."""
    warmup_steps: int = 0
    """Linear warm-up, in optimizer steps."""
    min_lr_ratio: float = 0.1
    """Cosine decay ends at lr * min_lr_ratio after all optimizer steps."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value (0 = off)."""


@dataclass
class RunConfig:
    steps: int = 100
    """Training steps (one batch of prompts sampled, scored and optimised per step)."""
    batch_size: int = 16
    """Prompts per step (B)."""
    seed: int = 0
    """Seed of sampling, data order and initialisation; a run is reproducible for a seed."""
    out_dir: str = "runs/default"
    """Run directory: config.yaml, metrics.jsonl, samples.jsonl, checkpoints/, eval.json."""
    save_every: int = 25
    """Write a checkpoint every this many steps (and at the end); 0 = only at the end."""
    keep_checkpoints: int = 2
    """How many of the newest checkpoints to keep."""
    eval_every: int = 0
    """Evaluate on the held-out split every this many steps (0 = only at the end)."""
    eval_n: int = 8
    """Samples per held-out problem during evaluation."""
    eval_k: list[int] = field(default_factory=lambda: [1, 8])
    """k values of pass@k reported during evaluation (each <= eval_n)."""
    eval_temperature: float = 1.0
    """Sampling temperature of evaluation."""
    eval_sets: dict[str, dict] = field(default_factory=dict)
    """More held-out sets, evaluated beside the task's own each time the run evaluates: name -> `task` settings
    layered over the run's `task` section, e.g. `{ood: {difficulties: [8, 9]}}` or `{math500: {name: file, path:
    data/math500.jsonl}}` (a file named by `path` alone is held out from: its first `eval_size` rows). Reported as
    `eval/<name>/pass@k` (and every other eval metric) in metrics.jsonl, the trackers and eval.json."""
    log_samples: int = 2
    """Prompts per step whose completions go to samples.jsonl."""
    threads: int = 0
    """torch CPU threads (0 = leave torch's default)."""
    max_nonfinite_steps: int = 3
    """Stop the run after this many consecutive steps whose loss or gradient was not finite."""
    report_to: list[str] = field(default_factory=list)
    """Experiment trackers beside metrics.jsonl: any of `tensorboard` (RUN/tensorboard) and `wandb` (its own
    environment decides online or offline); every metric and evaluation, the resolved config, resumed runs continue
    the same tracked run. Optional packages: `pip install "explorl[track]"`."""
    wandb_project: str = "explorl"
    """`report_to: [wandb]`: the W&B project."""
    plugins: list[str] = field(default_factory=list)
    """Python modules imported before the config is validated, so the estimators, shapers, losses, schedules,
    budget policies and tasks they register (`explorl.algos.registry.register`) can be named in this config."""


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy."""
    task: TaskConfig = field(default_factory=TaskConfig)
    """Prompts, answers and rewards."""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    """Rollouts."""
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    """Rollouts per prompt."""
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    """Advantage estimator and policy loss."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer and schedule."""
    run: RunConfig = field(default_factory=RunConfig)
    """Steps, batch, seed, outputs."""
    rft: RftConfig = field(default_factory=RftConfig)
    """Rejection-sampling fine-tuning (`explorl rft`)."""
    sft: SftConfig = field(default_factory=SftConfig)
    """Supervised fine-tuning on worked solutions (`explorl sft`)."""


# ----------------------------------------------------------------------------------------------------------------
# building from dicts, with errors that name the field


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (list, tuple):
        return f"list of {_type_name(typing.get_args(tp)[0])}"
    if origin in (typing.Union, types.UnionType):
        return " or ".join("null" if a is type(None) else _type_name(a) for a in typing.get_args(tp))
    return getattr(tp, "__name__", str(tp))


def _scalar(text: str) -> Any:
    """`text` parsed as a YAML scalar (`4` -> 4, `1e-4` stays a string for `_coerce`), or itself if not YAML."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _coerce(value: Any, tp: Any, name: str) -> Any:
    """Check `value` against the annotation `tp` (after YAML parsing) and return it in canonical form."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            raise ConfigError(f"{name}: {value!r} is not a valid choice; valid choices: {', '.join(map(str, choices))}")
        return value
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None and len(args) < len(typing.get_args(tp)):
            return None
        if isinstance(value, (list, tuple)):  # `str | list[str]`: a list takes the list form
            args = [a for a in args if typing.get_origin(a) is list] or args
        return _coerce(value, args[0], name)
    if origin is dict:  # name -> a section's fields (run.eval_sets); the fields are checked by `validate`
        if not isinstance(value, dict) or not all(isinstance(v, dict) or v is None for v in value.values()):
            raise ConfigError(f"{name}: expected a mapping of names to mappings of fields, e.g. "
                              f"{{ood: {{difficulties: [8, 9]}}}}, got {value!r}")
        return {str(k): dict(v or {}) for k, v in value.items()}
    if origin is list:
        (inner,) = typing.get_args(tp)
        if isinstance(value, str):  # `a,b,c` on the command line; numbers are parsed as YAML scalars
            items = [v.strip() for v in value.split(",") if v.strip()]
            value = items if inner is str else [_scalar(v) for v in items]
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = [value]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{name}: expected a list, got {value!r}")
        return [_coerce(v, inner, f"{name}[{i}]") for i, v in enumerate(value)]
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{name}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{name}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, str):
            try:  # YAML 1.1 reads "1e-5" as a string
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value):
            return float(value)
        raise ConfigError(f"{name}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        if isinstance(value, str):
            return value
        raise ConfigError(f"{name}: expected a string, got {value!r}")
    raise ConfigError(f"{name}: unsupported field type {tp}")


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def from_dict(cls: type, data: dict[str, Any] | None, prefix: str = "") -> Any:
    """Build dataclass `cls` from a nested dict, validating keys and types."""
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a mapping, got {data!r}")
    data = dict(data or {})
    hints = _hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        if key not in names:
            near = difflib.get_close_matches(str(key), names, n=1)
            hint = f" Did you mean '{prefix}{near[0]}'?" if near else ""
            raise ConfigError(f"unknown key '{prefix}{key}'.{hint} Valid keys here: {', '.join(names)}")
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            value = data[f.name]
            if value is not None and not isinstance(value, dict):
                raise ConfigError(f"{prefix}{f.name}: expected a mapping of its fields, got {value!r}")
            kwargs[f.name] = from_dict(tp, value, f"{prefix}{f.name}.")
        else:
            kwargs[f.name] = _coerce(data[f.name], tp, f"{prefix}{f.name}")
    return cls(**kwargs)


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def _field_type(parts: list[str], cls: type = Config) -> Any:
    """The annotation of the dotted field `parts` of `cls`, or None when there is no such field."""
    for i, part in enumerate(parts):
        tp = _hints(cls).get(part) if dataclasses.is_dataclass(cls) else None
        if tp is None or i == len(parts) - 1:
            return tp
        cls = tp
    return None


def apply_override(data: dict[str, Any], override: str) -> None:
    """Apply one `a.b.c=value` override to a nested dict; the value is parsed as YAML (`1e-4`, `[1,2]`, `true`),
    except for plain string fields, which take the text verbatim (`task.prompt_template=Q: {question}`) unless
    it is quoted, and fields whose choices are strings (`task.chat_template=off` is `off`, not YAML's false)."""
    if "=" not in override:
        raise ConfigError(f"override {override!r} must look like key.sub=value (e.g. sampling.temperature=0.7)")
    key, raw = override.split("=", 1)
    key = key.strip()
    try:
        value = yaml.safe_load(raw) if raw.strip() != "" else ""
    except yaml.YAMLError:
        value = raw
    parts = key.split(".")
    quoted = len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"" and isinstance(value, str)
    tp = _field_type(parts)
    choices = typing.get_args(tp) if typing.get_origin(tp) is Literal else ()
    if (tp is str or (choices and all(isinstance(c, str) for c in choices))) and not quoted:
        value = raw.strip() if choices else raw
    node = data
    for p in parts[:-1]:
        if not isinstance(node.get(p, {}), dict):
            raise ConfigError(f"override {override!r}: '{p}' is not a section")
        node = node.setdefault(p, {})
    node[parts[-1]] = value


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read a YAML config (optional), apply overrides, build and validate the typed `Config`.

    A YAML file may name `base: other.yaml` (relative to itself) to inherit from another config.
    """
    data: dict[str, Any] = {}
    if path is not None:
        data = _read_yaml(Path(path))
    for ov in overrides:
        apply_override(data, ov)
    cfg = from_dict(Config, data)
    validate(cfg)
    return cfg


def _read_yaml(path: Path, depth: int = 0) -> dict[str, Any]:
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    try:
        loader = yaml.SafeLoader(path.read_text(encoding="utf-8"))
        loader.name = str(path)  # YAML's messages name the file (not "<unicode string>") and quote its line
        try:
            data = loader.get_single_data() or {}
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not a UTF-8 text file ({e})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections (model, task, ...)")
    base = data.pop("base", None)
    if base is not None:
        if not isinstance(base, str) or not base:
            raise ConfigError(f"{path}: `base:` must be the path of another YAML config, got {base!r}")
        if depth > 8:
            raise ConfigError(f"{path}: `base:` chain is too deep (a cycle?)")
        data = _merge(_read_yaml(path.parent / base, depth + 1), data)
    return data


def import_plugins(modules: list[str]) -> None:
    """Import `run.plugins` (with the working directory on sys.path, as for `task.reward: module:function`)."""
    import importlib
    import os
    import sys

    if modules and "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    for i, name in enumerate(modules):
        try:
            importlib.import_module(name)
        except Exception as e:  # the module's own error, named with the field
            raise ConfigError(f"run.plugins[{i}]: cannot import {name!r}: {type(e).__name__}: {e}") from None


def _registered(kind: str, name: str, field_name: str):
    """The registry entry `name` of `kind`, or ConfigError naming `field_name` and the valid names."""
    from explorl.algos.registry import lookup, names

    try:
        return lookup(kind, name)
    except KeyError:
        raise ConfigError(f"{field_name}: unknown {kind.replace('_', ' ')} {name!r}; valid: {', '.join(names(kind))}"
                          f" (your own: register it in a module named in run.plugins)") from None


EVAL_KEYS_RESERVED = ("entropy", "length", "errors", "timeouts", "format_rate", "problems", "n")


def held_out_task(base: TaskConfig, fields: Mapping[str, Any], prefix: str) -> TaskConfig:
    """Task settings `fields` over `base`, each checked (errors name `prefix` + the field). A `file` task named by
    `path` alone is held out from that file: `eval_path` = `path` (its first `eval_size` rows)."""
    task = from_dict(TaskConfig, {**to_dict(base), **fields}, prefix)
    if task.name == "file" and "path" in fields and "eval_path" not in fields:
        task.eval_path = task.path
    return task


def eval_set_task(cfg: "Config", name: str) -> "TaskConfig":
    """The task of held-out set `name` of `run.eval_sets`: its settings layered over `cfg.task` (`held_out_task`)."""
    return held_out_task(cfg.task, cfg.run.eval_sets[name], f"run.eval_sets.{name}.")


def command_task(run_cfg: "Config | None", name: str | None, opts: Mapping[str, str]) -> TaskConfig:
    """The task `explorl eval` and `explorl probe` use: an evaluated run's own `task` section when there is a run and
    `name` is None or its task's name, else task `name` (default `arith`) with its defaults; `opts` (`field=value`
    text, as `--task-opt` gives it) on top. A `file` named by `path` alone is evaluated on all of its rows (unless
    `eval_size` is given)."""
    if run_cfg is not None and name in (None, run_cfg.task.name):
        base = run_cfg.task
    else:
        base = from_dict(TaskConfig, {"name": name or "arith"}, "task.")
    data: dict = {"task": {}}
    for k, v in opts.items():
        apply_override(data, f"task.{k}={v}")
    task = held_out_task(base, data["task"], "task.")
    if task.name == "file" and "path" in opts and "eval_path" not in opts and "eval_size" not in opts:
        from explorl.tasks.files import count_rows

        task.eval_size = max(count_rows(task.eval_path, "--task-opt path"), 1)
    return task


DEVICES = "auto, cpu, cuda, cuda:N"


def valid_device(device: str) -> bool:
    """Whether `device` is one of DEVICES (`model.device`, the commands' `--device`)."""
    return device in ("auto", "cpu") or device.startswith("cuda")


def validate(cfg: Config) -> None:
    """Cross-field checks; raises ConfigError naming the field and the fix.

    Names are checked against the registry (after importing `run.plugins`), and each chosen entry may carry its
    own `check(cfg) -> message or None` (registered with `register(..., check=fn)`).
    """
    import explorl.algos  # noqa: F401  (these imports fill the registry)
    import explorl.rollout.controllers  # noqa: F401
    import explorl.tasks  # noqa: F401

    def need(cond: bool, msg: str) -> None:
        if not cond:
            raise ConfigError(msg)

    s, a, o, r, t, b = cfg.sampling, cfg.algo, cfg.optim, cfg.run, cfg.task, cfg.budget
    import_plugins(r.plugins)
    chosen = [_registered("estimator", a.advantage, "algo.advantage")]
    chosen += [_registered("shaper", x, f"algo.shapers[{i}]") for i, x in enumerate(a.shapers)]
    need(len(set(a.shapers)) == len(a.shapers), f"algo.shapers: {a.shapers} names a shaper twice")
    chosen += [_registered("policy_loss", a.loss, "algo.loss"),
               _registered("token_filter", a.token_filter, "algo.token_filter")]
    schedule = _registered("temperature_schedule", s.schedule, "sampling.schedule")
    chosen += [schedule, _registered("budget_policy", b.policy, "budget.policy"),
               _registered("task", t.name, "task.name")]
    need(s.group_size >= 1, "sampling.group_size: must be >= 1")
    need(s.temperature > 0, "sampling.temperature: must be > 0 (use a small value such as 1e-3 for near-greedy)")
    need(0 < s.top_p <= 1, "sampling.top_p: must be in (0, 1]")
    need(s.max_new_tokens >= 1, "sampling.max_new_tokens: must be >= 1")
    need(0 <= a.eps_low < 1, "algo.eps_low: must be in [0, 1)")
    need(a.eps_high >= 0, "algo.eps_high: must be >= 0")
    need(a.kl_coef >= 0, "algo.kl_coef: must be >= 0")
    need(a.kl_clamp is None or a.kl_clamp > 0,
         f"algo.kl_clamp: must be > 0 (verl's low_var_kl uses 10) or null for no clamp, got {a.kl_clamp}")
    need(a.tis_level in ("token", "sequence"),
         f"algo.tis_level: {a.tis_level!r} is not a valid choice; valid choices: token, sequence")
    if a.dual_clip_c is not None:
        need(a.dual_clip_c > 1, f"algo.dual_clip_c: must be > 1 (verl's clip_ratio_c is 3.0) or null for no dual "
                                f"clip, got {a.dual_clip_c}")
        need("dual_clip_c" in _registered("policy_loss", a.loss, "algo.loss").kwargs.values(),
             f"algo.dual_clip_c: the loss {a.loss!r} does not apply a dual clip (only `ppo` does; verl's Clip-Cov "
             f"has none); set algo.dual_clip_c=null or algo.loss=ppo")
    need(a.epochs >= 1, "algo.epochs: must be >= 1")
    need(a.mini_batches >= 1, "algo.mini_batches: must be >= 1")
    need(a.micro_batch_size >= 0, "algo.micro_batch_size: must be >= 0 (0 = split by algo.length_buckets)")
    need(a.length_buckets >= 1, "algo.length_buckets: must be >= 1 (1 = the whole mini-batch in one forward)")
    need(a.mini_batches <= r.batch_size * s.group_size,
         f"algo.mini_batches: {a.mini_batches} mini-batches need at least that many responses; "
         f"run.batch_size * sampling.group_size = {r.batch_size * s.group_size}")
    need(o.lr > 0, "optim.lr: must be > 0")
    need(0 <= o.min_lr_ratio <= 1, "optim.min_lr_ratio: must be in [0, 1]")
    need(o.warmup_steps >= 0, "optim.warmup_steps: must be >= 0")
    need(o.grad_clip >= 0, "optim.grad_clip: must be >= 0 (0 = off)")
    need(r.steps >= 1, "run.steps: must be >= 1")
    need(r.batch_size >= 1, "run.batch_size: must be >= 1")
    need(r.eval_n >= 1, "run.eval_n: must be >= 1")
    need(all(1 <= k <= r.eval_n for k in r.eval_k),
         f"run.eval_k: every k must be in [1, run.eval_n={r.eval_n}], got {r.eval_k}")
    need(r.eval_temperature > 0, "run.eval_temperature: must be > 0")
    for set_name in r.eval_sets:
        need(re.fullmatch(r"[A-Za-z0-9_.-]+", set_name) is not None and set_name not in EVAL_KEYS_RESERVED,
             f"run.eval_sets: {set_name!r} is not a usable name (letters, digits, '_', '-', '.'; not a metric "
             f"name such as pass@1)")
        # unknown or ill-typed fields raise, naming run.eval_sets.<name>.<field>; then the task's own check
        set_task = eval_set_task(cfg, set_name)
        check = _registered("task", set_task.name, f"run.eval_sets.{set_name}.name").extra.get("check")
        message = check(dataclasses.replace(cfg, task=set_task)) if check is not None else None
        need(message is None, (message or "").replace("task.", f"run.eval_sets.{set_name}."))
    bad = [x for x in r.report_to if x not in ("tensorboard", "wandb")]
    need(not bad, f"run.report_to: unknown tracker(s) {bad}; valid: tensorboard, wandb")
    need(cfg.model.dtype != "float16",
         "model.dtype: float16 weights cannot be trained (AdamW keeps its moments in the weights' dtype: squared "
         "gradients below ~2e-4 and its eps of 1e-8 round to 0 in float16, so the first step writes inf/NaN, on the "
         "CPU and on a GPU alike); use model.dtype=float32, or bfloat16 on a GPU that supports it (`auto` picks it)")
    need(valid_device(cfg.model.device), f"model.device: {cfg.model.device!r} is not one of {DEVICES}")
    need(t.train_size >= 1 and t.eval_size >= 1, "task.train_size and task.eval_size must be >= 1")
    _validate_rewards(t, need)
    need(t.reward_timeout_s > 0, "task.reward_timeout_s: must be > 0")
    need(t.reward_workers >= 0, f"task.reward_workers: must be >= 0 (0 = one per CPU core), got {t.reward_workers}")
    need(0 <= t.max_reward_failure_frac <= 1,
         f"task.max_reward_failure_frac: must be in [0, 1] (0.5: stop when most of a step's rewards fail; 1: never "
         f"stop), got {t.max_reward_failure_frac}")
    need("{question}" in t.prompt_template, "task.prompt_template: must contain {question}")
    if a.tis:
        need(not schedule.behavior_is_policy or s.top_p < 1.0,
             f"algo.tis: the behaviour policy equals the optimised one here (schedule {s.schedule}, top_p = 1), so "
             "every importance weight is 1; use sampling.schedule=ead or revead, or turn tis off")
        need(a.tis_cap >= 1.0, "algo.tis_cap: must be >= 1")
    need(0 < a.forking_top_frac <= 1, "algo.forking_top_frac: must be in (0, 1]")
    if a.overlong == "penalty":
        need(0 < a.overlong_buffer < s.max_new_tokens,
             f"algo.overlong_buffer: must be in (0, sampling.max_new_tokens={s.max_new_tokens})")
    if a.ppl_clamp is not None:
        need(len(a.ppl_clamp) == 2 and 0 <= a.ppl_clamp[0] <= a.ppl_clamp[1],
             f"algo.ppl_clamp: expected [lo, hi] with 0 <= lo <= hi, got {a.ppl_clamp}")
    need(a.position_cap_frac is None or a.position_cap_frac >= 0, "algo.position_cap_frac: must be >= 0")
    need(math.isfinite(a.position_n), f"algo.position_n: must be a finite number (0.5 centres the bonus mid-response; "
                                      f"the paper prints -0.5), got {a.position_n}")
    need(0 < a.cw_bandwidth < math.inf, f"algo.cw_bandwidth: must be > 0 and finite (a multiple of sigma; 1 = paper "
                                        f"002's kernel), got {a.cw_bandwidth}")
    for entry in chosen:
        check = entry.extra.get("check")
        message = check(cfg) if check is not None else None
        need(message is None, message or "")
    f = cfg.rft
    bad = [x for x in f.strategies if x not in ("noisy", "entropy", "branching")]
    need(not bad, f"rft.strategies: unknown {bad}; valid: noisy, entropy, branching")
    need(not ("entropy" in f.strategies and "branching" in f.strategies),
         "rft.strategies: entropy and branching both rank the same samples; choose one")
    need(f.iterations >= 1 and f.prompts >= 1 and f.samples_per_prompt >= 1 and f.epochs >= 1,
         "rft.iterations, rft.prompts, rft.samples_per_prompt and rft.epochs must be >= 1")
    need(0 < f.select_frac <= 1 and 0 <= f.noisy_frac <= 1, "rft.select_frac in (0, 1] and rft.noisy_frac in [0, 1]")
    need(f.select_count >= 0, f"rft.select_count: must be >= 0 (0 = no fixed count), got {f.select_count}")
    sf = cfg.sft
    need(sf.epochs >= 1, f"sft.epochs: must be >= 1, got {sf.epochs}")
    need(sf.batch_size >= 1, f"sft.batch_size: must be >= 1, got {sf.batch_size}")
    need(sf.micro_batch_size >= 0, f"sft.micro_batch_size: must be >= 0 (0 = the whole batch in one forward), got "
                                   f"{sf.micro_batch_size}")
    need(sf.max_length >= 0, f"sft.max_length: must be >= 0 (0 = no limit), got {sf.max_length}")
    need(0 < f.eval_top_p <= 1, f"rft.eval_top_p: must be in (0, 1] (1 = off; paper 004 uses 0.95), got "
                                f"{f.eval_top_p}")
    lo = cfg.model.lora
    if lo.enabled:
        need(lo.rank >= 1, "model.lora.rank: must be >= 1")
        need(len(lo.target_modules) > 0, "model.lora.target_modules: name at least one module")


def _validate_rewards(t: TaskConfig, need) -> None:
    """`task.reward` entries and `task.reward_weights` (see `validate`)."""
    from explorl.rewards import reward_entries, reward_metric_name

    entries = reward_entries(t.reward)
    need(len(entries) > 0, "task.reward: name at least one reward function (auto, math, exact or module:function)")
    for i, e in enumerate(entries):
        where = "task.reward" if len(entries) == 1 else f"task.reward[{i}]"
        need(e in ("auto", "math", "exact") or ":" in e,
             f"{where}: {e!r}; valid: auto, math, exact, or module:function")
    names = [reward_metric_name(e) for e in entries]
    twice = sorted({x for x in names if names.count(x) > 1})
    need(not twice, f"task.reward: {entries} names {', '.join(twice)} more than once; list each function once (its "
                    f"weight in task.reward_weights can be any number)")
    w = t.reward_weights
    if w is not None:
        need(len(w) == len(entries),
             f"task.reward_weights: {len(w)} weight(s) for {len(entries)} reward function(s) in task.reward "
             f"{entries}; give one weight per entry, in order, or null for all 1")
        need(all(math.isfinite(x) for x in w), f"task.reward_weights: every weight must be a finite number, got {w}")
        need(any(x != 0 for x in w), "task.reward_weights: all weights are 0, so every reward would be 0 and nothing "
                                     "would be learned; give at least one function a nonzero weight")


# ----------------------------------------------------------------------------------------------------------------
# field documentation (read from the source, so the docstring under each field is the one source)


def field_docs(cls: type) -> dict[str, str]:
    """Map each field of dataclass `cls` to the docstring written under it."""
    src = inspect.getsource(cls)
    tree = ast.parse(src)
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for prev, node in zip(body, body[1:]):
        if (isinstance(prev, ast.AnnAssign) and isinstance(prev.target, ast.Name) and isinstance(node, ast.Expr)
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
            docs[prev.target.id] = " ".join(node.value.value.split())
    return docs


def reference(cls: type = Config, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """Rows (dotted name, type, default, doc) for every leaf field, for `explorl config` and the README."""
    rows = []
    docs = field_docs(cls)
    hints = _hints(cls)
    default = cls()
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            rows.extend(reference(tp, f"{prefix}{f.name}."))
        else:
            rows.append((f"{prefix}{f.name}", _type_name(tp), repr(getattr(default, f.name)), docs.get(f.name, "")))
    return rows


def dump_yaml(cfg: Config) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False, default_flow_style=None, width=120)
