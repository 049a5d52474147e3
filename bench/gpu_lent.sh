#!/usr/bin/env bash
# What a GPU lent for a few minutes runs, in one call of under 10 minutes (bench/RESULTS.md "GPU path" says what
# each part answered last time):
#   1. `make test`'s default suite on the GPU machine (the CPU-float tests pinned to the CPU, the `gpu` ones on CUDA);
#   2. the CUDA-graph tests of the sampler (`tests/test_gpu.py -k graph`);
#   3. sampling throughput, Qwen2.5-0.5B architecture, 512 tokens, at 32 rows (4 x 8) and 256 rows (32 x 8):
#      explorl compiled, eager and with `sampling.cuda_graph`, against HF `generate`.
# Each part has its own time limit and writes its output to $OUT (default ./gpu-lent); a part that fails does not
# stop the others. Packages the machine lacks can come as wheels in .whl/ (docs/gpu.md says which): they are
# installed into /tmp/site, nothing is downloaded.
#
#     bash bench/gpu_lent.sh            # or, on the device tool: bash bench/gpu_lent.sh (carry .whl)
set -u
OUT=${OUT:-gpu-lent}
mkdir -p "$OUT"
SITE=/tmp/site
if compgen -G ".whl/*.whl" > /dev/null; then
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

part make-test 270 python3 -m pytest -q $XDIST -p no:cacheprovider -o addopts="-m 'not slow'"
part graph-tests 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py -k graph -rfs
part sampling-32 90 python3 bench/gpu.py --models 0.5B --lengths 512 --skip training
part sampling-256 100 python3 bench/gpu.py --models 0.5B --lengths 512 --batch 32 --skip training
cat "$OUT/card.txt" "$OUT/summary.txt"
grep -h "^| Qwen" "$OUT"/sampling-*.txt
