"""A run directory and what is written to it: config.yaml, metrics.jsonl, samples.jsonl, reward_errors.log,
checkpoints/, final/, eval.json; the per-step rollout metrics, the report of reward failures and the progress bar.

Checkpoints are written to a temporary name and renamed, so a kill never leaves a half checkpoint; they hold the
trainable weights, the optimizer and scheduler, every RNG and the loop's state (prompt stream, controllers), so
`--resume` continues a killed run exactly. They hold data only (safetensors, and tensors, numbers, strings, lists and
dicts in trainer_state.pt, checked when written), read back with `torch.load(weights_only=True)`: a run directory is
untrusted input (shared, downloaded), and loading one never unpickles an object, so it never runs code.
The append-only files (metrics.jsonl, samples.jsonl, config_history.jsonl, reward_errors.log) are written record by
record, each flushed; on resume the records and samples of steps after the checkpoint, and the final evaluation line,
are dropped (they will be recomputed identically), and a last line a kill tore is dropped with a warning naming the
file and line; any other line that is not JSON is an error naming them. eval.json is written last, after final/: a
run directory whose eval.json has the last step is complete. One process writes a run directory: `RunLog.open`
takes its lock (`explorl.runs.lock`) before writing anything and `close` releases it.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import time
from pathlib import Path

import torch

from explorl.analysis.measures import entropy_by_position
from explorl.runs.lock import (RunDirWarning, RunLock, check_out_dir, holds_steps, is_explorl_run,
                             refuse_if_locked)

# Every key written to metrics.jsonl at each training step, with its meaning (docs/run-directory.md's table comes
# from here).
STEP_METRICS: dict[str, str] = {
    "step": "training step (1-based)",
    "reward/mean": "mean reward of the step's responses",
    "reward/std": "population std of the rewards",
    "reward/correct_frac": "fraction of correct responses (task.correct_by's score above task.correct_threshold)",
    "reward/all_correct_frac": "fraction of prompts whose responses are all correct (zero advantage in GRPO)",
    "reward/all_wrong_frac": "fraction of prompts whose responses are all wrong (zero advantage in GRPO)",
    "reward/errors": "reward-function failures this step (scored 0)",
    "reward/timeouts": "reward-function timeouts this step (scored 0)",
    "entropy/mean": "mean token entropy of the policy at the training temperature over response tokens",
    "entropy/pos": "the same over correct responses (null when none)",
    "entropy/neg": "the same over incorrect responses (null when none)",
    "entropy/behavior_mean": "mean entropy of the distribution actually sampled from",
    "temperature/mean": "mean sampling temperature over response tokens",
    "temperature/train": "temperature of the optimised policy (the E3 tau; the base temperature otherwise)",
    "rollouts/per_prompt_min": "fewest responses sampled for a prompt",
    "rollouts/per_prompt_max": "most responses sampled for a prompt",
    "rollouts/per_prompt_mean": "mean responses per prompt",
    "rollouts/total": "responses this step (N)",
    "length/mean": "mean response length in tokens (EOS included)",
    "length/max": "longest response",
    "length/truncated_frac": "fraction of responses that hit sampling.max_new_tokens",
    "entropy/by_position": "mean token entropy in 10 relative-position bins of the responses (a list)",
    "adv/mean": "mean advantage over response tokens",
    "adv/std": "std of the advantage over response tokens",
    "tokens/masked_frac": "fraction of response tokens removed from the loss (overlong masking, forking filter)",
    "tokens/downweighted_frac": "fraction of response tokens whose |advantage| the shapers reduced",
    "loss/pg": "clipped policy-gradient loss (aggregated)",
    "loss/clip_frac": "fraction of tokens where the clipped term is active",
    "loss/clip_frac_low": "fraction clipped at 1 - eps_low (A < 0)",
    "loss/clip_frac_high": "fraction clipped at 1 + eps_high (A > 0)",
    "loss/ratio_mean": "mean importance ratio pi_new / pi_old (exactly 1 on the first update)",
    "loss/ratio_max": "largest importance ratio",
    "loss/ratio_min": "smallest importance ratio (with ratio_max: whether the updates after the first move pi)",
    "loss/ppo_kl": "mean of logp_old - logp_new over tokens",
    "loss/nonfinite": "1 when this step's update was skipped for a non-finite loss or gradient",
    "optim/grad_norm": "global gradient norm before clipping",
    "optim/lr": "learning rate after the step",
    "perf/step_s": "wall time of the step",
    "perf/sample_s": "wall time of sampling",
    "perf/update_s": "wall time of the policy update (epochs x mini-batches)",
    "perf/tokens_per_s": "generated tokens per second of sampling",
    "perf/mem_sample_gib": "CUDA only: peak GPU memory (GiB) while sampling and scoring (docs/gpu.md)",
    "perf/mem_logprob_gib": "CUDA only: peak GPU memory while pi_old's and the reference's log-probs are computed",
    "perf/mem_update_gib": "CUDA only: peak GPU memory of the update's forward, backward and optimizer steps",
    "perf/mem_peak_gib": "CUDA only: the step's peak GPU memory, the largest of the three above",
}
# Present only when configured (docs/run-directory.md lists them): kl/mean (a reference model is kept), loss/entropy
# (algo.entropy_coef != 0), temperature/tau|h_target|h_init|clamped (E3 schedule), temperature/ead_d|ead_min|
# at_min_frac (EAD, RevEAD), temperature/adaptive_factor_min|max (adaptive schedule), is/* (algo.importance_weights),
# rollouts/dapo_rounds|dapo_kept_frac (DAPO sampling), loss/clip_cov_frac, loss/kl_cov_frac,
# loss/kl_cov_penalty_share (those losses),
# loss/dual_clip_frac (algo.ppo.dual_clip_c), reward/<name> (several task.reward functions: each one's mean,
# unweighted), eval/* (run.eval_every > 0, and once after the last step).


def rollout_metrics(ro, rewards: torch.Tensor, entropy: torch.Tensor, advantages: torch.Tensor,
                    correct: torch.Tensor) -> dict:
    """Per-step statistics of a batch of rollouts (namespaced metric names, docs/run-directory.md); `correct[N]`
    (bool) says which responses are correct by the task's rule (`Task.correct`), not by the shaped reward."""
    mask = ro.mask
    correct = correct.to(torch.bool)
    group = ro.group
    n_groups = int(group.max()) + 1 if len(group) else 0
    counts = torch.bincount(group, minlength=n_groups)
    n_correct = torch.bincount(group, weights=correct.float(), minlength=n_groups)
    present = counts > 0
    ent_rows = mask * entropy
    pos, neg = correct[:, None] & (mask > 0), (~correct)[:, None] & (mask > 0)
    lengths = mask.sum(-1)
    valid = mask > 0
    adv = advantages[valid]
    return {
        "reward/mean": float(rewards.mean()),
        "reward/std": float(rewards.std(unbiased=False)),
        "reward/correct_frac": float(correct.float().mean()),
        "reward/all_correct_frac": float((n_correct[present] == counts[present]).float().mean()),
        "reward/all_wrong_frac": float((n_correct[present] == 0).float().mean()),
        "entropy/mean": float(ent_rows.sum() / mask.sum().clamp_min(1)),
        "entropy/pos": float(entropy[pos].mean()) if pos.any() else float("nan"),
        "entropy/neg": float(entropy[neg].mean()) if neg.any() else float("nan"),
        "entropy/behavior_mean": float((ro.entropy * mask).sum() / mask.sum().clamp_min(1)),
        "temperature/mean": float((ro.temperatures * mask).sum() / mask.sum().clamp_min(1)),
        "rollouts/per_prompt_min": int(counts[present].min()),
        "rollouts/per_prompt_max": int(counts[present].max()),
        "rollouts/per_prompt_mean": float(counts[present].float().mean()),
        "rollouts/total": int(len(rewards)),
        "length/mean": float(lengths.mean()),
        "length/max": int(lengths.max()),
        "length/truncated_frac": float(ro.truncated.float().mean()),
        "entropy/by_position": entropy_by_position(entropy, mask, bins=10).tolist(),
        "adv/mean": float(adv.mean()) if adv.numel() else 0.0,
        "adv/std": float(adv.std(unbiased=False)) if adv.numel() else 0.0,
    }


