#!/usr/bin/env bash
# One command for the GPU box (device tool, `carry: [".whl"]`): install carried wheels and the
# package, run the GPU tests (kernels vs their references), then the GPU benchmarks (quantize, kernels vs
# roofline and bf16 peers); tests/server holds no GPU tests (and needs wheels the box lacks); logs and JSON/PNG results land in $OUT.
#   bash tools/gpu_check.sh
set -uo pipefail
OUT=${OUT:-out/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
python3 -m pytest -m gpu -q -rs -p no:cacheprovider --ignore=tests/server 2>&1 | tee "$OUT/pytest_gpu.log" | tail -5
python3 tools/bench_quant.py --device cuda --out "$OUT" 2>&1 | tee "$OUT/bench_quant.log"
python3 tools/bench_kernels.py --out "$OUT" 2>&1 | tee "$OUT/bench_kernels.log"
