"""The remat extension against the real PyTorch: PYTHONPATH holds build/python (remat) and
allocator/python (remat_alloc), REMAT_ALLOC_LIBRARY the build's libremat_alloc.so (ctest sets
all three), or both packages come from `pip install .`."""

import pytest
import torch

import remat


@pytest.fixture(autouse=True)
def fresh_trace():
    """Each test starts with an empty remat trace and the default generator seed."""
    remat._C.collect_trace()
    torch.manual_seed(0)
    yield
    remat._C.collect_trace()
