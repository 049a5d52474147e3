"""EAD's per-token temperature inside vLLM: a logits processor for vLLM's V1 model runner.

EAD (docs/methods.md §6a) samples token t of a response at `T * tau(t)`, where `T` is the request's
temperature and `tau` the annealed schedule of the training step. vLLM takes one temperature per request, so the
per-token factor is a logits processor: a request that carries `SamplingParams(extra_args={"explorl_ead": args})`
(`args`: `"schedule"`, the name of a registered temperature schedule that declares a per-token temperature
(`per_token`: EAD, RevEAD, or a user's own), `"step"`, and the fields of that schedule's options: exactly what the
schedule gives as `PromptTemperature.anneal`) has its logits divided by `tau(t)` at output position t; other
requests are untouched. The processor asks the registry for the function, so a per-token schedule registered
in a user's module (imported in the engine's process, e.g. through `run.plugins`' modules on its PYTHONPATH)
works here without a change to this file.

Load it with `--logits-processors explorl.integrations.vllm:EADLogitsProcessor` (in verl:
`+actor_rollout_ref.rollout.engine_kwargs.vllm.logits_processors='["explorl.integrations.vllm:EADLogitsProcessor"]'`).

Supported interface: vLLM's V1 model runner (`vllm.v1.sample.logits_processor.LogitsProcessor`, vLLM >= 0.10.2;
with vLLM's Model Runner V2 set `VLLM_USE_V2_MODEL_RUNNER=0`). Model Runner V2's processor interface is not
supported. The processor declares itself argmax-invariant (dividing logits by a positive number keeps the
argmax), so vLLM applies it after the request temperature, and the log-probs vLLM returns in its
`processed_logprobs` mode (verl's default `rollout.logprobs_mode`) are those of the distribution sampled: EAD's
behaviour policy, which truncated importance sampling needs (docs/methods.md §6c). Check that order on the vLLM
version you install.

The bookkeeping (`AnnealedRows`) and the arithmetic (`token_factors`) do not import vLLM and are tested on the
CPU; `EADLogitsProcessor` is a thin class built on first access, where vLLM imports.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from explorl.algos.registry import entries
from explorl.rollout.temperature_schedules import anneal_fields, anneal_options

EAD_ARG = "explorl_ead"
"""The `SamplingParams.extra_args` key holding a request's annealing arguments."""
PROCESSOR_NAME = "explorl.integrations.vllm:EADLogitsProcessor"
"""How an engine is told to load the processor (`LLM(logits_processors=[...])`, verl's engine kwargs)."""


def per_token_schedules() -> dict[str, Callable]:
    """Registered temperature schedules with a per-token temperature: name -> `fn(t, step, options) -> factor`."""
    import explorl.rollout.controllers  # noqa: F401  (registers explorl's schedules)

    return {name: e.per_token for name, e in entries("temperature_schedule").items() if e.per_token is not None}


def check_anneal_args(args: Any) -> dict:
    """A request's annealing arguments, checked: a mapping with `schedule` (a registered per-token schedule),
    `step` (int >= 0) and fields of the schedule's options; raises ValueError naming what is wrong (vLLM rejects
    the request)."""
    if not isinstance(args, dict):
        raise ValueError(f"extra_args[{EAD_ARG!r}] must be a dict, got {type(args).__name__}")
    schedules = per_token_schedules()
    if args.get("schedule") not in schedules:
        raise ValueError(f"extra_args[{EAD_ARG!r}]['schedule'] must be one of {sorted(schedules)}, "
                         f"got {args.get('schedule')!r}")
    keywords = anneal_fields(args["schedule"])
    unknown = set(args) - {"schedule", "step", *keywords}
    if unknown:
        raise ValueError(f"extra_args[{EAD_ARG!r}]: unknown keys {sorted(unknown)}; valid: schedule, step, "
                         f"{', '.join(keywords)}")
    if not isinstance(args.get("step"), int) or args["step"] < 0:
        raise ValueError(f"extra_args[{EAD_ARG!r}]['step'] must be an int >= 0 (the 0-based training step)")
    return args


