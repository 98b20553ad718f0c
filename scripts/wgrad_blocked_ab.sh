#!/usr/bin/env bash
# Token-blocked wgrad images (docs/notes/gemm.md, "Token-blocked wgrad images"): tests, then exact
# wgrad on token-blocked images (the "mxmoe-exact" line, what the layer now does) against row-major
# ones ("mxmoe-exact-rowimg", --wgrad-rowimg; output bitwise equal) and torch BF16, in alternation.
# Builds nothing: MXMOE_BUILD_DIR (default build) must hold mxmoe_gpu_tests and libmxmoe_c.so. Every
# command under `timeout`; ~230 s in all (WGRAD_AB_BUDGET), the last step gets what is left.
#   MXMOE_BUILD_DIR=build-gpu timeout 240 scripts/wgrad_blocked_ab.sh OUT
# 1. the new tests (GemmGpu.WgradTokenBlockedImagesBitwiseEqual, DequantizeGpu.TokenBlockedMatchesReference)
#    and the layer's exact-mode check (MoeLayerGpu.ForwardBackwardMatchMxReferenceBothModes)   OUT/tests_new.log
# 2. bench_gemm --wgrad --wgrad-only --wgrad-rowimg, Qwen3-30B and DSV3 shapes, T = 8192 then 2048
#    per expert (two runs, so that a timeout keeps the first table)     OUT/bench_8192.log, OUT/bench_2048.log
# 3. GemmGpu.* (the rest of the GEMM tests; row-major paths unchanged)  OUT/tests_gemm.log
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-out}
mkdir -p "$OUT"
export MXMOE_BUILD_DIR=${MXMOE_BUILD_DIR:-build}
export PYTHONUNBUFFERED=1
B=$MXMOE_BUILD_DIR
T0=$SECONDS
timeout 30 "$B/mxmoe_gpu_tests" \
  --gtest_filter='GemmGpu.WgradTokenBlockedImagesBitwiseEqual:DequantizeGpu.TokenBlockedMatchesReference:MoeLayerGpu.ForwardBackwardMatchMxReferenceBothModes' \
  > "$OUT/tests_new.log" 2>&1
echo "new tests rc=$? ($((SECONDS - T0)) s)"
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|Failure|SKIPPED \]|differs|layer-case-errors" "$OUT/tests_new.log" | head -20
bench() {  # tpe timeout
  local t0=$SECONDS
  timeout "$2" python3 bench/bench_gemm.py --wgrad --wgrad-only --wgrad-rowimg --tpe "$1" \
    --shapes "Qwen3-30B,DSV3" --reps 7 --json "$OUT/bench_$1.json" > "$OUT/bench_$1.log" 2>&1
  echo "bench_gemm T=$1 rc=$? ($((SECONDS - t0)) s; xBF16 = torch BF16 time / ours; xdefault on the rowimg line = blocked time / row-major time)"
  grep -E "copy:|mxmoe-exact|mxmoe-fast |mxmoe-dequant|torch-bf16|VERIFY|Error|error" "$OUT/bench_$1.log" | cut -c1-190
}
bench 8192 100
bench 2048 50
LEFT=$((${WGRAD_AB_BUDGET:-230} - SECONDS))
if [ "$LEFT" -gt 5 ]; then
  T0=$SECONDS
  timeout "$LEFT" "$B/mxmoe_gpu_tests" --gtest_filter='GemmGpu.*:-GemmGpu.WgradTokenBlockedImagesBitwiseEqual' \
    > "$OUT/tests_gemm.log" 2>&1
  echo "GemmGpu.* rc=$? ($((SECONDS - T0)) s of $LEFT)"
  grep -E "^\[  (PASSED|FAILED) |FAILED  \]|Failure|SKIPPED \]" "$OUT/tests_gemm.log" | head -20
else
  echo "GemmGpu.* skipped: no time left"
fi