# ----------------------------------------------------------------------------------------------------------------


class RunLog:
    """The files of one run directory."""

    def __init__(self, run_dir: Path):
        self.dir = Path(run_dir)
        self.metrics_path = self.dir / "metrics.jsonl"
        self.samples_path = self.dir / "samples.jsonl"
        self.reward_errors_path = self.dir / "reward_errors.log"
        self.trackers = None
        """`tracking.Trackers` (run.report_to): every metrics record also goes to them."""
        self.lock: RunLock | None = None
        """The directory's lock while this object writes it (`open`), released by `close`."""

    @classmethod
    def open(cls, out_dir: str | Path, config_yaml: str, resume: str | Path | None,
             resume_hint: str = "explorl train --resume") -> "RunLog":
        """The run directory to continue (`resume`: a run explorl made) or a new one at `out_dir` (absent, empty, or
        a run explorl made that logged no step: `runlock.check_out_dir`), locked for this process before anything is
        written (RunDirLocked naming the holder when another process writes it). `resume_hint`: the command that
        continues a run, named when `out_dir` already holds one."""
        if resume is not None:
            log = cls(Path(resume))
            if not (log.dir / "config.yaml").exists():
                raise FileNotFoundError(f"--resume {log.dir}: no config.yaml there; is it a run directory?")
            if not is_explorl_run(log.dir):
                raise FileExistsError(f"--resume {log.dir}: not a run directory explorl made (no {log.dir / '.lock'}, "
                                      f"metrics.jsonl or checkpoints/ beside its config.yaml); nothing to continue")
            log.lock = RunLock.acquire(log.dir)
            log.write_config(config_yaml, resumed=True)
            return log
        log = cls(Path(out_dir))
        refuse_if_locked(log.dir)  # a run in progress is named as such
        check_out_dir(log.dir, resume_hint)  # before anything is written, even the lock file
        log.dir.mkdir(parents=True, exist_ok=True)
        log.lock = RunLock.acquire(log.dir)
        if holds_steps(log.dir):  # another run logged steps between the check and the lock
            log.close()
            check_out_dir(log.dir, resume_hint)
        _write_atomic(log.dir / "config.yaml", config_yaml)
        return log

    def _writing(self) -> None:
        """Refuse to write once a later run of this process took the directory over (`RunLock.check`)."""
        if self.lock is not None:
            self.lock.check()

    def write_config(self, config_yaml: str, resumed: bool = False) -> None:
        """Rewrite config.yaml (a setting resolved at load time, e.g. `task.chat_template: auto`, or a resumed run's
        overrides), so it always describes the run that produces the next weights. When a resumed run's config
        differs from the file's, the change is appended to `config_history.jsonl` first: when, after which step
        (the checkpoint it continues from), which keys changed (old and new values) and the whole previous file."""
        self._writing()
        path = self.dir / "config.yaml"
        previous = path.read_text() if path.exists() else None
        if resumed and previous is not None and previous != config_yaml:
            import yaml

            old, new = _flatten(yaml.safe_load(previous) or {}), _flatten(yaml.safe_load(config_yaml) or {})
            changes = {k: [old.get(k), new.get(k)] for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)}
            ckpts = self.checkpoints()
            record = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                      "resumed_after_step": int(ckpts[-1].name.rsplit("_", 1)[-1]) if ckpts else 0,
                      "changes": changes, "previous": previous}
            history = self.dir / "config_history.jsonl"
            drop_torn_last_line(history)  # a kill while appending the last change: that record is incomplete
            append_jsonl(history, record)
        if previous != config_yaml:
            _write_atomic(path, config_yaml)

    def checkpoints(self) -> list[Path]:
        return _checkpoint_dirs(self.dir)

    def save_checkpoint(self, step: int, model, optimizer, scheduler, state: dict, keep: int,
                        every: int = 0) -> Path:
        self._writing()
        return save_checkpoint(self.dir, step, model, optimizer, scheduler, state, keep, every)

    def truncate_metrics(self, done_steps: int, step_key: str = "reward/mean") -> None:
        """Drop the step records after `done_steps` and the final evaluation line (a resume writes them again);
        `step_key` is a key every step record has (`sft/loss` for `explorl sft`)."""
        self._writing()
        _truncate_jsonl(self.metrics_path, lambda r: r["step"] <= done_steps and step_key in r)

    def truncate_samples(self, done_steps: int) -> None:
        """Drop the samples of steps after `done_steps` (a resume samples them again)."""
        self._writing()
        _truncate_jsonl(self.samples_path, lambda r: r["step"] <= done_steps)

    def is_complete(self, steps: int) -> bool:
        """Whether this run finished all `steps`: eval.json (written last) is for that step and final/ exists."""
        try:
            done = json.loads((self.dir / "eval.json").read_text()).get("step") == steps
        except (OSError, ValueError, AttributeError):
            return False
        return done and (self.dir / "final").is_dir()

    def append_metrics(self, record: dict) -> None:
        self._writing()
        append_jsonl(self.metrics_path, _clean(record))
        if self.trackers is not None:
            self.trackers.log(_clean(record))

    def start_trackers(self, run, config: dict, resume_step: int | None) -> None:
        """TensorBoard / W&B beside metrics.jsonl as `run.report_to` (a `RunConfig`) asks, with `config` as the tracked
        run's config; `resume_step` (a resumed run's last done step, else None) continues the same tracked run."""
        if run.report_to:
            from explorl.runs.tracking import Trackers

            self.trackers = Trackers(run.report_to, self.dir, config, resume_step=resume_step,
                                     project=run.wandb_project)

    def close(self) -> None:
        """Finish the trackers (the files are flushed record by record) and release the directory's lock."""
        try:
            if self.trackers is not None:
                self.trackers.close()
                self.trackers = None
        finally:
            if self.lock is not None:
                self.lock.release()

    def log_samples(self, step: int, problems, ro, texts, rewards, k: int) -> None:
        """The first `k` prompts of the step with their completions and rewards."""
        if k <= 0:
            return
        self._writing()
        group = ro.group.tolist()
        with open(self.samples_path, "a") as f:
            for j, p in enumerate(problems[:k]):
                rows = [i for i, g in enumerate(group) if g == j]
                f.write(json.dumps({"step": step, "prompt": p.prompt, "answer": p.answer,
                                    "completions": [texts[i] for i in rows],
                                    "rewards": [rewards[i] for i in rows]}) + "\n")
                f.flush()  # record by record: a kill tears at most the last line
            os.fsync(f.fileno())

    def write_eval(self, step: int, summary: dict, base_fingerprint: str) -> None:
        """eval.json, written whole under a temporary name and renamed (it marks the run complete); it names the
        weights the run started from (`base_fingerprint`, `evaluate.check_same_base`)."""
        self._writing()
        _write_atomic(self.dir / "eval.json",
                      json.dumps({"step": step, "base_fingerprint": base_fingerprint, **summary}, indent=2))

    def save_final_model(self, model, tok, card: str | None = None) -> Path:
        """`final/`: a standard Hugging Face model directory, with `card` as its README.md (the model card)."""
        self._writing()
        save_final_model(self.dir / "final", model, tok, card)
        return self.dir / "final"


