"""Brings the frontier points other worktrees evaluated into this one's, so that drawing a seed's frontier here
samples nothing already sampled there (issue 53: the sweep's methods train in several git worktrees, one process a
core, each drawing the frontier of its own runs into its own `frontier.partial.json`).

For each seed's `bench/results/<name>/frontier/seed<k>/<split>_chain/frontier.partial.json` of each worktree given,
the points this worktree's partial file lacks are added, where the setting (split, n, seed, length, top-p, reward
and checker versions) is the same and each model's weight fingerprints agree; a disagreement stops before anything
is written. The frontier command checks the fingerprints against the weights again when it reads the file, so a
merged point of other weights is evaluated again, not used. Then draw the frontier here as usual
(`bench/testbed_ood_long.py --no-train ...`): it evaluates only what no worktree has.

    python bench/testbed_frontier_merge.py --name testbed_ood_answer /work/sweep /work/newm2
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from explorl.runs import nofollow  # noqa: E402

PARTIAL = "frontier.partial.json"  # explorl.commands.frontier.PARTIAL (read without importing torch)


def merged(mine: dict | None, theirs: dict, where: str) -> dict:
    """`mine` (a partial file's contents; None where there is none yet) with the points of `theirs` it lacks.
    Raises ValueError naming `where` when the settings differ or a model's fingerprints disagree."""
    if mine is None:
        return theirs
    if mine["setting"] != theirs["setting"]:
        raise ValueError(f"{where}: evaluated in another setting ({theirs['setting']} against {mine['setting']})")
    for label, fingerprint in theirs["fingerprints"].items():
        if label in mine["fingerprints"] and mine["fingerprints"][label] != fingerprint:
            raise ValueError(f"{where}: model {label!r} has other weights there ({fingerprint} against "
                             f"{mine['fingerprints'][label]}); its points cannot be shared")
    # this worktree's entries first, in their order: a merge that adds nothing leaves the file as it was
    return {"setting": mine["setting"], "fingerprints": {**mine["fingerprints"], **theirs["fingerprints"],
                                                         **mine["fingerprints"]},
            "points": {**mine["points"], **theirs["points"], **mine["points"]}}


def merge_worktrees(name: str, others: list[Path], root: Path = ROOT) -> dict[str, int]:
    """Merges every partial file of `others` (worktree roots) into `root`'s, checked in full before any is
    written; {the partial file's path under bench/results/<name>/frontier: points added}."""
    frontier = Path("bench") / "results" / name / "frontier"
    updates: dict[Path, dict] = {}
    added: dict[str, int] = {}
    for other in others:
        for theirs_path in sorted((other / frontier).glob(f"*/*/{PARTIAL}")):
            relative = theirs_path.relative_to(other / frontier)
            target = root / frontier / relative
            mine = updates.get(target)
            if mine is None and target.exists():
                mine = json.loads(target.read_text())
            before = len(mine["points"]) if mine else 0
            updates[target] = merged(mine, json.loads(theirs_path.read_text()), str(theirs_path))
            added[str(relative)] = added.get(str(relative), 0) + len(updates[target]["points"]) - before
    for target, data in updates.items():
        if target.exists() and not added[str(target.relative_to(root / frontier))]:
            continue  # nothing new: the file is left as it was
        target.parent.mkdir(parents=True, exist_ok=True)
        nofollow.write_atomic(target, json.dumps(data))
    return added


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("worktrees", nargs="+", type=Path, help="the other worktrees' roots")
    ap.add_argument("--name", default="testbed_ood_answer", help="bench/results/NAME")
    args = ap.parse_args()
    try:
        added = merge_worktrees(args.name, args.worktrees)
    except ValueError as e:
        raise SystemExit(f"nothing merged: {e}")
    for path, count in added.items():
        print(f"{path}: {count} points added")


if __name__ == "__main__":
    main()
