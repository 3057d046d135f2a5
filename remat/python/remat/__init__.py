"""remat: activation checkpointing with save and recompute regions, for PyTorch.

    import remat

    def block(x):
        h = remat.region(attention, "attention", recompute=False)(x)   # kept for backward
        return remat.region(mlp, "mlp")(h)                             # recomputed in backward

    y = remat.checkpoint(block, x, region_name="layers.0")

Forward keeps only what backward needs from save regions; the rest is recomputed when backward
first needs it, and recompute stops as soon as every needed tensor exists. The runtime is C++
(the same as LibTorch programs use): it installs an autograd engine that handles only its own
saved-tensor hooks and hands everything else to PyTorch's, so saved_tensors_hooks,
save_on_cpu, torch.utils.checkpoint and detect_anomaly keep working around it.
"""

import contextlib
import functools
import threading

import torch  # loads LibTorch and PyTorch's autograd engine before the runtime captures it

from . import _C
from ._C import (  # noqa: F401  (re-exported)
    CheckpointScope,
    MemoryReport,
    RecomputeReplay,
    RegionDecision,
    RematError,
    RematTrace,
    SavedReport,
    collect_trace,
    current_memory_report,
    format_current_memory_report,
    is_recomputing,
    live_bytes,
    recompute_needs_tensor,
    saved_report,
    tag_cpu_tensors,
    track_saved_tensors,
    write_dump,
)

__all__ = [
    "checkpoint",
    "region",
    "RecomputeStateHook",
    "RecomputeReplay",
    "cpu_rng_state_hook",
    "verify_recompute",
    "is_recomputing",
    "recompute_needs_tensor",
    "collect_trace",
    "current_memory_report",
    "format_current_memory_report",
    "saved_report",
    "track_saved_tensors",
    "tag_cpu_tensors",
    "live_bytes",
    "write_dump",
    "RematError",
]


class RecomputeStateHook:
    """State that recompute must see as forward saw it (an RNG, a counter): snapshot() at
    checkpoint entry, restore(state) before recompute runs the body again; the state backward
    had is put back afterwards."""

    def snapshot(self):
        raise NotImplementedError(f"{type(self).__name__} must define snapshot()")

    def restore(self, state):
        raise NotImplementedError(f"{type(self).__name__} must define restore(state)")


def cpu_rng_state_hook():
    """A state hook for the CPU generator (dropout and friends give the same masks in
    recompute)."""
    return _C.cpu_rng_state_hook()


_defaults = threading.local()


@contextlib.contextmanager
def verify_recompute(enabled=True):
    """Checkpoints started inside compare every tensor recompute recreates with forward's and
    raise an error naming the region and the difference on a mismatch (as
    checkpoint(..., verify_recompute=True))."""
    previous = getattr(_defaults, "verify_recompute", False)
    _defaults.verify_recompute = enabled
    try:
        yield
    finally:
        _defaults.verify_recompute = previous


def checkpoint(fn, *args, region_name="checkpoint", recompute_state_hooks=(), contexts=(), verify_recompute=None,
               **kwargs):
    """Runs fn(*args, **kwargs) keeping only what backward needs.

    Tensors among args (alone, or in one level of tuple or list) are the checkpoint's inputs;
    other positional and keyword arguments are passed as they are. fn returns a tensor or a
    tuple or list of tensors. Recompute calls fn again, with the GIL, from autograd's thread;
    an exception it raises reaches the caller of backward().

    recompute_state_hooks: RecomputeStateHook instances (cpu_rng_state_hook() for dropout).
    contexts: RecomputeReplay channels, or callables returning an object with any of
    enter_forward/exit_forward/enter_recompute/exit_recompute, entered around forward and
    around every recompute.
    """
    if not callable(fn):
        raise TypeError(f"checkpoint: fn must be callable, got {type(fn).__name__}")
    if "preserve_rng_state" in kwargs:
        # torch.utils.checkpoint's option; passed on, fn would fail with a TypeError that hides the alternative.
        raise RematError(f"checkpoint '{region_name}': preserve_rng_state is not supported; pass "
                         "recompute_state_hooks=[remat.cpu_rng_state_hook()] (or your own remat.RecomputeStateHook)")
    if verify_recompute is None:
        verify_recompute = getattr(_defaults, "verify_recompute", False)
    return _C.checkpoint(fn, tuple(args), dict(kwargs), region_name, list(recompute_state_hooks), list(contexts),
                         bool(verify_recompute))


def region(fn=None, name=None, recompute=True):
    """A region inside a checkpoint: region(fn, "mlp")(x), or as a decorator,
    @region(name="attention", recompute=False). recompute=False makes a save region: what
    autograd saves in it is kept, and recompute skips its body. Outside a checkpoint the body
    simply runs."""
    if isinstance(fn, str) and name is None:  # @region("attention")
        fn, name = None, fn
    if not name:
        raise ValueError("region: name each region, e.g. region(fn, \"attention\")")

    def wrap(body):
        if not callable(body):
            raise TypeError(f"region '{name}': fn must be callable, got {type(body).__name__}")

        @functools.wraps(body)
        def run(*args, **kwargs):
            return _C.region(body, tuple(args), dict(kwargs), name, bool(recompute))

        return run

    return wrap if fn is None else wrap(fn)