def rng_state(generators: dict[str, torch.Generator], device: torch.device) -> dict:
    """Every random state a step consumes: the named generators, torch's, CUDA's and Python's."""
    return {**{k: g.get_state() for k, g in generators.items()}, "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
            "python_rng": random.getstate()}


def restore_rng(state: dict, generators: dict[str, torch.Generator], device: torch.device) -> None:
    for k, g in generators.items():
        g.set_state(state[k])
    torch.set_rng_state(state["torch_rng"])
    if device.type == "cuda" and state.get("cuda_rng") is not None:
        torch.cuda.set_rng_state(state["cuda_rng"], device)
    random.setstate(state["python_rng"])


def _flatten(data: dict, prefix: str = "") -> dict:
    """A nested config mapping as {dotted key: value} (lists and scalars are leaves)."""
    out = {}
    for k, v in data.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _checkpoint_dirs(run_dir: Path) -> list[Path]:
    root = run_dir / "checkpoints"
    return sorted(p for p in root.glob("step_*") if p.is_dir()) if root.exists() else []


def save_checkpoint(run_dir: Path, step: int, model, optimizer, scheduler, state: dict, keep: int,
                    every: int = 0) -> Path:
    """Write checkpoint `step_<step>` (through a temporary directory) and prune the older ones: with `every` > 0
    a checkpoint off that schedule (a stop's, written so the run can resume) goes once a newer one exists, so it
    never evicts a scheduled one; of the rest the newest `keep` stay."""
    from safetensors.torch import save_file

    root = run_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:07d}"
    tmp = root / f".tmp_step_{step:07d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    trainable = {n: p.detach().cpu().contiguous() for n, p in model.named_parameters() if p.requires_grad}
    save_file(trainable, str(tmp / "trainable.safetensors"))
    trainer_state = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), **state}
    check_data_only(trainer_state)  # what `load_checkpoint` can read back without unpickling objects
    torch.save(trainer_state, tmp / "trainer_state.pt")
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    older = _checkpoint_dirs(run_dir)[:-1]
    off_schedule = [p for p in older if every > 0 and int(p.name[len("step_"):]) % every]
    kept = [p for p in older if p not in off_schedule]
    for old in off_schedule + kept[:max(len(kept) + 1 - max(keep, 1), 0)]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(path: Path, model, optimizer, scheduler) -> dict:
    from safetensors.torch import load_file

    weights = load_file(str(path / "trainable.safetensors"))
    named = dict(model.named_parameters())
    missing = [n for n, p in named.items() if p.requires_grad and n not in weights]
    if missing:
        raise RuntimeError(f"checkpoint {path} lacks parameters {missing[:5]}... (config changed since the run?)")
    with torch.no_grad():
        for n, t in weights.items():
            named[n].copy_(t.to(named[n].device, named[n].dtype))
    state = load_trainer_state(path / "trainer_state.pt")
    optimizer.load_state_dict(state.pop("optimizer"))
    scheduler.load_state_dict(state.pop("scheduler"))
    return state


