"""The runs that decide issue 43 ("A testbed where coverage out of distribution can be lost"): `bench/testbed_long.py`
on the second shipped model, `embedded:testbed` (`src/explorl/embedded_testbed/README.md`), which writes some right
chains out of distribution. Every checkpoint (500, 1000, 1500 steps) is judged by right chains (`task.reward:
chain`) in distribution (difficulties 3-7, what RL trains on) and out of it (8-9), at T = 1 and at the base model's
entropy, with pass@k curves to k = 256 (128 problems x 256 samples); the base model once per split at T = 1.

Runs in `runs/testbed_ood/<method>/seed<k>/`, records in `bench/results/testbed_ood/<method>/seed<k>/step<N>.<split>.
<t1-chain|matched-chain>.json`. Resumable as `bench/testbed_long.py` is: a killed run resumes from its last
checkpoint, a recorded evaluation is skipped, every seed 0 first. Any option of `bench/testbed_long.py` given here
overrides the defaults below (e.g. `--seeds 1`, `--methods grpo`). With `--commit` each record is committed as it
lands (`git commit -- <that file>`: nothing else in the index or the working tree goes with it).

After each run it takes (and once more at the end), a process draws the out-of-distribution frontier at equal
entropy (`bench/testbed_long_frontier.py --split ood`) of every run that has reached its last step and is not in
its seed's frontier yet, one seed at a time under a claim as the runs are, and commits it with `--commit`. A
record or frontier judged by an older version of the chain judge (`explorl.rewards.REWARD_VERSIONS`) counts as not
recorded: it is evaluated again, on the same seeded samples.

    OMP_NUM_THREADS=1 nohup python bench/testbed_ood_long.py --commit > /tmp/testbed_ood.log 2>&1 &
    python bench/testbed_long_table.py --name testbed_ood       # the tables, from what is recorded

Longer runs, where narrowing needs them (RESULTS, "Seed 2's `grpo`, and the longer GRPO runs"): fresh 3,000-step
`grpo` runs, since the learning-rate schedule decays over `run.steps` and a continued run would not be a longer one.
They go to `runs/testbed_ood_3000/` and `bench/results/testbed_ood_3000/`, checkpoints at 1000, 2000 and 3000 steps:

    OMP_NUM_THREADS=1 nohup python bench/testbed_ood_long.py --commit --name testbed_ood_3000 --steps 3000 \
        --every 1000 --methods grpo > /tmp/testbed_ood_3000.log 2>&1 &
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import testbed_long  # noqa: E402

DEFAULTS = ["--model", "embedded:testbed", "--name", "testbed_ood", "--ood-chain", "--n", "256",
            "--modes", "t1-chain,matched-chain", "--methods", "grpo_verified,clip_cov,e3_ts,ead_tis,kl_cov"]
"""The issue's methods (their GRPO baselines are added: `grpo`, and the 8-update and 4-update ones of Clip-Cov,
KL-Cov and EAD) on the testbed model, right chains only: answers alone are mostly guessed on this task."""


def commit(path: Path, tries: int = 12) -> None:
    """`git add` and `git commit` one record (or directory), that path only, unless nothing there changed; waits
    out another process's index lock."""
    root = testbed_long.ROOT
    relative = str(path.relative_to(root))
    name, _, rest = relative.removeprefix("bench/results/").partition("/")  # "testbed_ood: grpo/seed0/..."
    for _ in range(tries):
        if not (root / ".git" / "index.lock").exists():
            added = subprocess.run(["git", "add", "--", relative], cwd=root, capture_output=True)
            staged = subprocess.run(["git", "diff", "--cached", "--quiet", "--", relative], cwd=root)
            if added.returncode == 0 and staged.returncode == 0:
                return  # nothing new under that path
            done = added.returncode == 0 and subprocess.run(
                ["git", "commit", "-q", "-m", f"{name}: {rest}", "--", relative], cwd=root,
                capture_output=True).returncode == 0
            if done:
                return
        time.sleep(5)
    print(f"  {relative}: not committed (git busy or failing); commit it by hand", flush=True)


def main() -> None:
    argv = sys.argv[1:]
    committing = "--commit" in argv
    sys.argv = [sys.argv[0], *DEFAULTS, *(a for a in argv if a != "--commit")]  # argparse keeps the last value
    if committing:
        evaluate = testbed_long.evaluate

        def evaluate_and_commit(model, split, mode, out, args, temperature=1.0):
            evaluate(model, split, mode, out, args, temperature)
            commit(out)

        testbed_long.evaluate = evaluate_and_commit  # run_job and the base model's evaluations call it by name
    run_job = testbed_long.run_job

    def run_job_then_frontiers(method, seed, run_dir, steps, args):
        run_job(method, seed, run_dir, steps, args)
        frontiers(args, committing)  # a seed whose last run this was gets its frontier before the next run starts

    testbed_long.run_job = run_job_then_frontiers  # main calls it by name
    testbed_long.main()
    frontiers(testbed_long.parser().parse_args(), committing)  # seeds whose runs were all done before this started


def frontiers(args, committing: bool) -> None:
    """The out-of-distribution frontier of every seed, grown as its runs land: the points of each run (of
    `args.methods` and, unless `--no-baselines`, their baselines) that has its final checkpoint are drawn, each seed
    claimed so parallel processes share them, until no new run has landed meanwhile. A frontier.json lacking a landed
    run, or judged by an older chain judge, is drawn again, with the runs it already holds (drawn by a process of
    other methods); recorded points are reused (the directory's partial file), so a seed's last run is followed by
    its own points only. Committed as it grows."""
    import testbed_long_frontier as frontier
    from learning import with_baselines

    named = [m for m in args.methods.split(",") if m]
    methods = named if args.no_baselines else with_baselines(named)
    for seed in range(args.seeds):
        out = frontier.frontier_dir(args.name, seed, "ood")
        if set(methods) <= frontier.drawn_models(out / "frontier.json"):
            continue
        with testbed_long.claimed(testbed_long.ROOT / "runs" / args.name / f"frontier_seed{seed}.claim") as mine:
            while mine:
                done = frontier.final_checkpoints(args.name, seed, args.steps)
                drawn = frontier.drawn_models(out / "frontier.json")
                # the runs another process (its own --methods) drew stay in: the file is drawn whole each time
                models = {m: done[m] for m in set(methods) | (drawn - {"base"}) if m in done}
                if not models or set(models) <= drawn:
                    break
                frontier.run_frontier(args.name, seed, models, args.problems, args.model, "ood")
                if committing:
                    commit(out)
                    commit(frontier.base_low_dir(args.name, "ood"))


if __name__ == "__main__":
    main()
