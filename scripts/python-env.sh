# Sourced by the scripts: sets PYTHON, the interpreter the project installs its Python packages
# into (install-deps.sh), builds the extension against and tests with (build.sh):
#   - PYTHON when it is set;
#   - else python3, when it is a virtual environment's or its installation lets pip install;
#   - else (an externally managed Python, PEP 668, as Debian 12's is: pip refuses to install into
#     it) the virtual environment REMAT_VENV (default ~/.local/share/remat/venv), which
#     install-deps.sh makes, seeing the system's packages. Its bin/ then goes first on PATH, so
#     CMake and the tests find it too. It is outside the checkout: CMake refuses an exported
#     target whose include folders (torch's, inside it) lie in the source or build tree.
REMAT_VENV=${REMAT_VENV:-${XDG_DATA_HOME:-$HOME/.local/share}/remat/venv}
if [ -z "${PYTHON:-}" ]; then
  PYTHON=$(python3 -c 'import sys; print(sys.executable)' 2>/dev/null || echo python3)  # not a shim's path
  if "$PYTHON" - <<'PY' 2>/dev/null
import os, sys, sysconfig
in_venv = sys.prefix != sys.base_prefix
sys.exit(0 if not in_venv and os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")) else 1)
PY
  then
    PYTHON=$REMAT_VENV/bin/python3
    export PATH=$REMAT_VENV/bin:$PATH
  fi
fi
export PYTHON