def token_factors(args: Sequence[dict | None], positions: Sequence[int]) -> Tensor:
    """Per-row temperature factors `[B]` (float32): row b's schedule at its output position `positions[b]`
    (0-based: the number of tokens it has generated), 1.0 for a row without annealing (`args[b]` None).

    Equals `explorl`'s sampler table: `Tm.ead_schedule(step, T_max, options)[t] == token_factors([args], [t])[0]`
    where `options = anneal_options(args)`.
    """
    out = torch.ones(len(args), dtype=torch.float32)
    schedules = per_token_schedules() if any(a is not None for a in args) else {}
    for b, (a, t) in enumerate(zip(args, positions)):
        if a is not None:
            out[b] = schedules[a["schedule"]](int(t), a["step"], anneal_options(a))
    return out


class AnnealedRows:
    """Which rows of vLLM's persistent batch anneal, with what arguments, and how far each has generated.

    `update(batch_update)` follows vLLM's `BatchUpdate` (applied in its documented order: removed, added, moved):
    `added` holds `(row, params, prompt_ids, output_ids)` where `output_ids` is the request's live list of output
    tokens (its length is the position of the next token), `moved` holds `(a, b, direction)` with direction
    SWAP or UNIDIRECTIONAL (a's request moves to b; a becomes empty).
    """

    def __init__(self) -> None:
        self.rows: dict[int, tuple[dict, list[int]]] = {}

    def update(self, batch_update) -> None:
        if batch_update is None:
            return
        for row in batch_update.removed:
            self.rows.pop(row, None)
        for row, params, _prompt_ids, output_ids in batch_update.added:
            args = (getattr(params, "extra_args", None) or {}).get(EAD_ARG)
            if args is None:
                self.rows.pop(row, None)  # a new request without annealing may reuse an annealed row
            else:
                self.rows[row] = (check_anneal_args(args), output_ids)
        for a, b, direction in batch_update.moved:
            entry_a, entry_b = self.rows.pop(a, None), self.rows.pop(b, None)
            if entry_a is not None:
                self.rows[b] = entry_a
            if entry_b is not None and getattr(direction, "name", str(direction)).upper().endswith("SWAP"):
                self.rows[a] = entry_b

    def apply(self, logits: Tensor) -> Tensor:
        """`logits [B, V]` with each annealed row divided by its factor (in place, as vLLM's processors do)."""
        if not self.rows:
            return logits
        rows = sorted(r for r in self.rows if r < logits.shape[0])
        factors = token_factors([self.rows[r][0] for r in rows], [len(self.rows[r][1]) for r in rows])
        index = torch.tensor(rows, dtype=torch.long, device=logits.device)
        logits[index] = logits[index] / factors.to(logits.device, logits.dtype)[:, None]
        return logits


def _build_processor():
    from vllm.v1.sample.logits_processor import LogitsProcessor  # vLLM: optional (the vllm extra or its own venv)

    class EADLogitsProcessor(LogitsProcessor):
        """EAD / RevEAD per-token temperature for requests with `extra_args["explorl_ead"]` (module docstring)."""

        @classmethod
        def validate_params(cls, sampling_params) -> None:
            args = (getattr(sampling_params, "extra_args", None) or {}).get(EAD_ARG)
            if args is not None:
                check_anneal_args(args)

        def __init__(self, vllm_config, device, is_pin_memory: bool):
            self.annealed = AnnealedRows()

        def is_argmax_invariant(self) -> bool:
            return True

        def update_state(self, batch_update) -> None:
            self.annealed.update(batch_update)

        def apply(self, logits: Tensor) -> Tensor:
            return self.annealed.apply(logits)

    return EADLogitsProcessor


def __getattr__(name: str):
    # built on first access, so importing this module (and testing its arithmetic) needs no vLLM
    if name == "EADLogitsProcessor":
        cls = _build_processor()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
