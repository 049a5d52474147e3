"""Why ERPO does not learn on the testbed (issue "Coverage at equal entropy"): its token term pulls the policy back
to the reference model.

ERPO's token term (docs/methods.md §3, paper 001 eq. 10) is `eta * Psi` with `Psi ~ W * sign(A_group) * s~` and
`s = beta * (log pi_old - log pi_ref)`: in a wrong response (sign -1) a token the policy has raised above the
reference (s > 0) is pushed down and a lowered one pushed up, back towards the reference; in a right response the
reverse. The paper calls the term an entropy-weighted relative-entropy regulariser (section 4.5.1). Which way it
pulls on balance depends on how many responses are wrong: on the testbed about 1 to 3 of a group's 16.

1. Four 50-step runs from seed 0 on the testbed's settings: `erpo`, `erpo` without its KL term (`algo.kl_coef=0`),
   `erpo` without its token term (`algo.erpo.eta=0`, which leaves GRPO's advantage z-scored over tokens) and its
   GRPO baseline (token-mean, clip 0.2/0.2); the mean training reward over steps 1-25 and 26-50.
2. The first 20 steps of `erpo` with every advantage call recorded: over the tokens of the wrong and right responses
   (by the sign of their group advantage), the sum of (the token term's share of the advantage) x s. A negative
   sum pushes s towards 0 (towards the reference), a positive one away from it.

    OMP_NUM_THREADS=1 python bench/erpo_pull.py     # about 8 min on one core
    OMP_NUM_THREADS=1 python bench/erpo_pull.py --override 'task.difficulties=[1, 2]' --out runs/erpo_pull_easy
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from learning import RECIPES, spec, testbed_overrides  # noqa: E402

VARIANTS = {  # name: (method of bench/learning.py, extra overrides)
    "erpo": ("erpo", []),
    "erpo, kl_coef 0": ("erpo", ["algo.kl_coef=0"]),
    "erpo, eta 0": ("erpo", ["algo.erpo.eta=0"]),
    "grpo baseline": ("grpo__token-mean__0.2-0.2", []),
}


def run(method: str, extra: list[str], out: Path, steps: int, seed: int, overrides: list[str]) -> Path:
    """Train `method` for `steps` on the testbed's settings and `overrides` into `out` (kept: a finished run is not
    redone)."""
    from explorl.config import load_config
    from explorl.train.loop import train

    if (out / "final").exists():
        return out
    shutil.rmtree(out, ignore_errors=True)
    recipe, method_extra = spec(method)
    cfg = load_config(RECIPES / f"{recipe}.yaml", [
        *testbed_overrides(), f"run.seed={seed}", f"run.out_dir={out}", f"run.steps={steps}", "run.save_every=0",
        "run.eval_every=0", "run.eval_n=2", "run.eval_k=[1,2]", "run.threads=1", *overrides, *method_extra, *extra])
    train(cfg, progress=False)
    return out


def mean_rewards(run_dir: Path, window: int) -> list[float]:
    rewards = [r["reward/mean"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
               if "reward/mean" in r]
    return [sum(rewards[a:a + window]) / len(rewards[a:a + window]) for a in range(0, len(rewards), window)]


def pull(calls: list[dict]) -> dict[str, tuple[float, int]]:
    """{"wrong" / "right": (sum over their tokens of (A - A at eta 0) * s, tokens)} over the recorded `erpo` calls.
    Responses are split by the sign of their group advantage, ERPO's own anchor (with 0/1 rewards: wrong and right);
    a response with advantage 0, such as every one of a group whose rewards are all equal, is in neither."""
    from explorl.algos.advantages import erpo, grpo

    out = {"wrong": [0.0, 0], "right": [0.0, 0]}
    for c in calls:
        adv = erpo(c["rewards"], c["group"], c["mask"], c["entropy"], c["logprobs"], c["ref_logprobs"],
                   options=c["options"])
        adv0 = erpo(c["rewards"], c["group"], c["mask"], c["entropy"], c["logprobs"], c["ref_logprobs"],
                    options=dataclasses.replace(c["options"], eta=0.0))
        share = adv.double() - adv0.double()
        s = (c["logprobs"] - c["ref_logprobs"]).double()
        anchor = grpo(c["rewards"].double(), c["group"], torch.ones(len(c["rewards"]), 1))[:, 0]
        for name, rows in (("wrong", anchor < 0), ("right", anchor > 0)):
            tokens = c["mask"].bool() & rows[:, None]
            out[name][0] += float((share * s)[tokens].sum())
            out[name][1] += int(tokens.sum())
    return {k: (v[0], v[1]) for k, v in out.items()}


def record_calls(out: Path, steps: int, seed: int, overrides: list[str]) -> list[dict]:
    """Train `erpo` for `steps`, keeping the inputs of every call of its advantage."""
    import explorl.algos.methods.erpo as advantages  # the module whose adapter calls `erpo`

    calls, real = [], advantages.erpo

    def recording(rewards, group, mask, entropy, logprobs, ref_logprobs, *, options):
        calls.append({"rewards": rewards.clone(), "group": group.clone(), "mask": mask.clone(),
                      "entropy": entropy.clone(), "logprobs": logprobs.clone(),
                      "ref_logprobs": ref_logprobs.clone(), "options": options})
        return real(rewards, group, mask, entropy, logprobs, ref_logprobs, options=options)

    advantages.erpo = recording
    try:
        shutil.rmtree(out, ignore_errors=True)
        run("erpo", [], out, steps, seed, overrides)
    finally:
        advantages.erpo = real
    return calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("runs/erpo_pull"))
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--probe-steps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for every run, over the testbed's settings (repeatable)")
    args = ap.parse_args()
    torch.set_num_threads(1)

    print(f"| run | mean reward, steps 1-{args.steps // 2} | steps {args.steps // 2 + 1}-{args.steps} |")
    print("|---|---:|---:|")
    for name, (method, extra) in VARIANTS.items():
        slug = name.replace(", ", "_").replace(" ", "_")
        means = mean_rewards(run(method, extra, args.out / slug, args.steps, args.seed, args.override), args.steps // 2)
        print(f"| {name} | " + " | ".join(f"{m:.4f}" for m in means[:2]) + " |", flush=True)

    calls = record_calls(args.out / "probe", args.probe_steps, args.seed, args.override)
    print(f"\n| responses (mixed groups, {args.probe_steps} steps) | tokens | sum of token-term share x s |")
    print("|---|---:|---:|")
    for name, (total, tokens) in pull(calls).items():
        print(f"| {name} | {tokens} | {total:+.1f} |")


if __name__ == "__main__":
    main()
