#!/usr/bin/env bash
# Configures and builds into BUILD_DIR (default: build; BUILD_TYPE, default Release, the
# configuration users build, which demo.sh and test.sh then share) against the Python
# scripts/python-env.sh picks. Extra arguments go to CMake;
# TARGETS (space-separated) limits the build to those targets. The project's own builds treat
# warnings as errors (REMAT_WERROR, off in a plain configure); -DREMAT_WERROR=OFF overrides it.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/ccache-env.sh
source scripts/python-env.sh
build_dir=${BUILD_DIR:-build}
jobs=${JOBS:-$(nproc)}
# CMake finds LibTorch from this Python's torch (cmake/RematTorch.cmake); with -DREMAT_WITH_TORCH=OFF
# none is needed
has_torch=$("$PYTHON" -c 'import importlib.util; print(importlib.util.find_spec("torch") is not None)' 2>/dev/null) || {
  echo "build.sh: $PYTHON does not run: run scripts/install-deps.sh first (it installs what the build needs)" >&2
  exit 1
}
if [ "$has_torch" != True ] && [[ " $* " != *" -DREMAT_WITH_TORCH=OFF "* ]]; then
  echo "build.sh: $PYTHON cannot import torch: run scripts/install-deps.sh first, or build without the checkpoint" \
    "runtime (-DREMAT_WITH_TORCH=OFF)" >&2
  exit 1
fi
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-Release} -DREMAT_WERROR=ON \
  -DPython3_EXECUTABLE="$PYTHON" -DREMAT_PYTHON="$PYTHON" "$@"
targets=()
for target in ${TARGETS:-}; do targets+=(--target "$target"); done
cmake --build "$build_dir" -j "$jobs" "${targets[@]}"
