#!/usr/bin/env bash
# Issue 6 (warp decode, B = 1..8) on the GPU machine: the decode tests, the A/B of the MXFP8
# gate/up launch bound (MXMOE_DECODE_MX_GATE_UP_CTAS) with the per-kernel split at B = 1 and a
# bitwise comparison of ids, routing weights and outputs across settings, then the issue's table
# (bench_decode.py at the defaults). Builds nothing: MXMOE_BUILD_DIR (default build) must hold mxmoe_gpu_tests and
# libmxmoe_c.so. Every command under `timeout`; at most ~165 s in all.
#   MXMOE_BUILD_DIR=build-gpu timeout 180 scripts/decode_ab.sh OUT
# Writes OUT/decode_tests.log, OUT/decode_ab.log, OUT/decode_bench.log; prints their summaries.
# Settings (bench/bench_decode_split.py; the first is the reference for the bitwise check):
#   new       library defaults (MXFP8 gate/up at 3 CTAs a SM)
#   cta2      the MXFP8 gate/up at 2 CTAs a SM (BF16 is not affected by this switch)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-out}
mkdir -p "$OUT"
export MXMOE_BUILD_DIR=${MXMOE_BUILD_DIR:-build}
export PYTHONUNBUFFERED=1
B=$MXMOE_BUILD_DIR
T0=$SECONDS
timeout 50 ./$B/mxmoe_gpu_tests --gtest_filter='DecodeGpu.*' > "$OUT/decode_tests.log" 2>&1
echo "decode tests rc=$? ($((SECONDS - T0)) s)"
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|Failure|SKIPPED \]" "$OUT/decode_tests.log" | head -12
SETTINGS="new:;cta2:MXMOE_DECODE_MX_GATE_UP_CTAS=2"
T0=$SECONDS
timeout 55 python3 bench/bench_decode_split.py --shapes Qwen3-30B-A3B,Qwen3-235B-A22B,DeepSeek-V3 \
  --batches 1,2,8 --split-batches 1 --reps 8 --settings "$SETTINGS" > "$OUT/decode_ab.log" 2>&1
echo "decode A/B rc=$? ($((SECONDS - T0)) s; 'x new' = new's step time / this setting's)"
grep -E "copy bandwidth|B=|MISMATCH|Error|error" "$OUT/decode_ab.log" | sed -E 's/ \| alone:.*//' | cut -c1-200
T0=$SECONDS
timeout 60 python3 bench/bench_decode.py --shapes Qwen3-30B-A3B,Qwen3-235B-A22B --batches 1,2,4,8 --reps 10 \
  > "$OUT/decode_bench.log" 2>&1
echo "bench_decode rc=$? ($((SECONDS - T0)) s)"
grep -E "copy|warp|decode_step|crossover|Error|error" "$OUT/decode_bench.log" | cut -c1-160 | head -60
