# Shared by the quantizer A/B scripts (scripts/quant*_ab.sh), sourced after their header:
#   ab_setup OUT_ARG DEFAULT_BUDGET LOG_PREFIX   cd to the repository, OUT, BUILD (MXMOE_BUILD_DIR,
#       default build), BUDGET (QUANT_AB_BUDGET, default DEFAULT_BUDGET s), TESTS (mxmoe_gpu_tests),
#       the logs of start_test at $OUT/LOG_PREFIX<name>.log
#   left WANT                    timeout for a step: min(WANT, what is left of BUDGET - 3 s), at least 5
#   start_test NAME ENV... -- FILTER   one test process in the background, timeout $T (set T first)
#   wait_tests                   waits for all of them: RCS[name] = exit status; one sorted line each
#   show_failures                the first failures of every log with one
ab_setup() {
  cd "$(dirname "$0")/.."
  OUT=${1:-out}
  BUILD=${MXMOE_BUILD_DIR:-build}
  BUDGET=${QUANT_AB_BUDGET:-$2}
  AB_PREFIX=$3
  mkdir -p "$OUT"
  export PYTHONUNBUFFERED=1 MXMOE_BUILD_DIR=$BUILD
  TESTS=$BUILD/mxmoe_gpu_tests
  declare -gA LOGS=() RCS=()
}
left() {
  local l=$((BUDGET - SECONDS - 3)); [ "$1" -lt "$l" ] && l=$1; [ "$l" -lt 5 ] && l=5; echo "$l"
}
start_test() {
  local name=$1; shift; local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  env "${envs[@]}" timeout "$T" "$TESTS" --gtest_filter="$1" > "$OUT/$AB_PREFIX$name.log" 2>&1 &
  LOGS[$name]=$!
}
wait_tests() {
  local res="" name rc
  for name in "${!LOGS[@]}"; do
    wait "${LOGS[$name]}"; rc=$?
    RCS[$name]=$rc
    res+="$name rc=$rc $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/$AB_PREFIX$name.log" | head -1)"$'\n'
  done
  printf '%s' "$res" | sort
}
show_failures() {
  local f
  for f in "$OUT/$AB_PREFIX"*.log; do
    grep -q ": Failure$" "$f" && { echo "-- $f"; grep -E -A4 ": Failure$" "$f" | cut -c1-220 | head -16; }
  done
}
