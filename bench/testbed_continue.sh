#!/usr/bin/env bash
# Continue the testbed comparison of bench/RESULTS.md (issue 11) where it stopped: every recorded result is skipped.
# 1. Training, 3 seeds of every recipe and combination: two single-thread processes (2 cores) over disjoint method
#    lists (their GRPO baselines are recorded, so the two never train the same run); clip-higher with 4
#    mini-batches, one seed.
# 2. The out-of-distribution evaluation of every final model (bench/testbed_ood.py, two shards).
# 3. pass@k to k = 128 of every method's seed 0 and the base model (n = 128, difficulties 3-7).
# Then `python bench/testbed_table.py` prints the table of RESULTS.md from the records.
# Usage: bench/testbed_continue.sh   (logs in runs/logs/continue_*.log; commit bench/results/testbed/ as runs land)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
mkdir -p runs/logs
common=(--testbed --seeds 3 --threads 1 --eval-every 0)
first=clip_cov,e3_ts,erpo,ead_tis,e3,ead,cw_grpo,adaptive_temperature,entropy_adv,dapo,entropy_reg,ead_e3_budget,ead_erpo
second=cw_balanced,forking_tokens,passk,still_ppl,still_position,kl_cov,e3_ts_an,dr_grpo,ead_forking,adaptive_e3_budget
"$PY" bench/learning.py "${common[@]}" --methods "$first" > runs/logs/continue_1.log 2>&1 &
"$PY" bench/learning.py "${common[@]}" --methods "$second" > runs/logs/continue_2.log 2>&1 &
wait
"$PY" bench/learning.py --testbed --seeds 1 --threads 1 --eval-every 0 \
  --methods grpo_token_mean_mb4,clip_higher_mb4 > runs/logs/continue_3.log 2>&1
"$PY" bench/testbed_ood.py --shard 0/2 > runs/logs/continue_ood_0.log 2>&1 &
"$PY" bench/testbed_ood.py --shard 1/2 > runs/logs/continue_ood_1.log 2>&1 &
wait
mapfile -t runs < <(ls -d runs/testbed/*/seed0 | grep -v '/grpo/seed0$\|/e3_ts/seed0$')
runs=(runs/testbed/grpo/seed0 runs/testbed/e3_ts/seed0 "${runs[@]}")
base=bench/results/testbed/curves/base__d3-7_n128.json
N=128 SPLITS=d3-7 bench/testbed_curves.sh "${runs[@]::${#runs[@]}/2}" > runs/logs/continue_curves_0.log 2>&1 &
(while [ ! -f "$base" ]; do sleep 10; done  # the first process evaluates the base model; the second pairs with it
 N=128 SPLITS=d3-7 bench/testbed_curves.sh "${runs[@]:${#runs[@]}/2}" > runs/logs/continue_curves_1.log 2>&1) &
wait
