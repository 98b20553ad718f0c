#!/usr/bin/env bash
# Issue 2: A/B of the quantizer's scale-store order, store hints and skeletons (session 10), in one
# GPU session, on an existing build (nothing is built here): MXMOE_BUILD_DIR (default: build) must
# hold mxmoe_gpu_tests and libmxmoe_c.so built from this tree.
#   MXMOE_BUILD_DIR=build-gpu timeout 210 scripts/quant_ab.sh OUT
# Whole script <= ~200 s: each step's timeout is cut to what is left of QUANT_AB_BUDGET (200 s).
# Expected: ~20 + ~45 + ~60 + ~35 s. Prints a compact summary; the full logs go to OUT:
#  0. the pipelined kernel's test with the scale writer warp (MXMOE_QUANT_TMA_SCALES=warp, the one
#     new synchronisation); if it fails or hangs, the tma-warp variant is left out of steps 1-2
#  1. bench/quant_variants.py: copy ceilings and, rowwise / colwise / row+col on 3 shapes + batched
#     weights, today's kernels (default, late = MXMOE_QUANT_LATE_SCALES=1) and the pipelined kernel
#     (as run 59 measured it, scale order early / late / warp, with and without the evict_last
#     stores, row-major raster) and skeletons (no scales, scales before / after the fence), each
#     timed three ways (flush = bench_quant.py's timer, clean = L2 clean at the start, loop = back
#     to back), checked variants bit for bit -> OUT/quant_variants.{log,json}
#  2. ncu, 16384x7168: SM copy, default / late / pipelined variants / skeleton with early scales for
#     both directions, late and pipelined column-wise, pipelined row-wise; one line per kernel
#     (DRAM bytes vs expected, DRAM/L2/SM %, occupancy, eligible warps, issue, top stalls)
#     -> OUT/ncu_diag.{txt,csv}, OUT/ncu_diag_run.log, OUT/ncu_query.txt (every metric name)
#  3. tests, in parallel processes (their time is the CPU reference): the pipelined kernel's test
#     under the new defaults, the old order (+ row-major raster, load evict_first, no store hint)
#     and the writer warp on a column-major raster; the dense quantize tests with MXMOE_QUANT_TMA=1
#     and with MXMOE_QUANT_LATE_SCALES=1 (one process a test); a short set on the defaults
#     -> OUT/quant_ab_test_*.log
set -uo pipefail
source "$(dirname "$0")/ab_lib.sh"
ab_setup "${1:-out}" 200 quant_ab_test_
summary() {  # gtest log: verdict and first failures
  grep -E "^\[==========\]|^\[  PASSED  \]|^\[  FAILED  \]|^\[  SKIPPED \] [0-9]" "$1" | head -6
  grep -E -A4 ": Failure$" "$1" | cut -c1-220 | head -20
}

P=QuantizeGpu.PipelinedKernelOnPlainCopies
echo "== 0. pipelined test, scale writer warp (t=${SECONDS}s)"
MXMOE_QUANT_TMA_SCALES=warp timeout "$(left 45)" "$TESTS" --gtest_filter="$P" > "$OUT/quant_ab_test_pipelined_warp.log" 2>&1
rc=$?
echo "rc=$rc $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/quant_ab_test_pipelined_warp.log" | head -1)"
SKIP='^$'
if [ $rc -ne 0 ]; then SKIP='warp'; echo "leaving the tma-warp variant out"; fi

echo "== 1. quant_variants.py (t=${SECONDS}s)"
timeout "$(left 75)" python3 bench/quant_variants.py --skip "$SKIP" --json "$OUT/quant_variants.json" > "$OUT/quant_variants.log" 2>&1
echo "rc=$?"
sed '/^Traceback/,$d' "$OUT/quant_variants.log" | cut -c1-220 | head -40
grep -q "^Traceback" "$OUT/quant_variants.log" && sed -n '/^Traceback/,$p' "$OUT/quant_variants.log" | tail -6

