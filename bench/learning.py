"""The papers' learning claims on the embedded default: every method, several seeds, one rollout budget.

Runs each recipe for every seed (same steps x prompts x group size, so the same number of rollouts; DAPO's extra
sampling rounds are counted and reported, since dynamic sampling spends more rollouts by design), evaluates the
final policy on the held-out split with n = 32 samples per problem, and writes:
- `OUT/<method>/seed<k>/`: the run directories; `bench/results/<OUT name>/<method>/seed<k>.json`: each run's
  summary, committed as it lands (a recorded run is not run again);
- `OUT/summary.json` and a printed table: final pass@1, pass@8, pass@32 (mean and 95% interval across seeds),
  entropy at the end, all-wrong fraction over the last third of training, mean response length, rollouts used;
- `OUT/compare/index.html`: `explorl compare` over all runs (overlaid curves, per-config intervals).

Aggregation control: a method is compared with a GRPO baseline of its own objective (loss aggregation and clip
range, `objective`); the baselines a comparison needs are added to the run list (`grpo` itself for recipes on the
GRPO objective, `grpo__<aggregation>__<eps_low>-<eps_high>` for the others), and the table's last columns are the
per-seed paired differences to that baseline (same seed: same prompts order and initial sampling state).

    python bench/learning.py                      # the full comparison: ~11 methods x 3 seeds x ~2 min on 2 cores
    python bench/learning.py --quick              # a one-minute smoke run (3 steps, 1 seed, 3 methods)

This is the longer, documented command of the learning part of bench/RESULTS.md (not part of `make bench`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "configs" / "recipes"
METHODS = ["grpo", "dapo", "e3_ts", "e3_ts_an", "e3", "erpo", "cw_grpo", "cw_grpo_group", "ead", "ead_tis",
           "still_ppl", "still_position"]
# methods run from another recipe with overrides: paper 002's per-group reading of the CW statistics
VARIANTS = {"cw_grpo_group": ("cw_grpo", ["algo.shapers=[cw_group]"]),
            # explorl's sign-balanced covariance weights (not the paper's; docs/methods.md §4)
            "cw_balanced": ("cw_grpo", ["algo.shapers=[cw_balanced]"]),
            # explorl's: a right answer reached through a false stated equation scores 0 (docs/methods.md §8f)
            "grpo_verified": ("grpo", ["task.reward=verified"]),
            # explorl's: the KL to the base model on the tokens that begin a line only (docs/methods.md §5ae), over
            # GRPO's objective; the second the same at a quarter of the coefficient (0.25)
            "grpo_line_start_kl": ("grpo", ["algo.kl_coef=1.0", "algo.kl_tokens=line_starts"]),
            "grpo_line_start_kl_beta025": ("grpo", ["algo.kl_coef=0.25", "algo.kl_tokens=line_starts"]),
            # combinations (paper 003's limitations: EAD with other exploration methods; papers 000/003's future work)
            "ead_e3_budget": ("ead_tis", ["budget.policy=e3"]),
            "ead_erpo": ("ead_tis", ["algo.advantage=erpo", "algo.kl_coef=0.001", "algo.erpo.beta_progress=0.1",
                                     "algo.erpo.gamma=5.0", "algo.erpo.eta=0.2", "algo.erpo.num_buckets=10",
                                     "algo.erpo.sigma_target=1.0", "optim.weight_decay=0.001"]),
            "ead_forking": ("ead_tis", ["algo.token_filter=forking"]),
            "adaptive_e3_budget": ("adaptive_temperature", ["budget.policy=e3"]),
            # clip-higher where it can act: 4 mini-batches per batch (the recipes update once, at ratio 1)
            "grpo_token_mean_mb4": ("grpo", ["algo.loss_agg=token-mean", "algo.mini_batches=4"]),
            "clip_higher_mb4": ("grpo", ["algo.loss_agg=token-mean", "algo.eps_high=0.28", "algo.mini_batches=4"])}


def interval(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% t-interval across seeds (0 with one seed): `report.seeds.seed_stat`."""
    from explorl.report.seeds import seed_stat

    stat = seed_stat(values)
    return stat.mean, stat.half_width or 0.0


TESTBED = ROOT / "configs" / "testbed" / "testbed.yaml"


def testbed_overrides(path: Path = TESTBED) -> list[str]:
    """The testbed's shared settings as `key.sub=value` overrides (layered over each recipe)."""
    import yaml

    def flat(node: dict, prefix: str = "") -> list[str]:
        out = []
        for k, v in node.items():
            out += flat(v, f"{prefix}{k}.") if isinstance(v, dict) else [f"{prefix}{k}={json.dumps(v)}"]
        return out

    return flat(yaml.safe_load(path.read_text()))


