#!/usr/bin/env bash
# Issue 6 (warp decode, B = 1..8) A/B runs on the GPU machine. Builds nothing: MXMOE_BUILD_DIR
# (default build) must hold mxmoe_gpu_tests and libmxmoe_c.so. Every command under `timeout`.
#   MXMOE_BUILD_DIR=build-gpu timeout 180 scripts/decode_ab.sh OUT [ctas|fused]
# Both modes first run the decode tests (OUT/decode_tests.log; incl. DecodeGpu.FusedStepMatchesThreeKernels,
# the fused step bitwise against the three kernels), then:
#   ctas  (default; run 59, ~165 s): the MXFP8 gate/up launch bound (MXMOE_DECODE_MX_GATE_UP_CTAS: new =
#         the library default of 3 CTAs a SM, cta2 = 2) with the per-kernel split at B = 1 and a bitwise
#         comparison of ids, routing weights and outputs across settings (OUT/decode_ab.log), then the
#         issue's table (bench_decode.py at the defaults, OUT/decode_bench.log)
#   fused (run 63, ~150 s): decode_step_fused against the three-kernel step (bench_decode_split.py --fused:
#         Qwen3-30B, Qwen3-235B, DeepSeek-V3; B = 1, 2, 8; BF16 and MXFP8; outputs bit for bit), with its
#         L2 prefetches on (fused) and off (nopf) (OUT/fused_ab.log), then the cooperative-launch
#         attribute once (OUT/fused_coop.log)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-out}
MODE=${2:-ctas}
mkdir -p "$OUT"
export MXMOE_BUILD_DIR=${MXMOE_BUILD_DIR:-build}
export PYTHONUNBUFFERED=1
B=$MXMOE_BUILD_DIR
T0=$SECONDS
timeout 60 "$B/mxmoe_gpu_tests" --gtest_filter='DecodeGpu.*' > "$OUT/decode_tests.log" 2>&1
echo "decode tests rc=$? ($((SECONDS - T0)) s)"
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|Failure|SKIPPED \]|^\[fused\]|first difference" "$OUT/decode_tests.log" | head -24
split() {  # log settings extra-args...: bench_decode_split.py on the three shapes at B = 1, 2, 8
  local log=$1 settings=$2; shift 2
  timeout 75 python3 bench/bench_decode_split.py --shapes Qwen3-30B-A3B,Qwen3-235B-A22B,DeepSeek-V3 \
    --batches 1,2,8 --reps 8 --settings "$settings" "$@" > "$OUT/$log" 2>&1
}
T0=$SECONDS
if [ "$MODE" = fused ]; then
  split fused_ab.log "fused:;nopf:MXMOE_DECODE_FUSED_W2_PREFETCH=0,MXMOE_DECODE_FUSED_WR_PREFETCH=0" \
    --split-batches "" --fused
  echo "fused A/B rc=$? ($((SECONDS - T0)) s; 'x step' = three-kernel step time / fused time, same setting)"
  grep -E "copy bandwidth|B=|MISMATCH|Error|error" "$OUT/fused_ab.log" \
    | sed -E 's/^(\S+ B=[0-9]+ \S+ \S+): step ([0-9.]+ us = [0-9.]+% copy).*\| fused (.*)$/\1: step \2 | fused \3/' | cut -c1-200
  T0=$SECONDS
  MXMOE_DECODE_FUSED_COOP=1 timeout 15 python3 bench/bench_decode_split.py --shapes Qwen3-30B-A3B --batches 1 \
    --split-batches "" --reps 5 --fused --settings "coop:" > "$OUT/fused_coop.log" 2>&1
  echo "cooperative launch rc=$? ($((SECONDS - T0)) s)"
  grep -E "B=|Error|error" "$OUT/fused_coop.log" | cut -c1-200 | tail -4
  exit 0
fi
split decode_ab.log "new:;cta2:MXMOE_DECODE_MX_GATE_UP_CTAS=2" --split-batches 1
echo "decode A/B rc=$? ($((SECONDS - T0)) s; 'x new' = new's step time / this setting's)"
grep -E "copy bandwidth|B=|MISMATCH|Error|error" "$OUT/decode_ab.log" | sed -E 's/ \| alone:.*//' | cut -c1-200
T0=$SECONDS
timeout 60 python3 bench/bench_decode.py --shapes Qwen3-30B-A3B,Qwen3-235B-A22B --batches 1,2,4,8 --reps 10 \
  > "$OUT/decode_bench.log" 2>&1
echo "bench_decode rc=$? ($((SECONDS - T0)) s)"
grep -E "copy|warp|decode_step|crossover|Error|error" "$OUT/decode_bench.log" | cut -c1-160 | head -60
