#!/usr/bin/env bash
# One command for the GPU box (device tool, `carry: [".whl"]`): install the carried wheels (fla-core,
# zstandard, fastapi, ...) and the package, then run the stages asked for (default: all), each under
# its own time limit so one slow stage cannot take the others' results with it:
#   tests   pytest -m gpu: every kernel against its torch reference (tests/server holds no GPU tests)
#   quant   tools/bench_quant.py --device cuda: GPU quantizer bytes == CPU bytes, GB/s
#   gemv    tools/bench_kernels.py --gemv-only: the decode GEMVs alone, every CUDA (tiles, warps) shape
#   floor   tools/bench_kernels.py --floor-sweep: the GEMV's loads alone in each work layout
#   chain   tools/bench_kernels.py --chain: the MLP block in a CUDA graph, GEMVs apart / grouped / PDL
#   attn    tools/bench_kernels.py --attention-sweep: decode attention in a graph, pool-wide tables, per partition target
#   gdn     tools/bench_kernels.py --gdn-sweep: the GDN recurrence of a decode step (48 layers in a graph), per Dv block and warps
#   gdnrows tools/bench_kernels.py --gdn-only: fla's chunked GDN vs torch's, the in-place decode step, the prefill conv kernel vs torch
#   sampling tools/bench_sampling.py: a sampled row's host and device time: whole vocabulary, top-k + one kernel, top-k + torch ops
#   pattn   tools/bench_kernels.py --prefill-attention-ab: a long chunk's attention in each NINFER_PREFILL_ATTENTION mode
#   smallops tools/bench_kernels.py --prefill-small-ops: an 8K chunk's norms (the GDN output norm many rows a program
#           and one), SiLU-mul and NVFP4 dequantization against copy
#   overlap tools/probe_overlap.py (PROBE_ARGS, e.g. "--orders plain overlap"): decode in each host order, the
#           graphs' device time and the gaps between them from CUDA events, a finished run's retirement
#   ncu     Nsight Compute on NCU_KERNEL (a regex; default the attention's partial kernel) while NCU_BENCH_ARGS (default
#           one attention cell, 32K tokens at C = 1) runs bench_kernels.py: speed of light, memory and compute
#           workload, warp stalls, occupancy of 2 launches (ncu_report.txt)
#   kernels tools/bench_kernels.py: each kernel vs the roofline and its bf16 peer
#   bench   tools/bench.py: the full-size qwen3.8-27b through the engine vs transformers
#   sass    the engine's NVFP4 GEMVs (tiled, 8 warps, depth 2: M = 1 with the blocks as MMA columns, 2-8 rows
#           with x staged) disassembled: gemv_sass.txt, gemv_columns_sass.txt and their instruction counts
#           by opcode (what the arithmetic costs per tile)
# JSON/PNG land in $OUT, the logs and profiles in $OUT/gpu_check_logs.tgz.       bash tools/gpu_check.sh [tests] [quant] [gemv] [floor] [chain] [attn] [gdn] [gdnrows] [sampling] [pattn] [smallops] [overlap] [ncu] [kernels] [bench] [sass]
# Stage limits (seconds) can be set: TESTS_S, QUANT_S, GEMV_S, KERNELS_S, BENCH_S; FLOOR_ARGS="--floor-l2" narrows
# the floor stage to the engine's layouts without and with the L2::256B hint; CHAIN_ARGS="--chain-only engine alone"
# the chain to the variants whose names hold one of those words (split on spaces; "--chain-rows 8": the MLP block
# at 8 rows, as at C = 8); BENCH_ARGS are passed
# to bench.py (e.g. "--profiles nvfp4 --profile-prefill 32768"), TESTS_ARGS to pytest (e.g. "tests/kernels"; split
# on spaces, so a -k expression goes in PYTEST_ADDOPTS="-k 'norm or captured'", which pytest parses itself).
set -uo pipefail
OUT=${OUT:-out/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
stages=${*:-tests quant kernels bench}
GEMV_SYMBOL=_ZN11ninfer_sm904gemvINS_10Nvfp4TiledELb0ELi8ELi2ELb1ELb1EEEvPK13__nv_bfloat16NS_5PartsINT_4ArgsEEEii
GEMV_COLUMNS_SYMBOL=_ZN11ninfer_sm9011gemv_cappedINS_12Nvfp4ColumnsELi8ELi2ELb1ELb1EEEvPK13__nv_bfloat16NS_5PartsINT_4ArgsEEEii
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . > /tmp/install.log 2>&1 || { cat /tmp/install.log; exit 1; }
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv
for stage in $stages; do
    case $stage in
        tests) timeout ${TESTS_S:-300} python3 -m pytest -m gpu -q -rs -p no:cacheprovider --ignore=tests/server ${TESTS_ARGS:-} 2>&1 \
                   | tee "$OUT/pytest_gpu.log" | grep -E "^(FAILED|ERROR)|passed|failed"
               # (a stage cut by its limit prints no summary: say so, with the progress line it reached)
               [ "${PIPESTATUS[0]}" = 124 ] && echo "tests: stopped at TESTS_S=${TESTS_S:-300} s: $(grep -E '^[.FEsxX]+' "$OUT/pytest_gpu.log" | tail -1)" ;;
        quant) timeout ${QUANT_S:-120} python3 tools/bench_quant.py --device cuda --out "$OUT" 2>&1 | tee "$OUT/bench_quant.log" ;;
        gemv) timeout ${GEMV_S:-150} python3 tools/bench_kernels.py --gemv-only --out "$OUT" 2>&1 | tee "$OUT/bench_gemv.log" | grep gemv | cut -c1-220 ;;
        floor) timeout ${GEMV_S:-150} python3 tools/bench_kernels.py ${FLOOR_ARGS:---floor-sweep} --out "$OUT" 2>&1 | tee "$OUT/bench_floor.log" | grep floor ;;
        attn) timeout ${GEMV_S:-150} python3 tools/bench_kernels.py --attention-sweep --out "$OUT" 2>&1 | tee "$OUT/bench_attention.log" | grep attention ;;
        gdn) timeout ${GEMV_S:-150} python3 tools/bench_kernels.py --gdn-sweep --out "$OUT" 2>&1 | tee "$OUT/bench_gdn.log" | grep gdn ;;
        gdnrows) timeout ${GEMV_S:-150} python3 tools/bench_kernels.py --gdn-only --out "$OUT" 2>&1 | tee "$OUT/bench_gdn_rows.log" | grep gdn ;;
        sampling) timeout ${GEMV_S:-150} python3 tools/bench_sampling.py --out "$OUT" 2>&1 | tee "$OUT/bench_sampling.log" | tail -5 ;;
        pattn) timeout ${GEMV_S:-150} python3 tools/bench_kernels.py --prefill-attention-ab --out "$OUT" 2>&1 | tee "$OUT/bench_prefill_attention.log" | grep "prefill attention" ;;
        overlap) timeout ${BENCH_S:-300} python3 tools/probe_overlap.py --out "$OUT" ${PROBE_ARGS:-} 2>&1 \
                     | tee "$OUT/probe_overlap.log" | grep -v Warning | tail -20 ;;
        smallops) timeout ${GEMV_S:-150} python3 tools/bench_kernels.py --prefill-small-ops --out "$OUT" 2>&1 | tee "$OUT/bench_prefill_small_ops.log" | grep "prefill op" ;;
        ncu) timeout ${NCU_S:-240} ncu --clock-control none --kernel-name "regex:${NCU_KERNEL:-_partial_kernel}" \
                 --launch-skip 2 --launch-count 2 --section SpeedOfLight --section MemoryWorkloadAnalysis \
                 --section ComputeWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats \
                 --section SourceCounters python3 tools/bench_kernels.py ${NCU_BENCH_ARGS:---attention-sweep --attention-cells 32768 1} \
                 --out "$OUT" > "$OUT/ncu_report.txt" 2>&1; echo "ncu: exit $?"; grep -E "Duration|Throughput|Achieved Occupancy|Registers Per|Stall|Executed Ipc|Issued Ipc|Issue Slots" "$OUT/ncu_report.txt" | head -40 ;;
        chain) timeout ${GEMV_S:-150} python3 tools/bench_kernels.py --chain ${CHAIN_ARGS:-} --out "$OUT" 2>&1 | tee "$OUT/bench_chain.log" | grep chain ;;
        kernels) timeout ${KERNELS_S:-300} python3 tools/bench_kernels.py --out "$OUT" 2>&1 | tee "$OUT/bench_kernels.log" | tail -40 ;;
        bench) # the GPU's clocks, temperature, power and throttle reasons every 2 s beside it (prefill is
               # power-capped; a slow 100K TTFT in stops 16 and 17 was never sampled)
               nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,temperature.gpu,power.draw,clocks_throttle_reasons.active \
                   --format=csv -lms 2000 > "$OUT/smi_bench.log" 2>&1 &
               smi=$!
               timeout ${BENCH_S:-420} python3 tools/bench.py --out "$OUT" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | grep -v Warning
               kill $smi ;;
        sass) python3 -c "from ninfer_run.kernels import cuda_ops; assert cuda_ops.available()" || continue
              so=$(find "${NINFER_CACHE:-$HOME/.cache/ninfer}" -name 'ninfer_cuda_ops*.so')
              for pair in "gemv:$GEMV_SYMBOL" "gemv_columns:$GEMV_COLUMNS_SYMBOL"; do
                  name=${pair%%:*}
                  cuobjdump -sass -fun "${pair#*:}" $so > "$OUT/${name}_sass.txt" \
                  && grep -oE '^\s+/\*[0-9a-f]{4}\*/\s+(@!?U?P[0-9T] )?[A-Z0-9_]+' "$OUT/${name}_sass.txt" | awk '{print $NF}' \
                     | sort | uniq -c | sort -rn | tee "$OUT/${name}_sass_counts.txt" | head -25
              done ;;
        *) echo "unknown stage $stage" >&2; exit 2 ;;
    esac
done
# The device tool returns at most 8 files: the logs and profiles travel as one archive (JSON and PNG apart).
(cd "$OUT" && shopt -s nullglob && logs=(*.log *.txt) && [ ${#logs[@]} -gt 0 ] && tar czf gpu_check_logs.tgz "${logs[@]}" \
    && rm -f "${logs[@]}") || true
