"""An explorl config as a verl run: the same YAML and `key=value` overrides `explorl train` takes, mapped to verl's
Hydra overrides, the task's data converted to verl's parquet, explorl's rewards scored inside verl.

    python examples/verl/launch.py my_run.yaml algo.eps_high=0.28 [--print] [-- trainer.nnodes=4 ...]

`prepare` does the work and `main` is the command line (examples/verl/launch.py is a thin wrapper):
- the config is loaded and validated as `explorl train` loads it (`load_config`, with `run.plugins` and
  `run.python_path`);
- `verl_overrides` maps it to verl's keys. Every mapped value comes from the config (no recipe's settings are
  written here a second time): model, optimizer, batch and steps, sampling, the method (`explorl_<advantage>` with
  every other `algo` field under `+algorithm.explorl.<field>`, `explorl_<loss>` with its options where its registry
  entry says verl keeps them), the rollout controllers (`+algorithm.explorl.sampling|budget.*`), DAPO's dynamic
  sampling as verl's `algorithm.filter_groups`, and `trainer.v1.trainer_mode=explorl` when the method needs it
  (`trainer_needs`) or when the run directory is written. A setting with no verl counterpart is refused naming the
  field (`ConfigError`); a setting that only tunes explorl's own loop (speed, memory, logging) is listed as dropped
  in the printed comments;
- `convert_task` writes the task's train and held-out problems (`load_task`: the user's files and field names,
  chat template, system prompt) as verl's parquet to `RUN/verl/{train,val}.parquet`: `prompt` (chat messages),
  `data_source`, `reward_model: {ground_truth, style}`, `extra_info: {index, split, meta}` (`index`: the row,
  which E3's budgets and per-prompt temperatures key on; `meta`: the problem's meta as JSON, the reward functions'
  keyword arguments). With the chat template off, prompts are one user message rendered by a pass-through template
  (`actor_rollout_ref.model.custom_chat_template`), so verl's prompt tokens equal explorl's; `prepare` checks that
  verl's tokenizer (AutoTokenizer) tokenizes the first prompts as explorl does and refuses the model otherwise;
- `RUN/verl/explorl.yaml` is the resolved config, read by the reward bridge (`explorl.integrations.verl.reward`)
  and by explorl's trainer mode, which writes explorl's run directory at `run.out_dir` (`+explorl.config`);
- after a successful run `finish` evaluates verl's exported Hugging Face weights of the last step with explorl's
  held-out evaluation and writes `final/` and `eval.json` (`--finish` does only that, e.g. after a cluster job).

`--print` prints the comments and the command and writes nothing: it reads the task's data (to size
`data.max_prompt_length` and check the tokenizer) but converts nothing; the printed paths are where a launch
writes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from explorl.config import Config, ConfigError, dump_yaml, load_config, to_dict
from explorl.integrations.vllm import PROCESSOR_NAME

VERL_DIR = "verl"
"""Subdirectory of `run.out_dir` holding the converted data, explorl.yaml and verl's checkpoints."""
REWARD_PATH = "pkg://explorl.integrations.verl.reward"
CHAT_PASS_THROUGH = "{% for m in messages %}{{ m.content }}{% endfor %}"
"""verl renders every prompt through a chat template; with `task.chat_template` off, this one passes the text."""
NEVER = 1e9
"""A verl field that cannot be turned off (the dual clip `clip_ratio_c`, the gradient clip) set so it never acts."""
VERL_OFF = {"clip_ratio_c": NEVER}
PLUGINS_ENV, PYTHON_PATH_ENV = "EXPLORL_PLUGINS", "EXPLORL_PYTHON_PATH"
"""Environment of verl's processes: modules `explorl.integrations.verl` imports before it registers the methods
(`run.plugins`, so a plugin's estimator or loss is registered in every worker), and where they are found."""
A, R, M = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.model"
CHECK_PROMPTS = 8
"""Prompts on which verl's tokenizer must give explorl's token ids."""


# ----------------------------------------------------------------------------------------------------------------
# Hydra overrides


