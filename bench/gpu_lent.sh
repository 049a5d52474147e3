#!/usr/bin/env bash
# What a GPU lent for a short while runs (bench/RESULTS.md "GPU path" says what each part answered last time):
#   make-test     `make test`'s default suite on the GPU machine (CPU-float tests pinned to the CPU, `gpu` ones on
#                 CUDA); every failure is written to $OUT/failures.txt the moment it happens (tests/conftest.py
#                 EXPLORL_FAILURE_LOG), so a suite cut by its limit still names what failed and why
#   graph-tests   the sampler's CUDA-graph tests alone (`tests/test_gpu.py -k graph`; make-test runs them too)
#   sampling-32   sampling throughput, Qwen2.5-0.5B architecture, 512 tokens, 32 rows (4 x 8): HF `generate`,
#                 explorl eager, compiled and with `sampling.cuda_graph`; one line per round as it finishes
#   sampling-256  the same at 256 rows (32 x 8)
#   sampling-spread  sampling-32 with lengths spread as RL's (`--spread-lengths`: mean about 128 of 512 tokens),
#                 where the CUDA graph's static batch and the compacting dynamic decoder part
#   training      one training step at that cell against TRL's GRPOTrainer, explorl sampling with the CUDA graph
# Each part has its own time limit (below) and writes its output to $OUT (default ./gpu-lent); a part that fails does
# not stop the others, and a bench part prints every thread's stack 10 s before its limit.
#
# A loan is 15 minutes of device time in all, a start about 40 s of it (H200, 2026-11-27). Two calls fit:
#     bash bench/gpu_lent.sh                            # make-test sampling-32: one call, timeout_s 560
#     bash bench/gpu_lent.sh training                   # at once, on the still-warm machine: timeout_s 260
# and the next loan: `bash bench/gpu_lent.sh sampling-256 sampling-spread graph-tests`.
# On 2026-11-27 (H200) the suite did not finish in 220 s on 8 workers and sampling-32 printed nothing in 170 s
# (the bench then printed only at the end): the limits below are sized after that.
#
# Packages the machine lacks come as wheels in .whl/ (`bash bench/gpu_wheels.sh` here fills it; the call names
# `.whl` in its carry): installed into /tmp/site, nothing downloaded; pycosat, published as source only, is built
# there.
set -u
OUT=${OUT:-gpu-lent}
mkdir -p "$OUT"
SITE=/tmp/site
if compgen -G ".whl/*.whl" > /dev/null && [ ! -d "$SITE" ]; then
    python3 -m pip install -q --no-index --no-deps --target "$SITE" .whl/*.whl > "$OUT/pip.txt" 2>&1
    if compgen -G ".whl/*.tar.gz" > /dev/null; then
        python3 -m pip install -q --no-index --no-deps --no-build-isolation --target "$SITE" .whl/*.tar.gz \
            >> "$OUT/pip.txt" 2>&1 || echo "building $(ls .whl/*.tar.gz) failed: see pip.txt" | tee -a "$OUT/summary.txt"
    fi
fi
export PYTHONPATH="$SITE:$PWD/src:${PYTHONPATH:-}" TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/card.txt" 2>&1
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" \
    >> "$OUT/card.txt" 2>&1
python3 -c "import reasoning_gym, math_verify, trl, datasets" >> "$OUT/card.txt" 2>&1 \
    || echo "a package the suite needs is missing: see card.txt" | tee -a "$OUT/summary.txt"
XDIST=$(python3 -c "import xdist" 2>/dev/null && echo "-n 14")
export EXPLORL_FAILURE_LOG="$OUT/failures.txt"

part() {  # part NAME SECONDS COMMAND...: run with a time limit, output to $OUT/NAME.txt, one summary line
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
    local rc=$?
    echo "$name: rc $rc in $((SECONDS - t0)) s; $(tail -n 1 "$OUT/$name.txt")" | tee -a "$OUT/summary.txt"
}

bench() {  # bench NAME SECONDS ARGS...: bench/gpu.py under a limit, its stacks dumped 10 s before it
    local name=$1 limit=$2; shift 2
    part "$name" "$limit" python3 bench/gpu.py --models 0.5B --lengths 512 --dump-after $((limit - 10)) "$@"
}

for name in "${@:-make-test sampling-32}"; do
  for one in $name; do
    case $one in
      make-test) part make-test 300 python3 -m pytest -q $XDIST -p no:cacheprovider -o addopts="-m 'not slow'" \
                     --timeout=150 -rfE ;;
      graph-tests) part graph-tests 110 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py -k graph -rfs ;;
      sampling-32) bench sampling-32 220 --skip training --repeats 1 ;;
      sampling-256) bench sampling-256 200 --batch 32 --skip training ;;
      sampling-spread) bench sampling-spread 200 --skip training --repeats 1 --spread-lengths ;;
      training) bench training 240 --skip sampling --cuda-graph ;;
      *) echo "unknown part $one (make-test, graph-tests, sampling-32, sampling-256, sampling-spread," \
              "training)"; exit 2 ;;
    esac
  done
done
cat "$OUT/card.txt" "$OUT/summary.txt"
grep -c "^=== " "$OUT/failures.txt" 2>/dev/null | sed 's/^/failures logged: /'
grep -h "^=== " "$OUT/failures.txt" 2>/dev/null | head -40
grep -h "^| Qwen\|by phase\|tok/s\|training, " "$OUT"/sampling-*.txt "$OUT"/training.txt 2>/dev/null