def spec(method: str) -> tuple[str, list[str]]:
    """(recipe, overrides) of a method name: a recipe, a VARIANT, or a GRPO baseline `grpo__agg__lo-hi` (with
    `__uN` when it takes N policy updates per rollout batch: N mini-batches)."""
    if method.startswith("grpo__"):
        _, agg, clip, *updates = method.split("__")
        lo, hi = clip.split("-")
        extra = [f"algo.mini_batches={int(updates[0][1:])}"] if updates else []
        return "grpo", [f"algo.loss_agg={agg}", f"algo.eps_low={lo}", f"algo.eps_high={hi}", *extra]
    return VARIANTS.get(method, (method, []))


def objective(method: str) -> tuple[str, float, float, int]:
    """The policy objective a method trains with: (loss aggregation, eps_low, eps_high, policy updates per rollout
    batch). E3's per-question aggregation is GRPO's seq-mean-token-mean when every question has G rollouts, as a
    GRPO baseline has."""
    from explorl.config import load_config

    recipe, extra = spec(method)
    a = load_config(RECIPES / f"{recipe}.yaml", extra).algo
    agg = "seq-mean-token-mean" if a.loss_agg == "seq-mean-token-mean-per-question" else a.loss_agg
    return agg, a.eps_low, a.eps_high, a.epochs * a.mini_batches


def baseline(method: str) -> str:
    """The GRPO run of the same objective as `method`: `grpo` when the objective is the GRPO recipe's."""
    obj = objective(method)
    if obj == objective("grpo"):
        return "grpo"
    return f"grpo__{obj[0]}__{obj[1]:g}-{obj[2]:g}" + (f"__u{obj[3]}" if obj[3] != 1 else "")


def with_baselines(methods: list[str]) -> list[str]:
    """`methods` plus the GRPO baseline of each one's objective, baselines first, no repeats."""
    out = []
    for m in [baseline(m) for m in methods] + methods:
        if m not in out:
            out.append(m)
    return out


RECORDED = ROOT / "bench" / "results"
"""Each finished run's summary is committed here (`<out name>/<method>/seed<k>.json`); a run whose summary is
recorded is not run again, so a comparison continues across sessions even when `runs/` is gone."""


MECHANISM = ("loss/clip_frac_low", "loss/clip_frac_high", "loss/ratio_mean", "loss/clip_cov_frac",
             "loss/kl_cov_frac", "loss/kl_cov_penalty_share", "loss/dual_clip_frac")
"""Per-update statistics of what the clip and the covariance losses did (their mean over the run's steps)."""


def mechanism(steps: list[dict]) -> dict:
    """Whether a run's clip and covariance mechanisms acted: the mean over steps of each `MECHANISM` statistic the
    run logged, and the extremes of the PPO ratio (`loss/ratio_min|max`, the smallest and largest of any update)."""
    out = {k: statistics.fmean(r[k] for r in steps if r.get(k) is not None)
           for k in MECHANISM if any(r.get(k) is not None for r in steps)}
    for key, pick in (("loss/ratio_min", min), ("loss/ratio_max", max)):
        values = [r[key] for r in steps if r.get(key) is not None]
        if values:
            out[key] = pick(values)
    return out


def backfill_mechanism(name: str) -> int:
    """Add `mechanism` to the recorded summaries of runs/NAME whose run directory is still here; returns how many."""
    done = 0
    for record in sorted((RECORDED / name).glob("*/seed*.json")):
        data = json.loads(record.read_text())
        metrics = Path("runs") / name / record.parent.name / record.stem / "metrics.jsonl"
        if "mechanism" in data or not metrics.exists():
            continue
        steps = [r for r in map(json.loads, metrics.read_text().splitlines()) if "reward/mean" in r]
        data["mechanism"] = mechanism(steps)
        record.write_text(json.dumps(data, indent=1) + "\n")
        done += 1
    return done


