# Sourced by the scripts: sets PYTHON, the interpreter the project installs its Python packages
# into (install-deps.sh) and builds and tests with (build.sh, which hands it to CMake):
#   - PYTHON when it is set (made absolute where it runs);
#   - else python3, when it is a virtual environment's or pip may install into it;
#   - else (an externally managed Python, PEP 668, as Debian 12's is: pip refuses to install into
#     it) the virtual environment REMAT_VENV (default $XDG_DATA_HOME/remat/venv, that is
#     ~/.local/share/remat/venv), which install-deps.sh makes, seeing the system's packages; then
#     REMAT_MADE_VENV=1 and its bin/ goes first on PATH. It is outside the checkout: CMake refuses
#     an exported target whose include folders (torch's, inside it) lie in the source or build tree.

# PYTHON... : whether that interpreter runs and is externally managed (not a virtual environment's).
remat_externally_managed() {
  "$1" - <<'PY' 2>/dev/null
import os, sys, sysconfig
in_venv = sys.prefix != sys.base_prefix
sys.exit(0 if not in_venv and os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")) else 1)
PY
}

REMAT_MADE_VENV=0
if [ -n "${PYTHON:-}" ]; then
  PYTHON=$("$PYTHON" -c 'import sys; print(sys.executable)' 2>/dev/null || echo "$PYTHON")
else
  PYTHON=$(python3 -c 'import sys; print(sys.executable)' 2>/dev/null || echo python3)  # not a shim's path
  if remat_externally_managed "$PYTHON"; then
    if [ -z "${REMAT_VENV:-}" ]; then
      remat_home=${HOME:-$(getent passwd "$(id -u)" | cut -d: -f6)}
      REMAT_VENV=${XDG_DATA_HOME:-${remat_home:?no HOME: set REMAT_VENV to the virtual environment to use}/.local/share}/remat/venv
    fi
    PYTHON=$REMAT_VENV/bin/python3
    REMAT_MADE_VENV=1
    export PATH=$REMAT_VENV/bin:$PATH REMAT_VENV
  fi
fi
export PYTHON
