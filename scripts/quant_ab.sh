#!/usr/bin/env bash
# A/B of the pipelined quantizer (MXMOE_QUANT_TMA=1) against today's kernels, in one GPU session,
# on an existing build (nothing is built here): MXMOE_BUILD_DIR (default: build) must hold
# mxmoe_gpu_tests and libmxmoe_c.so built from this tree.
#   MXMOE_BUILD_DIR=build-gpu timeout 150 scripts/quant_ab.sh OUT
# Every step runs under `timeout` (35 + 25 + 60 s at most). Writes OUT/quant_ab_tests_tma.log,
# OUT/quant_ab_tests_base.log, OUT/quant_ab_bench.log and OUT/quant_ab_bench.json; prints a summary.
#  1. the dense quantize tests with MXMOE_QUANT_TMA=1 (every plain copy of a dense input then takes
#     the pipelined kernel), then the pipelined kernel's own test (PipelinedKernelOnPlainCopies);
#  2. the same dense tests with MXMOE_QUANT_TMA=0 (today's kernels);
#  3. bench_quant.py --quick --tma on the plain dense cases: "% copy" = today's default kernel,
#     "tma % copy" = the pipelined kernel, same process, same data, both outputs checked bit for bit.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-out}
BUILD=${MXMOE_BUILD_DIR:-build}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
TESTS=$BUILD/mxmoe_gpu_tests
DENSE='QuantizeGpu.EveryBf16PatternAsElementAndAsAmax:QuantizeGpu.RandomShapesBitExact:QuantizeGpu.BatchedWeightsBothDirectionsOnePass:QuantizeGpu.NanAndInfPoisonBlocksAndChunks:QuantizeGpu.RerunsAreBitwiseIdentical:QuantizeGpu.UnalignedScalePointers'
summary() {  # log: gtest's verdict and the first failures
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests? ran" "$1" | head -12
  grep -E -A4 ": Failure$" "$1" | cut -c1-220 | head -30
}
echo "== tests, MXMOE_QUANT_TMA=1 (dense quantize tests + PipelinedKernelOnPlainCopies)"
MXMOE_QUANT_TMA=1 timeout 35 "$TESTS" --gtest_filter="$DENSE:QuantizeGpu.PipelinedKernelOnPlainCopies" \
  > "$OUT/quant_ab_tests_tma.log" 2>&1
echo "rc=$?"; summary "$OUT/quant_ab_tests_tma.log"
echo "== tests, MXMOE_QUANT_TMA=0 (today's kernels)"
MXMOE_QUANT_TMA=0 timeout 25 "$TESTS" --gtest_filter="$DENSE" > "$OUT/quant_ab_tests_base.log" 2>&1
echo "rc=$?"; summary "$OUT/quant_ab_tests_base.log"
echo "== bench_quant.py --quick --tma (plain copies of dense inputs)"
MXMOE_BUILD_DIR=$BUILD timeout 60 python3 bench/bench_quant.py --quick --tma \
  --cases '^(rowwise|colwise|row\+col|weights row\+col) [0-9]' --json "$OUT/quant_ab_bench.json" > "$OUT/quant_ab_bench.log" 2>&1
echo "rc=$?"
B="$OUT/quant_ab_bench.log"
grep -E "^device-to-device copy" "$B"
if grep -q "^MXFP8 quantization" "$B"; then sed -n '/^MXFP8 quantization/,$p' "$B" | cut -c1-200 | head -20
else grep -E "^done: " "$B" | cut -c1-200; fi  # cut short: the cases that finished
grep -E "ERROR|Error|error|Traceback" "$B" | head -5
