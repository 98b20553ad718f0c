#!/usr/bin/env bash
# On the GPU machine: build with all cores, run every test (GPU ones included) and every
# benchmark, writing logs and JSON results under OUT (default ./out). Prints a short summary last.
#   scripts/gpu_run.sh OUT [--quick]
# Files written (at most 8, so a remote run can bring them all back):
#   build.log tests.log bench_quant.log bench_quant.json bench_gemm.log bench_gemm.json summary.json
#   dmon.log (nvidia-smi dmon through the benchmarks; beyond 7 files the logs travel as logs.tar.gz)
#   and, with MXMOE_NCU=1, ncu_quant.txt (Nsight Compute sections of each quantizer variant),
#   ncu_quant_run.log and ncu_quant_src.csv.gz (stall samples per SASS instruction);
#   with MXMOE_PYTHON=1, python_build.log and python_tests.log (keep MXMOE_BENCHES short: 8 files come back);
#   MXMOE_EP=1 runs the expert-parallel tests (mxmoe_ep_test: dispatch/combine; mxmoe_ep_layer_test:
#   the EP layer vs MoeLayer) at R = #GPUs (if >= 2) and R = 1, printed inline, then the torch.distributed
#   baselines (bench_ep_a2a.py; bench_ep_layer_a2a.py, which needs MXMOE_PYTHON=1 for the binding);
#   MXMOE_CTEST_REGEX=re runs only the tests whose names match (ctest -R);
#   MXMOE_NCU_GEMM=1 writes ncu_gemm.txt, ncu_gemm_run.log and ncu_gemm_src.csv.gz (stall reasons
#   of the fast GEMM, DSV3 gate-up, also per SASS instruction).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-out}
QUICK=${2:-}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
{ nvidia-smi; nvcc --version; } > "$OUT/build.log" 2>&1
./scripts/deps.sh >> "$OUT/build.log" 2>&1
BUILD=build-gpu
start=$(date +%s)
cmake -S . -B $BUILD -DCMAKE_BUILD_TYPE=Release -DMXMOE_PTXAS_VERBOSE=ON >> "$OUT/build.log" 2>&1 &&
  cmake --build $BUILD -j"$(nproc)" >> "$OUT/build.log" 2>&1
build_rc=$?
echo "build rc=$build_rc in $(( $(date +%s) - start )) s"
tests_rc=-1
if [ $build_rc -eq 0 ]; then
  (cd $BUILD && timeout ${MXMOE_TESTS_TIMEOUT:-420} ctest --output-on-failure -j1 --timeout 90 ${MXMOE_CTEST_REGEX:+-R "$MXMOE_CTEST_REGEX"}) > "$OUT/tests.log" 2>&1
  tests_rc=$?
  grep -E "tests passed|tests failed|Failed|\*\*\*" "$OUT/tests.log" | tail -20
  # What failed, inline (the log itself may not come back from a remote run)
  grep -E -B1 -A4 "^[^ ]*: Failure|C\+\+ exception|Value of:|Expected" "$OUT/tests.log" | cut -c1-200 | head -60
  timeout 60 ./$BUILD/mxmoe_example_quantize >> "$OUT/tests.log" 2>&1; echo "example rc=$?"
fi
run_bench() {  # name
  local b=$1
  [ -f bench/$b.py ] || return 0
  [ $build_rc -eq 0 ] || return 0
  timeout ${MXMOE_BENCH_TIMEOUT:-300} python3 bench/$b.py --json "$OUT/$b.json" $QUICK > "$OUT/$b.log" 2>&1
  echo "$b rc=$?"
  tail -40 "$OUT/$b.log"
}
[ -e build ] || ln -s $BUILD build
# Power and clocks through the benchmarks (nvidia-smi dmon: W, temperatures, memory / SM clock, power
# and thermal violations): the H200 runs the GEMM benchmarks at its 700 W cap, the SM clock falling
# from 1980 MHz to 1300-1550 in the heaviest stretches (runs 94-95), so what ran before a kernel
# changes its clock (bench/common.py Timer.many balances the orders for that). summary.json gets the
# share of busy samples (>= 300 W) with a power violation, and the SM clock and power under load.
dmon_pid=
stop_dmon() {  # SIGTERM, then SIGKILL if it is still there a second later
  [ -n "$dmon_pid" ] || return 0
  kill "$dmon_pid" 2>/dev/null; sleep 1; kill -9 "$dmon_pid" 2>/dev/null; wait "$dmon_pid" 2>/dev/null
  dmon_pid=
}
trap stop_dmon EXIT
if command -v nvidia-smi >/dev/null 2>&1; then
  timeout 3600 nvidia-smi dmon -s pcv -d 1 -o T > "$OUT/dmon.log" 2>&1 &
  dmon_pid=$!
