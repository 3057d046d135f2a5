"""Python access to libremat_alloc.so through ctypes (no compiled extension).

    import remat_alloc
    remat_alloc.install()                 # make it PyTorch's CUDA allocator
    with remat_alloc.region("layers.0"):
        y = model.layers[0](x)            # these allocations are tagged layers.0
    remat_alloc.dump_snapshot("snap.json")

The library is found through REMAT_ALLOC_LIBRARY, next to this package, or on the
loader's search path.
"""

from __future__ import annotations

import contextlib
import ctypes
import numbers
import os
import threading
import warnings
from pathlib import Path
from typing import Callable, Iterator, Optional, Union

from .arguments import C_POINTER as _C_POINTER
from .arguments import int_arg as _int_arg
from .arguments import path_arg as _path_arg
from .arguments import text_arg as _text_arg
from . import _tracking
from ._tracking import Tracker, track, untrack
from ._oom_observers import OomEvent, add_oom_observer, is_installed, pluggable_allocator_in_use, remove_oom_observer

__all__ = [
    "RematError", "load", "configure", "install", "region", "recv_slot", "site", "phase",
    "policy", "set_label", "label", "labelled", "CATEGORIES", "set_category", "category", "categorized", "block_category",
    "category_bytes", "track", "untrack", "Tracker", "dump_snapshot", "dump_trace", "memory_stats", "reset_peak_stats", "PeakWindow", "live_bytes",
    "empty_cache", "record_stream", "set_memory_fraction", "library_path", "pluggable_library_path",
    "check_one_copy",
    "OomEvent", "add_oom_observer", "remove_oom_observer", "is_installed", "pluggable_allocator_in_use",
]


class RematError(RuntimeError):
    """A remat C ABI call failed; the message is the library's own."""


class _Stats(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("allocated_bytes", ctypes.c_int64),
        ("allocated_bytes_peak", ctypes.c_int64),
        ("requested_bytes", ctypes.c_int64),
        ("requested_bytes_peak", ctypes.c_int64),
        ("active_bytes", ctypes.c_int64),
        ("active_bytes_peak", ctypes.c_int64),
        ("reserved_bytes", ctypes.c_int64),
        ("reserved_bytes_peak", ctypes.c_int64),
        ("live_blocks", ctypes.c_int64),
        ("segments", ctypes.c_int64),
        ("num_allocs", ctypes.c_uint64),
        ("num_frees", ctypes.c_uint64),
        ("num_segment_allocs", ctypes.c_uint64),
        ("num_segment_frees", ctypes.c_uint64),
        ("num_ooms", ctypes.c_uint64),
        ("num_alloc_retries", ctypes.c_uint64),
        ("num_invalid_frees", ctypes.c_uint64),
    ]


_lib: Optional[ctypes.CDLL] = None
_lib_path: Optional[str] = None


def _candidates() -> list[str]:
    found = []
    env = os.environ.get("REMAT_ALLOC_LIBRARY")
    if env:
        found.append(env)
    here = Path(__file__).resolve().parent
    for folder in (here, here.parent, here.parent.parent):
        found.append(str(folder / "libremat_alloc.so"))
    found.append("libremat_alloc.so")
    return found


