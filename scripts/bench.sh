#!/usr/bin/env bash
# The main job: build mxmoe and run the flagship benchmark on the GPU, printing the comparison
# table (baselines timed in the same process). Extra arguments go to the benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "mxmoe: the benchmark needs a CUDA GPU and none was found; to build and run the tests here: ./scripts/test.sh" >&2
  exit 1
fi
./scripts/deps.sh
BUILD=${MXMOE_BUILD_DIR:-build}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DMXMOE_BUILD_TESTS=OFF >/dev/null
cmake --build "$BUILD" -j"$(nproc)" --target mxmoe_c >/dev/null
exec python3 bench/bench_quant.py "$@"
