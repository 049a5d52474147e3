"""The training loop: sample, reward, advantages, clipped policy update; one function, top to bottom.

Deliberate choices, stated up front:
- The optimised policy is softmax(logits / the batch's training temperature): the fixed temperature, or the E3
  tau that sampled the batch; under EAD the base temperature (the annealed per-token ones are behaviour only).
  Old, new and reference log-probs all come from `rollout.logprobs.response_logprobs` (the same code path), so
  the first PPO ratio is exactly 1. With one update per batch and nothing needing pi_old before it, pi_old is
  that update's own forward, detached (`on_policy_single_update`), which saves a forward pass, as TRL does.
- The sampler's own log-probs are behaviour log-probs: they feed truncated importance weights (`algo.tis`).
- Methods plug in by name: the sampling schedule and budgets (`Controllers`, with DAPO dynamic sampling in
  `collect_rollouts`), the estimator and shapers (`algos.advantages`), the per-token objective (`algos.losses`).
- A response counts as correct (for `entropy/pos`, all-correct/all-wrong fractions) when its reward > 0.5.
- A loss or gradient that is not finite skips the rest of that step's updates before `optimizer.step`, so the
  weights and the AdamW moments never see it; too many such steps in a row stop the run.
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

from explorl.algos import get_advantage
from explorl.analysis.measures import entropy_by_position
from explorl.algos.advantages import get_shaper
from explorl.algos.losses import (aggregate, forking_mask, get_policy_loss, kl_k3, masked_mean, overlong_penalty,
                                  tis_stats, tis_weights)
from explorl.config import Config, dump_yaml, load_config
from explorl.evaluate import decode_responses, evaluate
from explorl.models import load_policy, make_reference, reference_mode
from explorl.rewards import RewardRunner
from explorl.rollout.logprobs import response_logprobs
from explorl.rollout.sampler import Rollouts, sample
from explorl.tasks import load_task


class NonFiniteError(RuntimeError):
    """The loss or the gradient norm of an update was NaN or infinite."""


class PromptStream:
    """Shuffled passes over the training prompts; its state is two integers, so resume is exact."""

    def __init__(self, size: int, seed: int):
        self.size, self.seed = size, seed
        self.epoch, self.pos = 0, 0
        self._order = self._permutation()

    def _permutation(self) -> list[int]:
        order = list(range(self.size))
        random.Random(self.seed * 1_000_003 + self.epoch).shuffle(order)
        return order

    def next(self, k: int) -> list[int]:
        out = []
        while len(out) < k:
            if self.pos == self.size:
                self.epoch, self.pos = self.epoch + 1, 0
                self._order = self._permutation()
            take = min(k - len(out), self.size - self.pos)
            out.extend(self._order[self.pos:self.pos + take])
            self.pos += take
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.pos = state["epoch"], state["pos"]
        self._order = self._permutation()


def lr_lambda(warmup: int, total: int, min_ratio: float):
    """Linear warm-up then cosine decay to `min_ratio` of the peak, as a LambdaLR multiplier."""

    def fn(i: int) -> float:
        if i < warmup:
            return (i + 1) / warmup
        progress = min(1.0, (i - warmup) / max(1, total - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return fn


def _micro_weight(mask: torch.Tensor, rows: torch.Tensor, agg: str) -> float:
    """Share of a micro-batch in its mini-batch's normaliser, so accumulated gradients equal the full batch's."""
    if agg == "token-mean":
        return float(mask[rows].sum()) / max(float(mask.sum()), 1.0)
    if agg == "seq-mean-token-mean":
        nonempty = mask.sum(-1) > 0
        return float(nonempty[rows].sum()) / max(float(nonempty.sum()), 1.0)
    return len(rows) / mask.shape[0]


def _loss_kwargs(cfg: Config, generator: torch.Generator) -> dict:
    """Keyword arguments of the configured per-token objective (`algo.loss`)."""
    a = cfg.algo
    if a.loss == "clip_cov":
        return {"eps_low": a.eps_low, "eps_high": a.eps_high, "clip_ratio": a.clip_cov_ratio, "lb": a.clip_cov_lb,
                "ub": a.clip_cov_ub, "generator": generator}
    if a.loss == "kl_cov":
        return {"k_percent": a.kl_cov_k_percent, "kl_coef": a.kl_cov_coef}
    return {"eps_low": a.eps_low, "eps_high": a.eps_high}


def on_policy_single_update(cfg: Config) -> bool:
    """Whether the batch's only update happens at the sampling weights and temperature, and nothing before the
    update needs pi_old's log-probs (estimators, shapers, importance weights), so pi_old can be taken from the
    training forward itself (detached) instead of a separate forward pass, as TRL does for one update per batch."""
    a, s = cfg.algo, cfg.sampling
    return (a.epochs == 1 and a.mini_batches == 1 and s.schedule in ("fixed", "e3") and not a.tis
            and a.advantage in ("grpo", "dr_grpo", "passk") and set(a.shapers) <= {"entropy_adv", "position"})


def _micro_batches(mb: torch.Tensor, lengths: torch.Tensor, a) -> list[torch.Tensor]:
    """Positions in mini-batch `mb` of each micro-batch: rows sorted by length (longest first) and cut into
    `micro_batch_size` rows, or into `length_buckets` parts, so each forward pads only to its own longest row.
    The accumulated gradient is the mini-batch's (`_micro_weight`); only the padding compute changes."""
    order = torch.sort(lengths[mb], descending=True, stable=True).indices
    size = a.micro_batch_size if a.micro_batch_size > 0 else math.ceil(len(mb) / max(1, a.length_buckets))
    return list(order.split(max(1, size)))


