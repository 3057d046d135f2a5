"""Per-op figures: each ATen op a region runs, measured in the profiled step.

While profile_regions() measures a region's forward, a TorchDispatchMode (below autograd, so it
sees the ATen ops autograd runs, matmuls and elementwise ops alike) numbers every op the region
runs and times it with the thread's CPU time (CUDA events on a GPU). An op whose output a plan
could keep while the region recomputes is listed with its index, its name ("aten::mm",
"aten::add.Tensor"), its outputs' bytes (each storage once) and its time: functional ops whose
outputs are new storages. Not listed: ops that write into a tensor (in-place, out=), ops whose
outputs are views of their inputs (nothing to keep, nothing to spare; not numbered either: the
runtime's saved-tensor hooks run some, differently in a saved region and a recomputed one), and
random ops (keeping one would skip its draw in recompute and move every later draw of the region).

Watching ops costs time of its own: the mode's time around each op is taken out of the region's
seconds, and what watching costs per op when nothing is measured (calibrated once per process on a
tiny op) is the region's op_overhead_seconds, which a plan that keeps ops of it pays in forward
and again in recompute (remat/budget/op_plan.hpp).
"""

from __future__ import annotations

import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["OpMeter", "op_name", "keepable", "is_view", "interception_seconds"]

_interception = None  # seconds one op costs under a mode that only passes it on


def op_name(func):
    """The op's name as plans write it: "aten::mm", "aten::add.Tensor"."""
    schema = func._schema
    return f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name


_keepable = {}
_views = {}


def is_view(func):
    """Whether the op returns views of its inputs and writes nothing (detach, view, transpose):
    such ops are not numbered. They cost nothing to run again, and the runtime's own saved-tensor
    hooks run some (detach) while autograd saves a tensor, so their count differs between a saved
    region and a recomputed one."""
    known = _views.get(func)
    if known is None:
        schema = func._schema
        known = (not schema.is_mutable and bool(schema.returns)
                 and all(r.alias_info is not None for r in schema.returns))
        _views[func] = known
    return known



def keepable(func):
    """Whether a plan may keep the op's outputs: functional, not random, outputs not views."""
    known = _keepable.get(func)
    if known is None:
        schema = func._schema
        known = (not schema.is_mutable and bool(schema.returns)
                 and all(r.alias_info is None for r in schema.returns)
                 and torch.Tag.nondeterministic_seeded not in func.tags)
        _keepable[func] = known
    return known


def output_storages(out, inputs):
    """{storage key: bytes} of the op's tensor outputs that are new storages (not its inputs')."""
    if isinstance(out, torch.Tensor):
        out = (out,)
    if not isinstance(out, (tuple, list)):
        return None
    storages = {}
    for tensor in out:
        if tensor is None:
            continue
        if not isinstance(tensor, torch.Tensor):
            return None
        storage = tensor.untyped_storage()
        key = (str(tensor.device), storage.data_ptr())
        if key in inputs:
            return None
        storages[key] = storage.nbytes()
    return storages


def _input_keys(args, kwargs):
    keys = set()
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            keys.add((str(value.device), value.untyped_storage().data_ptr()))
        elif isinstance(value, (list, tuple)):
            keys.update((str(t.device), t.untyped_storage().data_ptr()) for t in value if isinstance(t, torch.Tensor))
    return keys


class _PassOn(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def interception_seconds():
    """What one op costs under a mode that only passes it on, over the op alone (calibrated once
    per process: the median of 9 rounds of 200 calls of a one-element add)."""
    global _interception
    if _interception is None:
        a, b = torch.ones(1), torch.ones(1)
        rounds = []
        for _ in range(9):
            start = time.thread_time_ns()
            for _ in range(200):
                torch.add(a, b)
            bare = time.thread_time_ns() - start
            with _PassOn():
                start = time.thread_time_ns()
                for _ in range(200):
                    torch.add(a, b)
                watched = time.thread_time_ns() - start
            rounds.append(max(0, watched - bare) / 200 / 1e9)
        _interception = sorted(rounds)[len(rounds) // 2]
    return _interception


class OpMeter(TorchDispatchMode):
    """Numbers, times and sizes the ops of one region's forward (module docstring). After the
    block: ops (the keepable ones, as the region-profile dump lists them), count (every op),
    own_seconds (the meter's time around the ops, to take out of the region's)."""

    def __init__(self, cuda=False):
        super().__init__()
        self.ops = []
        self.count = 0
        self.own_seconds = 0.0
        self._cuda = cuda
        self._events = []  # (entry in ops, start event, end event) on CUDA

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        entered = time.thread_time_ns()
        kwargs = kwargs or {}
        if is_view(func):
            return func(*args, **kwargs)
        index = self.count
        self.count += 1
        if not keepable(func):
            started = time.thread_time_ns()
            out = func(*args, **kwargs)
            finished = time.thread_time_ns()
            self.own_seconds += (started - entered + time.thread_time_ns() - finished) / 1e9
            return out
        inputs = _input_keys(args, kwargs)
        if self._cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        started = time.thread_time_ns()
        out = func(*args, **kwargs)
        finished = time.thread_time_ns()
        if self._cuda:
            end.record()
        storages = output_storages(out, inputs)
        if storages:
            entry = {"index": index, "op": op_name(func), "bytes": sum(storages.values()),
                     "seconds": (finished - started) / 1e9}
            self.ops.append(entry)
            if self._cuda:
                self._events.append((entry, start, end))
        self.own_seconds += (started - entered + time.thread_time_ns() - finished) / 1e9
        return out

    def finish(self):
        """The ops' seconds from their CUDA events (after a synchronize), where timed so."""
        for entry, start, end in self._events:
            entry["seconds"] = start.elapsed_time(end) / 1000.0
        self._events.clear()
