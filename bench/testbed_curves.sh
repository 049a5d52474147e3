#!/usr/bin/env bash
# pass@k and maj@k curves (n samples of each of 256 held-out problems, k up to n) of the base model and testbed
# runs, on the training difficulties (3-7) and on 8-9 (never trained on). Writes
# bench/results/testbed/curves/<model>__<split>[_n<N>].json (per-problem counts kept, so `explorl curves` pairs any
# two of them over the same problems) and skips those already there; plot with `explorl curves`.
# Usage: [N=256] [SPLITS="d3-7 d8-9"] bench/testbed_curves.sh [RUN_DIR ...]
#   (default runs: runs/testbed/grpo/seed0 runs/testbed/e3_ts/seed0)
#   N=128 SPLITS=d3-7 bench/testbed_curves.sh runs/testbed/*/seed0   # every method's seed 0 to k = 128
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=bench/results/testbed/curves
mkdir -p "$OUT"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
EXPLORL=${EXPLORL:-.venv/bin/explorl}
N=${N:-256}
SPLITS=${SPLITS:-d3-7 d8-9}
TASK=(--task arith --task-opt train_size=4096 --task-opt eval_size=256)
KS=$(for k in 1 2 4 8 16 32 64 128 256; do if [ "$k" -le "$N" ]; then printf "%s," "$k"; fi; done)
suffix=$([ "$N" = 256 ] && echo "" || echo "_n$N")
evaluate() {  # name split_name difficulties max_new_tokens model
  local out="$OUT/$1__$2$suffix.json"
  [ -f "$out" ] && { echo "recorded: $out"; return; }
  echo "evaluating $5 on $2 (n = $N)"
  "$EXPLORL" eval --model "$5" "${TASK[@]}" --task-opt "difficulties=$3" --n "$N" --k "${KS%,}" \
    --max-new-tokens "$4" --temperature 1.0 --curve --out "$out.tmp" > /dev/null && mv "$out.tmp" "$out"
}
runs=("$@")
[ ${#runs[@]} -eq 0 ] && runs=(runs/testbed/grpo/seed0 runs/testbed/e3_ts/seed0)
for split in $SPLITS; do
  case $split in
    d3-7) difficulties="[3,4,5,6,7]"; tokens=96 ;;
    d8-9) difficulties="[8,9]"; tokens=128 ;;
    *) echo "unknown split $split (d3-7 or d8-9)" >&2; exit 2 ;;
  esac
  evaluate base "$split" "$difficulties" "$tokens" embedded
  for run in "${runs[@]}"; do
    [ -f "$run/final/config.json" ] || { echo "skipped $run: no final model" >&2; continue; }
    name=$(echo "$run" | sed 's|runs/testbed/||; s|/|_|g')
    evaluate "$name" "$split" "$difficulties" "$tokens" "$run/final"
  done
done