def update_policy(model, optimizer, scheduler, batch: dict, advantages: torch.Tensor, cfg: Config,
                  shuffle: torch.Generator, ref=None, temperature: float | None = None) -> dict:
    """Epochs x mini-batches of clipped policy-gradient updates on one batch of rollouts. Returns mean stats.

    `temperature` is the training temperature of the batch (the optimised policy is softmax(logits / it));
    `batch` may carry `is_weights` (truncated importance weights) and `token_weights` (token filters).
    """
    a = cfg.algo
    params = [p for p in model.parameters() if p.requires_grad]
    n = batch["mask"].shape[0]
    stats: dict[str, list[float]] = {}
    temp = cfg.sampling.temperature if temperature is None else temperature
    loss_fn = get_policy_loss(a.loss)
    loss_kwargs = _loss_kwargs(cfg, shuffle)
    lengths = batch["prompt_mask"].sum(-1) + batch["mask"].sum(-1)
    for _ in range(a.epochs):
        perm = torch.randperm(n, generator=shuffle)
        for mb in perm.chunk(a.mini_batches):
            mb_mask = batch["mask"][mb]
            optimizer.zero_grad(set_to_none=True)
            for local in _micro_batches(mb, lengths, a):
                rows = mb[local]
                mask = batch["mask"][rows]
                width = max(int(mask.sum(-1).max()), 1)  # trim padding columns this micro-batch does not use
                mask = mask[:, :width]
                prompt_mask = batch["prompt_mask"][rows]
                lead = int((prompt_mask.cumsum(-1) == 0).sum(-1).min())  # left-padding columns common to all rows
                need_entropy = a.entropy_coef != 0
                lp, ent = response_logprobs(model, batch["prompt_ids"][rows, lead:], prompt_mask[:, lead:],
                                            batch["response_ids"][rows, :width], mask, temp,
                                            with_entropy=need_entropy)
                extra = {k: batch[k][rows, :width] if batch.get(k) is not None else None
                         for k in ("is_weights", "token_weights")}
                old = lp.detach() if batch["logprobs"] is None else batch["logprobs"][rows, :width]
                loss, st = loss_fn(lp, old, advantages[rows, :width], mask,
                                   agg=a.loss_agg, max_response_len=cfg.sampling.max_new_tokens, **extra,
                                   **loss_kwargs)
                if a.kl_coef > 0:
                    kl = aggregate(kl_k3(lp, batch["ref_logprobs"][rows, :width], mask), mask, a.loss_agg,
                                   cfg.sampling.max_new_tokens)
                    loss = loss + a.kl_coef * kl
                    st["kl/mean"] = float(kl.detach())
                if need_entropy:
                    ent_term = aggregate(ent, mask, a.loss_agg, cfg.sampling.max_new_tokens)
                    loss = loss - a.entropy_coef * ent_term
                    st["loss/entropy"] = float(ent_term.detach())
                if not torch.isfinite(loss):
                    raise NonFiniteError(f"loss is {float(loss.detach())} (pg={st.get('loss/pg')}); update skipped")
                (loss * _micro_weight(mb_mask, local, a.loss_agg)).backward()
                for k, v in st.items():
                    stats.setdefault(k, []).append(float(v))
            clip = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else float("inf")
            grad_norm = torch.nn.utils.clip_grad_norm_(params, clip)
            if not torch.isfinite(grad_norm):
                optimizer.zero_grad(set_to_none=True)
                raise NonFiniteError(f"gradient norm is {float(grad_norm)}; update skipped")
            optimizer.step()
            scheduler.step()
            stats.setdefault("optim/grad_norm", []).append(float(grad_norm))
    out = {k: sum(v) / len(v) for k, v in stats.items()}
    out["optim/lr"] = scheduler.get_last_lr()[0]
    return out


