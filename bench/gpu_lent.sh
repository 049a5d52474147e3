#!/usr/bin/env bash
# What a GPU lent for a short while runs (bench/RESULTS.md "GPU path" says what each part answered last time):
#   make-test     `make test`'s default suite on the GPU machine (CPU-float tests pinned to the CPU, `gpu` ones on CUDA)
#   graph-tests   the sampler's CUDA-graph tests (`tests/test_gpu.py -k graph`)
#   sampling-32   sampling throughput, Qwen2.5-0.5B architecture, 512 tokens, 32 rows (4 x 8): explorl compiled,
#                 eager and with `sampling.cuda_graph`, against HF `generate`
#   sampling-256  the same at 256 rows (32 x 8)
#   training      one training step at that cell against TRL's GRPOTrainer, explorl sampling with the CUDA graph
# Each part has its own time limit (below) and writes its output to $OUT (default ./gpu-lent); a part that fails does
# not stop the others. Without arguments: the first three (560 s of limits: one device call); name parts to run others:
#
#     bash bench/gpu_lent.sh                            # make-test graph-tests sampling-32
#     bash bench/gpu_lent.sh sampling-256 training      # a second call
#
# Packages the machine lacks can come as wheels in .whl/ (docs/gpu.md says which): they are installed into /tmp/site,
# nothing is downloaded.
set -u
OUT=${OUT:-gpu-lent}
mkdir -p "$OUT"
SITE=/tmp/site
if compgen -G ".whl/*.whl" > /dev/null && [ ! -d "$SITE" ]; then
    python3 -m pip install -q --no-index --no-deps --target "$SITE" .whl/*.whl > "$OUT/pip.txt" 2>&1
fi
export PYTHONPATH="$SITE:$PWD/src:${PYTHONPATH:-}" TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/card.txt" 2>&1
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" \
    >> "$OUT/card.txt" 2>&1
XDIST=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8")

part() {  # part NAME SECONDS COMMAND...: run with a time limit, output to $OUT/NAME.txt, one summary line
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
    local rc=$?
    echo "$name: rc $rc in $((SECONDS - t0)) s; $(tail -n 1 "$OUT/$name.txt")" | tee -a "$OUT/summary.txt"
}

for name in "${@:-make-test graph-tests sampling-32}"; do
  for one in $name; do
    case $one in
      make-test) part make-test 260 python3 -m pytest -q $XDIST -p no:cacheprovider -o addopts="-m 'not slow'" ;;
      graph-tests) part graph-tests 110 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py -k graph -rfs ;;
      sampling-32) part sampling-32 190 python3 bench/gpu.py --models 0.5B --lengths 512 --skip training ;;
      sampling-256) part sampling-256 150 python3 bench/gpu.py --models 0.5B --lengths 512 --batch 32 --skip training ;;
      training) part training 240 python3 bench/gpu.py --models 0.5B --lengths 512 --skip sampling --cuda-graph ;;
      *) echo "unknown part $one (make-test, graph-tests, sampling-32, sampling-256, training)"; exit 2 ;;
    esac
  done
done
cat "$OUT/card.txt" "$OUT/summary.txt"
grep -h "^| Qwen\|by phase" "$OUT"/sampling-*.txt "$OUT"/training.txt 2>/dev/null
