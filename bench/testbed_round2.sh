#!/usr/bin/env bash
# The testbed rows that the papers' update schedules change (the "Recipes that are their papers, round 2" issue), on
# the embedded model shipped with explorl (fingerprint 7523a82d260ba825): records in bench/results/testbed_v2/ (the
# rows of bench/results/testbed/ were made with an earlier machine's bootstrapped model and stay as they were).
# Each method with the GRPO baseline of its objective and update count (bench/learning.py: `grpo__agg__lo-hi__uN`).
# Two single-thread processes over method lists that share no baseline; seed 0 of every row first, then seeds 1-2.
# Every recorded run is skipped, an unfinished one started again: run it again to continue.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
mkdir -p runs/logs
first=dapo,forking_tokens,e3,e3_ts_an
second=ead,ead_tis,clip_cov,kl_cov
for seeds in 1 3; do
  common=(--testbed --out runs/testbed_v2 --seeds "$seeds" --threads 1 --eval-every 0)
  "$PY" bench/learning.py "${common[@]}" --methods "$first" > "runs/logs/round2_1_$seeds.log" 2>&1 &
  "$PY" bench/learning.py "${common[@]}" --methods "$second" > "runs/logs/round2_2_$seeds.log" 2>&1 &
  wait
done