DATA_TYPES = (torch.Tensor, dict, list, tuple, str, bytes, int, float, bool, type(None))
"""What a checkpoint's trainer_state.pt may hold: `torch.load(weights_only=True)` reads these without running code."""


def check_data_only(value, where: str = "trainer_state") -> None:
    """TypeError naming the entry when `value` holds anything but `DATA_TYPES` (an object a data-only load would
    refuse): a controller's `state_dict` must return plain data."""
    if not isinstance(value, DATA_TYPES):
        raise TypeError(f"{where}: a checkpoint holds data only (tensors, numbers, strings, lists, dicts), not "
                        f"{type(value).__module__}.{type(value).__qualname__}; return plain data from its state_dict")
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, (str, int, float, bool, type(None))):
                raise TypeError(f"{where}: key {k!r} of type {type(k).__qualname__}; keys must be strings or numbers")
            check_data_only(v, f"{where}[{k!r}]")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            check_data_only(v, f"{where}[{i}]")


class UnsafeCheckpointError(ValueError):
    """A checkpoint file that cannot be read as data only (it names code to run); never unpickled."""


def load_trainer_state(path: Path) -> dict:
    """A checkpoint's trainer_state.pt, read as data only (`weights_only=True`: tensors, numbers, strings, lists,
    dicts; no object is unpickled, so no code in the file runs). UnsafeCheckpointError naming the file and the fix
    when it holds anything else."""
    import pickle

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        detail = next((line.strip() for line in str(e).splitlines() if "GLOBAL" in line or "global" in line), "")
        raise UnsafeCheckpointError(
            f"{path}: holds more than data ({detail or 'objects a data-only load refuses'}); explorl never unpickles "
            f"objects from a run directory, since loading them could run any code the file names. explorl writes "
            f"its checkpoints as data only, so this file was written by something else or altered: continue from an "
            f"earlier checkpoint (remove {path.parent}), or start the run again from its config "
            f"(`explorl train {path.parent.parent.parent / 'config.yaml'} run.out_dir=NEW_DIR`)") from None
    if not isinstance(state, dict) or not {"optimizer", "scheduler"} <= set(state):
        raise UnsafeCheckpointError(f"{path}: not an explorl trainer state (a mapping with optimizer and scheduler "
                                    f"states); remove {path.parent} to continue from an earlier checkpoint")
    return state


