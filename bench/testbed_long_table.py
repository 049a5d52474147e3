"""The long testbed runs' answer (issue "Coverage at equal entropy", item 4): for every method, checkpoint and split,
pass@1 and pass@k at T = 1 and at the base model's entropy, each paired to the GRPO baseline of the method's own
objective (`learning.baseline`), or for a control the run it controls (`testbed_long_records.CONTROLS`: `sft`
against `grpo`), and to the base model, over the problems both evaluated.

Reads the records `bench/testbed_long.py` writes (`bench/results/testbed_long/<method>/seed<k>/step<N>.<split>.
<t1|matched>.json`, and the base model's `base/step0.<split>.t1.json`) and prints Markdown tables:
- per method and checkpoint, for each recorded mode (in distribution also judged by right chains, every worked
  step the solution's, where the answer alone is often guessed): mean pass@1 and pass@K over the seeds recorded,
  and the entropy sampled at;
- the paired difference in pass@K to the baseline (seed with seed) and to the base model, with a 95% bootstrap
  interval that resamples the problems and the seeds (`metrics.bootstrap_ci_seeds`), and with two seeds or more
  each seed's own difference in brackets. With one seed the interval covers the problems drawn only, and says
  nothing about another seed's run;
- pass@K against the GRPO baseline's at the same pass@1 (`equal_pass1_table`): out-of-distribution coverage at
  equal in-distribution pass@1, and right-chain coverage at equal right-chain pass@1, with a 95% interval over
  problems and seeds;
- narrowing against steps: pass@K at the last checkpoint minus at the first, seed with seed, with its interval
  (`narrowing_table`);
- by right chains, pass@K minus the base model's on each operation count of a split alone (`by_operations_table`);
- which problems each method loses or gains against the base model, beside how many chance alone would give
  (`solved_sets_table`);
- with `--plot`, pass@K against training steps; with `--forest`, `--curves` and `--problems`, the figures of
  `bench/testbed_long_figures.py` (differences from the base model with intervals; pass@k against k; each
  out-of-distribution problem's right chains, the base model's against each run's).

    python bench/testbed_long_table.py                  # K = the largest k recorded (n = 128: pass@128)
    python bench/testbed_long_table.py --k 32 --split ood
    python bench/testbed_long_table.py --name testbed_ood --seeds 2   # seeds 0 and 1 only, while seed 2 runs
    python bench/testbed_long_table.py --plot bench/results/testbed_long/narrowing.png
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from testbed_long_records import (MODES, base_mode, fate, is_baseline, ordered_methods, paired,  # noqa: E402
                                 per_problem, records_at, reference)


def load_records(root: Path, seeds: int | None = None) -> dict[tuple[str, int, int, str, str], dict]:
    """{(method, seed, step, split, mode): eval record} of every record under `root`, of seeds 0 to `seeds` - 1 only
    where `seeds` is given (the base model's records always)."""
    out = {}
    for path in sorted(root.glob("*/seed*/step*.json")):
        step, split, mode = path.name[len("step"):-len(".json")].split(".")
        seed = int(path.parent.name[len("seed"):])
        if seeds is None or seed < seeds:
            out[(path.parent.parent.name, seed, int(step), split, mode)] = json.loads(path.read_text())
    for path in sorted((root / "base").glob("step0.*.json")):
        _, split, mode = path.name[:-len(".json")].split(".")
        out[("base", 0, 0, split, mode)] = json.loads(path.read_text())
    return out


def one_judge(records: dict) -> tuple[dict, int]:
    """(records, how many were left out): where some right-chain records are judged by the chain judge in use
    (`testbed_long.current_judge`), the right-chain records of an older judge are left out, since verdicts of two
    judges do not compare; records of one judge only are kept as they are."""
    from testbed_long import current_judge

    chain = {key for key in records if key[4].endswith("-chain")}
    if not any(current_judge(records[key]) for key in chain):
        return records, 0
    kept = {key: r for key, r in records.items() if key not in chain or current_judge(r)}
    return kept, len(records) - len(kept)


def fmt(ci: tuple[float, float, float, list[float]] | None) -> str:
    if ci is None:
        return "-"
    seeds = "" if len(ci[3]) < 2 else " (" + ", ".join(f"{v:+.3f}" for v in ci[3]) + ")"
    return f"{ci[0]:+.3f} [{ci[1]:+.3f}, {ci[2]:+.3f}]{seeds}"


def table(records: dict, split: str, mode: str, k: int) -> list[str]:
    methods = ordered_methods(records)
    base = records.get(("base", 0, 0, split, base_mode(mode)))
    lines = [f"#### {split.upper()}, sampled at {MODES[mode]}: pass@{k}",
             "", f"| method | step | seeds | pass@1 | pass@{k} | entropy | vs its GRPO baseline | vs base |",
             "|---|---:|---:|---:|---:|---:|---|---|"]
    if base is not None:
        lines.append(f"| base | 0 | 1 | {base['pass@1']:.3f} | {statistics.fmean(per_problem(base, k).values()):.3f} "
                     f"| {base['entropy']:.3f} | | |")
    for method in methods:
        ref = None if is_baseline(method) else reference(method)
        for step in sorted({s for m, _, s, sp, md in records if m == method and sp == split and md == mode}):
            mine = {seed: r for (m, seed, s, sp, md), r in records.items()
                    if (m, s, sp, md) == (method, step, split, mode)}
            rows = list(mine.values())
            pass1 = statistics.fmean(r["pass@1"] for r in rows)
            passk = statistics.fmean(statistics.fmean(per_problem(r, k).values()) for r in rows)
            ent = statistics.fmean(r["entropy"] for r in rows)
            vs_ref = None
            if ref is not None:
                vs_ref = paired([(records[(ref, seed, step, split, mode)], r) for seed, r in mine.items()
                                 if (ref, seed, step, split, mode) in records], k)
            vs_base = paired([(base, r) for r in rows], k) if base is not None else None
            lines.append(f"| {method} | {step} | {len(rows)} | {pass1:.3f} | {passk:.3f} | {ent:.3f} | "
                         f"{'(baseline)' if ref is None else fmt(vs_ref)} | {fmt(vs_base)} |")
    return lines + [""]


def operations_of(pid: str) -> int | None:
    """The number of operations of an arithmetic problem (`explorl.tasks.arith`: its record's problem id is its
    prompt, "7+12-5=?"), None for another task's problem."""
    from explorl.tasks.arith import operations

    try:
        return len(operations(pid)[1])
    except ValueError:
        return None


def restricted(record: dict, pids: set[str]) -> dict:
    """`record` with its per-problem counts cut to the problems in `pids` (what `per_problem` and `paired` read)."""
    p = record["curve"]["problems"]
    keep = [i for i, pid in enumerate(p["id"]) if pid in pids]
    problems = {key: [p[key][i] for i in keep] for key in ("id", "n", "correct")}
    return {**record, "curve": {**record["curve"], "problems": problems}}


def operation_levels(record: dict) -> dict[int, set[str]]:
    """{operation count: the ids of the arithmetic problems of `record` with that many operations}, in count order."""
    levels: dict[int, set[str]] = {}
    for pid in record["curve"]["problems"]["id"]:
        if (ops := operations_of(pid)) is not None:
            levels.setdefault(ops, set()).add(pid)
    return dict(sorted(levels.items()))


def by_operations_table(records: dict, split: str, mode: str, k: int) -> list[str]:
    """pass@k minus the base model's on the problems of each operation count of `split` alone, per method and
    checkpoint, paired as `table` pairs (95% interval over those problems and the seeds). A split that mixes
    problems one and two operations beyond training can hide a loss at one behind a gain at the other."""
    base = records.get(("base", 0, 0, split, base_mode(mode)))
    if base is None:
        return []
    levels = operation_levels(base)
    if len(levels) < 2:
        return []
    base_at = {ops: restricted(base, pids) for ops, pids in sorted(levels.items())}
    heads = [f"{ops} operations ({len(levels[ops])} problems; base {statistics.fmean(per_problem(b, k).values()):.3f})"
             for ops, b in base_at.items()]
    lines = [f"#### {split.upper()}, sampled at {MODES[mode]}: pass@{k} by operations, minus the base model's", "",
             "| method | step | seeds | " + " | ".join(heads) + " |", "|---|---:|---:|" + "---|" * len(heads)]
    for method in ordered_methods(records):
        for step in sorted({s for m, _, s, sp, md in records if (m, sp, md) == (method, split, mode)}):
            rows = records_at(records, method, step, split, mode)
            cells = []
            for ops, b in base_at.items():
                mine = [restricted(r, levels[ops]) for r in rows]
                ci = paired([(b, r) for r in mine], k)
                mean = statistics.fmean(statistics.fmean(per_problem(r, k).values()) for r in mine)
                cells.append(f"{mean:.3f}, {fmt(ci)}")
            lines.append(f"| {method} | {step} | {len(rows)} | " + " | ".join(cells) + " |")
    return lines + [""]


def operation_modes(recorded: set[tuple[str, str]], split: str) -> list[str]:
    """The modes of `split` read by operation count (`by_operations_table`): the right-chain ones, and out of
    distribution the answer-level `t1` beside them (issue 53: the answer-level verifier at 8 and 9 operations, where
    right answers can come with wrong work)."""
    return [m for m in MODES if (split, m) in recorded and (m.endswith("-chain") or (split, m) == ("ood", "t1"))]


def narrowing_table(records: dict, split: str, mode: str, k: int) -> list[str]:
    """Narrowing against steps, with an interval: each method's pass@k at its last checkpoint minus at its first,
    seed with seed over the seeds that recorded both (`paired`: 95% interval over problems and seeds), beside the
    change in entropy. A fall at an unchanged entropy (the base-entropy modes) is coverage lost with training, not
    sharper sampling."""
    lines = [f"#### {split.upper()}, sampled at {MODES[mode]}: pass@{k} at the last checkpoint minus at the first",
             "", f"| method | steps | seeds | pass@{k} change | entropy change |", "|---|---|---:|---|---:|"]
    for method in ordered_methods(records):
        by_seed: dict[int, dict[int, dict]] = {}
        for (m, seed, step, sp, md), r in records.items():
            if (m, sp, md) == (method, split, mode):
                by_seed.setdefault(seed, {})[step] = r
        steps = sorted(set.intersection(*(set(v) for v in by_seed.values()))) if by_seed else []
        if len(steps) < 2:
            continue
        pairs = [(by_seed[seed][steps[0]], by_seed[seed][steps[-1]]) for seed in sorted(by_seed)]
        entropy = statistics.fmean(last["entropy"] - first["entropy"] for first, last in pairs)
        lines.append(f"| {method} | {steps[0]} to {steps[-1]} | {len(pairs)} | {fmt(paired(pairs, k))} | "
                     f"{entropy:+.3f} |")
    return lines + [""]


def problem_matrix(rows: list[dict], k: int, pids: list[str]) -> "torch.Tensor":
    """`[len(rows), len(pids)]`: pass@k of each record (one per seed) on each of `pids`."""
    import torch

    scores = [per_problem(r, k) for r in rows]
    return torch.tensor([[row[pid] for pid in pids] for row in scores], dtype=torch.float64)


def interpolate(xs: "torch.Tensor", ys: "torch.Tensor", at: "torch.Tensor") -> "torch.Tensor":
    """Piecewise-linear `ys` against `xs` at `at`, row by row: `xs, ys` `[B, U]` (the points of each row in any order,
    sorted here by x), `at` `[B]`; NaN where `at` lies outside a row's points."""
    import torch

    order = xs.argsort(dim=1)
    xs, ys = xs.gather(1, order), ys.gather(1, order)
    out = torch.full_like(at, float("nan"))
    for j in range(xs.shape[1] - 1):  # the first segment that holds the point, as the table always read it
        x0, x1, y0, y1 = xs[:, j], xs[:, j + 1], ys[:, j], ys[:, j + 1]
        hit = out.isnan() & (x0 <= at) & (at <= x1) & (x1 > x0)
        value = y0 + (y1 - y0) * (at - x0) / (x1 - x0).clamp_min(1e-12)
        out = torch.where(hit, value, out)
    return out


def equal_pass1_difference(records: dict, method: str, step: int, k: int, x: tuple[str, str], y: tuple[str, str],
                           n_boot: int = 2000, seed: int = 0, reverse: bool = False
                           ) -> tuple[int, float, float, float, float, float | None, float | None] | None:
    """`method`'s pass@k on `y` at `step` minus its GRPO baseline's at the same pass@1 on `x`, with a 95% bootstrap
    interval over problems and seeds.

    The baseline's path is the base model (step 0, the same for every seed) and each checkpoint recorded for every
    seed `method` has at `step`; its (pass@1, pass@k) points, each the mean over those seeds and the problems, are
    joined by straight lines in pass@1, so a method that learns less is not credited with the coverage its baseline
    had before it learned as much. Each resample draws the seeds, the `x` problems and the `y` problems with
    replacement (independently: the two splits hold different problems), the same draw for the method and its
    baseline (paired), and interpolates again. With `reverse` the two swap: the baseline at `step` against the
    method's path, for a method that learns more than its baseline ever did (still the method minus the baseline).

    Returns `(seeds, pass@1, pass@k, the path's pass@k at that pass@1, difference, lo, hi)`, the first two of the
    method (with `reverse`, of the baseline) at `step`; the path's value and the difference are NaN where that
    pass@1 lies outside the path, and `lo, hi` are None where more than 5% of the resamples fall outside it. None
    when the point or its path is not recorded."""
    import torch

    ref = reference(method)
    if reverse:
        method, ref = ref, method
    on_path = {s for m, s, st, sp, md in records if (m, sp, md) == (ref, *x) and (ref, s, st, *y) in records}
    seeds = sorted(s for m, s, st, sp, md in records
                   if (m, st, sp, md) == (method, step, *x) and (method, s, step, *y) in records and s in on_path)
    if not seeds:
        return None
    mine_x = [records[(method, s, step, *x)] for s in seeds]
    mine_y = [records[(method, s, step, *y)] for s in seeds]
    path = []  # [(records on x, records on y)] per point of the baseline's path, one record per seed
    base_x = records.get(("base", 0, 0, x[0], base_mode(x[1])))
    base_y = records.get(("base", 0, 0, y[0], base_mode(y[1])))
    if base_x is not None and base_y is not None:
        path.append(([base_x] * len(seeds), [base_y] * len(seeds)))
    for ref_step in sorted({st for m, _, st, *_ in records if m == ref}):
        keys_x = [(ref, s, ref_step, *x) for s in seeds]
        keys_y = [(ref, s, ref_step, *y) for s in seeds]
        if all(key in records for key in keys_x + keys_y):
            path.append(([records[key] for key in keys_x], [records[key] for key in keys_y]))
    if len(path) < 2:
        return None
    every_x = [mine_x, *(p[0] for p in path)]
    every_y = [mine_y, *(p[1] for p in path)]
    pids_x = sorted(set.intersection(*(set(r["curve"]["problems"]["id"]) for rows in every_x for r in rows)))
    pids_y = sorted(set.intersection(*(set(r["curve"]["problems"]["id"]) for rows in every_y for r in rows)))
    if not pids_x or not pids_y:
        return None
    # [1 + U, S, P]: the method first, then the path's points
    values_x = torch.stack([problem_matrix(rows, 1, pids_x) for rows in every_x])
    values_y = torch.stack([problem_matrix(rows, k, pids_y) for rows in every_y])

    def difference(px: "torch.Tensor", py: "torch.Tensor") -> tuple["torch.Tensor", ...]:
        """px, py `[B, 1 + U]` means -> the method's pass@1, pass@k, the baseline's pass@k there, the difference."""
        at = interpolate(px[:, 1:], py[:, 1:], px[:, 0])
        return px[:, 0], py[:, 0], at, (at - py[:, 0]) if reverse else (py[:, 0] - at)

    point = [v.item() for v in difference(values_x.mean(dim=(1, 2))[None], values_y.mean(dim=(1, 2))[None])]
    gen = torch.Generator().manual_seed(seed)
    s = len(seeds)
    draw_s = torch.randint(s, (n_boot, s), generator=gen)
    draw_x = torch.randint(len(pids_x), (n_boot, len(pids_x)), generator=gen)
    draw_y = torch.randint(len(pids_y), (n_boot, len(pids_y)), generator=gen)

    def resampled(values: "torch.Tensor", draw_p: "torch.Tensor") -> "torch.Tensor":
        """`values` `[V, S, P]` -> `[B, V]`: each resample's mean over its drawn seeds and problems."""
        picked = values[:, draw_s]  # [V, B, S, P]
        picked = picked.gather(3, draw_p[None, :, None, :].expand(values.shape[0], -1, s, -1))
        return picked.mean(dim=(2, 3)).T

    diffs = difference(resampled(values_x, draw_x), resampled(values_y, draw_y))[3]
    defined = diffs[~diffs.isnan()]
    lo = hi = None
    if defined.numel() >= 0.95 * n_boot:
        lo, hi = (torch.quantile(defined, q).item() for q in (0.025, 0.975))
    return (s, *point, lo, hi)


def equal_pass1_table(records: dict, k: int, x: tuple[str, str] = ("id", "t1"),
                      y: tuple[str, str] = ("ood", "matched")) -> list[str]:
    """Each method's pass@k (split and mode `y`) minus its GRPO baseline's at the same pass@1 (split and mode `x`),
    with a 95% interval over problems and seeds (`equal_pass1_difference`). At the method's pass@1 on its
    baseline's path; where the method has learned more than its baseline ever did, at the baseline's pass@1 on the
    method's path instead (the method's coverage when it had learned as much); '-' where neither path holds the
    other's pass@1, or (the interval) where more than 5% of the resamples fall outside it. Defaults: OOD coverage
    at the base entropy against ID pass@1 at T = 1; `x = y = ("id", "matched-chain")`: right-chain coverage against
    right-chain pass@1, both at the base entropy."""
    lines = [f"#### {y[0].upper()} pass@{k} (sampled at {MODES[y[1]]}) against the GRPO baseline's at equal "
             f"{x[0].upper()} pass@1 (sampled at {MODES[x[1]]})", "",
             f"| method | step | seeds | at the pass@1 of | pass@1 | method's pass@{k} | baseline's pass@{k} | "
             "difference [95% interval] |", "|---|---:|---:|---|---:|---:|---:|---|"]
    for method in sorted({m for m, *_ in records if m != "base" and not is_baseline(m)}):
        for step in sorted({s for m, _, s, *_ in records if m == method}):
            found, of = equal_pass1_difference(records, method, step, k, x, y), "the method"
            if found is not None and math.isnan(found[4]):
                mirrored = equal_pass1_difference(records, method, step, k, x, y, reverse=True)
                if mirrored is not None and not math.isnan(mirrored[4]):
                    found, of = mirrored, "its baseline"
            if found is None:
                continue
            seeds, p1, cov, other, diff, lo, hi = found
            mine, ref = (other, cov) if of == "its baseline" else (cov, other)
            shown = "-" if math.isnan(diff) else f"{diff:+.3f}" + ("" if lo is None else f" [{lo:+.3f}, {hi:+.3f}]")
            lines.append(f"| {method} | {step} | {seeds} | {of} | {p1:.3f} | "
                         f"{'-' if math.isnan(mine) else f'{mine:.3f}'} | {'-' if math.isnan(ref) else f'{ref:.3f}'}"
                         f" | {shown} |")
    return lines + [""]


def chance_lost_gained(base_counts: list[int], n: int, seeds: int, min_hits: int,
                       grid: int = 200_000) -> tuple[float, float]:
    """How many problems `solved_sets_table` would count lost and gained by chance alone: the expected numbers
    were each of `seeds` runs to sample every problem as the base model does (`base_counts`: its correct samples
    of n per problem; each run also draws n). A problem's pass@1 p is drawn from its posterior given the
    base's count c (Jeffreys prior: Beta(c + 1/2, n - c + 1/2)), the same p for every seed. Lost: c >= `min_hits`
    and 0 correct in every seed, E[(1 - p)^(n seeds)]; gained: c = 0 and at least `min_hits` in every seed,
    E[P(Binomial(n, p) >= min_hits)^seeds]. The prior matters most for the problems the base never solved: it gives
    each a mean pass@1 of 1 / (2n + 2), though some may be beyond the model at any n. Integrated by the midpoint
    rule over u = sqrt(p), where the posterior's density (p^-1/2 at p -> 0 when c = 0) is finite."""
    import torch

    u = (torch.arange(grid, dtype=torch.float64) + 0.5) / grid
    p = u * u
    log_p, log_q = torch.log(p), torch.log1p(-p)
    hits = torch.arange(min_hits, dtype=torch.float64)
    log_choose = torch.lgamma(torch.tensor(n + 1.0)) - torch.lgamma(hits + 1) - torch.lgamma(n - hits + 1)
    below = torch.exp(log_choose[:, None] + hits[:, None] * log_p + (n - hits[:, None]) * log_q).sum(0)
    at_least = (1 - below).clamp(min=0) ** seeds  # P(Binomial(n, p) >= min_hits) in every seed
    never = torch.exp(n * seeds * log_q)  # 0 correct in every seed

    def expected(c: int, outcome: "torch.Tensor") -> float:
        a, b = c + 0.5, n - c + 0.5
        log_beta = math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)
        density = torch.exp((a - 1) * log_p + (b - 1) * log_q - log_beta) * 2 * u  # dp = 2u du
        return float((outcome * density).sum() / grid)

    lost = sum((expected(c, never) for c in base_counts if c >= min_hits), 0.0)
    gained = base_counts.count(0) * expected(0, at_least) if 0 in base_counts else 0.0
    return lost, gained


