#!/usr/bin/env bash
# Continue the testbed comparison of bench/RESULTS.md (issue 11) where it stopped: every recorded run is skipped.
# Two single-thread training processes (2 cores) over disjoint method lists; their GRPO baselines are recorded for
# seeds 0-2, so the two never train the same run. Then the out-of-distribution evaluation of every new final model.
# Usage: bench/testbed_continue.sh   (logs in runs/logs/continue_*.log; commit bench/results/testbed/ as runs land)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
mkdir -p runs/logs
common=(--testbed --seeds 3 --threads 1 --eval-every 0)
first=clip_cov,e3_ts,erpo,ead_tis,e3,ead,cw_grpo,adaptive_temperature,entropy_adv
second=cw_balanced,forking_tokens,dapo,passk,still_ppl,still_position,kl_cov,e3_ts_an
"$PY" bench/learning.py "${common[@]}" --methods "$first" > runs/logs/continue_1.log 2>&1 &
"$PY" bench/learning.py "${common[@]}" --methods "$second" > runs/logs/continue_2.log 2>&1 &
wait
# combinations and clip-higher with several updates per batch (one seed each first)
"$PY" bench/learning.py --testbed --seeds 1 --threads 1 --eval-every 0 \
  --methods ead_e3_budget,ead_erpo,ead_forking,adaptive_e3_budget,grpo_token_mean_mb4,clip_higher_mb4 \
  > runs/logs/continue_3.log 2>&1
"$PY" bench/testbed_ood.py > runs/logs/continue_ood.log 2>&1
