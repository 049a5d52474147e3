"""`explorl export RUN_OR_DIR --out DIR [--merge]`: a run's model (or a LoRA adapter merged into its base) as a
standard Hugging Face model directory."""

from __future__ import annotations

from pathlib import Path

import torch
from rich.text import Text

import explorl.commands.common as common
from explorl.commands.common import add_overwrite_flag, refuse_to_replace
from explorl.config import Config, ConfigError
from explorl.config.recorded import recorded_model
from explorl.models import (adapter_base, check_fingerprint, find_run_output, is_adapter_dir, load_causal_lm,
                            load_run_output, resolve_dtype, resolve_model_path)
from explorl.runs import nofollow


def add_parser(sub) -> None:
    x = sub.add_parser("export", help="write a run's model (or a LoRA adapter merged into its base) as a standard "
                                      "Hugging Face model directory")
    x.add_argument("source", metavar="RUN_OR_DIR",
                   help="a run directory (its final/), RUN/final, RUN/checkpoints/step_N, or an adapter directory")
    x.add_argument("--out", required=True, help="new directory for the model (weights + tokenizer)")
    x.add_argument("--merge", action="store_true", help="merge LoRA adapters into the base weights (required for "
                                                        "LoRA runs and adapter directories)")
    x.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="dtype of the written weights (auto: float32, as loaded on the CPU)")
    add_overwrite_flag(x)
    x.set_defaults(fn=cmd_export)


def cmd_export(args) -> int:
    out = Path(args.out)
    refuse_to_replace(out, "--out", args.overwrite)
    # written as OUT.tmp and renamed, the replaced model kept as OUT.replaced until then: a symbolic link at any of
    # the three names is refused before any work (the model, or a deletion, would go where it points); a left-over
    # OUT.tmp or OUT.replaced of a killed export is removed
    tmp, old = out.with_name(out.name + ".tmp"), out.with_name(out.name + ".replaced")
    for path in (out, tmp, old):
        nofollow.check(path)
    nofollow.remove(tmp)
    replaced = out.exists() and (not out.is_dir() or any(out.iterdir()))
    if replaced and not (out.is_dir() and any((out / f).is_file() for f in ("config.json", "adapter_config.json"))):
        raise FileExistsError(f"--out {out}: --overwrite replaces a model directory (one with config.json), and "
                              f"{out} is not one; choose a new directory")
    run = find_run_output(args.source)
    if run is not None:
        # only the model of the run's config.yaml, read as data: the code it may name is never imported here
        run_cfg = Config(model=recorded_model(run.config_path))
        lora = is_adapter_dir(run.model_dir) or (run.kind == "checkpoint" and run_cfg.model.lora.enabled)
        what = f"{run.kind} of the run {run.run_dir}"
    else:
        path = resolve_model_path(args.source)
        lora = is_adapter_dir(path)
        what = f"LoRA adapter {path} on {adapter_base(path)}" if lora else f"model {path}"
    if lora and not args.merge:
        raise ConfigError(f"{args.source}: holds LoRA adapters, not a standalone model; add --merge to write the base "
                          f"model with the adapters merged into its weights")
    if run is not None:
        if run.kind == "checkpoint":
            check_fingerprint(run_cfg.model)
        model, tok, _ = load_run_output(run, run_cfg, device="cpu", dtype=args.dtype)
    else:
        model, tok = load_causal_lm(path, resolve_dtype(args.dtype, torch.device("cpu")))
    nofollow.make_dirs(tmp)  # a fresh, real directory: the model is written nowhere else
    model.save_pretrained(str(tmp))
    tok.save_pretrained(str(tmp))
    if replaced:  # the old model goes only once the new one is complete
        nofollow.remove(old)
        nofollow.replace(out, old)
        nofollow.replace(tmp, out)
        nofollow.remove(old)
    else:
        if out.exists():
            out.rmdir()  # empty, checked above
        nofollow.replace(tmp, out)
    merged = " (LoRA adapters merged)" if lora else ""
    common.console.print(Text(f"wrote {out}: {what}{merged} as a standard Hugging Face model directory, weights and "
                              f"tokenizer (AutoModelForCausalLM.from_pretrained; `model.path` or `--model` of "
                              f"explorl)"))
    return 0
