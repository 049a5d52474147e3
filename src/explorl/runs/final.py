"""A run's `final/` directory: the trained policy as a Hugging Face model directory, with its model card."""

from __future__ import annotations

from pathlib import Path

from explorl import __version__
from explorl.runs import nofollow
from explorl.runs.jsonl import read_jsonl


def save_final_model(path: Path, model, tok, card: str | None = None) -> None:
    """The trained policy as a Hugging Face directory (LoRA: the adapter, loadable with peft), ready to upload:
    written into a fresh `<name>.tmp` directory and renamed. A symbolic link at either name is refused before
    anything is written (`nofollow`): the model would go, or a directory would be deleted, wherever it points."""
    tmp = path.with_name(path.name + ".tmp")
    nofollow.check(path)
    nofollow.remove(tmp)  # a killed run's left-over, with whatever it holds
    nofollow.make_dirs(tmp)
    model.save_pretrained(str(tmp))
    tok.save_pretrained(str(tmp))
    if card is not None:
        nofollow.write_file(tmp / "README.md", card)
    nofollow.remove(path)
    nofollow.replace(tmp, path)


def model_card(cfg, summary: dict, steps: int, run_dir: Path | None = None) -> str:
    """A short Hugging Face model card: base model, method, steps, held-out pass@k (the run's own eval.json), and,
    for a run resumed with changed keys, what changed after which step (`run_dir`'s config_history.jsonl), since the
    settings above are the latest ones only."""
    a, s = cfg.algo, cfg.sampling
    method = (f"advantage `{a.advantage}`" + (f", shapers {a.shapers}" if a.shapers else "")
              + f", loss `{a.loss}` ({a.loss_agg}, clip {a.eps_low:g}/{a.eps_high:g}"
              + (f", KL {a.kl_coef:g}" if a.kl_coef else "") + f"), sampling schedule `{s.schedule}`, "
              f"budget `{cfg.budget.policy}`, {s.group_size} samples per prompt")
    rows = "\n".join(f"| {k} | {v:.4f} |" for k, v in summary.items()
                     if k.split("@")[0] in ("pass", "maj", "avg", "worst") and isinstance(v, (int, float)))
    lines = [
        "---", "library_name: transformers", "tags: [explorl, reinforcement-learning, rlvr]", "---", "",
        f"# RL-trained from `{cfg.model.path}`", "",
        f"Trained with [explorl](https://pypi.org/project/explorl/) {__version__} for {steps} steps on the "
        f"`{cfg.task.name}` task ({method}; lr {cfg.optim.lr:g}, {cfg.run.batch_size} prompts per step, up to "
        f"{s.max_new_tokens} new tokens, seed {cfg.run.seed}). The run's full configuration is its `config.yaml`.",
        "", f"Held-out evaluation after training ({summary.get('problems', '?')} problems, "
        f"n = {summary.get('n', '?')} samples each, temperature {cfg.run.eval_temperature:g}):", "",
        "| metric | value |", "|---|---|", rows, ""]
    history = run_dir / "config_history.jsonl" if run_dir is not None else None
    changes = read_jsonl(history, torn_last_line_ok=True) if history is not None and history.is_file() else []
    if changes:
        lines += ["Changed when the run was resumed (the settings above are the last ones):", ""]
        lines += [f"- after step {c.get('resumed_after_step', '?')}: " + ", ".join(
            f"`{k}` {old!r} -> {new!r}" for k, (old, new) in sorted((c.get("changes") or {}).items())) for c in changes]
        lines.append("")
    return "\n".join(lines)
