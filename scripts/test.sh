#!/usr/bin/env bash
# Build mxmoe and run every test (CTest). On a machine without a GPU the GPU tests are reported
# as skipped with the reason; the CPU tests (references, argument checks) run everywhere.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
BUILD=${MXMOE_BUILD_DIR:-build}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" -j"$(nproc)"
cd "$BUILD"
ctest --output-on-failure -j"$(nproc)"
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "note: no CUDA GPU on this machine, so the GPU tests (label 'gpu') were skipped, each with that"
  echo "      reason; the CPU tests above ran. On a GPU machine: ./scripts/test.sh, or scripts/gpu_run.sh OUT."
fi
