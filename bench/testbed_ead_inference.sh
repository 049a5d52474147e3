#!/usr/bin/env bash
# EAD at inference time on the testbed (paper 003 section 5.4, Fig. 9): the base model sampled with a fixed
# temperature, EAD and RevEAD (tau_max 1.2, tau_min 0.1, c = 10: the paper's; d = 25 as in the figure, and 50),
# n = 64 samples of each of 256 held-out problems (difficulties 3-7), maj@N and pass@N against N with 95% intervals.
# Writes bench/results/testbed/ead_inference/<schedule>.json, skipping those already there; plot with
#   explorl curves bench/results/testbed/ead_inference/{fixed,ead_d25,ead_d50,revead_d25}.json --metric maj@k
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=bench/results/testbed/ead_inference
mkdir -p "$OUT"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
EXPLORL=${EXPLORL:-.venv/bin/explorl}
evaluate() {  # name, then the schedule flags
  local out="$OUT/$1.json"; shift
  [ -f "$out" ] && { echo "recorded: $out"; return; }
  "$EXPLORL" eval --model embedded --task arith --task-opt "difficulties=[3,4,5,6,7]" --task-opt train_size=4096 \
    --task-opt eval_size=256 --n 64 --k 1,8,32,64 --max-new-tokens 96 --temperature 1.0 --curve "$@" \
    --out "$out.tmp" && mv "$out.tmp" "$out"
}
evaluate fixed
evaluate ead_d25 --schedule ead --schedule-opt d0=25
evaluate ead_d50 --schedule ead --schedule-opt d0=50
evaluate revead_d25 --schedule revead --schedule-opt d0=25