def solved_sets_table(records: dict, split: str = "ood", mode: str = "matched", min_hits: int = 4) -> list[str]:
    """Where coverage goes: per method and checkpoint, the problems the base model solves reliably (at least
    `min_hits` correct of its n samples) that the method never solves ("lost": 0 correct in every seed's n), and
    the reverse ("gained"), and how many of a method's lost problems GRPO lost too at the same step (whether a
    method loses the same problems or others). Problems solved by chance once in n are left out on both sides:
    at n = 128 a problem of pass@1 1/128 is missed by a second evaluation 37% of the time, while one of 4/128 is
    missed 1.7% of the time. Beside each count, how many a run sampling as the base model does would show by
    chance (`chance_lost_gained`)."""
    base = records.get(("base", 0, 0, split, base_mode(mode)))
    if base is None:
        return []

    def counts(method: str, step: int, mode: str) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for r in records_at(records, method, step, split, mode):
            for pid, c in zip(r["curve"]["problems"]["id"], r["curve"]["problems"]["correct"]):
                out.setdefault(pid, []).append(c)
        return out

    ref = dict(zip(base["curve"]["problems"]["id"], base["curve"]["problems"]["correct"]))

    def lost_gained(mine: dict[str, list[int]]) -> tuple[set[str], set[str]]:
        fates = {p: fate(ref.get(p), c, min_hits) for p, c in mine.items()}
        return {p for p, f in fates.items() if f == "lost"}, {p for p, f in fates.items() if f == "gained"}

    reliable = sum(1 for c in ref.values() if c >= min_hits)
    lines = [f"#### {split.upper()} problems lost and gained against the base model, sampled at {MODES[mode]} (the "
             f"base solves {reliable} of {len(base['curve']['problems']['id'])} at least {min_hits} times in "
             f"{base['n']})", "",
             f"| method | step | seeds | lost (base >= {min_hits}, method 0) | gained (method >= {min_hits} in every "
             "seed, base 0) | lost / gained by chance | lost by GRPO too |", "|---|---:|---:|---:|---:|---:|---:|"]
    chance: dict[tuple[int, int], tuple[float, float]] = {}
    methods = ordered_methods(records)
    for method in methods:
        for step in sorted({s for m, _, s, sp, md in records if (m, sp, md) == (method, split, mode)}):
            mine = counts(method, step, mode)
            lost, gained = lost_gained(mine)
            grpo = counts("grpo", step, mode)
            both = "-" if not grpo or method == "grpo" else str(len(lost & lost_gained(grpo)[0]))
            seeds, n = len(next(iter(mine.values()))), records_at(records, method, step, split, mode)[0]["n"]
            if (seeds, n) not in chance:
                chance[seeds, n] = chance_lost_gained(list(ref.values()), n, seeds, min_hits)
            by_chance = f"{chance[seeds, n][0]:.2f} / {chance[seeds, n][1]:.2f}"
            lines.append(f"| {method} | {step} | {seeds} | {len(lost)} | {len(gained)} | {by_chance} | {both} |")
    return lines + [""]


