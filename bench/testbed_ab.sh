#!/usr/bin/env bash
# The testbed run's wall time, old code against this checkout (issue "Twice the experiments per hour"): one
# 300-step GRPO testbed run of each, side by side at one thread each (the two-at-once convention), seed 0.
#   bash bench/testbed_ab.sh cf17092          # the old commit (a git worktree of it is made in /tmp)
# Prints each side's wall time; the run directories are /tmp/ab_old and /tmp/ab_new (logs beside them).
set -euo pipefail
cd "$(dirname "$0")/.."
old=${1:?usage: bench/testbed_ab.sh OLD_COMMIT}
tree=/tmp/ab_worktree_$old
[ -d "$tree" ] || git worktree add "$tree" "$old" >/dev/null
run() {  # SRC OUT
  rm -rf "$2"
  /usr/bin/time -f "$2: %e s wall" env PYTHONPATH="$1" OMP_NUM_THREADS=1 .venv/bin/explorl train \
    configs/recipes/grpo.yaml "task.difficulties=[3,4,5,6,7]" task.train_size=4096 task.eval_size=256 \
    sampling.group_size=16 sampling.max_new_tokens=96 optim.lr=0.0001 run.steps=300 run.batch_size=16 \
    run.eval_n=32 "run.eval_k=[1,8,32]" run.seed=0 run.threads=1 run.eval_every=0 run.out_dir="$2" > "$2.log" 2>&1
}
run "$tree/src" /tmp/ab_old &
run "$PWD/src" /tmp/ab_new &
wait