def _declare(lib: ctypes.CDLL) -> None:
    c_int, c_char_p, c_void_p, c_size_t = ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t
    signatures = {
        "remat_alloc": (c_void_p, [c_size_t, c_int, c_void_p]),
        "remat_free": (None, [c_void_p, c_size_t, c_int, c_void_p]),
        "remat_alloc_status": (c_int, [c_size_t, c_int, c_void_p, ctypes.POINTER(c_void_p)]),
        "remat_set_memory_fraction": (c_int, [c_int, ctypes.c_double]),
        "remat_configure": (c_int, [c_char_p]),
        "remat_push_region": (c_int, [c_char_p]),
        "remat_pop_region": (c_int, []),
        "remat_push_recv_slot": (c_int, [c_int, ctypes.c_char, c_int]),
        "remat_pop_recv_slot": (c_int, []),
        "remat_push_site": (c_int, [c_char_p]),
        "remat_pop_site": (c_int, []),
        "remat_push_phase": (c_int, [c_char_p]),
        "remat_pop_phase": (c_int, []),
        "remat_push_policy": (c_int, [c_char_p]),
        "remat_pop_policy": (c_int, []),
        "remat_set_label": (c_int, [c_char_p]),
        "remat_get_label": (c_int, [c_char_p, c_size_t, ctypes.POINTER(c_size_t)]),
        "remat_set_category": (c_int, [c_int, c_char_p]),
        "remat_get_category": (c_int, [ctypes.POINTER(c_int), c_char_p, c_size_t, ctypes.POINTER(c_size_t)]),
        "remat_retag_block": (c_int, [c_void_p, c_int, c_char_p, ctypes.POINTER(ctypes.c_uint32)]),
        "remat_categorize_as_activation": (c_int, [c_void_p, ctypes.POINTER(c_int)]),
        "remat_block_tag": (c_int, [c_void_p, ctypes.POINTER(ctypes.c_uint32)]),
        "remat_set_block_tag": (c_int, [c_void_p, ctypes.c_uint32]),
        "remat_block_category": (c_int, [c_void_p, ctypes.POINTER(c_int), c_char_p, c_size_t, ctypes.POINTER(c_size_t)]),
        "remat_category_bytes": (c_int, [c_int] + [ctypes.POINTER(ctypes.c_int64)] * 4),
        "remat_dump_snapshot": (c_int, [c_char_p]),
        "remat_dump_snapshot_device": (c_int, [c_char_p, c_int]),
        "remat_dump_trace": (c_int, [c_char_p]),
        "remat_empty_cache": (c_int, []),
        "remat_record_stream": (c_int, [c_void_p, c_void_p]),
        "remat_get_stats": (c_int, [c_int, ctypes.POINTER(_Stats)]),
        "remat_reset_peak_stats": (c_int, [c_int]),
        "remat_take_window_peak": (c_int, [c_int, ctypes.POINTER(ctypes.c_int64)]),
        "remat_live_bytes": (c_int, [c_int, c_char_p, ctypes.POINTER(ctypes.c_int64)]),
        "remat_last_error": (c_char_p, []),
        "remat_version": (c_char_p, []),
    }
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes


def load(path: Optional[str] = None) -> ctypes.CDLL:
    """Loads the library once (from `path` if given) and returns it."""
    global _lib, _lib_path
    if _lib is not None:
        if path is not None and os.path.realpath(path) != os.path.realpath(_lib_path or ""):
            raise RematError(f"libremat_alloc is already loaded from {_lib_path}; load() takes one library per process")
        return _lib
    errors = []
    for candidate in [path] if path else _candidates():
        try:
            lib = ctypes.CDLL(candidate)
        except OSError as e:
            errors.append(f"{candidate}: {e}")
            continue
        _declare(lib)
        _lib, _lib_path = lib, candidate
        check_one_copy()
        return lib
    raise RematError("cannot load libremat_alloc.so; set REMAT_ALLOC_LIBRARY to its path. Tried: " + "; ".join(errors))


def _mapped_copies() -> list[str]:
    """The files named libremat_alloc*.so mapped into this process (Linux), each once."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            paths = {line.split(None, 5)[5].strip() for line in maps if line.count(" ") >= 5 and "libremat_alloc" in line}
    except OSError:
        return []
    return sorted(path for path in paths if Path(path).name.startswith("libremat_alloc") and ".so" in path)


def check_one_copy() -> None:
    """Refuses a second copy of the allocator's library in this process. Each copy has its own
    pools, tags and observers: with remat's extension linking one and REMAT_ALLOC_LIBRARY naming
    another, observers added here would never see the other copy's out-of-memory errors."""
    copies = _mapped_copies()
    if len(copies) > 1:
        raise RematError(f"two copies of the allocator's library are loaded in this process: {' and '.join(copies)}; "
                         "each keeps its own memory, tags and observers. Load one: unset REMAT_ALLOC_LIBRARY (remat's "
                         "extension brings the copy it was built with), or point it at that copy")


