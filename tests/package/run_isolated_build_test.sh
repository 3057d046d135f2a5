#!/usr/bin/env bash
# `pip install .` with pip's default build isolation, which hides the environment's torch from
# the build: the build must fail, saying why and naming `pip install --no-build-isolation .`,
# instead of installing a remat package without its extension. First the configure step as
# scikit-build-core runs it (SKBUILD set) with an interpreter that cannot import torch, offline;
# then pip itself, which fetches scikit-build-core into its isolated environment from the
# package index: skipped (exit 77) where no index is reachable.
#
# usage: run_isolated_build_test.sh SOURCE_DIR WORK_DIR [PYTHON]   (CMAKE: the cmake to run)
set -euo pipefail
usage="usage: run_isolated_build_test.sh SOURCE_DIR WORK_DIR [PYTHON]"
source_dir=$(cd "${1:?$usage}" && pwd)
work=${2:?$usage}
python=${3:-python3}
cmake=${CMAKE:-cmake}
fix="pip install --no-build-isolation ."
unset PYTHONPATH

rm -rf "$work"
mkdir -p "$work"

# LOG WHAT: LOG must hold the refusal and the command that fixes it.
expect_refusal() {
  if ! grep -q "cannot build the remat package's extension remat._C" "$1" || ! grep -qF "$fix" "$1"; then
    tail -n 40 "$1"
    echo "$2 did not fail saying the extension cannot be built and naming '$fix'; the log is $1"
    exit 1
  fi
  echo "$2 fails as it must, naming '$fix'"
}

# The options pyproject.toml gives the wheel's build.
wheel_options=(-DSKBUILD=2 -DREMAT_BUILD_TESTS=OFF -DREMAT_BUILD_BENCH=OFF -DREMAT_BUILD_EXAMPLES=OFF)
"$python" -m venv --without-pip "$work/no-torch"
if "$cmake" -S "$source_dir" -B "$work/configure" "${wheel_options[@]}" \
    -DPython3_EXECUTABLE="$work/no-torch/bin/python" > "$work/configure.log" 2>&1; then
  tail -n 40 "$work/configure.log"
  echo "the wheel's configure succeeded with an interpreter that cannot import torch; it must fail"
  exit 1
fi
expect_refusal "$work/configure.log" "the wheel's configure without torch"

# Leaving the checkpoint runtime out on purpose, as the message offers, configures.
if ! "$cmake" -S "$source_dir" -B "$work/configure-without-torch" "${wheel_options[@]}" -DREMAT_WITH_TORCH=OFF \
    -DSKBUILD_SCRIPTS_DIR="$work/scripts" -DPython3_EXECUTABLE="$work/no-torch/bin/python" \
    > "$work/configure-without-torch.log" 2>&1; then
  tail -n 40 "$work/configure-without-torch.log"
  echo "the wheel's configure with REMAT_WITH_TORCH=OFF failed; the log is $work/configure-without-torch.log"
  exit 1
fi
echo "the wheel's configure with REMAT_WITH_TORCH=OFF succeeds"

# pip itself, from an environment that has torch (as the user's does), with build isolation.
source "$source_dir/tests/package/make_venv.sh"
make_venv "$python" "$work/venv"
status=0
timeout 600 "$work/venv/bin/python" -m pip install --disable-pip-version-check --no-deps --timeout 15 --retries 1 \
  --config-settings=build-dir="$work/wheel-build" "$source_dir" > "$work/pip.log" 2>&1 || status=$?
if [ "$status" -eq 0 ]; then
  echo "pip install with build isolation succeeded; it must fail (the log is $work/pip.log)"
  exit 1
fi
if ! grep -q "Installing build dependencies: finished with status 'done'" "$work/pip.log"; then
  tail -n 5 "$work/pip.log"
  echo "skipped: pip could not fetch the build dependencies into its isolated environment (no package index)"
  exit 77
fi
expect_refusal "$work/pip.log" "pip install with build isolation"