class Controllers:
    """What steers sampling from step to step: the E3 temperature, per-prompt difficulty and the budget curriculum.

    Plain state with `state_dict`, saved in every checkpoint, so a resumed run continues exactly.
    """

    def __init__(self, cfg: Config, vocab_size: int, num_prompts: int):
        from explorl.rollout.budget import BudgetCurriculum, DifficultyTracker
        from explorl.rollout.temperature import E3TemperatureController

        s, b = cfg.sampling, cfg.budget
        self.cfg = cfg
        self.temperature = None
        if s.schedule == "e3":
            self.temperature = E3TemperatureController(
                s.temperature, vocab_size, t_max=cfg.run.steps, anneal=s.e3_anneal, eta=s.e3_eta,
                anneal_frac=s.e3_anneal_frac, tau_floor=s.tau_floor, tau_ceil=s.tau_ceil)
        self.difficulty = DifficultyTracker(num_prompts) if b.policy == "e3" else None
        self.curriculum = (BudgetCurriculum(s.group_size, b.g_min_limit, b.g_max_limit, b.g_step)
                           if b.policy == "e3" else None)

    def sampling_temperature(self, step: int):
        """(temperature for the sampler, training temperature, stats) for 0-based training step `step`."""
        s = self.cfg.sampling
        if self.temperature is not None:
            tau = self.temperature.tau
            return tau, tau, self.temperature.stats()
        if s.schedule in ("ead", "revead"):
            from explorl.rollout import temperature as Tm

            fn = Tm.ead_schedule if s.schedule == "ead" else Tm.revead_schedule
            table = fn(step, s.max_new_tokens, tau_max=s.ead_tau_max, tau_min=s.ead_tau_min, d0=s.ead_d0,
                       alpha=s.ead_alpha, d_max=s.ead_d_max, c=s.ead_c, scale=s.ead_scale) * s.temperature
            values = table.tolist()
            d_s = min(s.ead_d0 + s.ead_alpha * step, s.ead_d_max)
            # behaviour policy only: the optimised policy stays at the base temperature (DESIGN: Temperature)
            return (lambda t: values[t]), s.temperature, {"temperature/ead_d": d_s,
                                                           "temperature/ead_min": min(values)}
        return s.temperature, s.temperature, {}

    def budgets(self, prompt_ids: list[int]) -> list[int]:
        """Rollouts per prompt of a batch."""
        g = self.cfg.sampling.group_size
        if self.difficulty is None:
            return [g] * len(prompt_ids)
        from explorl.rollout.budget import allocate

        g_min, g_max = self.curriculum.bounds()
        return allocate(self.difficulty.k(prompt_ids), g, g_min, g_max)

    def end_of_pass(self) -> None:
        if self.difficulty is not None:
            self.difficulty.end_of_pass()
            self.curriculum.end_of_pass()

    def observe_rewards(self, prompt_ids: list[int], rewards_per_prompt: list[list[float]]) -> None:
        if self.difficulty is not None:
            self.difficulty.update(prompt_ids, rewards_per_prompt)

    def observe_entropy(self, step: int, entropy: float) -> None:
        if self.temperature is not None:
            self.temperature.observe(step, entropy)

    def state_dict(self) -> dict:
        return {k: getattr(self, k).state_dict() for k in ("temperature", "difficulty", "curriculum")
                if getattr(self, k) is not None}

    def load_state_dict(self, state: dict) -> None:
        for k, v in state.items():
            getattr(self, k).load_state_dict(v)


