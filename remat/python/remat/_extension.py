"""Loads remat's C++ extension, remat._C, or says what is missing and how to get it.

The extension is compiled against the torch it will run with, so a wheel built where that
torch was not visible (pip's default build isolation hides the environment's packages from
the build) carries the Python modules and no extension. Without this module, `import remat`
then fails with Python's "partially initialized module" ImportError, which reads like a
circular import. Here the missing extension and the one that is present but cannot load
(built against another torch, its libraries not found) each raise an ImportError that names
the problem and the command that fixes it. LibTorch is loaded first: the extension links it.
"""

import importlib

import remat_alloc
import torch  # noqa: F401  (loads LibTorch, which the extension links, before the extension)

_NAME = f"{__package__}._C"
_REBUILD = (
    "In the environment that has torch, from the remat source tree, run\n"
    "    pip install --no-build-isolation .\n"
    "(it builds against that torch; scikit-build-core, cmake and ninja must be installed there too:\n"
    "    pip install scikit-build-core cmake ninja)\n"
    "From a build tree instead, put build/python on PYTHONPATH."
)

try:
    _C = importlib.import_module(_NAME)
except ModuleNotFoundError as error:
    if error.name != _NAME:
        raise
    raise ImportError(
        f"remat was installed without its C++ extension {_NAME}, which is built only where the build "
        f"finds torch (pip's default build isolation hides this environment's torch from the build).\n{_REBUILD}",
        name=_NAME,
    ) from error
except ImportError as error:
    where = error.path or _NAME
    raise ImportError(
        f"remat's C++ extension {where} is there but cannot be loaded: {error}\n"
        f"An extension built against another torch than this one ({torch.__version__}), or separated from "
        f"the remat_alloc package whose library it links, fails so; rebuild it here.\n{_REBUILD}",
        name=_NAME,
        path=error.path,
    ) from error

# The extension links the allocator's library; remat_alloc may have loaded another file of it.
remat_alloc.check_one_copy()
