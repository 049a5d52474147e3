#!/usr/bin/env bash
# pass@k and maj@k curves to k = 256 (n = 256 samples of each of 256 held-out problems) of the base model and
# testbed runs, on the training difficulties (3-7) and on 8-9 (never trained on). Writes
# bench/results/testbed/curves/<model>__<split>.json and skips those already there; plot with `explorl curves`.
# Usage: bench/testbed_curves.sh [RUN_DIR ...]   (default: runs/testbed/grpo/seed0 runs/testbed/e3_ts/seed0)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=bench/results/testbed/curves
mkdir -p "$OUT"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
EXPLORL=${EXPLORL:-.venv/bin/explorl}
TASK=(--task arith --task-opt train_size=4096 --task-opt eval_size=256)
evaluate() {  # name split_name difficulties max_new_tokens model
  local out="$OUT/$1__$2.json"
  [ -f "$out" ] && { echo "recorded: $out"; return; }
  "$EXPLORL" eval --model "$5" "${TASK[@]}" --task-opt "difficulties=$3" --n 256 --k 1,8,32,128,256 \
    --max-new-tokens "$4" --temperature 1.0 --curve --out "$out.tmp" && mv "$out.tmp" "$out"
}
runs=("$@")
[ ${#runs[@]} -eq 0 ] && runs=(runs/testbed/grpo/seed0 runs/testbed/e3_ts/seed0)
for split in "d3-7 [3,4,5,6,7] 96" "d8-9 [8,9] 128"; do
  set -- $split
  evaluate base "$1" "$2" "$3" embedded
  for run in "${runs[@]}"; do
    name=$(echo "$run" | sed 's|runs/testbed/||; s|/|_|g')
    evaluate "$name" "$1" "$2" "$3" "$run/final"
  done
done