def collect_rollouts(model, tok, task, runner, stream: PromptStream, controllers: Controllers, cfg: Config,
                     step: int, generator: torch.Generator):
    """Sample and score one step's batch (with DAPO dynamic sampling when configured).

    Returns (problems, rollouts, texts, rewards, info): `problems[g]` is the problem of group g; `info` holds the
    training temperature, the reward-function error counts and per-step statistics.
    """
    s, b = cfg.sampling, cfg.budget
    temp_arg, train_temp, info = controllers.sampling_temperature(step)
    info = dict(info)
    want = cfg.run.batch_size
    problems: list = []
    parts, texts, rewards = [], [], []
    errors = timeouts = rounds = sampled_groups = 0
    while True:
        epoch = stream.epoch
        ids = stream.next(want - len(problems))
        if stream.epoch != epoch:
            controllers.end_of_pass()
        round_problems = [task.train[i] for i in ids]
        prompts = [tok.encode(p.prompt, add_special_tokens=False) for p in round_problems]
        ro = sample(model, prompts, controllers.budgets(ids), eos_token_id=tok.eos_token_id,
                    pad_token_id=tok.pad_token_id, max_new_tokens=s.max_new_tokens, temperature=temp_arg,
                    top_p=s.top_p, generator=generator, fast_path=s.fast_path)
        round_texts = decode_responses(tok, ro)
        group = ro.group.tolist()
        rr = runner(round_texts, [round_problems[g].answer for g in group], [round_problems[g].meta for g in group])
        errors, timeouts = errors + rr.errors, timeouts + rr.timeouts
        per_prompt = [[rr.rewards[i] for i, g in enumerate(group) if g == j] for j in range(len(ids))]
        controllers.observe_rewards(ids, per_prompt)
        sampled_groups += len(ids)
        keep = [j for j in range(len(ids)) if per_prompt[j]]
        if b.policy == "dapo":  # drop groups whose rewards all agree: their GRPO advantage is zero
            keep = [j for j in keep if max(per_prompt[j]) > min(per_prompt[j])][:want - len(problems)]
        last_round = b.policy != "dapo" or rounds >= b.dapo_max_rounds
        if not keep and last_round and not problems:
            keep = [j for j in range(len(ids)) if per_prompt[j]]  # nothing informative at all: train on it anyway
        new_id = {j: len(problems) + i for i, j in enumerate(keep)}
        rows = [i for i, g in enumerate(group) if g in new_id]
        part = ro.select(torch.tensor(rows, dtype=torch.long, device=ro.group.device))
        part.group = torch.tensor([new_id[g] for g in part.group.tolist()], dtype=torch.long, device=ro.group.device)
        parts.append(part)
        problems += [round_problems[j] for j in keep]
        texts += [round_texts[i] for i in rows]
        rewards += [rr.rewards[i] for i in rows]
        if len(problems) >= want or last_round:
            break
        rounds += 1
    ro = parts[0] if len(parts) == 1 else Rollouts.cat(parts, tok.pad_token_id)
    info.update({"train_temperature": train_temp, "errors": errors, "timeouts": timeouts})
    if b.policy == "dapo":
        info["rollouts/dapo_rounds"] = rounds
        info["rollouts/dapo_kept_frac"] = len(problems) / max(sampled_groups, 1)
    return problems, ro, texts, rewards, info