def run_one(method: str, seed: int, out: Path, args) -> dict:
    from explorl.config import load_config
    from explorl.train.loop import train

    record = RECORDED / out.name / method / f"seed{seed}.json"
    if record.exists():
        return json.loads(record.read_text())
    run_dir = out / method / f"seed{seed}"
    if run_dir.exists() and not (run_dir / "eval.json").exists():  # killed mid-run (no checkpoints: save_every=0)
        print(f"{run_dir}: an unfinished run, started again", flush=True)
        shutil.rmtree(run_dir)
    if not (run_dir / "eval.json").exists():
        overrides = [f"run.seed={seed}", f"run.out_dir={run_dir}", f"run.steps={args.steps}",
                     f"run.eval_n={args.eval_n}", f"run.eval_k={[k for k in (1, 8, 32) if k <= args.eval_n]}",
                     f"run.eval_every={args.eval_every}", "run.save_every=0", f"run.threads={args.threads}"]
        if method == "still_position":  # the paper's window, scaled to the run: the second half
            overrides += [f"algo.position.start={args.steps // 2 + 1}", f"algo.position.steps={args.steps}"]
        recipe, extra = spec(method)
        base = testbed_overrides() if args.testbed else []
        train(load_config(RECIPES / f"{recipe}.yaml", base + overrides + extra), progress=False)
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in steps if "reward/mean" in r]
    last_third = steps[len(steps) - max(1, len(steps) // 3):]
    final = json.loads((run_dir / "eval.json").read_text())
    result = {**{k: final[k] for k in final if k.startswith("pass@")},
            "entropy_start": statistics.fmean(r["entropy/mean"] for r in steps[:5]),
            "entropy_end": statistics.fmean(r["entropy/mean"] for r in last_third[-5:]),
            "all_wrong_last_third": statistics.fmean(r["reward/all_wrong_frac"] for r in last_third),
            "length": statistics.fmean(r["length/mean"] for r in steps),
            # rollouts sampled (DAPO samples groups it then drops: kept / kept fraction)
            "rollouts": sum(r["rollouts/total"] / (r.get("rollouts/dapo_kept_frac") or 1.0) for r in steps),
            "steps": len(steps),
            # what ran: the resolved config (every selected method's options) and the weights it started from
            "config": yaml.safe_load((run_dir / "config.yaml").read_text()),
            "base_fingerprint": final.get("base_fingerprint"),
            "mechanism": mechanism(steps)}
    if not args.quick:  # smoke runs are not results
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps(result, indent=1) + "\n")
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="runs/learning")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--eval-n", type=int, default=32)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--quick", action="store_true", help="3 steps, 1 seed, grpo/e3/ead_tis, n = 8")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch threads per run (0 = torch's default); two processes at --threads 1 use 2 cores")
    ap.add_argument("--testbed", action="store_true",
                    help="layer configs/testbed/testbed.yaml over each recipe (difficulties 3-7, G = 16, lr 1e-4); "
                         "--steps then defaults to the testbed's")
    ap.add_argument("--backfill-mechanism", action="store_true",
                    help="only add the clip statistics (`mechanism`) to recorded summaries of --out whose run "
                         "directories are still here, then stop")
    args = ap.parse_args()
    if args.backfill_mechanism:
        print(f"{backfill_mechanism(Path(args.out).name)} record(s) given their clip statistics")
        return
    if args.testbed and args.out == ap.get_default("out"):
        args.out = "runs/testbed"
    if args.testbed and args.steps == ap.get_default("steps"):
        args.steps = int(next(o.split("=")[1] for o in testbed_overrides() if o.startswith("run.steps=")))
    if args.quick:
        args.steps, args.seeds, args.eval_n, args.eval_every, args.methods = 3, 1, 8, 0, "grpo,e3,ead_tis"
    console = Console(width=160)
    out = Path(args.out)
    methods = with_baselines([m for m in args.methods.split(",") if m])
    results = {m: [run_one(m, seed, out, args) for seed in range(args.seeds)] for m in methods}
    keys = [k for k in ("pass@1", "pass@8", "pass@32") if any(k in r for rs in results.values() for r in rs)]
    delta_keys = list(dict.fromkeys([keys[0], keys[-1]]))  # pass@1 and the largest k
    table = Table(title=f"held-out arithmetic after {args.steps} steps, {args.seeds} seed(s), n = {args.eval_n}")
    for col in ["method", "objective", *keys, "entropy (start)", "entropy (end)", "all-wrong (last third)",
                "length", "rollouts", "baseline", *[f"Δ{k} vs baseline" for k in delta_keys]]:
        table.add_column(col, justify="right")
    summary = {}
    for m, rs in results.items():
        row = {k: interval([r[k] for r in rs]) for k in [*keys, "entropy_start", "entropy_end",
                                                          "all_wrong_last_third", "length", "rollouts"]}
        base = baseline(m)
        deltas = {k: interval([r[k] - b[k] for r, b in zip(rs, results[base])]) for k in delta_keys}
        agg, lo, hi, updates = objective(m)
        summary[m] = {k: {"mean": v[0], "ci95": v[1]} for k, v in row.items()} | {
            "objective": {"loss_agg": agg, "eps_low": lo, "eps_high": hi, "updates": updates}, "baseline": base,
            "vs_baseline": {k: {"mean": v[0], "ci95": v[1]} for k, v in deltas.items()}, "per_seed": rs}
        shown = f"{agg} {lo:g}/{hi:g}" + (f" x{updates}" if updates != 1 else "")
        table.add_row(m, shown, *[f"{row[k][0]:.3f} ± {row[k][1]:.3f}" for k in keys],
                      f"{row['entropy_start'][0]:.3f}", f"{row['entropy_end'][0]:.3f}",
                      f"{row['all_wrong_last_third'][0]:.3f}", f"{row['length'][0]:.1f}", f"{row['rollouts'][0]:.0f}",
                      "-" if base == m else base,
                      *["-" if base == m else f"{deltas[k][0]:+.3f} ± {deltas[k][1]:.3f}" for k in delta_keys])
    console.print(table)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    from explorl.report import compare

    present = [out / m / f"seed{s}" for m in methods for s in range(args.seeds) if (out / m / f"seed{s}").exists()]
    if present:  # runs recorded in an earlier session may be gone from runs/: their curves are not drawn
        report = compare(present, out=out / "compare")
        console.print(f"wrote {out / 'summary.json'} and {report.html}")


if __name__ == "__main__":
    main()
