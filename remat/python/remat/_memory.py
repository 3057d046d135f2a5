"""Tagged memory from Python: CPU tensors through the tagging allocator, allocation sites, live
bytes per region, and dumps.

The checkpoint runtime tags what it allocates with the checkpoint, region, policy and phase.
CUDA tensors carry these tags once remat_alloc.install() made the tagging allocator PyTorch's;
CPU tensors carry them inside tag_cpu_tensors(). site("experts") adds an allocation-site tag,
shown in memory reports and dumps.
"""

import functools
import json
import threading

import remat_alloc
from remat_alloc.arguments import path_arg

from ._extension import _C
from ._arguments import name_arg

__all__ = ["tag_cpu_tensors", "site", "live_bytes", "write_dump"]


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
    # Called as the last guard is about to exit, while CPU tensors are still counted (remat.fit
    # checks a fitted model's last step there, as the next step would have)
    before_last_exit = []

    def __init__(self):
        self._times_entered = 0

    def __copy__(self):
        # A copy of an entered guard would exit what it never entered.
        raise TypeError("tag_cpu_tensors guards cannot be copied; make a new remat.tag_cpu_tensors()")

    def __deepcopy__(self, memo):
        return self.__copy__()

    def __reduce__(self):
        raise TypeError("tag_cpu_tensors guards cannot be copied or pickled; make a new remat.tag_cpu_tensors()")

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
        try:
            if cls._entered == 1 and self._times_entered == 1 and exc_info[0] is None:
                for call in cls.before_last_exit:
                    call()
        finally:  # (a call that raises, a warning made an error, leaves the guard exited all the same)
            self._leave()

    def _leave(self):
        cls = tag_cpu_tensors
        with cls._lock:
            if self._times_entered == 0 or cls._entered == 0:
                raise RuntimeError("tag_cpu_tensors: exited without being entered (or exited once more than "
                                   "entered)")
            self._times_entered -= 1
            cls._entered -= 1
            if cls._entered == 0:
                guard, cls._guard = cls._guard, None
                guard.__exit__(None, None, None)


class site:
    """An allocation-site tag: `with remat.site("experts"):` or `@remat.site("experts")` tags
    every allocation inside (CUDA under remat_alloc.install(), CPU under tag_cpu_tensors()), and
    memory reports and dumps show it. Scopes nest and exit in reverse order on their thread."""

    def __init__(self, name):
        self.name = name_arg("site", "name", name)
        self._scope = remat_alloc.site(name)

    def __repr__(self):
        return f"remat.site({self.name!r})"

    def __enter__(self):
        self._scope.__enter__()
        return self

    def __exit__(self, *exc_info):
        self._scope.__exit__(*exc_info)

    def __call__(self, fn):
        if not callable(fn):
            raise TypeError(f"{self!r}: decorates a callable, got {type(fn).__name__}")

        @functools.wraps(fn)
        def tagged(*args, **kwargs):
            with self:
                return fn(*args, **kwargs)

        return tagged


def live_bytes(region_prefix=""):
    """Requested bytes live under a region and the regions nested in it, on every allocator.
    Prefixes match whole components, separated by "::" or ".": "layers" covers "layers.0" and
    "layers.0::mlp"; "layers.1" does not cover "layers.10"."""
    return _C.live_bytes(name_arg("live_bytes", "region_prefix", region_prefix))


def write_dump(path, text):
    """Writes `text`, one JSON document (a report's to_json()), to `path` atomically."""
    if not isinstance(text, str):
        raise TypeError(f"write_dump: the dump must be a str (a report's to_json()), got {type(text).__name__}")
    try:
        json.loads(text)
    except ValueError as error:
        raise ValueError(f"write_dump: the dump is not one JSON document ({error}); pass a report's to_json()") from None
    _C.write_dump(path_arg("write_dump", "path", path), text)
