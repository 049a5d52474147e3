"""Where covariance-weighted GRPO's weights go: by outcome, by token probability, by task difficulty.

Paper 002's kernel `w = exp(-c^2 / 2 sigma^2)` depends on `c = (logp - mean logp)(A - mean A)`, so its largest
|c| sit where |A| is largest. Under GRPO's group normalisation |A| is largest for the *rarer* outcome of a group:
correct answers when the model mostly fails. This script samples one batch per arithmetic difficulty level from
a policy (the embedded default unless `--model`), computes GRPO advantages, the old policy's log-probs with the
training forward, and both CW readings (`cov_weights`: the batch statistics of docs/methods.md §4;
`cov_weights_grouped`: paper 002's per-group ones), and prints per level:

  correct     fraction of correct responses
  w+ / w-     mean weight w~ on the tokens of correct / wrong responses (1.0 = untouched)
  w+lo / w-lo the same on low-probability tokens (old log-prob < -1)
  kept+/kept- share of the positive / negative advantage mass that survives: sum(w~ A) / sum(A) over A > 0 / < 0
  mean w~A    the mean token advantage after weighting (GRPO's own is ~0 by construction)

    python bench/cw_weights.py                 # embedded default, 32 prompts x 8 samples per level, < 1 min
    python bench/cw_weights.py --model runs/grpo/final
"""

from __future__ import annotations

import argparse
import json

import torch
from rich.console import Console
from rich.table import Table

from explorl.algos.advantages import cov_weights, cov_weights_grouped, grpo
from explorl.config import ModelConfig, TaskConfig
from explorl.evaluation.evaluate import decode_responses
from explorl.models import load_policy
from explorl.rewards import RewardRunner
from explorl.rollout.logprobs import LogprobOptions, response_logprobs
from explorl.rollout.engines.native import sample
from explorl.rollout.sampler import Sampler
from explorl.tasks import load_task


def weight_stats(w: torch.Tensor, adv: torch.Tensor, logprobs: torch.Tensor, correct: torch.Tensor,
                 mask: torch.Tensor) -> dict:
    """Where the weights `w` [N, T] put the advantage `adv` [N, T] (see the module docstring)."""
    valid = mask.bool()
    pos, neg = valid & correct[:, None], valid & ~correct[:, None]
    low = logprobs < -1.0
    a, wa = adv.double(), (w * adv).double()

    def mean(x, where):
        return float(x[where].mean()) if where.any() else float("nan")

    def kept(where):
        total = float(a[where].sum())
        return float(wa[where].sum()) / total if total != 0 else float("nan")

    return {"w+": mean(w, pos), "w-": mean(w, neg), "w+lo": mean(w, pos & low), "w-lo": mean(w, neg & low),
            "kept+": kept(valid & (a > 0)), "kept-": kept(valid & (a < 0)), "mean w~A": mean(wa, valid)}


def level_batch(model, tok, level: int, prompts: int, n: int, seed: int, max_new_tokens: int) -> dict:
    task = load_task(TaskConfig(difficulties=[level], train_size=prompts, eval_size=1, data_seed=seed))
    problems = task.train[:prompts]
    ids = [tok.encode(p.prompt, add_special_tokens=False) for p in problems]
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    ro = sample(Sampler(model, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                        max_new_tokens=max_new_tokens),
                ids, n, temperature=1.0, generator=gen)
    texts = decode_responses(tok, ro)
    runner = RewardRunner(task.reward_fn, isolate=task.isolate)
    rewards = torch.tensor(runner(texts, [problems[g].answer for g in ro.group.tolist()]).rewards,
                           dtype=torch.float32)
    with torch.no_grad():
        logprobs, _ = response_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.mask, 1.0,
                                        options=LogprobOptions(with_entropy=False))
    return {"rewards": rewards, "group": ro.group, "mask": ro.mask, "logprobs": logprobs * ro.mask}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--levels", default="1,2,3,4,5")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--json", help="also write the rows to this file")
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    model, tok, _ = load_policy(ModelConfig(path=args.model))
    model.eval()
    table = Table(title=f"CW-GRPO weights on {args.model}: {args.prompts} prompts x {args.n} samples per level")
    cols = ["w+", "w-", "w+lo", "w-lo", "kept+", "kept-", "mean w~A"]
    for c in ["level", "correct", "reading", *cols]:
        table.add_column(c, justify="right")
    rows = []
    for level in [int(x) for x in args.levels.split(",")]:
        b = level_batch(model, tok, level, args.prompts, args.n, args.seed, args.max_new_tokens)
        adv = grpo(b["rewards"], b["group"], b["mask"])
        correct = b["rewards"] > 0.5
        for reading, w in (("batch", cov_weights(adv, b["logprobs"], b["mask"])),
                           ("group", cov_weights_grouped(adv, b["logprobs"], b["group"], b["mask"]))):
            stats = weight_stats(w, adv, b["logprobs"], correct, b["mask"])
            rows.append({"level": level, "correct": float(correct.float().mean()), "reading": reading, **stats})
            table.add_row(str(level), f"{rows[-1]['correct']:.3f}", reading, *[f"{stats[c]:.3f}" for c in cols])
    Console(width=120).print(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