# Every key written to metrics.jsonl at each training step, with its meaning (the README's table comes from here).
STEP_METRICS: dict[str, str] = {
    "step": "training step (1-based)",
    "reward/mean": "mean reward of the step's responses",
    "reward/std": "population std of the rewards",
    "reward/correct_frac": "fraction of responses with reward > 0.5",
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
    "loss/ppo_kl": "mean of logp_old - logp_new over tokens",
    "loss/nonfinite": "1 when this step's update was skipped for a non-finite loss or gradient",
    "optim/grad_norm": "global gradient norm before clipping",
    "optim/lr": "learning rate after the step",
    "perf/step_s": "wall time of the step",
    "perf/sample_s": "wall time of sampling",
    "perf/update_s": "wall time of the policy update (epochs x mini-batches)",
    "perf/tokens_per_s": "generated tokens per second of sampling",
}
# Present only when configured (README lists them): kl/mean (a reference model is kept), loss/entropy
# (algo.entropy_coef != 0), temperature/tau|h_target|h_init|clamped (E3 schedule), temperature/ead_d|ead_min
# (EAD), is/* (algo.tis), rollouts/dapo_rounds|dapo_kept_frac (DAPO sampling), loss/clip_cov_frac,
# loss/kl_cov_frac (those losses), eval/* (run.eval_every > 0, and once after the last step).


def method_metrics(batch: dict, base_adv: torch.Tensor, advantages: torch.Tensor, response_mask: torch.Tensor,
                   a) -> dict:
    """What the configured method did to the batch: tokens masked or down-weighted, importance weights."""
    valid = response_mask > 0
    n_valid = max(int(valid.sum()), 1)
    weights = batch["mask"]  # 0 on responses removed by overlong masking
    if batch.get("token_weights") is not None:
        weights = weights * batch["token_weights"]
    out = {"tokens/masked_frac": float(((weights == 0) & valid).sum()) / n_valid,
           "tokens/downweighted_frac": float(((advantages.abs() < base_adv.abs() - 1e-12) & valid).sum()) / n_valid}
    if batch.get("is_weights") is not None:
        out.update(tis_stats(batch["logprobs"], batch["behavior_logprobs"], batch["mask"], cap=a.tis_cap))
    return out


def rollout_metrics(ro, rewards: torch.Tensor, entropy: torch.Tensor, advantages: torch.Tensor) -> dict:
    """Per-step statistics of a batch of rollouts (namespaced metric names, DESIGN: Runs)."""
    mask = ro.mask
    correct = rewards > 0.5
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
# run directory: checkpoints written to a temporary name and renamed, so a kill never leaves a half checkpoint


def _checkpoint_dirs(run_dir: Path) -> list[Path]:
    root = run_dir / "checkpoints"
    return sorted(p for p in root.glob("step_*") if p.is_dir()) if root.exists() else []


def save_checkpoint(run_dir: Path, step: int, model, optimizer, scheduler, state: dict, keep: int) -> Path:
    from safetensors.torch import save_file

    root = run_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:07d}"
    tmp = root / f".tmp_step_{step:07d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    trainable = {n: p.detach().cpu().contiguous() for n, p in model.named_parameters() if p.requires_grad}
    save_file(trainable, str(tmp / "trainable.safetensors"))
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), **state},
               tmp / "trainer_state.pt")
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    for old in _checkpoint_dirs(run_dir)[:-max(keep, 1)]:
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
    state = torch.load(path / "trainer_state.pt", map_location="cpu", weights_only=False)
    optimizer.load_state_dict(state.pop("optimizer"))
    scheduler.load_state_dict(state.pop("scheduler"))
    return state


def _append_jsonl(path: Path, record: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record, default=_json_default) + "\n")
        f.flush()
        os.fsync(f.fileno())


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


