#!/usr/bin/env bash
# Installs everything the project builds and tests with, from Debian packages. Idempotent:
# installs only what is missing, and runs apt-get update only when it must install.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache git
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libcli11-dev libfmt-dev libsimdjson-dev
  python3 python3-jsonschema
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

# LibTorch from the PyPI wheel torch==2.11.0. Only its CPU libraries are linked, so the
# CUDA runtime and CUPTI (what libtorch_cpu loads) are the only CUDA packages installed.
python=${PYTHON:-python3}
torch_ready=$("$python" - <<'PY'
import importlib.util, os, pathlib
spec = importlib.util.find_spec("torch")
if spec is None:
    print("no"); raise SystemExit
root = pathlib.Path(spec.origin).parent
version = (root / "version.py").read_text()
cuda = root.parent / "nvidia" / "cu13" / "lib"
ok = "__version__ = '2.11.0" in version and (cuda / "libcudart.so.13").exists() and (cuda / "libcupti.so.13").exists()
print("yes" if ok else "no")
PY
)
if [ "$torch_ready" != yes ]; then
  echo "install-deps: installing torch==2.11.0 (LibTorch CPU libraries) from PyPI"
  "$python" -m pip install --quiet --disable-pip-version-check --no-deps torch==2.11.0
  "$python" -m pip install --quiet --disable-pip-version-check "cuda-toolkit[cudart,cupti]==13.0.2"
else
  echo "install-deps: torch 2.11.0 present"
fi