echo "== 2. ncu diagnostic, 16384x7168 (t=${SECONDS}s)"
if command -v ncu > /dev/null; then
  ncu --query-metrics > "$OUT/ncu_query.txt" 2>&1
  run_ncu() {  # $1: metric list
    timeout "$(left 70)" ncu --clock-control none --kernel-name-base demangled \
      -k "regex:quantize_mxfp8_[a-z_]+kernel|BitwiseOr" --section WarpStateStats --metrics "$1" \
      -f -o /tmp/ncu_qdiag python3 bench/quant_variants.py --skip "$SKIP" --profile "$OUT/ncu_labels.txt" > "$OUT/ncu_diag_run.log" 2>&1
  }
  run_ncu "$(python3 scripts/ncu_quant_diag.py metrics "$OUT/ncu_query.txt")"
  rc=$?
  if [ $rc -ne 0 ] && grep -qiE "metric|invalid" "$OUT/ncu_diag_run.log" && [ $((BUDGET - SECONDS)) -gt 50 ]; then
    echo "ncu rc=$rc; retrying with the basic metrics:"; grep -iE "error" "$OUT/ncu_diag_run.log" | head -3
    cp "$OUT/ncu_diag_run.log" "$OUT/ncu_diag_run_first.log"
    run_ncu "$(python3 scripts/ncu_quant_diag.py metrics "$OUT/ncu_query.txt" sure)"
    rc=$?
  fi
  echo "ncu rc=$rc"
  grep -E "==ERROR==|==WARNING==" "$OUT/ncu_diag_run.log" | sort | uniq -c | head -5
  if [ -f /tmp/ncu_qdiag.ncu-rep ]; then
    ncu -i /tmp/ncu_qdiag.ncu-rep --page raw --csv --print-units base > "$OUT/ncu_diag.csv" 2>&1 ||
      ncu -i /tmp/ncu_qdiag.ncu-rep --page raw --csv > "$OUT/ncu_diag.csv" 2>&1
    python3 scripts/ncu_quant_diag.py summary "$OUT/ncu_diag.csv" "$OUT/ncu_labels.txt" | tee "$OUT/ncu_diag.txt" | cut -c1-400
  fi
  grep -E "^(lts__|dram__|fbpa__)\S*(evict|dirty|clean|fabric|activ|page|row|turn|fill)" "$OUT/ncu_query.txt" | awk '{print $1}' | tr '\n' ' ' | cut -c1-600
  echo
else
  echo "ncu not found"
fi

echo "== 3. tests in parallel (t=${SECONDS}s)"
DENSE='RandomShapesBitExact BatchedWeightsBothDirectionsOnePass NanAndInfPoisonBlocksAndChunks UnalignedScalePointers'
SHORT='QuantizeGpu.NanAndInfPoisonBlocksAndChunks:QuantizeGpu.UnalignedScalePointers:QuantizeGpu.RerunsAreBitwiseIdentical'
T=$(left 95)
start_test pipelined MXMOE_QUANT_TMA=1 -- "$P"
start_test pipelined_early_g1_hints MXMOE_QUANT_TMA_SCALES=early MXMOE_QUANT_TMA_GROUP=1 MXMOE_QUANT_TMA_LOAD_HINT=first MXMOE_QUANT_TMA_STORE_HINT=none -- "$P"
start_test pipelined_warp_gcol MXMOE_QUANT_TMA_SCALES=warp MXMOE_QUANT_TMA_GROUP=1000000 MXMOE_QUANT_TMA_STORE_HINT=first -- "$P"
for t in $DENSE; do start_test "tma_$t" MXMOE_QUANT_TMA=1 -- "QuantizeGpu.$t"; done
for t in $DENSE; do start_test "late_$t" MXMOE_QUANT_TMA=0 MXMOE_QUANT_LATE_SCALES=1 -- "QuantizeGpu.$t"; done
start_test base_short MXMOE_QUANT_TMA=0 -- "$SHORT"
wait_tests
for f in "$OUT"/quant_ab_test_*.log; do grep -q ": Failure$" "$f" && { echo "-- $f"; summary "$f"; }; done
echo "== done (t=${SECONDS}s)"
