"""Ops kept inside recomputed regions: a per-op plan's third choice, carried out.

A per-op plan (profile.plan(budget_bytes=..., ops=True)) may recompute a region yet keep the
outputs of some of its ops, named by their index among the ops the region runs and their ATen
name. Forward runs such a region's body under a TorchDispatchMode (below autograd) that numbers
its ops as the profile numbered them (views and casts aside) and, at each kept index, checks the
op is the one the plan names and holds its outputs (aliases, no copy). Recompute runs the body under a mode
that checks each op against the one forward ran at its index and, at a kept index, that its
inputs have forward's shapes and dtypes, then hands back the held outputs instead of running
the op; autograd above sees the same values, so gradients are those of no checkpointing. The held
outputs belong to the checkpoint call (they go with it) and are let go once recompute has taken
them. Forward writing into a held output later (an in-place op, in the region or after it: the
held alias shares the output's version counter) makes recompute run the op again rather than
hand back a changed value; random ops are never kept (their draws would move).

A region whose ops differ from the plan's (another op at a kept index, fewer ops than the plan
keeps) is refused in forward with a ValueError naming the first difference; recompute running
other ops than forward did is refused the same way. A region that records a decision on a
RecomputeReplay channel is refused too (recompute takes the decision back and skips the ops that
made it, so indices no longer match): the profile lists no ops for such a region.
"""

from __future__ import annotations

import time
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ._op_figures import keepable, numbered, op_name, output_storages
from ._replay import recording_consults

__all__ = ["RegionKeep", "held_storages", "keeping_seconds_per_op"]

_holding = weakref.WeakSet()  # the RegionKeep objects holding outputs now
_per_op = None  # keeping_seconds_per_op(), once calibrated


def held_storages():
    """{(device, address): bytes} of every op output held for recompute now."""
    storages = {}
    for keep in list(_holding):
        for outputs, *_ in keep.held.values():
            for tensor in outputs:
                if tensor is not None:
                    storage = tensor.untyped_storage()
                    storages[(str(tensor.device), storage.data_ptr())] = storage.nbytes()
    return storages


def keeping_seconds_per_op():
    """What carrying out kept ops costs a region per op it runs, over the ops alone: a small
    normalization (pow, mean, add, rsqrt, mul, mul: ops with scalars and reductions, as a layer
    has them) that needs gradients, run as forward runs a region keeping three of its ops, against
    the body bare; the median of 9 rounds of 50 runs, calibrated once per process. A profile prices
    a region that keeps ops at this much an op, in forward and again in recompute
    (op_overhead_seconds). It is several times what a mode that only passes ops on costs
    (_op_figures.interception_seconds): the mode sees each op's arguments in Python, scalars
    wrapped, and holds and checks the kept outputs."""
    global _per_op
    if _per_op is None:
        x = torch.ones(2, 8, requires_grad=True)

        def body(t):
            scale = torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6)
            return x * (t * scale)

        kept = {1: "aten::mean.dim", 2: "aten::add.Tensor", 3: "aten::rsqrt"}
        rounds = []
        for _ in range(9):
            start = time.thread_time_ns()
            for _ in range(50):
                body(x)
            bare = time.thread_time_ns() - start
            start = time.thread_time_ns()
            for _ in range(50):
                RegionKeep("calibration", kept).wrap(body, False)(x)
            watched = time.thread_time_ns() - start
            rounds.append(max(0, watched - bare) / 50 / 6 / 1e9)
        _per_op = sorted(rounds)[len(rounds) // 2]
    return _per_op


def _profile_again(path):
    return (f"; the plan was made for other code in region '{path}': profile the model again "
            f"(remat.profile_regions(ops=True)) and plan from that profile")


def _input_shapes(args, kwargs):
    """The shapes and dtypes of an op's tensor inputs, which recompute checks a kept op against
    before handing back forward's outputs."""
    return tuple((tuple(t.shape), t.dtype) for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor))


def _describe_shapes(shapes):
    return ", ".join(f"{list(shape)} {str(dtype).removeprefix('torch.')}" for shape, dtype in shapes) or "none"