def hydra_value(value: Any) -> str:
    """A value as Hydra's override grammar reads it back (strings quoted when they hold anything but a plain
    name or path)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(float(f"{value:.12g}"))
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    text = str(value)
    if re.fullmatch(r"[A-Za-z0-9_./:@-]+", text) and isinstance(yaml.safe_load(text), str):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _flat(prefix: str, value: Any) -> list[tuple[str, Any]]:
    """A nested mapping as dotted keys (non-empty mappings are descended; lists and empty mappings are values)."""
    if isinstance(value, dict) and value:
        return [kv for k, v in value.items() for kv in _flat(f"{prefix}.{k}", v)]
    return [(prefix, value)]


@dataclass
class Overrides:
    """verl overrides in order, each with the explorl field it comes from ("" for a default of the launcher's
    that a verl override after `--` may replace), and comments for the printed command."""

    items: dict[str, Any] = field(default_factory=dict)
    owner: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def set(self, key: str, value: Any, source: str = "") -> None:
        self.items[key] = value
        self.owner[key.lstrip("+~")] = source

    def args(self) -> list[str]:
        return [f"{k}={hydra_value(v)}" for k, v in self.items.items()]

    def get(self, key: str, default: Any = None) -> Any:
        for k, v in self.items.items():
            if k.lstrip("+~") == key:
                return v
        return default

    def merge(self, extra: Sequence[str]) -> list[str]:
        """The overrides followed by the user's verl overrides `extra`: a key the explorl config decides is
        refused (set the explorl field instead); a launcher default is replaced."""
        keys = {}
        for item in extra:
            if "=" not in item:
                raise ConfigError(f"verl override {item!r} must look like key=value (after `--`)")
            keys[item.split("=", 1)[0].lstrip("+~")] = item
        for key in keys:
            source = self.owner.get(key)
            if source:
                raise ConfigError(f"verl override {key}: the launcher derives it from the explorl config ({source}); "
                                  f"set that instead (before `--`)")
        kept = [f"{k}={hydra_value(v)}" for k, v in self.items.items() if k.lstrip("+~") not in keys]
        return kept + list(extra)


# ----------------------------------------------------------------------------------------------------------------
# the task's data as verl's parquet


@dataclass
class DataFiles:
    """The converted task: where it is (or would be) written and what verl needs to know of it."""

    dir: Path
    train: Path
    val: Path
    config: Path
    """explorl.yaml: the resolved explorl config (reward bridge, run directory)."""
    train_rows: int
    val_rows: int
    max_prompt_tokens: int
    chat: bool
    """Whether prompts go through the model's chat template (`task.chat_template` resolved)."""
    batched_rewards: list[str] = field(default_factory=list)


def data_dir(cfg: Config) -> Path:
    return Path(cfg.run.out_dir).expanduser().resolve() / VERL_DIR


def _token_ids(encoded: Any) -> list[int]:
    """`apply_chat_template(..., tokenize=True)`'s result as a flat list of ids (transformers 4 or 5)."""
    if hasattr(encoded, "keys") and "input_ids" in encoded:
        encoded = encoded["input_ids"]
    encoded = list(encoded)
    return list(encoded[0]) if encoded and isinstance(encoded[0], (list, tuple)) else [int(i) for i in encoded]


