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

import functools
import threading

import torch  # loads LibTorch and PyTorch's autograd engine before the runtime captures it

from remat_alloc._arguments import path_arg as _path_arg
from remat_alloc._arguments import text_arg

from . import _C
from ._C import (  # noqa: F401  (re-exported)
    CheckpointScope,
    MemoryReport,
    RegionDecision,
    RematError,
    RematTrace,
    SavedReport,
    collect_trace,
    current_memory_report,
    format_current_memory_report,
    is_recomputing,
    recompute_needs_tensor,
    saved_report,
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


# Checked here: the runtime takes names as C++ strings, and paths end at the first NUL.
def _name_arg(function, parameter, value):
    text_arg(function, parameter, value)
    return value


def _flag_arg(function, parameter, value):
    if not isinstance(value, bool):
        raise TypeError(f"{function}: {parameter} must be True or False, got {type(value).__name__} {value!r:.80}")
    return value


class RecomputeReplay(_C.RecomputeReplay):
    """Decisions forward records and recompute takes back in order: record_or_replay(compute)
    under a checkpoint that has this channel in contexts=[...]."""

    def __init__(self, name):
        super().__init__(_name_arg("RecomputeReplay", "name", name))


def write_dump(path, json):
    """Writes `json` (a report's to_json()) to `path` atomically."""
    if not isinstance(json, str):
        raise TypeError(f"write_dump: json must be a str (a report's to_json()), got {type(json).__name__}")
    _C.write_dump(_path_arg("write_dump", "path", path), json)


def live_bytes(region_prefix=""):
    """Requested bytes live under a region (and its nested regions), on every allocator."""
    return _C.live_bytes(_name_arg("live_bytes", "region_prefix", region_prefix))


class tag_cpu_tensors:
    """Allocates CPU tensors through remat's tagging allocator while in force, so they carry
    the region, policy and phase tags and count in live_bytes(); tensors it allocated are freed
    through it afterwards too. Process-wide: while any tag_cpu_tensors() is entered, on any
    thread, every CPU tensor goes through it; guards may be nested and exited in any order.

    Capacity: CPU tensors then come from the allocator's host backend, which holds at most
    host_capacity_mb (default 4096 MiB, 4 GiB) of them at once; a tensor beyond what is left
    raises torch.OutOfMemoryError. Raise it before the first tagged CPU tensor, with
    REMAT_ALLOC_CONF="host_capacity_mb:16384" in the environment or
    remat_alloc.configure("host_capacity_mb:16384") (refused once tagged tensors are live)."""

    _lock = threading.Lock()
    _entered = 0  # guards entered, process-wide
    _guard = None  # the runtime's guard while _entered > 0

    def __init__(self):
        self._times_entered = 0

    def __enter__(self):
        cls = tag_cpu_tensors
        with cls._lock:
            if cls._entered == 0:
                guard = _C.tag_cpu_tensors()
                guard.__enter__()
                cls._guard = guard
            cls._entered += 1
            self._times_entered += 1
        return self

    def __exit__(self, *exc_info):
        cls = tag_cpu_tensors
        with cls._lock:
            if self._times_entered == 0:
                raise RuntimeError("tag_cpu_tensors: exited without being entered (or exited once more than "
                                   "entered)")
            self._times_entered -= 1
            cls._entered -= 1
            if cls._entered == 0:
                guard, cls._guard = cls._guard, None
                guard.__exit__(None, None, None)


class track_saved_tensors:
    """Records tensors autograd saves outside checkpoints on this thread, for saved_report().
    Guards may be nested and exited in any order; tracking stays on while any is entered on
    the thread. A guard must exit on the thread that entered it."""

    _thread = threading.local()  # .entered: guards entered on this thread; .guard: the runtime's

    def __init__(self):
        self._lock = threading.Lock()
        self._threads = {}  # thread id -> [thread name, times entered there]

    def __enter__(self):
        here, thread = track_saved_tensors._thread, threading.current_thread()
        if getattr(here, "entered", 0) == 0:
            guard = _C.track_saved_tensors()
            guard.__enter__()
            here.guard, here.entered = guard, 0
        here.entered += 1
        with self._lock:
            self._threads.setdefault(thread.ident, [thread.name, 0])[1] += 1
        return self

    def __exit__(self, *exc_info):
        here, thread = track_saved_tensors._thread, threading.current_thread()
        with self._lock:
            count = self._threads.get(thread.ident)
            if count is None:
                others = [name for name, _ in self._threads.values()]
                if others:
                    raise RuntimeError(
                        f"track_saved_tensors: entered on thread {others[0]!r} and exited on thread "
                        f"{thread.name!r}; tracking is per thread, so it stays on for {others[0]!r} until that "
                        "thread exits the guard")
                raise RuntimeError("track_saved_tensors: exited without being entered (or exited once more than "
                                   "entered)")
            count[1] -= 1
            if count[1] == 0:
                del self._threads[thread.ident]
        here.entered -= 1
        if here.entered == 0:
            guard, here.guard = here.guard, None
            guard.__exit__(None, None, None)


_defaults = threading.local()  # .verify_recompute: [(scope, enabled)] entered on this thread, innermost last


def _verify_recompute_default():
    entered = getattr(_defaults, "verify_recompute", None)
    return entered[-1][1] if entered else False


class _VerifyRecompute:
    def __init__(self, enabled):
        self._enabled = enabled
        self._entered_into = []  # the thread lists this scope was entered into, latest last

    def __enter__(self):
        if not hasattr(_defaults, "verify_recompute"):
            _defaults.verify_recompute = []
        _defaults.verify_recompute.append((self, self._enabled))
        self._entered_into.append(_defaults.verify_recompute)
        return self

    def __exit__(self, *exc_info):
        if not self._entered_into:
            raise RuntimeError("verify_recompute: exited without being entered (or exited once more than entered)")
        # This thread's list if it was entered here, else where it was entered last (another thread's).
        here = getattr(_defaults, "verify_recompute", None)
        mine = [i for i, entered in enumerate(self._entered_into) if entered is here]
        entered = self._entered_into.pop(mine[-1] if mine else -1)
        # Its own entry, wherever it is: scopes exited out of order leave the others' settings in force.
        index = max(i for i, (scope, _) in enumerate(entered) if scope is self)
        del entered[index]


def verify_recompute(enabled=True):
    """Checkpoints started inside on this thread compare every tensor recompute recreates with
    forward's and raise an error naming the region and the difference on a mismatch (as
    checkpoint(..., verify_recompute=True)). verify_recompute(False) turns it off inside."""
    return _VerifyRecompute(_flag_arg("verify_recompute", "enabled", enabled))


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
    _name_arg("checkpoint", "region_name", region_name)
    if verify_recompute is None:
        verify_recompute = _verify_recompute_default()
    _flag_arg(f"checkpoint '{region_name}'", "verify_recompute", verify_recompute)
    return _C.checkpoint(fn, tuple(args), dict(kwargs), region_name, list(recompute_state_hooks), list(contexts),
                         verify_recompute)


def region(fn=None, name=None, recompute=True):
    """A region inside a checkpoint: region(fn, "mlp")(x), or as a decorator,
    @region(name="attention", recompute=False). recompute=False makes a save region: what
    autograd saves in it is kept, and recompute skips its body. Outside a checkpoint the body
    simply runs."""
    if isinstance(fn, str) and name is None:  # @region("attention")
        fn, name = None, fn
    if name is None or name == "":
        raise ValueError("region: name each region, e.g. region(fn, \"attention\")")
    _name_arg("region", "name", name)
    _flag_arg(f"region '{name}'", "recompute", recompute)

    def wrap(body):
        if not callable(body):
            raise TypeError(f"region '{name}': fn must be callable, got {type(body).__name__}")

        @functools.wraps(body)
        def run(*args, **kwargs):
            return _C.region(body, tuple(args), dict(kwargs), name, recompute)

        return run

    return wrap if fn is None else wrap(fn)