fi
for b in ${MXMOE_BENCHES:-bench_quant bench_gemm}; do run_bench $b; done
stop_dmon
if [ "${MXMOE_PYTHON:-0}" = 1 ] && [ $build_rc -eq 0 ]; then  # the PyTorch binding and its pytest suite
  timeout 900 ./scripts/python_test.sh "$OUT" > /dev/null 2>&1
  echo "python tests rc=$?"; tail -3 "$OUT/python_tests.log" 2>/dev/null
fi
if [ "${MXMOE_EP:-0}" = 1 ] && [ $build_rc -eq 0 ] && [ -x $BUILD/mxmoe_ep_test ]; then
  # expert parallelism: R = every GPU of the machine (when 2 or more), then R = 1; everything in
  # OUT/ep.log, the result lines inline
  ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
  for r in $( [ "$ngpu" -ge 2 ] && echo "$ngpu" ) 1; do
    NCCL_NVLS_ENABLE=0 MXMOE_EP_TIMEOUT=90 timeout 120 scripts/ep_launch.sh "$r" $BUILD/mxmoe_ep_test 2>&1 |
      tee -a "$OUT/ep.log" | grep -E "PASS|FAIL|ERROR|GB/s|R = 1" | cut -c1-200
    echo "EP R=$r rc=${PIPESTATUS[0]}" | tee -a "$OUT/ep.log"
    # the EP training layer against the single-GPU MoeLayer (bitwise), graph replay, timing
    [ -x $BUILD/mxmoe_ep_layer_test ] &&
      { NCCL_NVLS_ENABLE=0 MXMOE_EP_TIMEOUT=240 timeout 270 scripts/ep_launch.sh "$r" $BUILD/mxmoe_ep_layer_test 2>&1 |
          tee -a "$OUT/ep.log" | grep -E "FAIL|ERROR|timing|GB/s|ALL PASS|rc=|exited|ep-layer" | cut -c1-400
        echo "EP layer R=$r rc=${PIPESTATUS[0]}" | tee -a "$OUT/ep.log"; }
  done
  if [ "$ngpu" -ge 2 ]; then  # the torch.distributed all_to_all baseline on the same bytes (issue 7)
    NCCL_NVLS_ENABLE=0 timeout 180 python3 bench/bench_ep_a2a.py --world "$ngpu" 2>&1 | tee -a "$OUT/ep.log" |
      grep -E "GB/s|rror" | cut -c1-200
    # mxmoe's EP layer at DeepSeek-V3-like size (E = 32, H = 7168, T_r = 4096 - 37r), timing only: the
    # "ep-layer dsv3" line, to compare with the baseline's "a2a-baseline dsv3" lines below
    NCCL_NVLS_ENABLE=0 MXMOE_EP_LAYER_DSV3=only MXMOE_EP_TIMEOUT=240 timeout 270 \
      scripts/ep_launch.sh "$ngpu" $BUILD/mxmoe_ep_layer_test 2>&1 | tee -a "$OUT/ep.log" |
      grep -E "FAIL|ERROR|timing|ep-layer|rc=|exited" | cut -c1-400
    echo "EP layer dsv3 timing R=$ngpu rc=${PIPESTATUS[0]}" | tee -a "$OUT/ep.log"
    # the EP *layer* baseline: torch.distributed all_to_all around mxmoe's single-GPU ops, fwd+bwd,
    # checked against a BF16 reference (issue 7's ">= 1.5x"; compare its "a2a-baseline ... fwd+bwd ms"
    # lines with the "ep-layer small" lines above). Needs the PyTorch binding: MXMOE_PYTHON=1.
    NCCL_NVLS_ENABLE=0 timeout ${MXMOE_EP_BASELINE_TIMEOUT:-600} python3 bench/bench_ep_layer_a2a.py --world "$ngpu" \
      --timeout 240 2>&1 | tee -a "$OUT/ep.log" |
      grep -E "a2a-baseline|compare |bench_ep_layer_a2a:|rror|FAIL|SKIP" | cut -c1-400
    echo "EP layer a2a baseline rc=${PIPESTATUS[0]}" | tee -a "$OUT/ep.log"
  fi