def library_path() -> str:
    load()
    assert _lib_path is not None
    return _lib_path


def _check(status: int) -> None:
    if status != 0:
        raise RematError(load().remat_last_error().decode(errors="replace"))


def configure(conf: str) -> None:
    """Applies REMAT_ALLOC_CONF-style text, e.g. "backend:host,host_capacity_mb:1024"."""
    _check(load().remat_configure(_text_arg("configure", "conf", conf)))


def pluggable_library_path() -> Optional[str]:
    """libremat_pluggable.so: REMAT_PLUGGABLE_LIBRARY, or the one beside libremat_alloc.so."""
    env = os.environ.get("REMAT_PLUGGABLE_LIBRARY")
    if env:
        return env
    loaded = Path(library_path())
    if loaded.parent == Path("."):
        return None  # found on the loader's search path: no folder to look beside
    sibling = loaded.resolve().parent / "libremat_pluggable.so"
    return str(sibling) if sibling.exists() else None


# Set once install() has made the hooks library's allocator PyTorch's (it cannot be undone): that
# allocator is not a torch._C._CUDAPluggableAllocator to Python, so is_installed() asks this.
_installed_with_hooks = False


def install() -> None:
    """Makes this allocator PyTorch's CUDA allocator. Call right after `import torch`,
    before the first CUDA tensor: PyTorch cannot swap an allocator it has used.

    Through libremat_pluggable.so (built with LibTorch's CUDA libraries, installed beside
    libremat_alloc.so), out-of-memory raises torch.OutOfMemoryError after the OOM report is
    written, and torch.cuda.empty_cache(), torch.cuda.set_per_process_memory_fraction() and
    Tensor.record_stream() reach this allocator. Without it, PyTorch's plain
    CUDAPluggableAllocator is used, which has none of these (a warning says so)."""
    import torch
    from torch.cuda import memory

    if torch.version.cuda is None:
        raise RematError(f"torch {torch.__version__} has no CUDA support; install a CUDA build of torch")
    path = library_path()
    pluggable = pluggable_library_path()
    if pluggable is None:
        warnings.warn(
            f"libremat_pluggable.so was not found beside {path}: under PyTorch's plain CUDAPluggableAllocator "
            "an out-of-memory error hands PyTorch a NULL pointer instead of raising torch.OutOfMemoryError, and "
            "empty_cache, set_per_process_memory_fraction and record_stream do not reach this allocator. Build "
            "the project where LibTorch's CUDA libraries are present, or set REMAT_PLUGGABLE_LIBRARY",
            RuntimeWarning,
            stacklevel=2,
        )
        memory.change_current_allocator(memory.CUDAPluggableAllocator(path, "remat_alloc", "remat_free"))
        return
    try:
        hooks = ctypes.CDLL(pluggable)
    except OSError as e:
        raise RematError(f"cannot load {pluggable}: {e}; it must be built against this torch ({torch.__version__})")
    hooks.remat_pluggable_install.restype = ctypes.c_int
    hooks.remat_pluggable_last_error.restype = ctypes.c_char_p
    if hooks.remat_pluggable_install() != 0:
        raise RematError(hooks.remat_pluggable_last_error().decode(errors="replace"))
    global _installed_with_hooks
    _installed_with_hooks = True


