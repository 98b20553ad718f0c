#!/usr/bin/env bash
# The main job: build mxmoe and run the flagship benchmark on the GPU, printing the comparison
# table (baselines timed in the same process). The flagship benchmark is the MoE training layer
# (forward + backward, mxmoe MXFP8 fast and exact against the plain-PyTorch BF16 layer, per-stage
# breakdown, peak memory); it writes out/bench_layer.json and out/bench_layer.png. Extra arguments
# go to the benchmark (e.g. --quick).
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
mkdir -p out
exec python3 bench/bench_layer.py --json out/bench_layer.json "$@"