class RegionKeep:
    """The kept ops of one region in one checkpoint call: {index: op name} from the plan, the
    outputs forward held, and the ops forward ran (for recompute to check against)."""

    def __init__(self, path, kept):
        self.path = path
        self.kept = kept
        self.last = max(kept)
        self.held = {}  # index -> (detached outputs, their versions, the type the op returned them as,
        #                  the shapes and dtypes of the op's tensor inputs)
        self.ran = []   # the ops forward ran, in order

    def wrap(self, body, recomputing):
        mode = _Recomputing(self) if recomputing else _Forward(self)

        def kept_ops_body(*args, **kwargs):
            if not recomputing and not torch.is_grad_enabled():
                return body(*args, **kwargs)  # no backward follows: nothing to keep
            consults = recording_consults()
            try:
                with mode:
                    out = body(*args, **kwargs)
            except BaseException:
                self.held.clear()
                raise
            mode.done()
            if not recomputing and recording_consults() != consults:
                self.held.clear()
                raise ValueError(f"region '{self.path}' records a decision on a RecomputeReplay channel, which "
                                 f"recompute takes back instead of running its ops again, so the ops forward ran "
                                 f"cannot be matched in recompute: a per-op plan keeps no op of such a region"
                                 + _profile_again(self.path))
            return out

        kept_ops_body.__qualname__ = getattr(body, "__qualname__", type(body).__name__)
        return kept_ops_body


class _Forward(TorchDispatchMode):
    # The common path (an op the plan does not keep) does as little as it can: each op a region
    # runs passes through here, so every attribute and call on it is paid per op.
    def __init__(self, keep):
        super().__init__()
        self.keep = keep
        self.kept = keep.kept
        self.ran = keep.ran = []
        keep.held.clear()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        if not numbered(func):
            return func(*args, **kwargs)
        ran = self.ran
        index = len(ran)
        ran.append(func)
        want = self.kept.get(index)
        if want is None:
            return func(*args, **kwargs)
        return self._hold(func, index, want, args, kwargs)

    def _hold(self, func, index, want, args, kwargs):
        keep = self.keep
        found = op_name(func)
        if found != want:
            raise ValueError(f"region '{keep.path}': op {index} is {found}, but the plan keeps {want} there"
                             + _profile_again(keep.path))
        inputs = {(str(t.device), t.untyped_storage().data_ptr())
                  for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)}
        out = func(*args, **kwargs)
        if not keepable(func) or not output_storages(out, inputs):
            raise ValueError(f"region '{keep.path}': op {index} ({found}) returned no new storage to keep"
                             + _profile_again(keep.path))
        returned = None if isinstance(out, torch.Tensor) else type(out)
        outputs = (out,) if returned is None else tuple(out)
        # The outputs themselves until the body returns (done() detaches them then): a detach here,
        # below autograd, would not share their version counter, and writes into them would go
        # unseen.
        keep.held[index] = (outputs, tuple(None if t is None else t._version for t in outputs), returned,
                            _input_shapes(args, kwargs))
        _holding.add(keep)
        return out

    def done(self):
        keep = self.keep
        for index, (outputs, *rest) in keep.held.items():
            keep.held[index] = (tuple(None if t is None else t.detach() for t in outputs), *rest)
        if len(keep.ran) <= keep.last:
            missing = min(i for i in keep.kept if i >= len(keep.ran))
            keep.held.clear()
            raise ValueError(f"region '{keep.path}' ran {len(keep.ran)} ops, but the plan keeps op {missing} "
                             f"({keep.kept[missing]})" + _profile_again(keep.path))


class _Recomputing(TorchDispatchMode):
    def __init__(self, keep):
        super().__init__()
        self.keep = keep
        self.ran = keep.ran
        self.held = keep.held
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        if not numbered(func):
            return func(*args, **kwargs)
        index = self.count
        self.count = index + 1
        ran = self.ran
        if index >= len(ran) or ran[index] is not func:
            self._refuse(func, index)
        if self.held:
            held = self.held.pop(index, None)
            if held is not None:
                outputs, versions, returned, shapes = held
                found = _input_shapes(args, kwargs)
                if found != shapes:
                    self._refuse(func, index, (shapes, found))
                if all(t is None or t._version == v for t, v in zip(outputs, versions)):
                    fresh = [None if t is None else t.detach() for t in outputs]
                    return fresh[0] if returned is None else returned(fresh)
        return func(*args, **kwargs)

    def _refuse(self, func, index, shapes=None):
        """Raises for an op recompute ran that is not forward's at its index: another op, or a kept
        op on inputs of other shapes (shapes: forward's and recompute's)."""
        keep = self.keep
        forward = op_name(keep.ran[index]) if index < len(keep.ran) else "no op"
        if shapes is None:
            ran = f"ran {op_name(func)} as op {index}, where forward ran {forward}"
        else:
            ran = (f"ran op {index} ({forward}) on inputs {_describe_shapes(shapes[1])}, where forward ran it "
                   f"on {_describe_shapes(shapes[0])}")
        raise ValueError(f"region '{keep.path}': recompute {ran}: the region's code takes another path in "
                         f"recompute (is_recomputing(), state a recompute hook does not restore, a decision "
                         f"replayed with gradients on); per-op plans need the same ops in both")

    def done(self):
        self.keep.held.clear()
