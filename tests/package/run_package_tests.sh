#!/usr/bin/env bash
# `pip install .` into a fresh virtual environment, then the Python tests from there: the
# remat_alloc module must find its library inside the installed package (no
# REMAT_ALLOC_LIBRARY, no source tree on the path) and remat-report must be a command.
#
# usage: run_package_tests.sh SOURCE_DIR WORK_DIR [PYTHON]
set -euo pipefail
source_dir=$(cd "${1:?usage: run_package_tests.sh SOURCE_DIR WORK_DIR [PYTHON]}" && pwd)
work=${2:?usage: run_package_tests.sh SOURCE_DIR WORK_DIR [PYTHON]}
python=${3:-python3}

# The project's ccache settings (scripts/ccache-env.sh): the units with a precompiled header
# (LibTorch's) are cached too, and paths inside the checkout are hashed relative to it.
source "$source_dir/scripts/ccache-env.sh"
rm -rf "$work"
mkdir -p "$work"
# The environment's torch stays visible (make_venv); nothing is downloaded: the build uses the
# scikit-build-core, CMake and Ninja already installed.
source "$source_dir/tests/package/make_venv.sh"
make_venv "$python" "$work/venv"
venv_python=$work/venv/bin/python
# Run by ctest beside a build of the same checkout, the wheel is built with that build's
# compilers and warnings-as-errors setting (stricter than a user's default, never looser), from
# scratch in a folder beside it: each unit's compile command is then the build's, so ccache
# hands back the objects the build made instead of compiling every unit again. What it proves
# is the same: `pip install .` builds and installs the package from a clean build folder.
pip_options=()
if [ -n "${REMAT_PACKAGE_BUILD_DIR:-}" ]; then
  rm -rf "$REMAT_PACKAGE_BUILD_DIR"
  # --config-settings, not its short form -C, which pip gained only in 23.1 (Debian 12 has 23.0.1)
  setting() { pip_options+=(--config-settings="$1"); }
  setting "build-dir=$REMAT_PACKAGE_BUILD_DIR"
  [ -z "${REMAT_PACKAGE_CXX:-}" ] || setting "cmake.define.CMAKE_CXX_COMPILER=$REMAT_PACKAGE_CXX"
  [ -z "${REMAT_PACKAGE_CC:-}" ] || setting "cmake.define.CMAKE_C_COMPILER=$REMAT_PACKAGE_CC"
  [ -z "${REMAT_PACKAGE_WERROR:-}" ] || setting "cmake.define.REMAT_WERROR=$REMAT_PACKAGE_WERROR"
fi
if ! "$venv_python" -m pip install --disable-pip-version-check --no-build-isolation --no-deps --no-index \
    "${pip_options[@]}" "$source_dir" > "$work/pip.log" 2>&1; then
  tail -n 40 "$work/pip.log"
  echo "pip install of $source_dir failed; the log is $work/pip.log"
  exit 1
fi

unset REMAT_ALLOC_LIBRARY PYTHONPATH REMAT_REPORT
cd "$work"
"$venv_python" - <<'PY'
import pathlib, sys
import remat_alloc
library = pathlib.Path(remat_alloc.library_path()).resolve()
package = pathlib.Path(remat_alloc.__file__).resolve().parent
assert library.parent == package, f"{library} is not inside the installed package {package}"
assert pathlib.Path(sys.prefix).resolve() in package.parents, f"{package} is not in the virtual environment"
print(f"remat_alloc {remat_alloc.__file__} loads {library}")
PY
# Each installed library finds the project's libraries it needs inside the package itself
# (LibTorch's are loaded by `import torch` first).
site_packages=$("$venv_python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
for library in "$site_packages"/remat_alloc/*.so "$site_packages"/remat/*.so; do
  [ -e "$library" ] || continue
  if ldd "$library" | grep 'libremat.*not found'; then
    echo "$library cannot find the project's libraries inside the installed package"; exit 1
  fi
done
test -x "$work/venv/bin/remat-report" || { echo "the package installed no remat-report command"; exit 1; }
PATH=$work/venv/bin:$PATH remat-report --help > /dev/null
PATH=$work/venv/bin:$PATH "$venv_python" -m unittest discover -v -s "$source_dir/tests/python" -p 'test_*.py'
# The checkpoint runtime's extension from the installed remat package.
"$venv_python" -c 'import remat, pathlib; print(f"remat {remat.__file__} loads {pathlib.Path(remat._C.__file__).name}")'
# The checkpoint runtime's tests from the installed package, one file or more for each native
# module: the runtime and replay, budget, step-peak and per-op plans, offload, compile, the OOM
# observer with remat-report on PATH, remat.fit, and the pipeline planner's checks. The rest of
# the suite reaches no module these leave out; it runs from the build tree
# (python_remat_extension.*, python_remat_pipelining), so it does not run twice.
remat_tests=$source_dir/tests/python/remat
PATH=$work/venv/bin:$PATH "$venv_python" -m pytest -q -p no:cacheprovider \
  "$remat_tests/test_regions.py" "$remat_tests/test_replay.py" "$remat_tests/test_budget_plans.py" \
  "$remat_tests/test_step_peak_plans.py" "$remat_tests/test_op_plans.py" \
  "$remat_tests/test_offload_plans.py" "$remat_tests/test_cpu_offload.py" "$remat_tests/test_compile.py" \
  "$remat_tests/test_oom_observer.py" "$remat_tests/test_fit.py" \
  "$remat_tests/test_pipelining.py::test_bad_input_is_refused_before_anything_changes"
