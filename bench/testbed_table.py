"""The testbed tables of bench/RESULTS.md, from what is recorded: every method's seeds, its GRPO baseline, the
out-of-distribution evaluations and the pass@k curves. Reads only `bench/results/testbed/` (no model, no runs/),
so the tables can be rebuilt at any time and always say what was measured.

- In distribution (difficulties 3-7, 256 problems, n = 32): pass@1/8/32 as mean ± 95% t-interval over seeds, and
  the per-seed paired difference to the method's GRPO baseline (same objective, same seed: same prompt order and
  initial sampling state; `bench/learning.py`); `*` marks a difference whose interval excludes 0.
- pass@128 of seed 0 (n = 128 curves of `bench/testbed_curves.sh`, with the 95% bootstrap interval over problems)
  and its paired difference to the base model over the same problems.
- Out of distribution (difficulties 8-9, never trained on; `bench/testbed_ood.py`): pass@32 over seeds, its
  difference to the base model, and its difference to the method's baseline paired per seed.

    python bench/testbed_table.py            # markdown on stdout, every recorded method
    python bench/testbed_table.py --methods ead_tis,ead_e3_budget   # those rows only, in that order
    python bench/testbed_table.py --paired base__d8-9.json grpo_seed{0,1,2}__d8-9.json   # the narrowing table:
        # each curve (under curves/) minus the first, paired over problems, and the mean ± t-interval over them
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learning import baseline, interval  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "testbed"
# the table's order: baselines, then each paper's methods, then explorl's own, then combinations
ORDER = ["grpo", "grpo__token-mean__0.2-0.2", "grpo__token-mean__0.2-0.28", "grpo__seq-mean-token-sum-norm__0.2-0.2",
         "dr_grpo", "dapo", "entropy_reg", "entropy_adv", "clip_cov", "kl_cov", "forking_tokens", "passk",
         "e3_ts", "e3_ts_an", "e3", "erpo", "cw_grpo", "cw_grpo_group", "cw_balanced", "ead", "ead_tis",
         "still_ppl", "still_position", "adaptive_temperature",
         "ead_e3_budget", "ead_erpo", "ead_forking", "adaptive_e3_budget", "grpo_token_mean_mb4", "clip_higher_mb4"]
CURVE_N = 128
# where a closer control than the objective's GRPO baseline was run: clip-higher against the same 4 mini-batches,
# each combination against the method it adds to (same seed)
CONTROL = {"clip_higher_mb4": "grpo_token_mean_mb4", "ead_e3_budget": "ead_tis", "ead_erpo": "ead_tis",
           "ead_forking": "ead_tis", "adaptive_e3_budget": "adaptive_temperature"}


def load(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def seeds_of(method: str, suffix: str = ".json") -> dict[int, dict]:
    """{seed: record} of a method's recorded runs (`seed<k>.json`) or their OOD evaluations (`seed<k>.ood.json`)."""
    out = {}
    for path in (RESULTS / method).glob(f"seed*{suffix}"):
        stem = path.name[: -len(suffix)]
        if stem[4:].isdigit():
            out[int(stem[4:])] = json.loads(path.read_text())
    return dict(sorted(out.items()))


def fmt(values: list[float]) -> str:
    mean, hw = interval(values)
    return f"{mean:.3f}" if len(values) < 2 else f"{mean:.3f} ± {hw:.3f}"


def fmt_delta(values: list[float]) -> str:
    if not values:
        return "-"
    mean, hw = interval(values)
    if len(values) < 2:
        return f"{mean:+.3f}"
    star = "*" if abs(mean) > hw else ""
    return f"{mean:+.3f} ± {hw:.3f}{star}"


def paired(rs: dict[int, dict], bs: dict[int, dict], key: str) -> list[float]:
    return [rs[s][key] - bs[s][key] for s in rs if s in bs and key in rs[s] and key in bs[s]]


def curve_at(summary: dict | None, k: int) -> tuple[float, float, float] | None:
    if summary is None or k not in summary["curve"]["k"]:
        return None
    return tuple(summary["curve"]["pass@k"][summary["curve"]["k"].index(k)])


def curve_cells(method: str, base_curve: dict | None) -> tuple[str, str]:
    """pass@128 of seed 0 with its interval, and its paired difference to the base model."""
    from explorl.evaluation.evaluate import paired_pass_difference

    summary = load(RESULTS / "curves" / f"{method}_seed0__d3-7_n{CURVE_N}.json")
    at = curve_at(summary, CURVE_N)
    if at is None:
        return "-", "-"
    cell = f"{at[0]:.3f} [{at[1]:.3f}, {at[2]:.3f}]"
    if base_curve is None or "problems" not in summary["curve"]:
        return cell, "-"
    d = paired_pass_difference(base_curve["curve"], summary["curve"])[CURVE_N]
    star = "*" if d[1] > 0 or d[2] < 0 else ""
    return cell, f"{d[0]:+.3f} [{d[1]:+.3f}, {d[2]:+.3f}]{star}"