class _Scope:
    """A tag scope: pushes its tag on this thread's tag stack on entry, pops it on exit.

    The C tag stack belongs to the thread, so scopes must exit in the reverse order of entry on
    the thread that entered them; an exit that breaks this raises RuntimeError and pops
    nothing, so the stack keeps matching the scopes still entered. A scope can be entered
    again, also nested in itself."""

    _thread = threading.local()  # .entered: this thread's scopes, innermost last

    def __init__(self, label: str, push: Callable[[], int], pop: Callable[[], int]) -> None:
        self._label = label
        self._push = push
        self._pop = pop
        self._lock = threading.Lock()
        self._threads: dict[int, list] = {}  # thread id -> [thread name, times entered there]

    def __repr__(self) -> str:
        return f"remat_alloc.{self._label}"

    @classmethod
    def _entered(cls) -> list:
        if not hasattr(cls._thread, "entered"):
            cls._thread.entered = []
        return cls._thread.entered

    def __enter__(self) -> "_Scope":
        _check(self._push())
        self._entered().append(self)
        thread = threading.current_thread()
        with self._lock:
            self._threads.setdefault(thread.ident, [thread.name, 0])[1] += 1
        return self

    def __exit__(self, *exc_info) -> None:
        entered = self._entered()
        thread = threading.current_thread()
        if not entered or entered[-1] is not self:
            if any(scope is self for scope in entered):
                raise RuntimeError(
                    f"{self!r} exited while {entered[-1]!r}, entered after it on this thread, is still entered; "
                    f"exit {entered[-1]!r} first (scopes exit in the reverse order of entry, as nested `with` "
                    "blocks do). Nothing was popped")
            with self._lock:
                others = [name for ident, (name, _) in self._threads.items() if ident != thread.ident]
            if others:
                raise RuntimeError(
                    f"{self!r} was entered on thread {others[0]!r} and exited on thread {thread.name!r}; a tag "
                    f"stack belongs to its thread, so this thread cannot pop it and the tag stays pushed on "
                    f"{others[0]!r} until that thread exits the scope")
            raise RuntimeError(f"{self!r} exited without being entered (or exited once more than entered)")
        entered.pop()
        with self._lock:
            count = self._threads[thread.ident]
            count[1] -= 1
            if count[1] == 0:
                del self._threads[thread.ident]
        _check(self._pop())


def region(name: str) -> _Scope:
    """Tags allocations in the block with a region; nested regions compose as a::b."""
    encoded = _text_arg("region", "name", name)
    lib = load()
    return _Scope(f"region({name!r:.80})", lambda: lib.remat_push_region(encoded), lib.remat_pop_region)


def recv_slot(stage: int, direction: str, slot: int) -> _Scope:
    """Tags allocations as pipeline receive buffers of (stage, 'F' or 'B', slot)."""
    stage = _int_arg("recv_slot", "stage", stage)
    slot = _int_arg("recv_slot", "slot", slot)
    if direction not in ("F", "B"):
        raise RematError(f"direction {direction!r} is not valid; pass 'F' (activations) or 'B' (gradients)")
    lib = load()
    return _Scope(f"recv_slot({stage}, {direction!r}, {slot})",
                  lambda: lib.remat_push_recv_slot(stage, direction.encode(), slot), lib.remat_pop_recv_slot)


def site(name: str) -> _Scope:
    """Tags allocations with an allocation-site annotation."""
    encoded = _text_arg("site", "name", name)
    lib = load()
    return _Scope(f"site({name!r:.80})", lambda: lib.remat_push_site(encoded), lib.remat_pop_site)


def phase(name: str) -> _Scope:
    """Tags allocations with a phase: forward, recompute, backward, offloaded or other."""
    encoded = _text_arg("phase", "name", name)
    lib = load()
    return _Scope(f"phase({name!r:.80})", lambda: lib.remat_push_phase(encoded), lib.remat_pop_phase)


def policy(name: str) -> _Scope:
    """Tags allocations with a checkpoint policy: save, recompute or none."""
    encoded = _text_arg("policy", "name", name)
    lib = load()
    return _Scope(f"policy({name!r:.80})", lambda: lib.remat_push_policy(encoded), lib.remat_pop_policy)


def set_label(text: str) -> None:
    """Labels every allocation that follows, on every thread, on top of the tags of each thread's
    scopes, as torch.cuda.memory._set_memory_metadata does for PyTorch's allocator; "" clears the
    label. Unlike the scopes, the label belongs to the process, not to a thread."""
    _check(load().remat_set_label(_text_arg("set_label", "text", text)))


