#!/usr/bin/env bash
# Installs what the build needs into .deps/ (ignored by git), pinned:
#   .deps/googletest       GoogleTest 1.12.1 sources (Debian package googletest=1.12.1-0.2), built
#                          with the project so the GPU machine (no package registry) can carry it.
#   .deps/cutlass/include  CUTLASS/CuTe headers from PyPI nvidia-cutlass==4.2.0.0.
# Idempotent: does nothing when both are present. Needs Debian's apt and PyPI on first use.
set -euo pipefail
cd "$(dirname "$0")/.."
DEPS=.deps
GTEST_DEB_VERSION=1.12.1-0.2
CUTLASS_VERSION=4.2.0.0
mkdir -p "$DEPS"

if [ ! -f "$DEPS/googletest/CMakeLists.txt" ]; then
  if [ ! -f /usr/src/googletest/CMakeLists.txt ]; then
    echo "deps: installing googletest=$GTEST_DEB_VERSION from Debian" >&2
    (apt-get update -qq && apt-get install -y -qq "googletest=$GTEST_DEB_VERSION") >&2
  fi
  rm -rf "$DEPS/googletest.tmp"
  cp -r /usr/src/googletest "$DEPS/googletest.tmp"
  mv "$DEPS/googletest.tmp" "$DEPS/googletest"
fi

if [ ! -f "$DEPS/cutlass/include/cute/tensor.hpp" ]; then
  echo "deps: installing CUTLASS/CuTe headers (nvidia-cutlass==$CUTLASS_VERSION)" >&2
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "nvidia-cutlass==$CUTLASS_VERSION" >&2
  rm -rf "$DEPS/cutlass"
  mkdir -p "$DEPS/cutlass"
  python3 - "$tmp"/nvidia_cutlass-*.whl "$DEPS/cutlass" <<'PY'
import sys, zipfile, os
whl, dst = sys.argv[1], sys.argv[2]
prefix = "cutlass_library/source/include/"
with zipfile.ZipFile(whl) as z:
    for n in z.namelist():
        if n.startswith(prefix) and not n.endswith("/"):
            out = os.path.join(dst, "include", n[len(prefix):])
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with open(out, "wb") as f:
                f.write(z.read(n))
PY
  rm -rf "$tmp"
fi
