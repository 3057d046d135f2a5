#!/usr/bin/env bash
# GPU checks, for a machine with an NVIDIA GPU, CMake, a compiler and PyTorch but without
# Debian packages or network access.
#
#   scripts/gpu-check.sh prepare   on a Debian machine: unpacks GoogleTest and nlohmann_json
#                                  into .gpu-deps/ (ignored by git) to carry along
#   scripts/gpu-check.sh run       on the GPU machine: builds the CUDA backend, remat::cuda
#                                  and their tests, runs them and the Python pluggable-allocator
#                                  check; logs go to $OUT (default build-gpu/logs)
set -euo pipefail
cd "$(dirname "$0")/.."
deps="$PWD/.gpu-deps"

case "${1:-}" in
  prepare)
    rm -rf "$deps"
    mkdir -p "$deps/debs"
    (cd "$deps/debs" && apt-get download libgtest-dev googletest nlohmann-json3-dev)
    for deb in "$deps"/debs/*.deb; do dpkg -x "$deb" "$deps/root"; done
    echo "unpacked into $deps/root; carry .gpu-deps to the GPU machine"
    ;;
  run)
    logs="${OUT:-$PWD/build-gpu/logs}"
    mkdir -p "$logs"
    nvidia-smi > "$logs/nvidia-smi.txt" 2>&1 || true
    cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_PREFIX_PATH="$deps/root/usr" \
      -DREMAT_BUILD_CLI=OFF -DREMAT_BUILD_BENCH=OFF -DREMAT_BUILD_EXAMPLES=OFF -DREMAT_BUILD_TESTS=ON \
      > "$logs/configure.log" 2>&1
    cmake --build build-gpu -j "$(nproc)" --target remat_cuda_tests remat_alloc_shared > "$logs/build.log" 2>&1
    status=0
    (cd build-gpu && ctest -R '^remat_cuda_tests' --output-on-failure) > "$logs/ctest.log" 2>&1 || status=1
    REMAT_ALLOC_LIBRARY="$PWD/build-gpu/allocator/libremat_alloc.so" PYTHONPATH="$PWD/allocator/python" \
      python3 - > "$logs/python.log" 2>&1 <<'PY' || status=1
import remat_alloc, torch
remat_alloc.install()
with remat_alloc.region("py.check"):
    x = torch.empty(1 << 20, device="cuda")
assert remat_alloc.live_bytes("py.check") == 4 << 20, remat_alloc.live_bytes("py.check")
del x
assert remat_alloc.live_bytes("py.check") == 0
print("python pluggable allocator: tagged 4 MiB and freed it")
PY
    tail -n 5 "$logs"/ctest.log "$logs"/python.log
    exit "$status"
    ;;
  *)
    echo "usage: $0 prepare|run" >&2
    exit 2
    ;;
esac