def label() -> str:
    """The label in force ("" when none)."""
    lib = load()
    while True:
        needed = ctypes.c_size_t()
        _check(lib.remat_get_label(None, 0, ctypes.byref(needed)))
        buffer = ctypes.create_string_buffer(needed.value)
        if lib.remat_get_label(buffer, needed.value, ctypes.byref(needed)) == 0:
            return buffer.value.decode(errors="replace")
        # another thread set a longer label between the two calls: ask again


@contextlib.contextmanager
def labelled(text: str) -> Iterator[None]:
    """Sets the label for the block and restores the one in force before it on exit. The label is
    process-wide: blocks on several threads that overlap restore each other's labels."""
    previous = label()
    set_label(text)
    try:
        yield
    finally:
        set_label(previous)


# The categories in the order of the C ABI's REMAT_CATEGORY_* values ("none": not assigned).
CATEGORIES = ("none", "parameter", "gradient", "optimizer_state", "activation", "temporary", "input", "other")


def _category_index(function: str, name: str) -> int:
    if name not in CATEGORIES:
        raise ValueError(f"{function}: category {name!r:.80} is not one of {', '.join(CATEGORIES)}")
    return CATEGORIES.index(name)


def set_category(name: str, module: str = "") -> None:
    """Gives every allocation that follows on this thread the category `name` (one of
    CATEGORIES) and the module path `module`; set_category("none") clears both. Per thread, set
    rather than pushed: to nest, read category() first and set it back."""
    index = _category_index("set_category", name)
    encoded = _text_arg("set_category", "module", module)
    _check(load().remat_set_category(index, encoded))
    _tracking._thread.current = (index, encoded)


def category() -> tuple[str, str]:
    """This thread's category and module path, as set_category set them."""
    lib = load()
    index, needed = ctypes.c_int(), ctypes.c_size_t()
    _check(lib.remat_get_category(ctypes.byref(index), None, 0, ctypes.byref(needed)))
    buffer = ctypes.create_string_buffer(needed.value)
    _check(lib.remat_get_category(ctypes.byref(index), buffer, needed.value, None))
    return CATEGORIES[index.value], buffer.value.decode(errors="replace")


@contextlib.contextmanager
def categorized(name: str, module: str = "") -> Iterator[None]:
    """set_category for the block, on this thread; the category in force before comes back on exit."""
    previous = category()
    set_category(name, module)
    try:
        yield
    finally:
        set_category(*previous)


def block_category(ptr: int) -> Optional[tuple[str, str]]:
    """The category and module of the live block at `ptr` (a storage's data_ptr()), or None when
    no remat allocator returned it (a CPU tensor made outside tag_cpu_tensors(), say)."""
    lib = load()
    ptr = _int_arg("block_category", "ptr", ptr, _C_POINTER)
    index, needed = ctypes.c_int(), ctypes.c_size_t()
    if lib.remat_block_category(ptr, ctypes.byref(index), None, 0, ctypes.byref(needed)) != 0:
        return None
    buffer = ctypes.create_string_buffer(needed.value)
    _check(lib.remat_block_category(ptr, ctypes.byref(index), buffer, needed.value, None))
    return CATEGORIES[index.value], buffer.value.decode(errors="replace")


def category_bytes(device: int = 0, at_peak: bool = False, requested: bool = False) -> dict[str, int]:
    """Bytes held per category on `device` (0: the host backend's, which tag_cpu_tensors() uses):
    now, or when its allocated bytes last peaked (at_peak; reset_peak_stats starts a new peak);
    rounded block sizes, or the sizes asked for (requested). "none" holds memory without one."""
    device = _int_arg("category_bytes", "device", device)
    arrays = [(ctypes.c_int64 * len(CATEGORIES))() for _ in range(4)]
    _check(load().remat_category_bytes(device, *arrays))
    chosen = arrays[(2 if at_peak else 0) + (1 if requested else 0)]
    return {name: int(chosen[i]) for i, name in enumerate(CATEGORIES)}


