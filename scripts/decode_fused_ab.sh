#!/usr/bin/env bash
# The fused decode step (decode_step_fused, one persistent kernel) on the GPU machine: the decode
# tests (incl. DecodeGpu.FusedStepMatchesThreeKernels: bitwise vs the three kernels), then the A/B
# fused vs three-kernel step (bench/bench_decode_split.py --fused: Qwen3-30B, Qwen3-235B,
# DeepSeek-V3; B = 1, 2, 8; BF16 and MXFP8; ids, routing weights and out compared bit for bit),
# then the cooperative-launch variant once (its launch attributes are untested together with PDL).
# Builds nothing: MXMOE_BUILD_DIR (default build) must hold mxmoe_gpu_tests and libmxmoe_c.so.
# Every command under `timeout`; at most ~150 s in all.
#   MXMOE_BUILD_DIR=build-gpu timeout 160 scripts/decode_fused_ab.sh OUT
# Writes OUT/fused_tests.log, OUT/fused_ab.log, OUT/fused_coop.log; prints their summaries.
# Settings (MXMOE_DECODE_FUSED_*, read by decode_step_fused; the three-kernel step ignores them):
#   fused   defaults (L2 prefetch of Wr before the wait and of the first W2 rows before barrier 2)
#   nopf    both prefetches off
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-out}
mkdir -p "$OUT"
export MXMOE_BUILD_DIR=${MXMOE_BUILD_DIR:-build}
export PYTHONUNBUFFERED=1
B=$MXMOE_BUILD_DIR
T0=$SECONDS
timeout 60 ./$B/mxmoe_gpu_tests --gtest_filter='DecodeGpu.*' > "$OUT/fused_tests.log" 2>&1
echo "decode tests rc=$? ($((SECONDS - T0)) s)"
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|Failure|SKIPPED \]|^\[fused\]|first difference" "$OUT/fused_tests.log" | head -24
SETTINGS="fused:;nopf:MXMOE_DECODE_FUSED_W2_PREFETCH=0,MXMOE_DECODE_FUSED_WR_PREFETCH=0"
T0=$SECONDS
timeout 75 python3 bench/bench_decode_split.py --shapes Qwen3-30B-A3B,Qwen3-235B-A22B,DeepSeek-V3 \
  --batches 1,2,8 --split-batches "" --reps 8 --fused --settings "$SETTINGS" > "$OUT/fused_ab.log" 2>&1
echo "fused A/B rc=$? ($((SECONDS - T0)) s; 'x step' = three-kernel step time / fused time, same setting)"
grep -E "copy bandwidth|B=|MISMATCH|Error|error" "$OUT/fused_ab.log" \
  | sed -E 's/^(\S+ B=[0-9]+ \S+ \S+): step ([0-9.]+ us = [0-9.]+% copy).*\| fused (.*)$/\1: step \2 | fused \3/' | cut -c1-200
T0=$SECONDS
MXMOE_DECODE_FUSED_COOP=1 timeout 15 python3 bench/bench_decode_split.py --shapes Qwen3-30B-A3B --batches 1 \
  --split-batches "" --reps 5 --fused --settings "coop:" > "$OUT/fused_coop.log" 2>&1
echo "cooperative launch rc=$? ($((SECONDS - T0)) s)"
grep -E "B=|Error|error" "$OUT/fused_coop.log" | cut -c1-200 | tail -4