def append_jsonl(path: Path, record: dict) -> None:
    """Append one record as a line, flushed and fsynced (a kill tears at most this line)."""
    with open(path, "a") as f:
        f.write(json.dumps(record, default=_json_default) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path: Path, *, torn_last_line_ok: bool = False) -> list[dict]:
    """The records of a JSONL file. A line that is not a JSON object is a ValueError naming the file and line, except,
    with `torn_last_line_ok`, the last line: a kill can tear a line only while it is being appended, so a last line
    that does not parse is an incomplete record, dropped with a `RunDirWarning` naming the file and line."""
    records = []
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError(f"a JSON {type(record).__name__}, not an object")
        except ValueError as e:
            if torn_last_line_ok and i == last:
                import warnings

                warnings.warn(f"{path}:{i + 1}: the last line is incomplete (a kill while it was written: "
                              f"{line[:60]!r}...); dropped", RunDirWarning, stacklevel=2)
                break
            raise ValueError(f"{path}:{i + 1}: not a JSON record ({e}); the file was altered or damaged: repair or "
                             f"remove that line") from None
        records.append(record)
    return records


def drop_torn_last_line(path: Path) -> None:
    """Before appending to a JSONL file after a kill: rewrite it without a torn last line (with a warning)."""
    if path.exists() and path.stat().st_size and not path.read_bytes().endswith(b"\n"):
        _rewrite_jsonl(path, read_jsonl(path, torn_last_line_ok=True))