fi
# ncu_export REPORT PAGE NAME: the report's PAGE (details or raw) as OUT/NAME.txt, and the stall
# samples per SASS instruction of every profiled launch as OUT/NAME_src.csv.gz (summarise with
# scripts/ncu_src_summary.py).
ncu_export() {
  ncu -i "$1.ncu-rep" --page "$2" > "$OUT/$3.txt" 2>&1
  ncu -i "$1.ncu-rep" --page source --csv --print-source sass 2>&1 | gzip > "$OUT/$3_src.csv.gz"
}
if [ "${MXMOE_NCU:-0}" = 1 ] && [ $build_rc -eq 0 ]; then  # hardware counters of the quantizers
  (cd bench && timeout 300 ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
     --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section SchedulerStats --section Occupancy \
     --section SourceCounters -k regex:quantize_mxfp8 -f -o /tmp/ncu_quant python3 profile_quant.py) > "$OUT/ncu_quant_run.log" 2>&1
  echo "ncu rc=$?"
  ncu_export /tmp/ncu_quant details ncu_quant
  grep -E "^  [a-z_]+quantize|Duration|DRAM Throughput|L2 Cache Throughput|Issue Slots Busy|Eligible Warps" "$OUT/ncu_quant.txt" | head -40
fi
if [ "${MXMOE_NCU_GEMM:-0}" = 1 ] && [ $build_rc -eq 0 ]; then
  # Why the fast GEMM idles (run 13: tensor pipe 49%; run 16: not L2): stall reasons, pipe and
  # shared-memory utilisation of the first two launches on DeepSeek-V3 EP8 gate-up (fast mode).
  timeout 300 ncu --clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis \
    --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section SourceCounters \
    -k regex:grouped_gemm_mxfp8 -c 2 -f -o /tmp/ncu_gemm python3 bench/bench_gemm.py --quick \
    --shapes "DSV3-EP8 gate-up" --reps 1 > "$OUT/ncu_gemm_run.log" 2>&1
  echo "ncu gemm rc=$?"
  ncu_export /tmp/ncu_gemm raw ncu_gemm
  # raw page: every metric the sections collected; the stall reasons are the *issue_stalled* ones
  grep -E "issue_stalled|pipe_tensor|data_pipe_lsu_wavefronts_mem_shared|issue_active|throughput.avg.pct" \
    "$OUT/ncu_gemm.txt" | sort -k3 -g -r | head -40
fi
python3 - "$OUT" "$build_rc" "$tests_rc" <<'PY'
import json, re, sys, os
out, b, t = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = {"build_rc": b, "tests_rc": t}
p = os.path.join(out, "tests.log")
if os.path.exists(p):
    m = re.search(r"(\d+)% tests passed, (\d+) tests failed out of (\d+)", open(p).read())
    if m:
        s.update(tests_failed=int(m.group(2)), tests_total=int(m.group(3)))
p = os.path.join(out, "dmon.log")  # nvidia-smi dmon -s pcv -o T: time gpu pwr gtemp mtemp mclk pclk pviol tviol
if os.path.exists(p):
    rows = [l.split() for l in open(p) if l.strip() and not l.startswith("#")]
    rows = [r for r in rows if len(r) >= 9 and r[2].isdigit() and r[6].isdigit()]
    load = [r for r in rows if int(r[2]) >= 300]  # samples with the GPU busy
    if load:
        clocks = sorted(int(r[6]) for r in load)
        s.update(dmon_busy_samples=len(load),
                 dmon_power_capped_share=sum(r[7] not in ("0", "-") for r in load) / len(load),
                 dmon_sm_clock_mhz_min=clocks[0], dmon_sm_clock_mhz_median=clocks[len(clocks) // 2],
                 dmon_power_w_max=max(int(r[2]) for r in load))
json.dump(s, open(os.path.join(out, "summary.json"), "w"), indent=1)
print("summary:", s)
PY
# The device tool returns at most 8 files from OUT (run 48 lost tests.log that way): beyond 7, the
# logs travel as one archive next to summary.json (tar xzf OUT/logs.tar.gz to read them).
n_files=$(find "$OUT" -maxdepth 1 -type f | wc -l)
if [ "$n_files" -gt 7 ]; then
  (cd "$OUT" && find . -maxdepth 1 -type f ! -name summary.json -printf '%f\n' | tar czf logs.tar.gz -T - &&
    find . -maxdepth 1 -type f ! -name summary.json ! -name logs.tar.gz -delete)
  echo "logs: $n_files files packed into OUT/logs.tar.gz"
fi
