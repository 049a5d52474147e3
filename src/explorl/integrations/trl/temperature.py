"""Where the temperature schedule's temperatures act in TRL, set once per generation round by the trainer's
`_begin_round` from `explorl.rollout.schedule.ScheduleDriver`:
- the sampling temperature: TRL's generation config (transformers) or its vLLM generation's request temperature
  (`set_sampling_temperature`);
- the training temperature: TRL's fused log-prob head of the policy and the reference, which divides the logits by
  it (`set_train_temperature`: the optimised policy is softmax(logits / tau), E3's tau or the base temperature);
- a per-token temperature (EAD, RevEAD, a user's `per_token` schedule): in transformers' `generate` the logits
  processor `PerTokenTemperature` divides token t's scores by `table[t]`; in vLLM each request carries the
  schedule's annealing arguments (`send_anneal`) for `explorl.integrations.vllm.EADLogitsProcessor`, which the
  colocated engine loads (a vLLM server needs `--logits-processors explorl.integrations.vllm:EADLogitsProcessor`).
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from accelerate.utils import is_peft_model
from torch import Tensor
from transformers import LogitsProcessor, LogitsProcessorList

from explorl.integrations.vllm import EAD_ARG
from explorl.rollout.logprobs import LogprobOptions, response_logprobs

__all__ = ["PerTokenTemperature", "behavior_logprobs", "send_anneal", "set_sampling_temperature",
           "set_train_temperature", "with_logits_processor"]


def set_sampling_temperature(trainer, tau: float) -> None:
    """The temperature TRL's generation samples at (its transformers generation config, or its vLLM generation)."""
    trainer.temperature = tau
    if trainer.use_vllm:
        trainer.vllm_generation.temperature = tau
    else:
        trainer.generation_config.temperature = tau
        trainer.generation_kwargs["temperature"] = tau


def set_train_temperature(trainer, tau: float) -> None:
    """Re-patch TRL's fused log-prob head (policy and reference) to divide the logits by `tau`
    (`trainer._train_tau`: the temperature it divides by now)."""
    if tau == trainer._train_tau:
        return
    from trl.trainer.utils import add_fused_lm_head  # trl: optional (the trl extra)

    policy = trainer.accelerator.unwrap_model(trainer.model)
    if is_peft_model(policy):  # TRL patched the base model, under the adapters
        policy = policy.get_base_model()
    targets = [(policy, ("log_probs", "entropy"))]
    if trainer.ref_model is not None:
        targets.append((trainer.accelerator.unwrap_model(trainer.ref_model), ("log_probs",)))
    for module, outputs in targets:
        if "forward" in vars(module):
            del module.forward  # drop TRL's patch (an instance attribute) before patching again
        add_fused_lm_head(module, temperature=tau, cast_lm_head_to_fp32=trainer.args.cast_lm_head_to_fp32,
                          outputs=outputs)
    trainer._train_tau = tau


def send_anneal(vllm_generation, anneal: dict | None) -> None:
    """TRL's vLLM generation sends `anneal` (a `PromptTemperature.anneal`: the schedule's per-token arguments for
    the step) in every request's `SamplingParams.extra_args`, where `EADLogitsProcessor` reads it."""
    kwargs = vllm_generation.generation_kwargs
    if kwargs is None:
        kwargs = vllm_generation.generation_kwargs = {}
    kwargs["extra_args"] = {**kwargs.get("extra_args", {}), **({EAD_ARG: dict(anneal)} if anneal is not None else {})}


class PerTokenTemperature(LogitsProcessor):
    """Divides the scores of generated token t (0-based, counted from the prompt's end) by `table[t]`.

    EAD's behaviour temperature in transformers' `generate` (TRL pads prompts on the left, so every row's token t
    is produced at the same call). Positions past the table keep its last value. One instance per `generate` call.

    table: `[max_new_tokens]` float temperatures (the schedule times the base temperature).
    """

    def __init__(self, table: Tensor):
        self.table = table.to(torch.float32)
        self.start: int | None = None

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        if self.start is None:
            self.start = input_ids.shape[1]
        t = min(input_ids.shape[1] - self.start, self.table.numel() - 1)
        return scores / self.table[t].to(scores.device, scores.dtype)


@contextlib.contextmanager
def with_logits_processor(model, processor: LogitsProcessor):
    """`model.generate` passes `processor` (after any the caller gives) for the duration of the block."""
    original = model.generate

    def generate(*args, **kwargs):
        processors = LogitsProcessorList(kwargs.pop("logits_processor", None) or [])
        processors.append(processor)
        return original(*args, logits_processor=processors, **kwargs)

    model.generate = generate
    try:
        yield
    finally:
        del model.generate  # the instance attribute; the class's method shows again


def sum_pi_squared(model, out: dict, mask: Tensor, temperature: float) -> Tensor:
    """`sum_v pi_old(v)^2` `[n, T]` of each of TRL's completion tokens `out` at the training `temperature`, in
    explorl's float32 blocks (`response_logprobs`' `with_sum_pi_squared`: the optimal token baseline). One no-grad
    forward."""
    with torch.no_grad():
        return response_logprobs(model, out["prompt_ids"], out["prompt_mask"], out["completion_ids"], mask,
                                 temperature, options=LogprobOptions(with_entropy=False, with_sum_pi_squared=True))[2]


def behavior_logprobs(model, out: dict, mask: Tensor, table: Tensor) -> Tensor:
    """Log-probs `[n, T]` of TRL's completions `out` under the distribution transformers sampled them from: the
    policy `model` at the per-token temperatures `table` (`[T']`, its last value repeated past its end), as
    explorl's sampler reports behaviour log-probs (`algo.importance_weights`). One no-grad forward."""
    t = out["completion_ids"].size(1)
    table = F.pad(table, (0, max(t - table.numel(), 0)), value=float(table[-1]))[:t]
    with torch.no_grad():
        lp, _ = response_logprobs(model, out["prompt_ids"], out["prompt_mask"], out["completion_ids"], mask,
                                  table[None, :].expand(mask.shape[0], -1).to(mask.device),
                                  options=LogprobOptions(with_entropy=False))
    return lp