def _rewrite_jsonl(path: Path, records: list[dict]) -> None:
    _write_atomic(path, "".join(json.dumps(r, default=_json_default) + "\n" for r in records))


def _write_atomic(path: Path, text: str) -> None:
    """`path` written whole under a temporary name, fsynced and renamed: a kill leaves the old file or the new."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _json_default(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return str(x)


def _clean(record: dict) -> dict:
    """NaN (e.g. entropy/pos with no correct response) is written as null: metrics.jsonl stays valid JSON."""
    def fix(v):
        if isinstance(v, list):
            return [fix(x) for x in v]
        return None if isinstance(v, float) and not math.isfinite(v) else v
    return {k: fix(v) for k, v in record.items()}


def _truncate_jsonl(path: Path, keep) -> None:
    """On resume, keep only the records that satisfy `keep` (the rest will be recomputed identically); a torn last
    line is dropped with a warning (`read_jsonl`). The kept lines are written back as they were."""
    if not path.exists():
        return
    records = read_jsonl(path, torn_last_line_ok=True)
    lines = [line for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    kept = []
    for n, (line, record) in enumerate(zip(lines, records), 1):
        try:
            wanted = keep(record)
        except (KeyError, TypeError) as e:
            raise ValueError(f"{path}:{n}: not a record of this run ({type(e).__name__}: {e}); repair or remove that "
                             f"line") from None
        if wanted:
            kept.append(line)
    _write_atomic(path, "".join(line + "\n" for line in kept))


def save_final_model(path: Path, model, tok, card: str | None = None) -> None:
    """The trained policy as a Hugging Face directory (LoRA: the adapter, loadable with peft), ready to upload."""
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp))
    tok.save_pretrained(str(tmp))
    if card is not None:
        (tmp / "README.md").write_text(card)
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)


class RewardFailureLog:
    """The reward failures of a run (`rewards.RewardFailure`s, as collected per step).

    Every distinct failure (by `RewardFailure.key`, at most `MAX_DISTINCT`) is appended to RUN/reward_errors.log
    with its step, input and traceback. On the console: the first failure's traceback once per run, with the
    step's count; afterwards one line for each step that brings a new kind of failure; and `summary()` at the end.
    """

    MAX_DISTINCT = 100

    def __init__(self, path: Path, console, start_step: int = 0):
        self.path, self.console = Path(path), console
        self.start_step = start_step
        self.seen: set[str] = set()
        self.errors = self.timeouts = self.steps = 0
        self.first = None

    def record(self, step: int, failures: list, scored: int) -> None:
        """Report the failures of training step `step` (1-based), out of `scored` samples."""
        from rich.markup import escape

        if not failures:
            return
        self.steps += 1
        timeouts = sum(f.kind == "timeout" for f in failures)
        self.timeouts += timeouts
        self.errors += len(failures) - timeouts
        new: list = []  # the first failure of each kind not seen before, in batch order
        for f in failures:
            if f.key not in self.seen and all(f.key != x.key for x in new):
                new.append(f)
        logged = new[:max(0, self.MAX_DISTINCT - len(self.seen))]
        self.seen.update(f.key for f in new)
        failed = len({f.index for f in failures})  # samples (several reward functions may fail on one)
        if logged:
            self._write(step, logged, failed, scored, truncated=len(logged) < len(new))
        counts = f"{failed} of {scored} samples ({len(failures) - timeouts} errors, {timeouts} timeouts)"
        if self.first is None:
            self.first = failures[0]
            self.console.print(f"[bold red]reward function failed[/] at step {step} on {counts}; the first "
                               f"failure (sample {self.first.index}, answer {escape(repr(self.first.answer))}):")
            self.console.print(self.first.detail.rstrip(), markup=False, highlight=False)
            more = f"{len(failures) - 1} more failure(s) in this step. " if len(failures) > 1 else ""
            self.console.print(f"{more}Failed samples score 0 and are counted (reward/errors, reward/timeouts); "
                               f"every distinct failure is logged to {escape(str(self.path))}", highlight=False)
        elif new:
            self.console.print(f"[red]step {step}: a new kind of reward failure[/] ({counts}): "
                               f"{escape(new[0].message)}; see {escape(str(self.path))}", highlight=False)

    def _write(self, step: int, failures: list, failed: int, scored: int, truncated: bool) -> None:
        with open(self.path, "a") as f:  # record by record, each flushed (a kill tears at most the last)
            if self.start_step is not None:
                f.write(f"##### {time.strftime('%Y-%m-%d %H:%M:%S')}: run started at step {self.start_step + 1}\n")
                f.flush()
                self.start_step = None
            for x in failures:
                detail = "" if x.detail == x.message else x.detail.rstrip() + "\n"
                f.write(f"=== step {step}, sample {x.index} ({failed} of {scored} samples of the step failed): "
                        f"{x.kind}: {x.message}\nanswer: {x.answer!r}\ncompletion: {x.completion!r}\n{detail}\n")
                f.flush()
            if truncated:
                f.write(f"(more than {self.MAX_DISTINCT} distinct failures: the others are only counted)\n")
            f.flush()
            os.fsync(f.fileno())

    def summary(self) -> str | None:
        """One line with the run's totals, or None when nothing failed."""
        if not self.steps:
            return None
        return (f"reward failures in this run: {self.errors} errors and {self.timeouts} timeouts over {self.steps} "
                f"step(s), {len(self.seen)} distinct; details in {self.path}")

    def print_summary(self) -> None:
        """`summary()` on the console, when anything failed."""
        line = self.summary()
        if line:
            self.console.print(line, markup=False, highlight=False)