def plot(records: dict, k: int, path: Path) -> None:
    """Narrowing against training steps: pass@k of each method (mean over its seeds, the seeds' range shaded) at every
    checkpoint, one panel per split and mode recorded (a row per split and judge, T = 1 and the base entropy side by
    side), the base model as a dotted line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = ordered_methods(records)
    recorded = {key[3:] for key in records}
    panels = [pair for pair in ([("id", "t1"), ("id", "matched")], [("ood", "t1"), ("ood", "matched")],
                                [("id", "t1-chain"), ("id", "matched-chain")],
                                [("ood", "t1-chain"), ("ood", "matched-chain")]) if set(pair) & recorded]
    fig, axes = plt.subplots(len(panels), 2, figsize=(11, 4.3 * len(panels)), sharex=True, squeeze=False)
    colours = plt.get_cmap("tab20")
    for row, pair in enumerate(panels):
        for col, (split, mode) in enumerate(pair):
            ax = axes[row][col]
            for method in methods:
                steps = sorted({s for m, _, s, sp, md in records if (m, sp, md) == (method, split, mode)})
                per_seed = [[statistics.fmean(per_problem(r, k).values())
                             for r in records_at(records, method, step, split, mode)] for step in steps]
                colour = colours(methods.index(method) % 20)  # one colour per method in every panel
                if steps:
                    ax.plot(steps, [statistics.fmean(v) for v in per_seed], marker="o", label=method, color=colour,
                            linestyle="--" if is_baseline(method) else "-")
                if any(len(v) > 1 for v in per_seed):  # the seeds' range
                    ax.fill_between(steps, [min(v) for v in per_seed], [max(v) for v in per_seed], color=colour,
                                    alpha=0.12, linewidth=0)
            base = records.get(("base", 0, 0, split, base_mode(mode)))
            if base is not None:
                ax.axhline(statistics.fmean(per_problem(base, k).values()), color="k", linestyle=":", label="base")
            ax.set_title(f"{split.upper()}, sampled at {MODES[mode]}")
            ax.set_ylabel(f"pass@{k}")
            ax.grid(alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("training step")
    handles = {}
    for ax in axes.flat:  # one legend for the figure: every method that has a curve in any panel
        handles.update(zip(*reversed(ax.get_legend_handles_labels())))
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=4, fontsize=8)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--name", default="testbed_long", help="bench/results/NAME")
    ap.add_argument("--k", type=int, default=None, help="pass@k of the tables (default: the largest recorded)")
    ap.add_argument("--split", choices=["id", "ood", "both"], default="both")
    ap.add_argument("--seeds", type=int, default=None,
                    help="only seeds 0 to SEEDS-1 (e.g. 1: seed 0 alone while later seeds are recorded); default all")
    ap.add_argument("--plot", default=None, help="PNG path: pass@k against training steps, every method")
    ap.add_argument("--forest", default=None, help="PNG path: each method's pass@k minus the base model's, intervals")
    ap.add_argument("--curves", default=None, help="PNG path: pass@k against k, base and each method's last step")
    ap.add_argument("--problems", default=None,
                    help="PNG path: per OOD problem, the base model's right chains against each run's")
    args = ap.parse_args()
    records, left_out = one_judge(load_records(ROOT / "bench" / "results" / args.name, args.seeds))
    if not records:
        raise SystemExit(f"no records under bench/results/{args.name}")
    if left_out:
        print(f"({left_out} right-chain records judged by an older chain judge left out: they are evaluated again "
              f"by the script that wrote them)\n")
    k = args.k or min(max(r["curve"]["k"]) for r in records.values())
    for split in (["id", "ood"] if args.split == "both" else [args.split]):
        for mode in [m for m in MODES if any(key[3:] == (split, m) for key in records)]:
            print("\n".join(table(records, split, mode, k)))
    recorded = {key[3:] for key in records}
    for split in (["id", "ood"] if args.split == "both" else [args.split]):
        for mode in [m for m in MODES if (split, m) in recorded]:
            print("\n".join(narrowing_table(records, split, mode, k)))
    if args.split != "id" and ("ood", "matched") in recorded:
        print("\n".join(equal_pass1_table(records, k)))
        print("\n".join(solved_sets_table(records)))
    for split in (["id", "ood"] if args.split == "both" else [args.split]):
        for mode in operation_modes(recorded, split):
            print("\n".join(by_operations_table(records, split, mode, k)))
    if args.split != "id" and ("ood", "matched-chain") in recorded:  # a base model with right work out of it
        print("\n".join(equal_pass1_table(records, k, ("id", "matched-chain"), ("ood", "matched-chain"))))
        print("\n".join(solved_sets_table(records, "ood", "matched-chain")))
    if args.split != "ood":  # right chains: coverage at equal pass@1, and where they are lost or gained
        print("\n".join(equal_pass1_table(records, k, ("id", "matched-chain"), ("id", "matched-chain"))))
        print("\n".join(solved_sets_table(records, "id", "matched-chain")))
    if args.plot:
        plot(records, k, Path(args.plot))
    if args.forest or args.curves or args.problems:
        import testbed_long_figures as figures

        if args.forest:
            figures.forest(records, k, Path(args.forest))
        if args.curves:
            figures.curves(records, Path(args.curves))
        if args.problems:
            figures.problems(records, Path(args.problems))


if __name__ == "__main__":
    main()
