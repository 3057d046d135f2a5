"""Offload in budget plans: the third choice per region beside save and recompute.

profile_regions() measures what offload costs on the profiled device: the copy bandwidth to the host
and back (a timed copy of the largest region's bytes into host memory: pinned memory on a GPU,
ordinary host memory on the CPU), and per region at most the bytes an offload would move (every
tensor its checkpoint keeps for it at its own size: the offloader copies views, the checkpoints'
inputs too). profile.plan(budget_bytes=..., host_budget_bytes=...) then picks save, recompute or offload
for each region (remat/budget/offload_plan.hpp prices the copies; with peak_bytes= instead, the
step's predicted peak on the device bounds the plan, remat/budget/src/step_model.cpp saying when
offloaded bytes are there), and a plan in force carries out
its offload decisions through one remat.CpuOffload per plan: an offloaded region runs saved, inside
the offloader's pair, so what it keeps goes to the host and comes back ahead of backward.
"""

import contextlib
import numbers
import statistics
import time

import torch

from ._offload import CpuOffload

# The copy timed: the largest region's bytes, within these bounds (a copy too small times the call,
# one too large costs the profile more than it tells).
_LEAST_COPY_BYTES = 1 << 20
_MOST_COPY_BYTES = 64 << 20
_COPY_ROUNDS = 5


def host_budget_arg(value, budget_arg, where="plan: host_budget_bytes"):
    """A host budget in bytes: 0 (no offload) or what budget_arg (the reader every budget goes
    through: ints, whole floats, strings with a unit) accepts; `where` names it in errors."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):  # numpy's numbers too
        if value == 0:
            return 0
        if value < 0:
            raise ValueError(f"{where} must be 0 or more bytes, got {value}; pass the host memory "
                             "offloaded regions may hold, such as 64 * 2**30 or '64GiB', or 0 for no offload")
    elif torch.is_tensor(value) and value.numel() == 1 and not value.is_floating_point() and int(value) <= 0:
        return host_budget_arg(int(value), budget_arg, where)
    elif isinstance(value, str):
        from . import _budget

        return _budget.parse_host_budget(value, where)  # "0 B" too: no offload
    return budget_arg(value, where)


def offload_bytes(tensors):
    """At most the bytes offloading a region would move: the offloader copies each tensor kept for
    it as the tensor (a view) is, not its storage, so two views of one storage are two copies. Every
    tensor its checkpoint keeps for it, each at its own size (its storage's where that is less),
    added up: saves of one view, which the offloader copies once, count again. Tensors the
    offloader leaves on the device (parameters and views of them, tensors that are not dense: a
    slice of a wider one) move nothing."""
    total = 0
    for tensor in tensors:
        if not getattr(tensor, "offloadable", True):
            continue
        dtype = getattr(torch, tensor.dtype, None)
        numel = 1
        for size in tensor.shape:
            numel *= size
        view = numel * dtype.itemsize if isinstance(dtype, torch.dtype) else tensor.bytes
        total += min(view, tensor.bytes)
    return total


def _timed(copy, synchronize):
    """The median seconds of a few runs of `copy`, after one untimed (first-touch page faults are
    not the bandwidth)."""
    copy()
    seconds = []
    for _ in range(_COPY_ROUNDS):
        if synchronize is not None:
            synchronize()
        start = time.perf_counter()
        copy()
        if synchronize is not None:
            synchronize()
        seconds.append(time.perf_counter() - start)
    return max(statistics.median(seconds), 1e-9)


def measure_host_copy(largest_bytes, device):
    """The copy bandwidth between `device` ("cpu", "cuda:N") and host memory, in bytes a second
    each way: the median of a few timed copies of about the largest region's bytes. On the CPU
    the buffers are numpy arrays, which no count of tensors sees (a step's peak, remat.fit's
    budget); on a GPU the copies need a device buffer of that size while they run."""
    size = max(_LEAST_COPY_BYTES, min(_MOST_COPY_BYTES, int(largest_bytes)))
    cuda = device.startswith("cuda")
    if not cuda:
        import numpy

        source, host = numpy.ones(size, dtype=numpy.uint8), numpy.empty(size, dtype=numpy.uint8)
        seconds = _timed(lambda: numpy.copyto(host, source), None)
        return {"to_host_bytes_per_second": size / seconds, "to_device_bytes_per_second": size / seconds,
                "measured_bytes": size}
    with torch.no_grad():
        source = torch.ones(size, dtype=torch.uint8, device=device if cuda else "cpu")
        host = torch.empty(size, dtype=torch.uint8, pin_memory=cuda)

        to_host = size / _timed(lambda: host.copy_(source, non_blocking=True), torch.cuda.synchronize)
        to_device = size / _timed(lambda: source.copy_(host, non_blocking=True), torch.cuda.synchronize)
    return {"to_host_bytes_per_second": to_host, "to_device_bytes_per_second": to_device, "measured_bytes": size}


class PlanOffload:
    """A plan's offload decisions as checkpoints carry them out: the offloader (made at the first
    offloaded region, kept for the plan's life so its host pool is reused across steps) and the
    block an offloaded region runs in."""

    def __init__(self, offloaded):
        self.offloaded = frozenset(offloaded)
        self._offloader = None

    @property
    def offloader(self):
        if self._offloader is None:
            # Every tensor, however small: the plan's host bytes count them all.
            self._offloader = CpuOffload(prefetch=1, min_bytes=0)
        return self._offloader

    def around(self, entry, recompute, recomputing):
        """The block a region runs in: the offloader's pair where the plan offloads it (by its
        plan entry) and it runs saved in forward, else nothing."""
        if entry not in self.offloaded or recompute or recomputing:
            return contextlib.nullcontext()
        return self.offloader