def verl_tokenizer(path: str | Path, chat_template: str | None = None, trust_remote_code: bool = False):
    """The tokenizer verl loads for `actor_rollout_ref.model.path` (`AutoTokenizer`, as verl's `hf_tokenizer`),
    with `custom_chat_template` applied as verl applies it; the model directory's code runs only with
    `trust_remote_code` (`model.trust_remote_code`)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    if chat_template is not None:
        tok.chat_template = chat_template
    return tok


def task_rows(cfg: Config, tok, task=None) -> tuple[list[dict], list[dict], list[int], bool]:
    """(train rows, val rows, each prompt's explorl token count, chat) of the task in verl's row format."""
    from explorl.tasks import load_task
    from explorl.tasks.chat import messages_of, prompt_encoder, prompt_text

    task = task if task is not None else load_task(cfg.task)
    encode = prompt_encoder(tok, cfg.task)
    chat = bool(encode.chat)
    source = f"explorl/{cfg.task.name}"

    def row(p, index: int, split: str) -> dict:
        if chat:
            messages = messages_of(p, cfg.task.system_prompt)
        else:
            messages = [{"role": "user", "content": prompt_text(p, tok, chat=False,
                                                                system_prompt=cfg.task.system_prompt)}]
        return {"data_source": source, "prompt": messages, "ability": "explorl",
                "reward_model": {"ground_truth": str(p.answer), "style": "rule"},
                "extra_info": {"index": index, "split": split, "meta": json.dumps(p.meta, default=str)}}

    train = [row(p, i, "train") for i, p in enumerate(task.train)]
    val = [row(p, i, "val") for i, p in enumerate(task.eval)]
    lengths = [len(encode(p)) for p in [*task.train, *task.eval]]
    return train, val, lengths, chat


def convert_task(cfg: Config, tok, verl_tok, *, write: bool = True) -> DataFiles:
    """The task (`load_task(cfg.task)`) as verl's parquet under `RUN/verl/` (written when `write`), after checking
    that verl's tokenizer `verl_tok` gives the first prompts explorl's token ids (`tok`, `prompt_encoder`)."""
    from explorl.rewards import is_batched, resolve_reward, reward_entries
    from explorl.tasks import load_task

    task = load_task(cfg.task)
    train, val, lengths, chat = task_rows(cfg, tok, task)
    if len(train) < cfg.run.batch_size:
        raise ConfigError(f"run.batch_size: {cfg.run.batch_size} prompts per step, but the task has only "
                          f"{len(train)} training problems; verl needs a full batch per step")
    from explorl.tasks.chat import prompt_encoder

    encode = prompt_encoder(tok, cfg.task)
    if not chat:
        verl_tok.chat_template = CHAT_PASS_THROUGH
    for p, r in list(zip(task.train, train))[:CHECK_PROMPTS]:
        ours = list(encode(p))
        theirs = _token_ids(verl_tok.apply_chat_template(r["prompt"], tokenize=True, add_generation_prompt=True))
        if ours != theirs:
            raise ConfigError(
                f"model.path: verl loads the tokenizer of {cfg.model.path} with AutoTokenizer, which tokenizes the "
                f"prompts differently from explorl (problem {p.meta.get('id', '?')}: {len(theirs)} tokens vs "
                f"explorl's {len(ours)}; e.g. transformers 5 loads the embedded character tokenizer as Qwen2's and "
                f"drops characters). Give a model directory whose tokenizer AutoTokenizer loads as it is")
    batched = []
    for entry in reward_entries(cfg.task.reward):
        if entry != "auto" and is_batched(resolve_reward(entry, (None, False))[0]):
            batched.append(entry)
    out = data_dir(cfg)
    files = DataFiles(dir=out, train=out / "train.parquet", val=out / "val.parquet", config=out / "explorl.yaml",
                      train_rows=len(train), val_rows=len(val), max_prompt_tokens=max(lengths), chat=chat,
                      batched_rewards=batched)
    if write:
        import pyarrow as pa
        import pyarrow.parquet as pq

        out.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(train), files.train)
        pq.write_table(pa.Table.from_pylist(val), files.val)
        files.config.write_text(dump_yaml(run_config(cfg, chat)))
    return files


def run_config(cfg: Config, chat: bool) -> Config:
    """The config verl's processes read: `task.chat_template` as it resolved, `run.out_dir` absolute, `model.device`
    auto (verl's trainer process has no GPU; the final evaluation takes one where it runs)."""
    out_dir = str(Path(cfg.run.out_dir).expanduser().resolve())
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, device="auto"),
                               task=dataclasses.replace(cfg.task, chat_template="on" if chat else "off"),
                               run=dataclasses.replace(cfg.run, out_dir=out_dir))


# ----------------------------------------------------------------------------------------------------------------
# what the method needs from verl


def trainer_needs(cfg: Config) -> list[str]:
    """Why the method needs explorl's verl trainer (`trainer.v1.trainer_mode=explorl`), from the registry: what
    explorl's advantage step reads beyond verl's plain estimator call (rewards, mask, groups: entropies, pi_old's,
    reference or rollout log-probs), a step window, overlong shaping (the length limit), per-token loss weights,
    and sampling steered by explorl's controllers. Empty: verl's own trainer runs the method."""
    import torch

    from explorl.algos import RolloutBatch, compute_advantages, requirements
    from explorl.algos.batch import MissingInputError
    from explorl.algos.registry import lookup
    from explorl.integrations.verl.rollout import needs_control

    algo, reasons = cfg.algo, []
    # what verl's plain estimator call carries: rewards, the response mask, the groups
    probe = RolloutBatch(mask=torch.ones(4, 3), rewards=torch.tensor([1.0, 0.0, 1.0, 0.0]),
                         group=torch.tensor([0, 0, 1, 1]), max_response_len=3, lengths=torch.full((4,), 3),
                         truncated=torch.zeros(4, dtype=torch.bool))
    try:
        prepared = compute_advantages(probe, algo, step=1)
        if prepared.token_weights is not None or prepared.is_weights is not None:
            reasons.append("the method weights tokens in the loss (rollout_is_weights)")
    except MissingInputError as e:
        reasons.append(f"verl's estimator call lacks what the advantage step reads: {e}")
    needs = requirements(algo)
    if not reasons:  # the registry's own account, should an entry read an input only on some batches
        for flag, what in ((needs.ref, "reference log-probs"), (needs.old_logprobs, "pi_old's log-probs"),
                           (needs.behavior, "the rollout's log-probs")):
            if flag:
                reasons.append(f"the method reads {what}")
    for name in algo.shapers:
        entry = lookup("shaper", name)
        if entry.extra.get("needs_step", lambda o: False)(entry.options_in(algo)):
            reasons.append(f"shaper {name!r} has a step window")
    for name in algo.reward_shapers:  # DAPO's overlong shaping reads the length limit and the truncation flags
        if lookup("reward_shaper", name).extra.get("needs_length_limit"):
            reasons.append(f"reward shaper {name!r} needs the response-length limit")
    if needs_control(controller_settings(cfg)):
        reasons.append(f"explorl's controllers steer sampling (sampling.schedule={cfg.sampling.schedule}, "
                       f"budget.policy={cfg.budget.policy})")
    return list(dict.fromkeys(reasons))