def dump_snapshot(path: Union[str, bytes, os.PathLike], device: Optional[int] = None) -> None:
    """Writes the snapshot of `device` (default: the current CUDA device, or 0 on host)."""
    encoded = _path_arg("dump_snapshot", "path", path)
    lib = load()
    if device is None:
        _check(lib.remat_dump_snapshot(encoded))
    else:
        _check(lib.remat_dump_snapshot_device(encoded, _int_arg("dump_snapshot", "device", device)))


def dump_trace(path: Union[str, bytes, os.PathLike]) -> None:
    _check(load().remat_dump_trace(_path_arg("dump_trace", "path", path)))


def memory_stats(device: int = 0) -> dict:
    device = _int_arg("memory_stats", "device", device)
    stats = _Stats()
    stats.struct_size = ctypes.sizeof(_Stats)
    _check(load().remat_get_stats(device, ctypes.byref(stats)))
    return {name: getattr(stats, name) for name, _ in _Stats._fields_ if name != "struct_size"}


def reset_peak_stats(device: int = 0) -> None:
    _check(load().remat_reset_peak_stats(_int_arg("reset_peak_stats", "device", device)))


class PeakWindow:
    """The most requested bytes held on `device` over a stretch of time, read with take(), which
    starts the next stretch: the peak of a part of a step, measured without reset_peak_stats(),
    so memory_stats()' peaks and PyTorch's max_memory_allocated() stay the user's. Any number of
    windows may be open at once, on any thread; the library keeps one, which every take() folds
    into all of them."""

    _lock = threading.Lock()
    _open: dict = {}  # device -> {id(window): window}

    def __init__(self, device: int = 0) -> None:
        self.device = _int_arg("PeakWindow", "device", device)
        with PeakWindow._lock:
            self._fold()
            self._peak = memory_stats(self.device)["requested_bytes"]
            PeakWindow._open.setdefault(self.device, {})[id(self)] = self

    def _fold(self) -> None:
        """Lends the library's window since the last take to every open window (lock held)."""
        out = ctypes.c_int64()
        _check(load().remat_take_window_peak(self.device, ctypes.byref(out)))
        for window in PeakWindow._open.get(self.device, {}).values():
            window._peak = max(window._peak, out.value)

    def take(self) -> int:
        """The most requested bytes held since this window opened or was last taken."""
        with PeakWindow._lock:
            if id(self) not in PeakWindow._open.get(self.device, {}):
                raise RuntimeError("PeakWindow.take(): the window is closed; open a new PeakWindow")
            self._fold()
            peak, self._peak = self._peak, memory_stats(self.device)["requested_bytes"]
            return max(peak, self._peak)

    def close(self) -> None:
        with PeakWindow._lock:
            PeakWindow._open.get(self.device, {}).pop(id(self), None)

    def __enter__(self) -> "PeakWindow":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def live_bytes(region_prefix: str = "", device: int = 0) -> int:
    """Requested bytes live under regions equal to or nested in `region_prefix`."""
    encoded = _text_arg("live_bytes", "region_prefix", region_prefix)
    device = _int_arg("live_bytes", "device", device)
    out = ctypes.c_int64()
    _check(load().remat_live_bytes(device, encoded, ctypes.byref(out)))
    return out.value


def empty_cache() -> None:
    _check(load().remat_empty_cache())


def record_stream(ptr: int, stream: int) -> None:
    """Marks the block at `ptr` as in use by `stream` (a cudaStream_t as an int; 0 or None: the
    default stream)."""
    ptr = _int_arg("record_stream", "ptr", ptr, _C_POINTER)
    stream = 0 if stream is None else _int_arg("record_stream", "stream", stream, _C_POINTER)
    _check(load().remat_record_stream(ptr, stream))


def set_memory_fraction(fraction: float, device: int = 0) -> None:
    """Caps the device's reserved bytes at `fraction` (in (0, 1]) of its memory."""
    if isinstance(fraction, bool) or not isinstance(fraction, numbers.Real):
        raise TypeError(f"set_memory_fraction: fraction must be a float in (0, 1], "
                        f"got {type(fraction).__name__} {fraction!r}")
    device = _int_arg("set_memory_fraction", "device", device)
    _check(load().remat_set_memory_fraction(device, float(fraction)))