def _truncate_metrics(path: Path, done_steps: int) -> None:
    """On resume, drop records of steps after the checkpoint: they will be recomputed identically."""
    if not path.exists():
        return
    keep = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= done_steps]
    path.write_text("".join(line + "\n" for line in keep))


# ----------------------------------------------------------------------------------------------------------------


def train(cfg: Config, *, resume: str | Path | None = None, console=None, progress: bool = True) -> Path:
    """Run GRPO-style RL as configured; returns the run directory. `resume` continues a killed run."""
    from rich.console import Console

    console = console or Console()
    if resume is not None:
        run_dir = Path(resume)
        if not (run_dir / "config.yaml").exists():
            raise FileNotFoundError(f"--resume {run_dir}: no config.yaml there; is it a run directory?")
    else:
        run_dir = Path(cfg.run.out_dir)
    r = cfg.run
    if r.threads > 0:
        torch.set_num_threads(r.threads)
    torch.manual_seed(r.seed)
    random.seed(r.seed)

    model, tok, device = load_policy(cfg.model)
    task = load_task(cfg.task)
    runner = RewardRunner(task.reward_fn, isolate=task.isolate, timeout_s=cfg.task.reward_timeout_s)
    need_ref = cfg.algo.kl_coef > 0 or cfg.algo.advantage == "erpo"  # ERPO's progress signal is against pi_ref
    ref = make_reference(model) if need_ref else None
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    o = cfg.optim
    optimizer = torch.optim.AdamW(params, lr=o.lr, betas=(o.beta1, o.beta2), weight_decay=o.weight_decay,
                                  foreach=device.type == "cuda")
    total_updates = r.steps * cfg.algo.epochs * cfg.algo.mini_batches
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(o.warmup_steps, total_updates, o.min_lr_ratio))
    stream = PromptStream(len(task.train), r.seed)
    controllers = Controllers(cfg, model.config.vocab_size, len(task.train))
    sampler_gen = torch.Generator(device=device).manual_seed(r.seed)
    shuffle_gen = torch.Generator().manual_seed(r.seed + 1)
    start, nonfinite_run = 0, 0
    metrics_path = run_dir / "metrics.jsonl"

    if resume is not None and _checkpoint_dirs(run_dir):
        ckpt = _checkpoint_dirs(run_dir)[-1]
        state = load_checkpoint(ckpt, model, optimizer, scheduler)
        start = state["step"]
        stream.load_state_dict(state["stream"])
        sampler_gen.set_state(state["sampler_rng"])
        shuffle_gen.set_state(state["shuffle_rng"])
        torch.set_rng_state(state["torch_rng"])
        if device.type == "cuda" and state.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(state["cuda_rng"], device)
        random.setstate(state["python_rng"])
        nonfinite_run = state.get("nonfinite_run", 0)
        controllers.load_state_dict(state.get("controllers", {}))
        _truncate_metrics(metrics_path, start)
        console.print(f"[bold]resuming[/] {run_dir} from {ckpt.name} (step {start}/{r.steps})")
    else:
        if run_dir.exists() and (metrics_path.exists() or _checkpoint_dirs(run_dir)):
            raise FileExistsError(f"run directory {run_dir} already holds a run; continue it with "
                                  f"`explorl train --resume {run_dir}` or choose another run.out_dir")
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(dump_yaml(cfg))

    def checkpoint(step: int) -> None:
        state = {"step": step, "stream": stream.state_dict(), "sampler_rng": sampler_gen.get_state(),
                 "shuffle_rng": shuffle_gen.get_state(), "torch_rng": torch.get_rng_state(),
                 "cuda_rng": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
                 "python_rng": random.getstate(), "nonfinite_run": nonfinite_run,
                 "controllers": controllers.state_dict()}
        save_checkpoint(run_dir, step, model, optimizer, scheduler, state, r.keep_checkpoints)

    def run_eval(step: int) -> dict:
        summary, _ = evaluate(model, tok, task.eval, task, n=r.eval_n, ks=r.eval_k, temperature=r.eval_temperature,
                              top_p=cfg.sampling.top_p, max_new_tokens=cfg.sampling.max_new_tokens,
                              seed=r.seed + 10_007 * (step + 1), reward_timeout_s=cfg.task.reward_timeout_s,
                              fast_path=cfg.sampling.fast_path)
        model.train()
        return summary

    s = cfg.sampling
    bar = _Progress(console, r.steps, start, enabled=progress)
    last_eval: dict = {}
    try:
        for step in range(start, r.steps):
            t0 = time.perf_counter()
            a = cfg.algo
            problems, ro, texts, reward_list, info = collect_rollouts(model, tok, task, runner, stream, controllers,
                                                                      cfg, step, sampler_gen)
            t_sample = time.perf_counter() - t0
            train_temp = info.pop("train_temperature")
            rewards = torch.tensor(reward_list, dtype=torch.float32, device=device)
            if a.overlong == "penalty":  # DAPO eq. 13: soft penalty for responses that run into the limit
                rewards = rewards + overlong_penalty(ro.lengths, ro.truncated, s.max_new_tokens,
                                                     buffer=a.overlong_buffer, penalty=a.overlong_penalty)
            loss_mask = ro.mask
            if a.overlong == "mask":  # DAPO overlong filtering: truncated responses do not train
                loss_mask = ro.mask * (~ro.truncated).to(ro.mask.dtype)[:, None]
            with torch.no_grad():
                if on_policy_single_update(cfg):
                    # the only update sees the sampling weights: pi_old is the training forward itself (detached),
                    # and the sampler's entropies are the policy's at this temperature. Saves a forward pass.
                    old_lp, old_ent = None, ro.entropy
                else:
                    old_lp, old_ent = response_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.response_ids,
                                                        ro.mask, train_temp)
                batch = {"prompt_ids": ro.prompt_ids, "prompt_mask": ro.prompt_mask, "response_ids": ro.response_ids,
                         "mask": loss_mask, "rewards": rewards, "group": ro.group, "logprobs": None if old_lp is None else old_lp * loss_mask,
                         "entropy": old_ent * loss_mask, "behavior_logprobs": ro.behavior_logprobs * loss_mask}
                if need_ref:
                    with reference_mode(model, ref) as ref_model:
                        batch["ref_logprobs"], _ = response_logprobs(
                            ref_model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, loss_mask, train_temp,
                            with_entropy=False)
                advantages = get_advantage(a.advantage)(batch, a)
                base_adv = advantages
                for name in a.shapers:
                    advantages = get_shaper(name)(advantages, batch, a, step + 1)
                if a.token_filter == "forking":
                    batch["token_weights"] = forking_mask(batch["entropy"], loss_mask, top_frac=a.forking_top_frac)
                if a.tis:
                    batch["is_weights"] = tis_weights(batch["logprobs"], batch["behavior_logprobs"], loss_mask,
                                                      cap=a.tis_cap)
            h_now = float((old_ent * ro.mask).sum() / ro.mask.sum().clamp_min(1))
            controllers.observe_entropy(step + 1, h_now)
            t1 = time.perf_counter()
            record = {"step": step + 1}
            record.update(rollout_metrics(ro, rewards, old_ent, advantages))
            record["reward/errors"] = info.pop("errors")
            record["reward/timeouts"] = info.pop("timeouts")
            record.update(info)
            record["temperature/train"] = train_temp
            record.update(method_metrics(batch, base_adv, advantages, ro.mask, a))
            if "ref_logprobs" in batch and old_lp is not None:
                record["kl/mean"] = float(masked_mean(kl_k3(old_lp, batch["ref_logprobs"], loss_mask), loss_mask))
            try:
                record.update(update_policy(model, optimizer, scheduler, batch, advantages, cfg, shuffle_gen, ref,
                                            temperature=train_temp))
                record["loss/nonfinite"] = 0
                nonfinite_run = 0
            except NonFiniteError as e:
                nonfinite_run += 1
                record["loss/nonfinite"] = 1
                console.print(f"[bold red]step {step + 1}: {e}.[/] The weights were not changed by it "
                              f"({nonfinite_run} such step(s) in a row; limit run.max_nonfinite_steps="
                              f"{r.max_nonfinite_steps}).")
            stop = nonfinite_run >= r.max_nonfinite_steps
            t2 = time.perf_counter()
            n_tokens = float(ro.mask.sum())
            record.update({"perf/step_s": t2 - t0, "perf/sample_s": t_sample, "perf/update_s": t2 - t1,
                           "perf/tokens_per_s": n_tokens / max(t_sample, 1e-9)})
            if r.eval_every > 0 and (step + 1) % r.eval_every == 0 and step + 1 < r.steps:
                last_eval = run_eval(step + 1)
                record.update({f"eval/{k}": v for k, v in last_eval.items()})
            _append_jsonl(metrics_path, _clean(record))
            _log_samples(run_dir / "samples.jsonl", step + 1, problems, ro, texts, reward_list, r.log_samples)
            bar.update(step + 1, record)
            if stop:
                raise RuntimeError(f"stopping: {nonfinite_run} consecutive steps had a non-finite loss or "
                                   f"gradient. Lower optim.lr, check the reward function, or raise "
                                   f"run.max_nonfinite_steps. Last good checkpoint: {run_dir / 'checkpoints'}")
            if r.save_every > 0 and (step + 1) % r.save_every == 0 and step + 1 < r.steps:
                checkpoint(step + 1)
        final = run_eval(r.steps)
        (run_dir / "eval.json").write_text(json.dumps({"step": r.steps, **final}, indent=2))
        checkpoint(r.steps)
        _append_jsonl(metrics_path, _clean({"step": r.steps, **{f"eval/{k}": v for k, v in final.items()}}))
        save_final_model(run_dir / "final", model, tok)
    finally:
        bar.close()
    return run_dir