VERL_SAMPLING = ("group_size", "temperature", "top_p", "max_new_tokens", "fast_path", "compile", "engine",
                 "vllm_memory")
"""`sampling` fields verl's own keys carry (or that only tune explorl's sampler)."""


def controller_settings(cfg: Config) -> dict:
    """`algorithm.explorl.sampling|budget` for the rollout controllers: the schedule and budget policy with their
    options when they are not static (a fixed temperature and `n` need no control; DAPO is verl's own filter)."""
    from explorl.algos.registry import lookup

    out: dict = {}
    if not lookup("temperature_schedule", cfg.sampling.schedule).can("static"):
        out["sampling"] = {k: v for k, v in to_dict(cfg.sampling).items() if k not in VERL_SAMPLING}
    policy = lookup("budget_policy", cfg.budget.policy)
    if not policy.can("static") and not policy.can("resamples"):
        out["budget"] = to_dict(cfg.budget)
    return out


# ----------------------------------------------------------------------------------------------------------------
# the config as verl's overrides


ALGO_OWNED = ("advantage", "loss", "eps_low", "eps_high", "loss_agg", "kl_coef", "entropy_coef", "epochs",
              "mini_batches", "micro_batch_size", "length_buckets")
"""`algo` fields verl's own keys carry; every other one goes to `+algorithm.explorl.<field>`."""
DROPPED = {
    "model.attn_implementation": "verl picks the attention kernel (flash_attention_2)",
    "model.gradient_checkpointing": "verl's actor_rollout_ref.model.enable_gradient_checkpointing decides",
    "model.compile": "verl runs its own training forward",
    "sampling.fast_path, sampling.compile, sampling.engine": "explorl's own sampler (verl samples with its rollout "
                                                             "engine, actor_rollout_ref.rollout.name)",
    "algo.micro_batch_size, algo.length_buckets": "verl splits micro-batches by tokens (use_dynamic_bsz), the same "
                                                  "gradient",
    "run.threads, run.log_samples, run.max_nonfinite_steps": "explorl's own loop only (verl skips non-finite "
                                                             "updates itself)",
    "run.eval_k, run.eval_sets": "evaluated by the finishing step (explorl's held-out evaluation of the exported "
                                 "weights), not by verl's validation",
}


