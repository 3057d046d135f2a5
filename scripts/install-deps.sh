#!/usr/bin/env bash
# Installs everything the project builds and tests with, from Debian packages. Idempotent:
# installs only what is missing, and runs apt-get update only when it must install.
set -euo pipefail
cd "$(dirname "$0")/.."  # as build.sh: the same python3 (a pyenv .python-version here counts)

packages=(
  build-essential cmake ninja-build ccache git
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libcli11-dev libfmt-dev libsimdjson-dev
  libgloo-dev  # headers for c10d's Gloo process group (the torch wheel ships its library only)
  python3 python3-dev python3-jsonschema python3-venv
  chromium  # renders remat-report's timeline pictures in the tests
)

missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install-deps: all Debian packages present"
fi

# PyTorch from the PyPI wheel torch==2.11.0, with its dependencies (about 4.6 GB, mostly
# NVIDIA libraries): the checkpoint runtime links LibTorch from it, and the Python tests run
# against the real torch (which imports on a machine without a GPU). scikit-build-core
# builds the pip package; pytest runs the checkpoint runtime's Python tests; transformers (about
# 45 MB with its dependencies; tested with 5.24.0) is for remat.wrap_decoder_layers and its tests,
# accelerate (tested with 1.16.0, a few hundred KB) for the tests that train with transformers.Trainer.
# Where the system Python is externally managed (PEP 668: Debian 12's), they go into the virtual
# environment REMAT_VENV (scripts/python-env.sh), made here.
source scripts/python-env.sh
python=$PYTHON
if [ "$REMAT_MADE_VENV" = 1 ] && ! "$python" -m pip --version >/dev/null 2>&1; then
  # Made afresh where it is missing or broken (its making interrupted, its Python upgraded)
  echo "install-deps: the system Python is externally managed (PEP 668); making the virtual environment $REMAT_VENV"
  python3 -m venv --clear --system-site-packages "$REMAT_VENV"
fi
if "$python" - <<'PY' 2>/dev/null
import importlib.metadata as metadata
import re
import sys
import pytest
import accelerate
import torch
import transformers

def release(version, parts=2):
    # Numeric (major, minor): as strings, "0.9" >= "0.10" would hold.
    numbers = []
    for part in version.split(".")[:parts]:
        digits = re.match(r"\d*", part).group()
        numbers.append(int(digits) if digits else 0)
    return tuple(numbers + [0] * (parts - len(numbers)))

ok = torch.__version__.startswith("2.11.0") and release(metadata.version("scikit-build-core")) >= (0, 10)
sys.exit(0 if ok else 1)
PY
then
  echo "install-deps: torch 2.11.0, scikit-build-core, pytest, transformers and accelerate present"
elif remat_externally_managed "$python"; then
  echo "install-deps: PYTHON=$python is externally managed (PEP 668), so pip may not install torch and the rest" \
    "into it: unset PYTHON to install into the virtual environment REMAT_VENV (default ~/.local/share/remat/venv)," \
    "or set PYTHON to a virtual environment's python" >&2
  exit 1
elif ! "$python" -m pip --version >/dev/null 2>&1; then
  echo "install-deps: $python has no pip to install torch and the rest with: set PYTHON to a Python that has it" \
    "(or to a virtual environment's python)" >&2
  exit 1
else
  echo "install-deps: installing torch==2.11.0 with its dependencies (about 4.6 GB), scikit-build-core, pytest," \
    "transformers and accelerate from PyPI into $python"
  "$python" -m pip install --quiet --disable-pip-version-check torch==2.11.0 "scikit-build-core>=0.10" pytest \
    transformers==5.24.0 accelerate==1.16.0
fi
if [ "$REMAT_MADE_VENV" = 1 ]; then
  echo "install-deps: the build and the tests use $python (source $REMAT_VENV/bin/activate to use it yourself;" \
    "a REMAT_VENV given here must be given to build.sh and test.sh too)"
fi