def format_duration(seconds: float) -> str:
    """h:mm:ss (m:ss under an hour)."""
    s = int(round(max(0.0, seconds)))
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


class Progress:
    """Training progress: steps done of the total, seconds per step smoothed over the last steps (an exponential
    moving average with weight `EMA` on the newest step, wall time between updates, evaluations and checkpoints
    included) and the time left at that pace, with the last step's key metrics. Each evaluation during training
    is printed as one line with its pass@k. A rich bar on a terminal; plain lines every 10 steps otherwise."""

    EMA = 0.3

    def __init__(self, console, total: int, start: int, enabled: bool = True, clock=time.monotonic):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self.console = console
        self.total, self.start, self.clock = total, start, clock
        self.live = enabled and console.is_terminal
        self.enabled = enabled
        self.progress = None
        self.s_per_step: float | None = None
        self._last = (start, clock())
        if self.live:
            self.progress = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("steps"),
                                     TextColumn("{task.fields[pace]}"), TextColumn("{task.fields[info]}"),
                                     console=console)
            self.progress.start()
            self.task = self.progress.add_task("train", total=total, completed=start, info="", pace=self.pace(start))

    @staticmethod
    def _info(rec: dict) -> str:
        def g(k):
            v = rec.get(k)
            return float("nan") if v is None else v
        failed = (rec.get("reward/errors") or 0) + (rec.get("reward/timeouts") or 0)
        return (f"reward {g('reward/mean'):.3f}  entropy {g('entropy/mean'):.3f}  "
                f"all-wrong {g('reward/all_wrong_frac'):.2f}  len {g('length/mean'):.1f}"
                + (f"  reward failures {failed}" if failed else ""))

    def pace(self, step: int) -> str:
        """`s/step` (smoothed) and the time left at that pace, once a step has been timed."""
        if self.s_per_step is None:
            return "-- s/step"
        return f"{self.s_per_step:.2f} s/step, {format_duration(self.s_per_step * (self.total - step))} left"

    def eval_line(self, step: int, rec: dict) -> str | None:
        """One line for an evaluation during training (the step's `eval/*` metrics), or None."""
        ks = sorted((k for k in rec if k.startswith("eval/pass@")), key=lambda k: int(k.split("@")[1]))
        if not ks:
            return None
        parts = [f"{k[5:]} {rec[k]:.3f}" for k in ks]
        if rec.get("eval/entropy") is not None:
            parts.append(f"entropy {rec['eval/entropy']:.3f}")
        return f"step {step}/{self.total} held-out eval: " + "  ".join(parts)

    def update(self, step: int, rec: dict) -> None:
        now = self.clock()
        last_step, last_t = self._last
        if step > last_step:
            dt = (now - last_t) / (step - last_step)
            self.s_per_step = dt if self.s_per_step is None else (1 - self.EMA) * self.s_per_step + self.EMA * dt
            self._last = (step, now)
        if not self.enabled:
            return
        line = self.eval_line(step, rec)
        if line is not None:
            self.console.print(line, highlight=False)
        if self.live:
            self.progress.update(self.task, completed=step, info=self._info(rec), pace=self.pace(step))
        elif step % 10 == 0 or step == self.start + 1 or step == self.total:
            self.console.print(f"step {step}/{self.total}: {self._info(rec)}  {self.pace(step)}", highlight=False)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()


def model_card(cfg, summary: dict, steps: int, run_dir: Path | None = None) -> str:
    """A short Hugging Face model card: base model, method, steps, held-out pass@k (the run's own eval.json), and,
    for a run resumed with changed keys, what changed after which step (`run_dir`'s config_history.jsonl), since the
    settings above are the latest ones only."""
    from explorl import __version__

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