def verl_overrides(cfg: Config, data: DataFiles, *, run_dir: bool = True) -> Overrides:
    """verl's Hydra overrides for the validated explorl config `cfg` and its converted task `data`; ConfigError
    names an explorl field verl has no counterpart for. `run_dir`: write explorl's run directory (explorl's
    trainer mode then runs even where the method does not need it)."""
    from explorl.algos import requirements
    from explorl.algos.registry import lookup
    from explorl.models import resolve_model_path

    o = Overrides()
    m, s, a, r, opt = cfg.model, cfg.sampling, cfg.algo, cfg.run, cfg.optim

    # model
    if m.device != "auto" and m.device != "cuda":
        raise ConfigError(f"model.device={m.device}: verl places its workers on GPUs through Ray; use auto or cuda "
                          f"(and CUDA_VISIBLE_DEVICES / trainer.n_gpus_per_node to choose GPUs)")
    o.set(f"{M}.path", str(resolve_model_path(m.path)), "model.path")
    if m.trust_remote_code:  # verl's default is off, as explorl's
        o.set(f"{M}.trust_remote_code", True, "model.trust_remote_code")
    if m.dtype == "float16":
        raise ConfigError("model.dtype=float16: explorl refuses to train in float16 (AdamW's moments underflow); "
                          "use auto or bfloat16 (verl: float32 master weights, bfloat16 compute) or float32")
    if m.dtype == "float32":
        for role in ("actor", "ref"):
            o.set(f"+actor_rollout_ref.{role}.fsdp_config.mixed_precision.param_dtype", "fp32", "model.dtype")
        o.set(f"{R}.dtype", "float32", "model.dtype")
    else:
        o.notes.append(f"model.dtype={m.dtype}: verl keeps float32 master weights and computes in bfloat16")
    if m.lora.enabled:
        if m.lora.dropout:
            raise ConfigError(f"model.lora.dropout={m.lora.dropout}: verl's FSDP LoRA has no dropout; set 0")
        o.set(f"{M}.lora_rank", m.lora.rank, "model.lora.rank")
        o.set(f"{M}.lora_alpha", m.lora.alpha, "model.lora.alpha")
        o.set(f"{M}.target_modules", list(m.lora.target_modules), "model.lora.target_modules")
    if not data.chat:
        o.set(f"{M}.custom_chat_template", CHAT_PASS_THROUGH, "task.chat_template")

    # data and reward
    o.set("data.train_files", str(data.train), "task")
    o.set("data.val_files", str(data.val), "task")
    o.set("data.max_prompt_length", data.max_prompt_tokens, "task (its longest prompt)")
    o.set("data.max_response_length", s.max_new_tokens, "sampling.max_new_tokens")
    o.set("data.train_batch_size", r.batch_size, "run.batch_size")
    o.set("data.seed", r.seed, "run.seed")
    o.set("reward.custom_reward_function.path", REWARD_PATH, "task.reward")
    o.set("reward.custom_reward_function.name", "compute_score", "task.reward")
    o.set("+reward.custom_reward_function.reward_kwargs.explorl_config", str(data.config), "task.reward")
    if data.batched_rewards:
        o.notes.append(f"task.reward {', '.join(data.batched_rewards)}: verl's v1 reward loop scores each response "
                       f"alone, so a batched function is called on batches of one")

    # sampling
    o.set(f"{R}.n", s.group_size, "sampling.group_size")
    o.set(f"{R}.temperature", s.temperature, "sampling.temperature")
    o.set(f"{R}.top_p", s.top_p, "sampling.top_p")
    o.set(f"{R}.seed", r.seed, "run.seed")
    o.set(f"{R}.name", "vllm")

    # optimizer (verl steps its LR schedule once per training step, explorl once per optimizer step)
    updates = a.epochs * a.mini_batches
    o.set(f"{A}.optim.lr", opt.lr, "optim.lr")
    o.set(f"{A}.optim.weight_decay", opt.weight_decay, "optim.weight_decay")
    o.set(f"{A}.optim.betas", [opt.beta1, opt.beta2], "optim.beta1, optim.beta2")
    o.set(f"{A}.optim.lr_warmup_steps", math.ceil(opt.warmup_steps / updates), "optim.warmup_steps")
    o.set(f"{A}.optim.lr_scheduler_type", "cosine", "optim")
    o.set(f"{A}.optim.min_lr_ratio", opt.min_lr_ratio, "optim.min_lr_ratio")
    o.set(f"{A}.optim.clip_grad", opt.grad_clip if opt.grad_clip > 0 else NEVER, "optim.grad_clip")
    if updates > 1 and opt.warmup_steps:
        o.notes.append(f"optim.warmup_steps={opt.warmup_steps} optimizer steps = "
                       f"{math.ceil(opt.warmup_steps / updates)} training steps of {updates} updates (verl steps "
                       f"its schedule once per training step)")
    if opt.grad_clip <= 0:
        o.notes.append(f"optim.grad_clip=0 (off): verl always clips, so {A}.optim.clip_grad={NEVER:g}")

    # the method: estimator, loss, objective
    o.set("algorithm.adv_estimator", f"explorl_{a.advantage}", "algo.advantage")
    o.set(f"{A}.policy_loss.loss_mode", f"explorl_{a.loss}", "algo.loss")
    loss = lookup("policy_loss", a.loss)
    _loss_options(o, cfg, loss)
    o.set(f"{A}.clip_ratio_low", a.eps_low, "algo.eps_low")
    o.set(f"{A}.clip_ratio_high", a.eps_high, "algo.eps_high")
    if a.loss_agg == "seq-mean-token-mean-per-question":
        raise ConfigError("algo.loss_agg=seq-mean-token-mean-per-question: verl aggregates over the tokens or the "
                          "responses of a mini-batch, not per question; set algo.loss_agg=seq-mean-token-mean (each "
                          "response weighs the same instead of each question) to run in verl")
    o.set(f"{A}.loss_agg_mode", a.loss_agg, "algo.loss_agg")
    if a.loss_agg == "seq-mean-token-sum-norm":  # explorl divides by the length limit, verl by default by the padding
        o.set(f"{A}.loss_scale_factor", s.max_new_tokens, "algo.loss_agg, sampling.max_new_tokens")
    if r.batch_size % a.mini_batches:
        raise ConfigError(f"algo.mini_batches={a.mini_batches}: verl splits the batch into mini-batches of whole "
                          f"prompts, and run.batch_size={r.batch_size} is not a multiple of it")
    o.set(f"{A}.ppo_mini_batch_size", r.batch_size // a.mini_batches, "run.batch_size / algo.mini_batches")
    o.set(f"{A}.ppo_epochs", a.epochs, "algo.epochs")
    o.set(f"{A}.data_loader_seed", r.seed, "run.seed")
    o.set(f"{A}.entropy_coeff", a.entropy_coef, "algo.entropy_coef")
    _kl(o, cfg)
    o.set(f"{A}.use_dynamic_bsz", True)
    o.set(f"{A}.ppo_max_token_len_per_gpu", max(16384, data.max_prompt_tokens + s.max_new_tokens))
    settings = {k: v for k, v in to_dict(a).items() if k not in (*ALGO_OWNED, loss.options_owner)}
    for key, value in _flat("+algorithm.explorl", settings):
        o.set(key, value, f"algo.{key.split('.', 2)[2]}")
    if requirements(a).behavior:  # the rollout's own log-probs (EAD's truncated importance weights)
        o.set(f"{R}.calculate_log_probs", True, "algo.importance_weights")

    # rollout controllers and DAPO's dynamic sampling
    control = controller_settings(cfg)
    for section, values in control.items():
        for key, value in _flat(f"+algorithm.explorl.{section}", values):
            o.set(key, value, f"{section}.{key.split('.', 3)[3]}")
    if control:
        from explorl.integrations.verl.rollout import rollout_config

        rollout_config(control, temperature=s.temperature, group_size=s.group_size, max_new_tokens=s.max_new_tokens,
                       top_p=s.top_p, total_steps=r.steps)  # verl's own refusals, before a cluster is started
    from explorl.config import selected_entries

    if any(e.can("per_token") for e in selected_entries(cfg)["sampling"]):
        o.set(f"+{R}.engine_kwargs.vllm.logits_processors", [PROCESSOR_NAME], "sampling.schedule")
    policy = lookup("budget_policy", cfg.budget.policy)
    if policy.can("resamples"):
        if not policy.can("drops_uniform_groups"):
            raise ConfigError(f"budget.policy={cfg.budget.policy}: it re-samples prompts, and verl's only re-sampling "
                              f"is DAPO's filter of groups whose rewards all agree; use explorl's own loop "
                              f"(`explorl train`)")
        o.set("algorithm.filter_groups.enable", True, "budget.policy")
        o.set("algorithm.filter_groups.metric", "reward", "budget.policy")
        rounds = getattr(policy.options_in(cfg.budget), "max_rounds", None)
        o.notes.append(f"budget.{cfg.budget.policy}.max_rounds={rounds} dropped: verl's sampler refills dropped "
                       f"groups until the batch is full, without a round limit")

    # trainer
    reasons = trainer_needs(cfg)
    if reasons or run_dir:
        o.set("trainer.v1.trainer_mode", "explorl", "algo (the method's needs)" if reasons else "")
        why = "; ".join(reasons) if reasons else "only for the run directory (the method runs in verl's own trainer)"
        o.notes.append(f"trainer.v1.trainer_mode=explorl: {why}")
    if run_dir:
        o.set("+explorl.config", str(data.config), "run.out_dir")
    o.set("trainer.total_training_steps", r.steps, "run.steps")
    per_epoch = data.train_rows // r.batch_size
    o.set("trainer.total_epochs", math.ceil(r.steps / per_epoch), "run.steps")
    o.set("trainer.default_local_dir", str(data.dir / "checkpoints"), "run.out_dir")
    o.set("trainer.save_freq", r.save_every if r.save_every > 0 else r.steps, "run.save_every")
    o.set("trainer.max_actor_ckpt_to_keep", r.keep_checkpoints, "run.keep_checkpoints")
    o.set(f"{A}.checkpoint.save_contents", ["model", "optimizer", "extra", "hf_model"])
    o.set("trainer.test_freq", r.eval_every if r.eval_every > 0 else -1, "run.eval_every")
    o.set("trainer.val_before_train", False, "run.eval_every")
    o.set(f"{R}.val_kwargs.n", r.eval_n, "run.eval_n")
    o.set(f"{R}.val_kwargs.temperature", r.eval_temperature, "run.eval_temperature")
    o.set(f"{R}.val_kwargs.do_sample", r.eval_temperature > 0, "run.eval_temperature")
    loggers = ["console"] + [x for x in r.report_to if x in ("tensorboard", "wandb")]
    o.set("trainer.logger", loggers, "run.report_to")
    o.set("trainer.project_name", r.wandb_project, "run.wandb_project")
    o.set("trainer.experiment_name", Path(r.out_dir).name, "run.out_dir")
    if r.plugins:
        o.set(f"+ray_kwargs.ray_init.runtime_env.env_vars.{PLUGINS_ENV}", ",".join(r.plugins), "run.plugins")
        o.set(f"+ray_kwargs.ray_init.runtime_env.env_vars.{PYTHON_PATH_ENV}", os.pathsep.join(r.python_path),
              "run.python_path")
    o.notes.append("dropped (they tune explorl's own loop): " + "; ".join(f"{k} ({v})" for k, v in DROPPED.items()))
    return o


def _loss_options(o: Overrides, cfg: Config, loss) -> None:
    """The loss's options as verl's actor fields (its registry entry's `verl_fields`: option -> (key, factor,
    verl's default)); an option verl has no field for must keep its default."""
    options = loss.options_in(cfg.algo)
    if options is None:
        return
    fields = loss.extra.get("verl_fields") or {}
    defaults = type(options)()
    for f in dataclasses.fields(options):
        value, name = getattr(options, f.name), f"algo.{loss.options_owner}.{f.name}"
        if f.name in fields:
            key, factor, _ = fields[f.name]
            if value is None:
                if key not in VERL_OFF:
                    raise ConfigError(f"{name}=null: verl's {A}.{key} cannot be turned off")
                o.set(f"{A}.{key}", VERL_OFF[key], name)
                o.notes.append(f"{name}=null (off): verl always applies {A}.{key}, so it is {VERL_OFF[key]:g} "
                               f"(never active)")
            else:
                o.set(f"{A}.{key}", value / factor, name)
        elif value != getattr(defaults, f.name):
            raise ConfigError(f"{name}={value!r}: verl's policy loss has no field for it (loss {loss.name!r}); keep "
                              f"the default {getattr(defaults, f.name)!r} or use explorl's own loop")


def _kl(o: Overrides, cfg: Config) -> None:
    """The k3 KL term: verl's `low_var_kl` (its estimate clamped to [-10, 10]); a reference model also when the
    method reads reference log-probs without a KL term (verl computes them only with its KL loss on)."""
    from explorl.algos import requirements

    a = cfg.algo
    o.set("algorithm.use_kl_in_reward", False, "algo.kl_coef")
    needs_ref = requirements(a).ref
    if a.kl_coef > 0 or needs_ref:
        if a.kl_clamp is not None and a.kl_clamp != 10:
            raise ConfigError(f"algo.kl_clamp={a.kl_clamp}: verl's k3 KL (low_var_kl) clamps at 10; set "
                              f"algo.kl_clamp=10 or null")
        o.set(f"{A}.use_kl_loss", True, "algo.kl_coef")
        o.set(f"{A}.kl_loss_coef", a.kl_coef, "algo.kl_coef")
        o.set(f"{A}.kl_loss_type", "low_var_kl", "algo.kl_coef")
        if a.kl_coef == 0:
            o.notes.append(f"algo.kl_coef=0 with algo.advantage={a.advantage}: verl computes reference log-probs "
                           f"only with its KL loss on, so use_kl_loss=true with kl_loss_coef=0")
        if a.kl_clamp is None and a.kl_coef > 0:
            o.notes.append("algo.kl_clamp=null: verl's k3 KL clamps the log-ratio to [-20, 20] and the estimate to "
                           "[-10, 10] (algo.kl_clamp=10 in explorl's terms)")
    else:
        o.set(f"{A}.use_kl_loss", False, "algo.kl_coef")


# ----------------------------------------------------------------------------------------------------------------
# the launch


@dataclass
class Launch:
    cfg: Config
    data: DataFiles
    overrides: Overrides
    command: list[str]
    env: dict[str, str]

    def text(self) -> str:
        """The printed form: comments, then the command (shlex-joined)."""
        return "\n".join([*(f"# {n}" for n in self.overrides.notes), shlex.join(self.command)])


def prepare(config: str | Path | None, overrides: Sequence[str] = (), extra: Sequence[str] = (), *,
            write: bool = True, run_dir: bool = True) -> Launch:
    """Load and validate the explorl config (`config` with `key=value` `overrides`), convert its task (written
    when `write`), map it to verl's overrides and append the user's verl overrides `extra`."""
    from explorl.models import load_tokenizer, resolve_model_path

    cfg = load_config(config, list(overrides))
    path = resolve_model_path(cfg.model.path)
    data = convert_task(cfg, load_tokenizer(path, cfg.model.trust_remote_code),
                        verl_tokenizer(path, trust_remote_code=cfg.model.trust_remote_code), write=write)
    ov = verl_overrides(cfg, data, run_dir=run_dir)
    command = [sys.executable, "-m", "verl.trainer.main_ppo", *ov.merge(extra)]
    env = {}
    if cfg.run.plugins:
        env = {PLUGINS_ENV: ",".join(cfg.run.plugins), PYTHON_PATH_ENV: os.pathsep.join(cfg.run.python_path)}
    launch = Launch(cfg, data, ov, command, env)
    if write:
        (data.dir / "command.json").write_text(json.dumps({"command": command, "env": env}, indent=1))
    return launch


def hf_export(out_dir: str | Path, step: int) -> Path:
    """verl's Hugging Face export of step `step` (`actor.checkpoint.save_contents` with `hf_model`)."""
    return Path(out_dir) / VERL_DIR / "checkpoints" / f"global_step_{step}" / "actor" / "huggingface"


def finish(out_dir: str | Path, step: int | None = None) -> dict:
    """After verl's last step: explorl's held-out evaluation of the exported weights, `final/` and `eval.json` in
    the run directory `out_dir` (its config.yaml, written by explorl's trainer mode, says what to evaluate)."""
    from explorl.runs.engine import finish_engine_run
    from explorl.models import WEIGHT_SUFFIXES, load_policy
    from explorl.runs.lock import RunLock
    from explorl.runs.log import RunLog

    run = Path(out_dir)
    if not (run / "config.yaml").is_file():
        raise FileNotFoundError(f"{run}: no config.yaml; explorl's verl trainer writes it (trainer.v1.trainer_mode="
                                f"explorl with +explorl.config, as examples/verl/launch.py launches)")
    log = RunLog(run)
    log.lock = RunLock.acquire(run)  # one writer: refused, naming the holder, while verl's trainer still writes it
    cfg = load_config(run / "config.yaml")
    step = int(step if step is not None else cfg.run.steps)
    hf = hf_export(run, step)
    if not hf.is_dir() or not any(f.name.endswith(WEIGHT_SUFFIXES) for f in hf.iterdir()):
        raise FileNotFoundError(
            f"{hf}: no Hugging Face weights of step {step}. verl writes them with {A}.checkpoint.save_contents "
            f"including hf_model (the launcher sets it); or merge the sharded checkpoint: python -m "
            f"verl.model_merger merge --backend fsdp --local_dir {hf.parent} --target_dir {hf}")
    model, tok, _ = load_policy(dataclasses.replace(cfg.model, path=str(hf), fingerprint="",
                                                    lora=dataclasses.replace(cfg.model.lora, enabled=False)))
    try:
        return finish_engine_run(log, cfg, model, tok, step)
    finally:
        log.close()


USAGE = """usage: python examples/verl/launch.py CONFIG [key=value ...] [--print] [--no-run-dir] [--no-finish]
                                    [--finish] [-- verl_key=value ...]"""


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    ours = argv[:argv.index("--")] if "--" in argv else argv
    flags = {a for a in ours if a.startswith("--")}
    unknown = flags - {"--print", "--no-run-dir", "--no-finish", "--finish"}
    positional = [a for a in ours if not a.startswith("--")]
    if unknown or not positional or "=" in positional[0]:
        print(__doc__ if not unknown else f"unknown option {sorted(unknown)[0]}\n{USAGE}", file=sys.stderr)
        return 2
    config, overrides = positional[0], positional[1:]
    try:
        if "--finish" in flags:
            cfg = load_config(config, overrides)
            print(json.dumps(finish(Path(cfg.run.out_dir).expanduser().resolve()), indent=1))
            return 0
        launch = prepare(config, overrides, extra, write="--print" not in flags, run_dir="--no-run-dir" not in flags)
    except (ConfigError, ValueError, FileNotFoundError, FileExistsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(launch.text(), flush=True)
    if "--print" in flags:
        return 0
    rc = subprocess.call(launch.command, env={**os.environ, **launch.env})
    if rc == 0 and "--no-run-dir" not in flags and "--no-finish" not in flags:
        try:
            print(json.dumps(finish(data_root(launch)), indent=1))
        except FileNotFoundError as e:
            print(f"not evaluated: {e}", file=sys.stderr)
    return rc


def data_root(launch: Launch) -> Path:
    """The run directory of a launch (`run.out_dir`, absolute)."""
    return launch.data.dir.parent
