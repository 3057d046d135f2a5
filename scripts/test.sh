#!/usr/bin/env bash
# Sets up a fresh machine, builds everything and runs every test. Prints how long each stage
# took and the slowest tests, so that where CI time goes is in every log.
set -euo pipefail
cd "$(dirname "$0")/.."

# NAME COMMAND...: runs COMMAND, says how long it took (failed or not), returns its status.
timed() {
  local name=$1 start=$SECONDS status=0
  shift
  "$@" || status=$?
  echo "test.sh: $name took $((SECONDS - start)) s"
  return "$status"
}

timed "installing dependencies" bash scripts/install-deps.sh
# build.sh's Release, the configuration users build (pip builds it too): the tests run on what
# users run, and its -O3, which makes GCC warn where -O2 does not, fails the build on such a
# warning (warnings are errors here) instead of letting it reach users. Without debug information
# it also compiles the LibTorch translation units about a third faster than RelWithDebInfo.
timed "the build" bash scripts/build.sh -DREMAT_BUILD_TESTS=ON
cd "${BUILD_DIR:-build}"
jobs=${JOBS:-$(nproc)}  # before OMP_NUM_THREADS is set: nproc reads it
# ctest runs tests side by side on every core, and the tests' tensors are tiny: PyTorch's intra-op
# threads would only wait for each other (its OpenMP workers spin while a compiler holds the other
# core, which made a thousand-step CPU test take 420 s instead of 4).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# ctest's output, also kept: each test's time in this run is on its line ("... Passed 12.34 sec").
ctest_logged() {
  ctest --output-on-failure -j "$jobs" --timeout 900 2>&1 | tee Testing/ctest-output.log
}
mkdir -p Testing
# A failing run still prints its time and the slowest tests, then fails.
status=0
timed "the tests" ctest_logged || status=$?
echo "test.sh: the slowest tests in this run (seconds):"
# awk stops printing, not reading, after twelve: with pipefail, an early exit would fail the run.
grep -E ' Test +#[0-9]+: ' Testing/ctest-output.log | awk '$NF == "sec" { print $(NF - 1), $4 }' | sort -g -r |
  awk 'shown++ < 12 { printf "  %7.1f  %s\n", $1, $2 }'
exit "$status"
