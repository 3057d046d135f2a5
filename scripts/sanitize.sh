#!/usr/bin/env bash
# Builds the tests with sanitizers and runs them: `scripts/sanitize.sh asan` (AddressSanitizer
# + UndefinedBehaviorSanitizer) or `scripts/sanitize.sh tsan` (ThreadSanitizer). Further arguments
# go to CMake, e.g. -DREMAT_BUILD_CLI=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  asan) sanitizers=address,undefined ;;
  tsan) sanitizers=thread ;;
  *) echo "usage: scripts/sanitize.sh asan|tsan" >&2; exit 1 ;;
esac
bash scripts/install-deps.sh
build_dir=build-$1
# CUDA and LibTorch are off: their prebuilt libraries are not instrumented. Tests that load
# the library into another process (Python, the package consumer) are left to the normal build.
BUILD_DIR=$build_dir BUILD_TYPE=Debug bash scripts/build.sh -DREMAT_WITH_CUDA=OFF -DREMAT_WITH_TORCH=OFF \
  -DREMAT_BUILD_BENCH=OFF \
  -DREMAT_SANITIZE=$sanitizers "${@:2}"
cd "$build_dir"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 TSAN_OPTIONS=halt_on_error=1
ctest --output-on-failure -j "${JOBS:-$(nproc)}" -LE no-sanitizer --timeout 1800
