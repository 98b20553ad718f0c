#!/usr/bin/env bash
# A/B of the pipelined quantizer (MXMOE_QUANT_TMA=1) against today's kernels, in one GPU session,
# on an existing build (nothing is built here): MXMOE_BUILD_DIR (default: build) must hold
# mxmoe_gpu_tests and libmxmoe_c.so built from this tree.
#   MXMOE_BUILD_DIR=build-gpu timeout 150 scripts/quant_ab.sh OUT
# Every step runs under `timeout` (30 + 45 + 30 + 15 s at most; expected ~15 + 20 + 20 + 3 s, the
# tests' time mostly the CPU reference). Writes OUT/quant_ab_pipelined.log, OUT/quant_ab_bench.log,
# OUT/quant_ab_bench.json, OUT/quant_ab_tests_tma.log, OUT/quant_ab_tests_base.log; prints a summary.
#  1. the pipelined kernel's own test (PipelinedKernelOnPlainCopies: every BF16 pattern, partial
#     tiles, batches, long walks, reruns; it sets MXMOE_QUANT_TMA=1 itself);
#  2. bench_quant.py --quick --tma on the plain dense cases: "% copy" = today's default kernel,
#     "tma % copy" = the pipelined kernel, same process, same data, both outputs checked bit for bit;
#  3. dense quantize tests with MXMOE_QUANT_TMA=1 (every plain copy of a dense input then takes the
#     pipelined kernel; the fast forms keep their kernels), and a short set with MXMOE_QUANT_TMA=0
#     (today's kernels; the full suite is the regular test run's).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-out}
BUILD=${MXMOE_BUILD_DIR:-build}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
TESTS=$BUILD/mxmoe_gpu_tests
DENSE='QuantizeGpu.RandomShapesBitExact:QuantizeGpu.BatchedWeightsBothDirectionsOnePass:QuantizeGpu.NanAndInfPoisonBlocksAndChunks:QuantizeGpu.UnalignedScalePointers'
SHORT='QuantizeGpu.NanAndInfPoisonBlocksAndChunks:QuantizeGpu.UnalignedScalePointers:QuantizeGpu.RerunsAreBitwiseIdentical'
summary() {  # log: gtest's verdict and the first failures
  grep -E "^\[==========\]|^\[  PASSED  \]|^\[  FAILED  \]|^\[  SKIPPED \] [0-9]" "$1" | head -12
  grep -E -A4 ": Failure$" "$1" | cut -c1-220 | head -30
}
echo "== 1. QuantizeGpu.PipelinedKernelOnPlainCopies"
timeout 30 "$TESTS" --gtest_filter=QuantizeGpu.PipelinedKernelOnPlainCopies > "$OUT/quant_ab_pipelined.log" 2>&1
echo "rc=$?"; summary "$OUT/quant_ab_pipelined.log"
echo "== 2. bench_quant.py --quick --tma (plain copies of dense inputs)"
MXMOE_BUILD_DIR=$BUILD timeout 45 python3 bench/bench_quant.py --quick --tma \
  --cases '^(rowwise|colwise|row\+col|weights row\+col) [0-9]' --json "$OUT/quant_ab_bench.json" > "$OUT/quant_ab_bench.log" 2>&1
echo "rc=$?"
B="$OUT/quant_ab_bench.log"
grep -E "^device-to-device copy" "$B"
if grep -q "^MXFP8 quantization" "$B"; then sed -n '/^MXFP8 quantization/,$p' "$B" | cut -c1-200 | head -20
else grep -E "^done: " "$B" | cut -c1-200; fi  # cut short: the cases that finished
grep -E "ERROR|Error|error|Traceback" "$B" | head -5
echo "== 3a. dense quantize tests, MXMOE_QUANT_TMA=1"
MXMOE_QUANT_TMA=1 timeout 30 "$TESTS" --gtest_filter="$DENSE" > "$OUT/quant_ab_tests_tma.log" 2>&1
echo "rc=$?"; summary "$OUT/quant_ab_tests_tma.log"
echo "== 3b. short set, MXMOE_QUANT_TMA=0 (today's kernels)"
MXMOE_QUANT_TMA=0 timeout 15 "$TESTS" --gtest_filter="$SHORT" > "$OUT/quant_ab_tests_base.log" 2>&1
echo "rc=$?"; summary "$OUT/quant_ab_tests_base.log"
