# Sourced by the project's own builds (scripts/build.sh, the package test's `pip install .`):
# ccache settings that let it cache the LibTorch translation units, which use a precompiled
# header. Without them ccache compiles those units every time ("could not use precompiled
# header"), the most expensive units of the build. The sloppiness is sound here: CMake includes
# the precompiled header first (-include, which is all GCC needs besides), so no #define comes
# before it, and the project uses no __DATE__ or __TIME__. The base directory makes the paths
# inside the checkout relative, so a fresh clone elsewhere finds what an earlier one stored.
# Settings already in the environment, and a base directory in ccache's configuration, are kept.
export CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}
if [ -z "${CCACHE_BASEDIR:-}" ] && [ -z "$(ccache --get-config base_dir 2>/dev/null)" ]; then
  CCACHE_BASEDIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  export CCACHE_BASEDIR
fi
# ccache hashes the locale variables, and Python run without a locale sets LC_CTYPE=C.UTF-8 for
# the processes it starts (PEP 538): the package test's `pip install .` then compiled every unit
# again on a machine with no locale set, the build's objects cached under other keys. One value
# for every build that sources this file.
export LC_CTYPE=C.UTF-8
