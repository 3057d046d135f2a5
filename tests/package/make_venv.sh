# Sourced by the package tests. make_venv PYTHON DIR: a virtual environment at DIR that sees
# PYTHON's packages after its own. --system-site-packages alone is not that where PYTHON is itself
# a virtual environment's (scripts/python-env.sh makes one where the system Python is externally
# managed): a venv made from a venv sees the base interpreter's packages, not the outer
# environment's, so these are added by a .pth file (torch found; what is installed in DIR first).
make_venv() {
  "$1" -m venv --system-site-packages "$2"
  "$1" -c 'import site; print("\n".join(site.getsitepackages()))' \
    > "$("$2/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/outer-environment.pth"
}
