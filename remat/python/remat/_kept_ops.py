"""Ops kept inside recomputed regions: a per-op plan's third choice, carried out.

A per-op plan (profile.plan(budget_bytes=..., ops=True)) may recompute a region yet keep the
outputs of some of its ops, named by their index among the ops the region runs and their ATen
name. The runtime carries it out below autograd (_C.KeptOps; remat/kept_ops.hpp): forward numbers
the region's ops as the profile numbered them (views and casts aside) and, at each kept index,
checks the op is the one the plan names and holds its outputs (aliases, no copy); recompute checks
each op against the one forward ran at its index and, at a kept index, that its inputs have
forward's shapes and dtypes, then hands back the held outputs instead of running the op; autograd
above sees the same values, so gradients are those of no checkpointing. The held outputs belong to
the checkpoint call (they go with it) and are let go once recompute has taken them. Forward writing
into a held output later (an in-place op, in the region or after it) makes recompute run the op
again rather than hand back a changed value; random ops are never kept (their draws would move).

A region whose ops differ from the plan's (another op at a kept index, fewer ops than the plan
keeps) is refused in forward with a ValueError naming the first difference; recompute running
other ops than forward did is refused the same way. A region that records a decision on a
RecomputeReplay channel is refused too (recompute takes the decision back and skips the ops that
made it, so indices no longer match): the profile lists no ops for such a region.
"""

from __future__ import annotations

import time

import torch

from . import _C
from ._replay import recording_consults

__all__ = ["RegionKeep", "held_storages", "keeping_seconds"]

_calibrated = None  # keeping_seconds()'s (per run, per op), once calibrated


def held_storages():
    """{(device, address): bytes} of every op output held for recompute now."""
    return _C.kept_op_outputs()


def keeping_seconds(op_count):
    """What carrying out kept ops costs a region that runs `op_count` ops, in one run of it (a
    profile prices a region that keeps ops at this, in forward and again in recompute:
    op_overhead_seconds): a cost per run (the runtime's scope, the replay check) and one per op
    (each op passes through the runtime's fallback boxed, and is numbered and checked).
    Calibrated once per process on a small normalization (pow, mean, add, rsqrt, mul, mul: ops
    with scalars and reductions, as a layer has them) that needs gradients, run once and four
    times over in one region, as forward runs a region keeping three of its ops, each against the
    body bare: the per-op cost from the difference of the two, the rest of the short one's cost
    per run; medians of 9 rounds of 50 runs."""
    global _calibrated
    if _calibrated is None:
        _set_aside_while_compiling()  # its one-time import before any timing
        x = torch.ones(2, 8, requires_grad=True)

        def norm(t):
            scale = torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6)
            return x * (t * scale)

        def four(t):
            return norm(norm(norm(norm(t))))

        kept = {1: "aten::mean.dim", 2: "aten::add.Tensor", 3: "aten::rsqrt"}

        def extra(body):
            start = time.thread_time_ns()
            for _ in range(50):
                body(x)
            bare = time.thread_time_ns() - start
            start = time.thread_time_ns()
            for _ in range(50):
                RegionKeep("calibration", kept).wrap(body, False)(x)
            return max(0, time.thread_time_ns() - start - bare) / 50 / 1e9

        short, long = [], []
        for _ in range(9):
            short.append(extra(norm))
            long.append(extra(four))
        short, long = sorted(short)[4], sorted(long)[4]
        per_op = max(0.0, (long - short) / 18)
        _calibrated = (max(0.0, short - 6 * per_op), per_op)
    per_run, per_op = _calibrated
    return per_run + op_count * per_op


_compile_hooks = None  # torch.compile's compile hooks, once imported


def _set_aside(_):
    _C.set_kept_ops_aside(True)


def _set_back(_):
    _C.set_kept_ops_aside(False)


def _set_aside_while_compiling():
    """torch.compile sets dispatch modes aside while it compiles a function (tracing it, running
    its backend), so the profile's mode never numbers those ops: kept ops are set aside on the
    compiling thread from its compile start hook to its end hook, which run on the thread that
    compiles. Registered when a region keeps ops, and again after torch._dynamo.reset() (which
    drops every hook)."""
    global _compile_hooks
    if _compile_hooks is None:
        from torch._dynamo.callback import callback_handler

        _compile_hooks = callback_handler
    if _set_aside not in _compile_hooks.start_callbacks:
        _compile_hooks.register_start_callback(_set_aside)
        _compile_hooks.register_end_callback(_set_back)


class RegionKeep:
    """The kept ops of one region in one checkpoint call ({index: op name} from the plan), and
    what forward held of them for recompute."""

    def __init__(self, path, kept):
        _set_aside_while_compiling()
        self.path = path
        self.ops = _C.KeptOps(path, kept)
        self.kept_in_forward = False  # forward ran the region with gradients, keeping its ops

    def wrap(self, body, recomputing):
        ops = self.ops

        def kept_ops_body(*args, **kwargs):
            if not recomputing:
                self.kept_in_forward = torch.is_grad_enabled()
            if not self.kept_in_forward:
                return body(*args, **kwargs)  # no backward reads what it makes: nothing kept, none to take
            consults = recording_consults()
            with ops.running(recomputing):
                out = body(*args, **kwargs)
            if not recomputing and recording_consults() != consults:
                ops.clear()
                raise ValueError(f"region '{self.path}' records a decision on a RecomputeReplay channel, which "
                                 f"recompute takes back instead of running its ops again, so the ops forward ran "
                                 f"cannot be matched in recompute: a per-op plan keeps no op of such a region; "
                                 f"the plan was made for other code in region '{self.path}': profile the model "
                                 f"again (remat.profile_regions(ops=True)) and plan from that profile")
            return out

        kept_ops_body.__qualname__ = getattr(body, "__qualname__", type(body).__name__)
        return kept_ops_body
