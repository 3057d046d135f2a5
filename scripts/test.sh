#!/usr/bin/env bash
# Sets up a fresh machine, builds everything and runs every test. Prints how long each stage
# took and the slowest tests, so that where CI time goes is in every log.
set -euo pipefail
cd "$(dirname "$0")/.."

timed() {
  local name=$1 start=$SECONDS
  shift
  "$@"
  echo "test.sh: $name took $((SECONDS - start)) s"
}

timed "installing dependencies" bash scripts/install-deps.sh
timed "the build" bash scripts/build.sh -DREMAT_BUILD_TESTS=ON
# The configuration a user builds: Release with the default options. Its -O3 makes GCC warn
# where the -O2 above does not (false positives included); warnings are errors here, so such
# a warning fails CI instead of reaching users. LibTorch-free libraries and programs and the
# checkpoint runtime's objects only, to keep it short.
BUILD_DIR=build-release BUILD_TYPE=Release \
  TARGETS="remat_alloc remat_alloc_shared remat_pipeline_plan remat_launch remat-report remat_remat_objects" \
  timed "the Release build" bash scripts/build.sh
cd "${BUILD_DIR:-build}"
timed "the tests" ctest --output-on-failure -j "${JOBS:-$(nproc)}" --timeout 900
echo "test.sh: the slowest tests (seconds):"
# awk stops printing, not reading, after twelve: with pipefail, an early exit would fail the run.
sort -k3 -g -r Testing/Temporary/CTestCostData.txt | awk 'NF == 3 && shown++ < 12 { printf "  %7.1f  %s\n", $3, $1 }'
