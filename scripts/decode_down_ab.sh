#!/usr/bin/env bash
# Down-kernel design-space sweep (docs/notes/decode.md, session 11) on the GPU machine, <= 150 s
# (timeouts 50 + 55 + 40). Builds nothing: MXMOE_BUILD_DIR (default build) must hold mxmoe_gpu_tests
# and libmxmoe_c.so. Every command under `timeout`.
#   MXMOE_BUILD_DIR=build timeout 170 scripts/decode_down_ab.sh OUT
# 1. the decode GPU tests (OUT/decode_tests.log), incl. DecodeGpu.DownSwitchesGiveDefaultBits (every
#    MXMOE_DECODE_DOWN_* setting: out bit for bit against the default) and DownSwitchesRejectBadValues;
# 2. bench_decode_split.py --settings down (10 settings, bench/bench_decode_split.py DOWN_SETTINGS):
#    the down kernel alone (D: us, % of copy for the routed W2 bytes, x = default's D time / this
#    setting's) and the step, all settings timed in alternation, at B = 1 and 8, BF16 and MXFP8, for
#    Qwen3-30B and Qwen3-235B (OUT/down_qwen.log), then DeepSeek-V3 with the short list (7 settings,
#    OUT/down_dsv3.log); ids, routing weights and out compared bit for bit across settings
#    ("bitwise=yes"; a mismatch makes the bench exit 1 and print BITWISE MISMATCH).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-out}
mkdir -p "$OUT"
export MXMOE_BUILD_DIR=${MXMOE_BUILD_DIR:-build}
export PYTHONUNBUFFERED=1
B=$MXMOE_BUILD_DIR
T0=$SECONDS
timeout 50 "$B/mxmoe_gpu_tests" --gtest_filter='DecodeGpu.*' > "$OUT/decode_tests.log" 2>&1
echo "decode tests rc=$? ($((SECONDS - T0)) s)"
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|Failure|SKIPPED \]|differs first|accepted" "$OUT/decode_tests.log" | head -24
show() {  # one line per (shape, B, weights, setting): D alone first, then the step
  grep -E "copy bandwidth|B=|MISMATCH|Error|error" "$1" \
    | sed -E 's/^(\S+ B=[0-9]+ \S+ \S+): step ([0-9.]+) us = ([0-9.]+% copy) \(([0-9.]+x) [^)]*\)( bitwise=\S+)? \| alone: D ([0-9.]+) \(([0-9]+% copy)\) ([0-9.]+x)$/\1 D \6 us \7 \8 | step \2 us \3 \4\5/' \
    | cut -c1-160
}
T0=$SECONDS
timeout 55 python3 bench/bench_decode_split.py --shapes Qwen3-30B-A3B,Qwen3-235B-A22B --batches 1,8 \
  --split-batches 1,8 --split-kinds D --reps 6 --settings down > "$OUT/down_qwen.log" 2>&1
echo "down sweep Qwen3 rc=$? ($((SECONDS - T0)) s; 'x' = default's time / this setting's)"
show "$OUT/down_qwen.log"
T0=$SECONDS
timeout 40 python3 bench/bench_decode_split.py --shapes DeepSeek-V3 --batches 1,8 \
  --split-batches 1,8 --split-kinds D --reps 5 --settings down-short > "$OUT/down_dsv3.log" 2>&1
echo "down sweep DeepSeek-V3 rc=$? ($((SECONDS - T0)) s)"
show "$OUT/down_dsv3.log"
