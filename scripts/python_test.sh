#!/usr/bin/env bash
# Build the PyTorch binding (python/mxmoe, extension mxmoe._C) against the installed torch and run
# its pytest suite (after scripts/deps.sh, which does nothing when .deps/ is already there). Meant for
# the GPU machine (no package registry there: nothing is downloaded);
# on a machine without a GPU the GPU tests skip with the reason.
#   scripts/python_test.sh [OUT]      logs: OUT/python_build.log, OUT/python_tests.log (default ./out)
# Environment: MXMOE_PYTEST_TIMEOUT (whole run, s; default 900), MXMOE_PYTEST_ARGS (extra pytest
# arguments, e.g. "-k gemm"), MAX_JOBS (parallel compiles; default: all cores).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
PY=${PYTHON:-python3}

./scripts/deps.sh > "$OUT/python_build.log" 2>&1 || { echo "scripts/deps.sh failed (CUTLASS/CuTe headers)"; exit 1; }
start=$(date +%s)
{ $PY -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)'
  nvcc --version | tail -1; } >> "$OUT/python_build.log" 2>&1
# Editable install (the extension lands in python/mxmoe/, ignored by git); if pip cannot do it,
# build in place and put python/ on the path instead.
if $PY -m pip install --no-build-isolation --no-deps -v -e . >> "$OUT/python_build.log" 2>&1; then
  echo "build: pip install -e . ok in $(( $(date +%s) - start )) s"
else
  echo "build: pip install -e . failed (see $OUT/python_build.log); trying setup.py build_ext --inplace"
  $PY setup.py build_ext --inplace >> "$OUT/python_build.log" 2>&1 || {
    echo "build FAILED in $(( $(date +%s) - start )) s; last lines of $OUT/python_build.log:"
    tail -40 "$OUT/python_build.log"
    exit 1
  }
  export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
  echo "build: in place ok in $(( $(date +%s) - start )) s"
fi
# The extension must use the process's shared libstdc++ (setup.py): report how it is linked.
so=$(ls python/mxmoe/_C*.so 2>/dev/null | head -1)
if [ -n "$so" ]; then
  echo "libstdc++: $(ldd "$so" | grep -c 'libstdc++.so') shared reference(s); std::ostream code defined inside: $(nm -C --defined-only "$so" 2>/dev/null | grep -c 'std::ostream::_M_insert')"
fi
# Import from outside the repository so the installed package (not a stray path) is what loads.
(cd /tmp && $PY -c 'import mxmoe, torch; print("import ok:", mxmoe.__file__); print(torch.ops.mxmoe.quantize_mxfp8.default._schema)') || {
  echo "import of mxmoe FAILED"; exit 1; }

timeout_arg=()
if $PY -c 'import pytest_timeout' 2>/dev/null; then timeout_arg=(-o timeout=300); fi  # per test
# One pytest process per test file, so that a crash (e.g. a segfault in the extension) in one file
# still lets the others run and report; a crashed file is rerun with torch's fatal-signal handler,
# which logs the native stack of every thread (how run 20 found the static-libstdc++ crash).
rc=0
: > "$OUT/python_tests.log"
deadline=$(( $(date +%s) + ${MXMOE_PYTEST_TIMEOUT:-900} ))
for f in python/tests/test_*.py; do
  left=$(( deadline - $(date +%s) ))
  if [ "$left" -le 0 ]; then echo "$f: not run (MXMOE_PYTEST_TIMEOUT spent)" | tee -a "$OUT/python_tests.log"; rc=1; continue; fi
  # shellcheck disable=SC2086
  timeout "$left" $PY -m pytest "$f" -p no:cacheprovider -rfEs -v "${timeout_arg[@]}" ${MXMOE_PYTEST_ARGS:-} \
    >> "$OUT/python_tests.log" 2>&1
  frc=$?
  echo "$f: pytest rc=$frc" | tee -a "$OUT/python_tests.log"
  [ $frc -eq 0 ] || [ $frc -eq 5 ] || rc=1   # 5: every test deselected/skipped by -k
  if [ $frc -ge 128 ]; then
    echo "--- native stacks of the crash in $f" >> "$OUT/python_tests.log"
    timeout 300 $PY -c 'import sys, torch, pytest
torch._C._set_print_stack_traces_on_fatal_signal(True)
sys.exit(pytest.main([sys.argv[1], "-p", "no:cacheprovider", "-x", "-q"]))' "$f" >> "$OUT/python_tests.log" 2>&1
  fi
done
grep -E "(PASSED|FAILED|ERROR|SKIPPED)( |$)" "$OUT/python_tests.log" | grep -E "^python/tests" | awk '{print $2}' | sort | uniq -c
echo "pytest rc=$rc"
exit "$rc"
