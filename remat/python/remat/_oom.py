"""Out-of-memory reports for PyTorch's native CUDA caching allocator, and the same call for
remat's tagging allocator.

PyTorch's native allocator calls observers registered with
torch._C._cuda_attach_out_of_memory_observer(fn) when a request fails (after releasing its cache
and retrying, with its lock released, before it raises torch.OutOfMemoryError), as
fn(device, alloc, limit, device_free). attach_oom_observer() registers an observer that takes the
allocator's snapshot and writes an `oom` dump built by oom_dump_from_snapshot() (_oom_dump) into
dump_dir under a new name for every OOM; it never raises into the allocator: a failure prints one
line to stderr and PyTorch goes on to raise its OutOfMemoryError. When remat's tagging allocator
is PyTorch's CUDA allocator instead (remat_alloc.install()), PyTorch's pluggable-allocator shim
has no observers, and the allocator writes a fuller report itself (tags, sites, phases, the
failing thread's tag stack, its own trace): the same call then points that report at dump_dir
and registers with the allocator's observers (remat_alloc.add_oom_observer); OomObserver.allocator
says which path was taken.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from typing import Callable, Optional

import remat_alloc

from ._extension import _C
from ._oom_dump import _dump_header, _is_int, _resident_storages, _write_dump, oom_dump_from_snapshot

__all__ = ["attach_oom_observer", "oom_dump_from_snapshot", "OomObserver"]


# --- the observer ---------------------------------------------------------------------------------

def _live_resident() -> list:
    """What the checkpoint runtime keeps now: every checkpoint whose forward finished and whose
    frame is alive, and the one whose forward is running on this thread."""
    from ._extension import _C

    reports = list(_C.live_checkpoint_reports()) if hasattr(_C, "live_checkpoint_reports") else []
    try:
        reports.append(_C.current_memory_report())
    except Exception:  # noqa: BLE001  (RematError: not inside a checkpoint's forward)
        pass
    return reports


def _native_snapshot() -> dict:
    import torch

    return torch.cuda.memory._snapshot()


def _device_total(device: int, limit: int) -> Optional[int]:
    """The device's memory. PyTorch hands observers the total, or the cap when
    set_per_process_memory_fraction set one; only then is the total asked for separately."""
    try:
        import torch

        if torch.cuda.get_per_process_memory_fraction(device) >= 1.0:
            return limit
        return max(limit, int(torch.cuda.get_device_properties(device).total_memory))
    except Exception:  # noqa: BLE001  (the dump then takes the observer's limit as the total)
        return None


def _num_ooms(device: int) -> Optional[int]:
    try:
        import torch

        return int(torch.cuda.memory_stats(device)["num_ooms"])
    except Exception:  # noqa: BLE001  (the dump then counts the trace's oom events)
        return None


def _allocator_config() -> str:
    return os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF") or ""


def _stderr_line(text: str) -> None:
    try:
        print(" ".join(text.split()), file=sys.stderr, flush=True)
    except Exception:  # noqa: BLE001  (no stderr to tell)
        pass


def _dump_dir_arg(dump_dir) -> str:
    from remat_alloc.arguments import path_arg

    path = os.fsdecode(path_arg("attach_oom_observer", "dump_dir", dump_dir))
    shown = f"{path!r:.200}"
    if not os.path.exists(path):
        raise FileNotFoundError(f"attach_oom_observer: dump_dir {shown} does not exist; create it first "
                                "(os.makedirs(dump_dir, exist_ok=True)) or pass an existing directory")
    if not os.path.isdir(path):
        raise NotADirectoryError(f"attach_oom_observer: dump_dir {shown} is not a directory; pass the directory "
                                 "the OOM reports should go to")
    if not os.access(path, os.W_OK | os.X_OK):
        raise PermissionError(f"attach_oom_observer: dump_dir {shown} is not writable by this process; pass a "
                              "directory it can create files in, or change the directory's permissions")
    return os.path.abspath(path)


def _device_arg(device) -> Optional[int]:
    if device is None:
        return None
    if _is_int(device):
        if device < 0:
            raise ValueError(f"attach_oom_observer: device={device} is negative; pass a CUDA device index, or None "
                             "for every device")
        return device
    import torch

    try:
        parsed = torch.device(device)
    except (TypeError, RuntimeError):
        raise TypeError(f"attach_oom_observer: device must be None, an int, 'cuda:N' or a torch.device, got "
                        f"{type(device).__name__} {device!r:.80}") from None
    if parsed.type != "cuda":
        raise ValueError(f"attach_oom_observer: device {device!r:.80} is not a CUDA device; OOM observers watch CUDA "
                         "devices (pass 'cuda:N', N, or None for every device)")
    return torch.cuda.current_device() if parsed.index is None else parsed.index


class OomObserver:
    """What attach_oom_observer() registered. allocator: "native" (PyTorch's caching allocator;
    this observer builds the report from its snapshot) or "remat" (remat's tagging allocator
    writes its own report). dumps: the reports written so far, oldest first. detach(): no more
    reports from this observer.

    Callable as PyTorch calls an OOM observer, observer(device, alloc, limit, device_free); on the
    native path that writes one report and never raises."""

    def __init__(self, dump_dir, *, device=None, snapshot_fn: Optional[Callable[[], dict]] = None,
                 resident_fn: Optional[Callable[[], list]] = None) -> None:
        self.dump_dir = _dump_dir_arg(dump_dir)
        self.device = _device_arg(device)
        self.allocator = "native"
        self.dumps: list = []
        self._snapshot_fn = snapshot_fn or _native_snapshot
        self._resident_fn = resident_fn or _live_resident
        self._lock = threading.Lock()
        self._attached = True
        self._remat_id = 0

    def __repr__(self) -> str:
        state = "attached" if self._attached else "detached"
        devices = "every device" if self.device is None else f"cuda:{self.device}"
        return (f"<remat OomObserver {state}: {self.allocator} allocator, {devices}, reports in {self.dump_dir!r}, "
                f"{len(self.dumps)} written>")

    @property
    def attached(self) -> bool:
        return self._attached

    def __call__(self, device, alloc, limit, device_free) -> None:
        try:
            self._observe(device, alloc, limit, device_free)
        except Exception as error:  # noqa: BLE001  (never into the allocator: PyTorch raises the OOM next)
            _stderr_line(f"remat: out of memory on device {device!r:.20}; no OOM report written: "
                         f"{type(error).__name__}: {error}")

    def _observe(self, device, alloc, limit, device_free) -> None:
        if not self._attached or (self.device is not None and device != self.device):
            return
        snapshot = self._snapshot_fn()
        resident, note = None, ""
        try:
            resident = list(self._resident_fn())
            _resident_storages(resident, device)  # checked here, so that bad data only skips attribution
        except Exception as error:  # noqa: BLE001
            resident, note = None, f" (regions not attributed: {type(error).__name__}: {error})"
        header = _dump_header(device)
        dump = oom_dump_from_snapshot(snapshot, device=device, segment_bytes=alloc, device_limit=limit,
                                      device_free=device_free, device_total=_device_total(device, limit),
                                      num_ooms=_num_ooms(device), config=_allocator_config(),
                                      resident=resident, header=header)
        path = _C.oom_dump_path(self.dump_dir, device)
        _write_dump(path, json.dumps(dump, separators=(",", ":"), allow_nan=False) + "\n")
        with self._lock:
            self.dumps.append(path)
        memory = dump["memory"]
        top = ", ".join(f"{h['name']} {_C.format_bytes(h['bytes'])}" for h in dump["holders"]["by_region"][:3])
        _stderr_line(f"remat: out of memory on device {device} (PyTorch's native allocator): tried to allocate "
                     f"{_C.format_bytes(dump['request']['rounded_bytes'])} (a {_C.format_bytes(alloc)} segment): "
                     f"{_C.format_bytes(memory['device_free_bytes'])} free of "
                     f"{_C.format_bytes(memory['device_total_bytes'])}, {_C.format_bytes(memory['allocated_bytes'])} "
                     f"allocated, {_C.format_bytes(memory['reserved_bytes'])} reserved; top holders: {top or 'none'}; "
                     f"report: {path}{note}")

    def detach(self) -> None:
        """Stops reporting. PyTorch cannot remove an observer, so on the native path it stays
        registered and does nothing; on the tagging allocator's path the allocator forgets it and
        writes its reports where it did before this observer was attached (the folder of the last
        one attached that is still attached, else REMAT_ALLOC_CONF's oom_dump_dir, else
        REMAT_OOM_DUMP_DIR)."""
        with self._lock:
            if not self._attached:
                return
            self._attached = False
        if self.allocator == "remat":
            remat_alloc.remove_oom_observer(self._remat_id)
            with _tagging_observers_lock:
                _tagging_observers.remove(self)
                directory = _tagging_observers[-1].dump_dir if _tagging_observers else _configured_dump_dir()
            remat_alloc.configure(f"oom_dump_dir:{directory}")


# The observers attached to the tagging allocator, oldest first. It writes one report per OOM, into
# the folder of the last one attached; each other observer gets a copy in its own.
_tagging_observers: list = []
_tagging_observers_lock = threading.Lock()


def _configured_dump_dir() -> str:
    """The oom_dump_dir REMAT_ALLOC_CONF gives ("" where it gives none)."""
    for setting in os.environ.get("REMAT_ALLOC_CONF", "").split(","):
        key, _, value = setting.partition(":")
        if key.strip() == "oom_dump_dir":
            return value.strip()
    return ""


def _copy_into(path: str, directory: str) -> str:
    """A copy of the report at `path` in `directory` (written atomically), or "" where it failed (said)."""
    try:
        with open(path, encoding="utf-8") as report:
            text = report.read()
        copy = os.path.join(directory, os.path.basename(path))
        _write_dump(copy, text)
        return copy
    except Exception as error:  # noqa: BLE001  (never into the allocator: PyTorch raises the OOM next)
        _stderr_line(f"remat: the OOM report {path} could not be copied into {directory}: "
                     f"{type(error).__name__}: {error}")
        return ""


def _attach_to_tagging_allocator(observer: OomObserver) -> None:
    directory = observer.dump_dir
    if "," in directory or directory != directory.strip():
        raise ValueError(f"attach_oom_observer: dump_dir {directory!r:.200} holds a comma or starts or ends with "
                         "white space, which the tagging allocator's key:value settings cannot carry; pass a "
                         "directory without them")
    remat_alloc.configure(f"oom_dump_dir:{directory}")

    def on_oom(event) -> None:
        if not observer._attached:
            return
        path = event.dump_path
        if path and (observer.device is None or event.device == observer.device):
            if os.path.dirname(os.path.abspath(path)) != observer.dump_dir:
                path = _copy_into(path, observer.dump_dir)  # written into another observer's folder
            if path:
                with observer._lock:
                    observer.dumps.append(path)

    observer._remat_id = remat_alloc.add_oom_observer(on_oom)
    observer.allocator = "remat"
    with _tagging_observers_lock:
        _tagging_observers.append(observer)


def attach_oom_observer(dump_dir, *, device=None, allocator: str = "auto") -> OomObserver:
    """Writes an `oom` report (schemas/oom.schema.json; `remat-report oom FILE` renders it) into
    dump_dir whenever a CUDA allocation fails, one file per OOM, named as the allocator names its
    own (oom-<host>-r<rank>-p<pid>-d<device>-<UTC time>.json), before PyTorch raises
    torch.OutOfMemoryError.

    allocator: "auto" uses remat's tagging allocator when remat_alloc.install() made it PyTorch's
    CUDA allocator, else PyTorch's native caching allocator. "native": PyTorch's observer; the
    report bills live blocks to the checkpoint regions that keep them and the rest to <untagged>.
    "remat": the tagging allocator writes its own, fuller report into dump_dir (also on its host
    backend, without CUDA); it writes at most one per oom_dump_interval_ms (remat_alloc.configure)
    and for every device, so `device` then only selects which reports .dumps lists.
    device: only OOMs on this CUDA device (int, 'cuda:N' or torch.device); None: every device.

    Returns an OomObserver (its .allocator says which path was taken, .dumps what was written).
    Raises at once, not at the OOM, when dump_dir is missing, not a directory or not writable,
    and RuntimeError when the native observer is asked for without CUDA, or when another
    pluggable allocator (which PyTorch gives no observers) is PyTorch's CUDA allocator.
    """
    if allocator not in ("auto", "native", "remat"):
        raise ValueError(f"attach_oom_observer: allocator={allocator!r:.80} is not one of 'auto', 'native', "
                         "'remat'")
    observer = OomObserver(dump_dir, device=None)
    if allocator == "remat" or (allocator == "auto" and remat_alloc.is_installed()):
        observer.device = _device_arg(device)
        _attach_to_tagging_allocator(observer)
        return observer

    import torch

    if not torch.cuda.is_available():
        raise RuntimeError(
            f"attach_oom_observer: PyTorch's native OOM observer needs CUDA, and torch.cuda.is_available() is False "
            f"here (torch {torch.__version__}, built for CUDA {torch.version.cuda}); run where a GPU is visible. "
            "remat.oom_dump_from_snapshot() builds the report anywhere, and allocator='remat' attaches to remat's "
            "tagging allocator, also on its host backend")
    if remat_alloc.pluggable_allocator_in_use():
        ours = remat_alloc.is_installed()
        raise RuntimeError(
            "attach_oom_observer: PyTorch's CUDA allocator is a pluggable allocator, which has no OOM observers"
            + ("; it is remat's tagging allocator: pass allocator='auto' or 'remat' to use its own report"
               if ours else "; install remat's tagging allocator (remat_alloc.install()) or keep PyTorch's native "
               "one to get OOM reports"))
    observer.device = _device_arg(device)
    torch._C._cuda_attach_out_of_memory_observer(observer)
    return observer
