"""The tagging allocator's out-of-memory observers, and whether it is PyTorch's CUDA allocator.

The allocator calls each registered observer, from its C ABI, when a request fails for good
(after its cache was released and the request retried), with one OomEvent: the device, the
request, the device's free and total bytes, what it had reserved and allocated, its one-line
message and the path of the report it wrote. The C struct lives on the allocator's stack for the
call only, so the observer gets a copy (strings decoded), which it may keep. Every observer is
registered with one ctypes callback that lives as long as the process, and a key (its
user_data) naming the Python observer: removal may return while another thread's call is still
in flight (it never waits for one, which could deadlock), and that call must not find its
callback freed. A call whose key was removed does nothing.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import sys
import threading
from typing import Callable


@dataclasses.dataclass(frozen=True)
class OomEvent:
    """One out-of-memory error of the tagging allocator, as an observer receives it: a copy that
    stays valid after the observer returns."""

    device: int
    requested_bytes: int
    rounded_bytes: int  # the request after the allocator's size rounding
    device_free_bytes: int
    device_total_bytes: int
    reserved_bytes: int
    allocated_bytes: int
    message: str
    dump_path: str  # the OOM report written, or ""


class _OomInfo(ctypes.Structure):
    """remat_oom_info in the C ABI: valid only while the allocator calls the observer."""

    _fields_ = [
        ("device", ctypes.c_int),
        ("requested_bytes", ctypes.c_size_t),
        ("rounded_bytes", ctypes.c_size_t),
        ("device_free_bytes", ctypes.c_size_t),
        ("device_total_bytes", ctypes.c_size_t),
        ("reserved_bytes", ctypes.c_int64),
        ("allocated_bytes", ctypes.c_int64),
        ("message", ctypes.c_char_p),
        ("dump_path", ctypes.c_char_p),
    ]


def _event_copied_from(info: _OomInfo) -> OomEvent:
    return OomEvent(device=info.device, requested_bytes=info.requested_bytes, rounded_bytes=info.rounded_bytes,
                    device_free_bytes=info.device_free_bytes, device_total_bytes=info.device_total_bytes,
                    reserved_bytes=info.reserved_bytes, allocated_bytes=info.allocated_bytes,
                    message=(info.message or b"").decode("utf-8", errors="replace"),
                    dump_path=os.fsdecode(info.dump_path or b""))


_OBSERVER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_OomInfo), ctypes.c_void_p)
_observers_lock = threading.Lock()
_observers: dict = {}  # key (the user_data) -> the Python observer
_keys: dict = {}  # observer id -> its key
_next_key = 1


def _library():
    from . import load

    lib = load()
    lib.remat_register_oom_observer.restype = ctypes.c_int
    lib.remat_register_oom_observer.argtypes = [_OBSERVER, ctypes.c_void_p]
    lib.remat_unregister_oom_observer.restype = ctypes.c_int
    lib.remat_unregister_oom_observer.argtypes = [ctypes.c_int]
    return lib


def _on_oom(info, key) -> None:
    with _observers_lock:
        observer = _observers.get(key)
    if observer is None or not info:
        return  # removed: a call that was in flight when it was
    try:
        observer(_event_copied_from(info.contents))
    except Exception as error:  # noqa: BLE001  (a ctypes callback must not raise)
        print(f"remat: OOM observer failed: {type(error).__name__}: {error}", file=sys.stderr, flush=True)


_CALLBACK = _OBSERVER(_on_oom)  # never freed: a call may be in flight after any removal


def add_oom_observer(observer: Callable[[OomEvent], None]) -> int:
    """Calls observer(event) on every out-of-memory error of the tagging allocator; returns the
    id remove_oom_observer() takes. An exception the observer raises is printed, never passed
    into the allocator."""
    global _next_key
    if not callable(observer):
        raise TypeError(f"add_oom_observer: observer must be callable, got {type(observer).__name__}")
    from . import RematError

    lib = _library()
    with _observers_lock:
        key = _next_key
        _next_key += 1
        _observers[key] = observer
    observer_id = lib.remat_register_oom_observer(_CALLBACK, key)
    if observer_id <= 0:
        with _observers_lock:
            del _observers[key]
        raise RematError(lib.remat_last_error().decode(errors="replace"))
    with _observers_lock:
        _keys[observer_id] = key
    return observer_id


def remove_oom_observer(observer_id: int) -> None:
    """The observer add_oom_observer() returned `observer_id` for is called no more (a call
    already running on another thread finishes; removal does not wait for it). An id that
    add_oom_observer() did not return, or that was removed already, raises RematError."""
    from . import RematError
    from .arguments import int_arg

    lib = _library()
    if lib.remat_unregister_oom_observer(int_arg("remove_oom_observer", "observer_id", observer_id)) != 0:
        raise RematError(lib.remat_last_error().decode(errors="replace"))
    with _observers_lock:
        key = _keys.pop(observer_id, None)
        _observers.pop(key, None)


def pluggable_allocator_in_use() -> bool:
    """Whether PyTorch's CUDA allocator is a pluggable allocator (this one or another)."""
    import torch

    pluggable = getattr(torch._C, "_CUDAPluggableAllocator", None)
    get = getattr(torch._C, "_cuda_getAllocator", None)
    if pluggable is None or get is None:
        return False
    try:
        return isinstance(get(), pluggable)
    except Exception:  # noqa: BLE001  (no CUDA allocator to ask about)
        return False


def is_installed() -> bool:
    """Whether the tagging allocator is PyTorch's CUDA allocator (install(), or PyTorch's
    CUDAPluggableAllocator over this library)."""
    package = sys.modules.get(__package__)
    if package is None or getattr(package, "_lib", None) is None:
        return False  # installing loads the library
    return package._installed_with_hooks or pluggable_allocator_in_use()
