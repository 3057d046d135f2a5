#!/usr/bin/env bash
# Sets up a fresh machine, builds everything and runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh -DREMAT_BUILD_TESTS=ON
# The configuration a user builds: Release with the default options. Its -O3 makes GCC warn
# where the -O2 above does not (false positives included); warnings are errors here, so such
# a warning fails CI instead of reaching users. LibTorch-free libraries and programs and the
# checkpoint runtime's objects only, to keep it short.
BUILD_DIR=build-release BUILD_TYPE=Release \
  TARGETS="remat_alloc remat_alloc_shared remat_pipeline_plan remat_launch remat-report remat_remat_objects" \
  bash scripts/build.sh
cd "${BUILD_DIR:-build}"
ctest --output-on-failure -j "${JOBS:-$(nproc)}" --timeout 900