def paired_seeds(files: list[str]) -> None:
    """pass@k of each curve minus the first's, paired over the problems (`evaluate.paired_pass_difference`), and
    the mean ± 95% t-interval of those differences over the curves (seeds)."""
    from explorl.evaluation.evaluate import paired_pass_difference

    curves = [json.loads((RESULTS / "curves" / f).read_text())["curve"] for f in files]
    diffs = [paired_pass_difference(curves[0], c) for c in curves[1:]]
    print("| k | " + " | ".join(Path(f).stem for f in files[1:]) + " | mean ± 95% t-interval over them |")
    print("|---:|" + "---:|" * len(diffs) + "---:|")
    for k in curves[0]["k"]:
        if all(k in d for d in diffs):
            values = [d[k][0] for d in diffs]
            print(f"| {k} | " + " | ".join(f"{v:+.3f}" for v in values) + f" | {fmt_delta(values)} |")


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--methods", default="", help="comma-separated rows to print, in order (default: every method)")
    ap.add_argument("--name", default="testbed",
                    help="which testbed's records: bench/results/NAME (testbed_v2: the shipped embedded model's)")
    ap.add_argument("--paired", nargs="+", metavar="CURVE_JSON",
                    help="instead: curves/ files, the first the reference; each minus it and the mean over them")
    args = ap.parse_args()
    global RESULTS
    RESULTS = ROOT / "bench" / "results" / args.name
    if args.paired:
        return paired_seeds(args.paired)
    methods = [m for m in ORDER if seeds_of(m)]
    methods += sorted(p.name for p in RESULTS.iterdir() if p.is_dir() and p.name not in ORDER and seeds_of(p.name))
    if args.methods:
        methods = [m for m in args.methods.split(",") if m]
        missing = [m for m in methods if not seeds_of(m)]
        if missing:
            raise SystemExit(f"--methods: nothing recorded for {', '.join(missing)} under {RESULTS}")
    base = load(RESULTS / "base_n32.json")
    base_ood = load(RESULTS / "base.ood.json")
    base_curve = load(RESULTS / "curves" / f"base__d3-7_n{CURVE_N}.json")
    print("| run | seeds | pass@1 | pass@8 | pass@32 | Δpass@1 vs baseline | Δpass@32 vs baseline | "
          f"pass@{CURVE_N} (seed 0) | Δpass@{CURVE_N} vs base model | entropy end | all-wrong (last third) | "
          "OOD pass@32 | OOD pass@32 minus base | OOD Δpass@32 vs baseline |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    if base:
        at = curve_at(base_curve, CURVE_N)
        print(f"| base model | - | {base['pass@1']:.3f} | {base['pass@8']:.3f} | {base['pass@32']:.3f} | - | - | "
              + (f"{at[0]:.3f} [{at[1]:.3f}, {at[2]:.3f}]" if at else "-")
              + f" | - | {base['entropy']:.3f} (eval) | - | "
              + (f"{base_ood['pass@32']:.3f}" if base_ood else "-") + " | - | - |")
    for m in methods:
        rs = seeds_of(m)
        b = CONTROL.get(m) or baseline(m)
        bs = seeds_of(b) if b != m else {}
        ood = seeds_of(m, ".ood.json")
        col = {k: [r[k] for r in rs.values()] for k in ("pass@1", "pass@8", "pass@32", "entropy_end",
                                                         "all_wrong_last_third")}
        name = f"`{m}`" + ("" if b in (m, "grpo") else f" (baseline `{b}`)")
        p128, d128 = curve_cells(m, base_curve)
        ood_col = [r["pass@32"] for r in ood.values()]
        ood_cells = (f"{fmt(ood_col)} ({len(ood_col)})", f"{interval(ood_col)[0] - base_ood['pass@32']:+.3f}") \
            if ood_col and base_ood else ("-", "-")
        base_ood_seeds = seeds_of(b, ".ood.json") if b != m else {}
        ood_delta = fmt_delta(paired(ood, base_ood_seeds, "pass@32")) if ood and base_ood_seeds else "-"
        print(f"| {name} | {len(rs)} | {fmt(col['pass@1'])} | {fmt(col['pass@8'])} | {fmt(col['pass@32'])} | "
              f"{'-' if b == m else fmt_delta(paired(rs, bs, 'pass@1'))} | "
              f"{'-' if b == m else fmt_delta(paired(rs, bs, 'pass@32'))} | {p128} | {d128} | "
              f"{fmt(col['entropy_end'])} | {fmt(col['all_wrong_last_third'])} | {ood_cells[0]} | {ood_cells[1]} | "
              f"{ood_delta} |")
    mechanism_table(methods)


def mechanism_table(methods: list[str]) -> None:
    """What the clip and the covariance losses did in each run (bench/learning.py's `mechanism`: means over steps
    of the per-update statistics, the ratio's extremes over every update), the mean over the recorded seeds."""
    rows = []
    for m in methods:
        got = [r["mechanism"] for r in seeds_of(m).values() if "mechanism" in r]
        if not got:
            continue

        def cell(key: str, pick=statistics.fmean, digits: str = ".4f") -> str:
            values = [g[key] for g in got if key in g]
            return format(pick(values), digits) if values else "-"

        rows.append(f"| `{m}` | {len(got)} | {cell('loss/clip_frac_low')} | {cell('loss/clip_frac_high')} | "
                    f"{cell('loss/ratio_min', min, '.3f')} - {cell('loss/ratio_max', max, '.3f')} | "
                    f"{cell('loss/clip_cov_frac')} | {cell('loss/kl_cov_frac')} | "
                    f"{cell('loss/kl_cov_penalty_share')} |")
    if rows:
        print("\n| run | seeds | clipped low (frac of tokens) | clipped high | PPO ratio range | Clip-Cov detached | "
              "KL-Cov penalised | KL-Cov share of the loss |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        print("\n".join(rows))


if __name__ == "__main__":
    main()