def save_final_model(path: Path, model, tok) -> None:
    """The trained policy as a Hugging Face directory (LoRA: the adapter, loadable with peft)."""
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp))
    tok.save_pretrained(str(tmp))
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)


def _log_samples(path: Path, step: int, problems, ro, texts, rewards, k: int) -> None:
    if k <= 0:
        return
    group = ro.group.tolist()
    with open(path, "a") as f:
        for j, p in enumerate(problems[:k]):
            rows = [i for i, g in enumerate(group) if g == j]
            f.write(json.dumps({"step": step, "prompt": p.prompt, "answer": p.answer,
                                "completions": [texts[i] for i in rows],
                                "rewards": [rewards[i] for i in rows]}) + "\n")


class _Progress:
    """A rich progress bar with the key metrics; plain lines every 10 steps when not on a terminal."""

    def __init__(self, console, total: int, start: int, enabled: bool = True):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.console = console
        self.live = enabled and console.is_terminal
        self.enabled = enabled
        self.progress = None
        if self.live:
            self.progress = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                                     TimeRemainingColumn(), TextColumn("{task.fields[info]}"), console=console)
            self.progress.start()
            self.task = self.progress.add_task("train", total=total, completed=start, info="")

    @staticmethod
    def _info(rec: dict) -> str:
        def g(k):
            v = rec.get(k)
            return float("nan") if v is None else v
        return (f"reward {g('reward/mean'):.3f}  entropy {g('entropy/mean'):.3f}  "
                f"all-wrong {g('reward/all_wrong_frac'):.2f}  len {g('length/mean'):.1f}  "
                f"{g('perf/step_s'):.2f}s/step")

    def update(self, step: int, rec: dict) -> None:
        if self.live:
            self.progress.update(self.task, completed=step, info=self._info(rec))
        elif self.enabled and (step % 10 == 0 or step == 1):
            self.console.print(f"step {step}: {self._info(rec)}")

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()


def train_from_files(config_path: str | None, overrides: list[str]) -> Path:
    return train(load_config(config_path, overrides))
