#!/usr/bin/env bash
# (Session 12: the unit walk is opt-in now, MXMOE_QUANT_SCALE_UNIT=1; its variant is "tma-unit".)
# Session 11: A/B of the pipelined quantizer's unit walk + unit scale writer (MXMOE_QUANT_SCALE_UNIT,
# the pipelined kernel's default) against the round-robin walk of run 62, today's default kernels
# and the skeletons, on an existing build (nothing is built here): MXMOE_BUILD_DIR (default: build)
# must hold mxmoe_gpu_tests and libmxmoe_c.so built from this tree.
#   MXMOE_BUILD_DIR=build-q9 timeout 150 scripts/quant_unit_ab.sh OUT
# Whole script <= ~145 s (QUANT_AB_BUDGET, each step's timeout cut to what is left). Expected
# ~50 + ~45 + ~30 s. Compact summary on stdout, full logs in OUT:
#  0. tests in parallel processes (their time is the CPU reference): PipelinedKernelScaleUnits (unit
#     shapes, partial units at every edge, MXMOE_QUANT_SCALE_UNIT=0, reruns), the pipelined test on
#     the defaults (unit walk), with MXMOE_QUANT_SCALE_UNIT=0 and with the per-tile writer warp on
#     the unit walk -> OUT/unit_ab_test_*.log. A failure or hang leaves the unit variants in step 1
#     (they are checked bit for bit there too) but says so.
#  1. bench/quant_variants.py, modes flush and loop: default, tma-rr (run 62's tma), tma-warp (run
#     62's writer warp), tma (unit walk + unit writer), tma-unit-late (unit walk, per-tile stores),
#     tma-u1x1 / u2x2 / u1x16, skel, skel-sc-late (run 62's skeletons), skel-unit, skel-sc-unit
#     -> OUT/unit_variants.{log,json}
#  2. ncu, 16384x7168 row+col: L2 write sectors and requests, DRAM bytes and duration of tma-rr,
#     tma, tma-u1x1, skel-sc-early, skel-sc-unit -> OUT/unit_ncu.{csv,txt}. The prediction
#     (quantize.md "Session 11"): write sectors 9.18M (tma-rr) -> ~7.86M (tma), requests 3.67M ->
#     ~2.35M; tma-u1x1 ~ tma-rr.
set -uo pipefail
source "$(dirname "$0")/ab_lib.sh"
ab_setup "${1:-out}" 145 unit_ab_test_

echo "== 0. tests in parallel (t=${SECONDS}s)"
P=QuantizeGpu.PipelinedKernelOnPlainCopies
T=$(left 55)
start_test units MXMOE_QUANT_TMA=1 -- QuantizeGpu.PipelinedKernelScaleUnits
start_test pipelined_default MXMOE_QUANT_TMA=1 MXMOE_QUANT_SCALE_UNIT=1 -- "$P"
start_test pipelined_rr MXMOE_QUANT_TMA=1 MXMOE_QUANT_SCALE_UNIT=0 -- "$P"
start_test pipelined_unit_warp MXMOE_QUANT_TMA=1 MXMOE_QUANT_SCALE_UNIT=1 MXMOE_QUANT_TMA_SCALES=warp -- "$P"
wait_tests
show_failures

echo "== 1. quant_variants.py (t=${SECONDS}s)"
V='^(default|tma-rr|tma-warp|tma-unit|tma-unit-late|tma-u1x1|tma-u2x2|tma-u1x16|skel|skel-sc-late|skel-unit|skel-sc-unit)$'
timeout "$(left 60)" python3 bench/quant_variants.py --modes flush,loop --variants "$V" \
  --json "$OUT/unit_variants.json" > "$OUT/unit_variants.log" 2>&1
echo "rc=$?"
sed '/^Traceback/,$d' "$OUT/unit_variants.log" | cut -c1-260 | head -30
grep -q "^Traceback" "$OUT/unit_variants.log" && sed -n '/^Traceback/,$p' "$OUT/unit_variants.log" | tail -6

echo "== 2. ncu: L2 write sectors / requests, 16384x7168 row+col (t=${SECONDS}s)"
if command -v ncu > /dev/null && [ $((BUDGET - SECONDS)) -gt 20 ]; then
  M=$(python3 scripts/ncu_quant_diag.py sector-metrics)
  KEEP='^(?!row\+col (tma-rr|tma-unit|tma-u1x1|skel-sc-early|skel-sc-unit)$)'
  timeout "$(left 40)" ncu --clock-control none --kernel-name-base demangled -k "regex:quantize_mxfp8_[a-z_]+kernel" \
    --metrics "$M" --csv --page raw --print-units base \
    python3 bench/quant_variants.py --skip "$KEEP" --profile "$OUT/unit_ncu_labels.txt" > "$OUT/unit_ncu.csv" 2> "$OUT/unit_ncu_run.log"
  echo "ncu rc=$?"
  python3 scripts/ncu_quant_diag.py sectors "$OUT/unit_ncu.csv" "$OUT/unit_ncu_labels.txt" | tee "$OUT/unit_ncu.txt"
else
  echo "ncu not found or no time left"
fi
echo "== done (t=${SECONDS}s)"
