"""Out-of-memory reports for PyTorch's native CUDA caching allocator, and the same call for
remat's tagging allocator.

PyTorch's native allocator tags nothing, but it does two things this module builds on: it calls
observers registered with torch._C._cuda_attach_out_of_memory_observer(fn) when a request fails
(after releasing its cache and retrying, with its lock released, before it raises
torch.OutOfMemoryError), as fn(device, alloc, limit, device_free); and it can describe every
segment and block it holds (torch.cuda.memory._snapshot()). attach_oom_observer() registers an
observer that takes that snapshot, attributes the live blocks to the checkpoint regions that keep
them, matching the storages the checkpoint runtime reports by address (a block covers
[address, address + size) on the failing device; every storage is counted once), bills the rest to
`<untagged>`, and writes an `oom` dump (schemas/oom.schema.json, the same fields and meanings as
the tagging allocator's own report, so `remat-report oom` renders both) into dump_dir under a new
name for every OOM. Building the dump is the pure function oom_dump_from_snapshot(), usable and
tested without a GPU; the observer never raises into the allocator: a failure prints one line to
stderr and PyTorch goes on to raise its OutOfMemoryError. When remat's tagging allocator is
PyTorch's CUDA allocator instead (remat_alloc.install()), PyTorch's pluggable-allocator shim has no
observers, and the allocator writes a fuller report itself (tags, sites, phases, the failing
thread's tag stack, its own trace): the same call then points that report at dump_dir and
registers with the allocator's C observer; OomObserver.allocator says which path was taken.
"""

from __future__ import annotations

import bisect
import ctypes
import itertools
import json
import os
import re
import sys
import threading
from collections.abc import Mapping
from typing import Callable, Optional

__all__ = ["attach_oom_observer", "oom_dump_from_snapshot", "OomObserver"]

OOM_SCHEMA_VERSION = 1
TOP_HOLDERS = 10  # as the tagging allocator: the largest holders of each kind
LAST_EVENTS = 64  # as the tagging allocator: the newest trace events
UNTAGGED = "<untagged>"
INPUTS = "<inputs>"  # MemoryReport's region for a checkpoint's inputs

# Block states of PyTorch's snapshot (its docstring says active_awaiting_free; the C++ writes
# active_pending_free).
_ALLOCATED = "active_allocated"
_PENDING_FREE = ("active_pending_free", "active_awaiting_free")
_INACTIVE = "inactive"
_BLOCK_STATES = (_ALLOCATED, *_PENDING_FREE, _INACTIVE)
# Trace actions the oom schema knows; PyTorch's others (snapshot, segment_map, ...) are left out.
_EVENT_ACTIONS = frozenset({"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom"})


# --- the dump, from a snapshot ------------------------------------------------------------------

def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _count(value, where: str) -> int:
    if not _is_int(value) or value < 0:
        raise ValueError(f"{where} must be a non-negative int, got {type(value).__name__} {value!r:.80}")
    return value


def _member(obj, key: str, where: str):
    """obj[key] for a mapping, obj.key otherwise (MemoryReport objects, or stand-ins in tests)."""
    if isinstance(obj, Mapping):
        if key not in obj:
            raise ValueError(f"{where} has no '{key}'")
        return obj[key]
    try:
        return getattr(obj, key)
    except AttributeError:
        raise ValueError(f"{where} ({type(obj).__name__}) has no '{key}'") from None


def _field(obj: Mapping, key: str, where: str, default=None, required=True):
    if key in obj:
        return obj[key]
    if required:
        raise ValueError(f"{where} has no '{key}'; a torch.cuda.memory._snapshot() segment and block have it")
    return default


def _list(value, where: str) -> list:
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{where} must be a list, got {type(value).__name__}")
    return list(value)


def _segments_of(snapshot, device: int) -> list:
    """[(segment, [(address, size, requested, state)])] of `device`, checked."""
    if not isinstance(snapshot, Mapping):
        raise ValueError(f"snapshot must be a dict as torch.cuda.memory._snapshot() returns, "
                         f"got {type(snapshot).__name__}")
    if "segments" not in snapshot:
        raise ValueError("snapshot has no 'segments'; pass what torch.cuda.memory._snapshot() returns")
    out = []
    for i, segment in enumerate(_list(snapshot["segments"], "snapshot['segments']")):
        where = f"snapshot['segments'][{i}]"
        if not isinstance(segment, Mapping):
            raise ValueError(f"{where} must be a dict, got {type(segment).__name__}")
        seg_device = _count(_field(segment, "device", where), f"{where}['device']")
        address = _count(_field(segment, "address", where), f"{where}['address']")
        total = _count(_field(segment, "total_size", where), f"{where}['total_size']")
        blocks = _list(_field(segment, "blocks", where), f"{where}['blocks']")
        if seg_device != device:
            continue
        parsed, at = [], address
        for j, block in enumerate(blocks):
            here = f"{where}['blocks'][{j}]"
            if not isinstance(block, Mapping):
                raise ValueError(f"{here} must be a dict, got {type(block).__name__}")
            size = _count(_field(block, "size", here), f"{here}['size']")
            # Blocks tile their segment in order; older snapshots leave the address out.
            block_address = _count(_field(block, "address", here, at, required=False), f"{here}['address']")
            requested = _count(_field(block, "requested_size", here, size, required=False),
                               f"{here}['requested_size']")
            state = _field(block, "state", here)
            if state not in _BLOCK_STATES:
                raise ValueError(f"{here}['state'] is {state!r:.80}; expected one of {', '.join(_BLOCK_STATES)}")
            parsed.append((block_address, size, requested, state))
            at = block_address + size
        used = sum(size for _, size, _, _ in parsed)
        if used > total:
            raise ValueError(f"{where}: its blocks add up to {used} bytes, more than its total_size {total}")
        out.append((total, parsed))
    return out


def _device_trace(snapshot: Mapping, device: int) -> list:
    traces = snapshot.get("device_traces", [])
    if traces is None:
        return []
    traces = _list(traces, "snapshot['device_traces']")
    if device >= len(traces):
        return []
    where = f"snapshot['device_traces'][{device}]"
    entries = _list(traces[device], where)
    for i, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            raise ValueError(f"{where}[{i}] must be a dict, got {type(entry).__name__}")
    return entries


def _last_events(trace: list, device: int) -> list:
    events = []
    for i, entry in enumerate(trace):
        action = entry.get("action")
        if action not in _EVENT_ACTIONS:
            continue
        where = f"snapshot['device_traces'][{device}][{i}]"
        time_us = entry.get("time_us", 0)
        if not _is_int(time_us):
            raise ValueError(f"{where}['time_us'] must be an int, got {type(time_us).__name__}")
        events.append({
            "action": action,
            "time_us": time_us,
            "address": 0 if action == "oom" else _count(entry.get("addr", 0), f"{where}['addr']"),
            "size": _count(entry.get("size", 0), f"{where}['size']"),
            "stream": _count(entry.get("stream", 0), f"{where}['stream']"),
            # The region an event's block had when it happened is not recorded; the runtime's
            # current residency would name the block's present owner, not the event's.
            "region": "",
        })
    return events[-LAST_EVENTS:]


def _resident_storages(resident, device: int) -> list:
    """[(address, bytes, holder name, saved)] of distinct storages on cuda:`device`, in report order."""
    if resident is None:
        return []
    wanted = f"cuda:{device}"
    seen, out = set(), []
    for i, report in enumerate(resident):
        where = f"resident[{i}]"
        checkpoint = _member(report, "checkpoint", where)
        if not isinstance(checkpoint, str):
            raise ValueError(f"{where}.checkpoint must be a str, got {type(checkpoint).__name__}")
        for j, region in enumerate(_member(report, "regions", where)):
            here = f"{where}.regions[{j}]"
            name = _member(region, "region", here)
            if not isinstance(name, str) or not name:
                raise ValueError(f"{here}.region must be a non-empty str, got {name!r:.80}")
            # Save regions are named checkpoint::region already; inputs are per checkpoint, and only
            # a save region's bytes go away by switching it to recompute.
            saved = name != INPUTS
            holder = name if saved else (f"{checkpoint}::{INPUTS}" if checkpoint else INPUTS)
            for k, tensor in enumerate(_member(region, "tensors", here)):
                at = f"{here}.tensors[{k}]"
                tensor_device = _member(tensor, "device", at)
                if not isinstance(tensor_device, str):
                    raise ValueError(f"{at}.device must be a str such as 'cuda:0', got {tensor_device!r:.80}")
                address = _count(_member(tensor, "address", at), f"{at}.address")
                nbytes = _count(_member(tensor, "bytes", at), f"{at}.bytes")
                if tensor_device != wanted or (address, nbytes) in seen:
                    continue
                seen.add((address, nbytes))
                out.append((address, nbytes, holder, saved))
    return out


def _holders(named: dict) -> list:
    rows = [{"name": name, "bytes": h[0], "blocks": h[1], "saved_bytes": h[2]} for name, h in named.items()]
    rows.sort(key=lambda row: (-row["bytes"], row["name"]))
    return rows[:TOP_HOLDERS]


def oom_dump_from_snapshot(snapshot, *, device: int, segment_bytes: int, device_limit: int, device_free: int,
                           device_total: Optional[int] = None, requested_bytes: Optional[int] = None,
                           rounded_bytes: Optional[int] = None, num_ooms: Optional[int] = None, config: str = "",
                           resident=None, header: Optional[dict] = None) -> dict:
    """The `oom` dump (schemas/oom.schema.json) for a failed request on `device`, from a
    torch.cuda.memory._snapshot() dict. Pure: works anywhere, touches no GPU.

    segment_bytes, device_limit and device_free are what PyTorch's OOM observer receives as its
    2nd, 3rd and 4th arguments: the allocation it tried to make (the rounded request grown to a
    segment), the device's total memory or, under set_per_process_memory_fraction, the cap, and
    what CUDA reported free. device_total: the device's memory, which tells a cap apart (default:
    device_limit, no cap). requested_bytes, rounded_bytes: the request (default: the size of the
    newest 'oom' trace event when memory history is recorded, else segment_bytes; PyTorch does not
    hand observers the size the caller asked for). num_ooms: default, the 'oom' trace events, at
    least 1. config: the allocator settings in force, "key:value,..." (PYTORCH_CUDA_ALLOC_CONF).
    resident: what checkpoints keep (a list of remat MemoryReport, or objects or dicts with the
    same fields); live blocks holding their storages are billed to the region, the rest to
    <untagged>. None: everything is <untagged>. header: the common dump header fields (default:
    this process's).

    Raises ValueError naming the first malformed part of the snapshot or of `resident`.
    """
    device = _count(device, "device")
    segment_bytes = _count(segment_bytes, "segment_bytes")
    device_limit = _count(device_limit, "device_limit")
    device_free = _count(device_free, "device_free")
    device_total = device_limit if device_total is None else _count(device_total, "device_total")
    if not isinstance(config, str):
        raise ValueError(f"config must be a str, got {type(config).__name__}")

    segments = _segments_of(snapshot, device)
    trace = _device_trace(snapshot, device)
    storages = _resident_storages(resident, device)

    reserved = allocated = requested_live = active = 0
    largest_free = releasable = fragmented = split_free_blocks = 0
    live = []  # (address, size) of allocated blocks
    for total, blocks in segments:
        reserved += total
        for address, size, requested, state in blocks:
            if state == _ALLOCATED:
                allocated += size
                requested_live += requested
                active += size
                live.append((address, size))
            elif state in _PENDING_FREE:
                active += size
            else:
                largest_free = max(largest_free, size)
                if size == total:  # a whole free segment: what empty_cache() gives back
                    releasable += size
                else:
                    fragmented += size
                    split_free_blocks += 1

    # Bill each live block to the first storage inside it; a block is billed once.
    live.sort()
    starts = [address for address, _ in live]
    billed = {}  # block index -> (holder, saved)
    for address, _, holder, saved in storages:
        i = bisect.bisect_right(starts, address) - 1
        if i >= 0 and address < live[i][0] + live[i][1] and i not in billed:
            billed[i] = (holder, saved)
    regions = {}
    for i, (holder, saved) in billed.items():
        row = regions.setdefault(holder, [0, 0, 0])
        row[0] += live[i][1]
        row[1] += 1
        row[2] += live[i][1] if saved else 0
    untagged_blocks = len(live) - len(billed)
    if untagged_blocks:
        regions.setdefault(UNTAGGED, [0, 0, 0])
        regions[UNTAGGED][0] += allocated - sum(live[i][1] for i in billed)
        regions[UNTAGGED][1] += untagged_blocks

    ooms = [entry for entry in trace if entry.get("action") == "oom"]
    if rounded_bytes is None:
        rounded_bytes = _count(ooms[-1].get("size", segment_bytes), "the 'oom' trace event's size") if ooms \
            else segment_bytes
    rounded_bytes = _count(rounded_bytes, "rounded_bytes")
    requested_bytes = rounded_bytes if requested_bytes is None else _count(requested_bytes, "requested_bytes")
    num_ooms = max(1, len(ooms)) if num_ooms is None else _count(num_ooms, "num_ooms")
    if num_ooms < 1:
        raise ValueError("num_ooms must be at least 1: this OOM counts")

    capped = 0 < device_limit < device_total
    fraction = device_limit / device_total if capped else 1.0
    if segment_bytes > device_total:
        cause = "request_exceeds_device"
    elif capped and reserved + segment_bytes > device_limit:
        cause = "memory_fraction_cap"
    else:
        cause = "device_full"

    memory = {
        "device_free_bytes": device_free,
        "device_total_bytes": device_total,
        "reserved_bytes": reserved,
        "allocated_bytes": allocated,
        "requested_bytes": requested_live,
        "active_bytes": active,
        "segments": len(segments),
        "memory_fraction": fraction,
    }
    if capped:
        memory["reserved_limit_bytes"] = device_limit
    dump = dict(_dump_header(device) if header is None else header)
    dump.update({
        "backend": "cuda",
        "cause": cause,
        "request": {"requested_bytes": requested_bytes, "rounded_bytes": rounded_bytes,
                    "segment_bytes": segment_bytes},
        "memory": memory,
        "fragmentation": {
            "largest_free_block": largest_free,
            "cached_free_bytes": reserved - active,
            "releasable_bytes": releasable,
            "fragmented_free_bytes": fragmented,
            "free_blocks_in_split_segments": split_free_blocks,
            "internal_bytes": max(0, allocated - requested_live),
        },
        "num_ooms": num_ooms,
        "config": config,
        # The native allocator keeps no receive slots, sites or phases, nor a tag stack.
        "holders": {"by_region": _holders(regions), "by_recv_slot": [], "by_site": [], "by_phase": []},
        "tag_stack": [],
        "last_events": _last_events(trace, device),
    })
    return dump


# --- the common dump header -----------------------------------------------------------------------

def _dump_header(device: int) -> dict:
    """The header every dump has, from the allocator's one writer of it, with the producer saying
    where the figures came from (a reader tells this report from the tagging allocator's)."""
    from . import _C

    header = json.loads(_C.dump_header("oom", OOM_SCHEMA_VERSION, device))
    header["producer"] += " (PyTorch's native allocator)"
    return header


def _write_dump(path: str, text: str) -> None:
    """Through the project's atomic write (temporary file, fsync, rename)."""
    from . import _C

    _C.write_dump(os.fsencode(path), text)


# --- the observer ---------------------------------------------------------------------------------

def _format_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n} B"  # not reached


def _live_resident() -> list:
    """What the checkpoint runtime keeps now: every checkpoint whose forward finished and whose
    frame is alive, and the one whose forward is running on this thread."""
    from . import _C

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


_sequence_lock = threading.Lock()
_sequence = itertools.count(1)  # process-wide, so observers sharing a directory never collide


def _dump_path(dump_dir: str, device: int, header: dict) -> str:
    host = re.sub(r"[^A-Za-z0-9._-]", "_", header["host"])[:64] or "host"
    stem = f"oom-{host}-r{header['rank']}-p{header['pid']}-d{device}"
    with _sequence_lock:
        while True:
            path = os.path.join(dump_dir, f"{stem}-{next(_sequence)}.json")
            if not os.path.lexists(path):  # a restarted job's process may reuse a pid
                return path


def _dump_dir_arg(dump_dir) -> str:
    from remat_alloc._arguments import path_arg

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
        path = _dump_path(self.dump_dir, device, header)
        _write_dump(path, json.dumps(dump, separators=(",", ":"), allow_nan=False) + "\n")
        with self._lock:
            self.dumps.append(path)
        memory = dump["memory"]
        top = ", ".join(f"{h['name']} {_format_bytes(h['bytes'])}" for h in dump["holders"]["by_region"][:3])
        _stderr_line(f"remat: out of memory on device {device} (PyTorch's native allocator): tried to allocate "
                     f"{_format_bytes(dump['request']['rounded_bytes'])} (a {_format_bytes(alloc)} segment): "
                     f"{_format_bytes(memory['device_free_bytes'])} free of "
                     f"{_format_bytes(memory['device_total_bytes'])}, {_format_bytes(memory['allocated_bytes'])} "
                     f"allocated, {_format_bytes(memory['reserved_bytes'])} reserved; top holders: {top or 'none'}; "
                     f"report: {path}{note}")

    def detach(self) -> None:
        """Stops reporting. PyTorch cannot remove an observer, so on the native path it stays
        registered and does nothing; on the tagging allocator's path the allocator forgets it and
        its oom_dump_dir is cleared (REMAT_OOM_DUMP_DIR applies again)."""
        with self._lock:
            if not self._attached:
                return
            self._attached = False
        if self.allocator == "remat":
            import remat_alloc

            lib = remat_alloc.load()
            lib.remat_unregister_oom_observer(self._remat_id)
            with _callbacks_lock:
                _callbacks.pop(self._remat_id, None)
            remat_alloc.configure("oom_dump_dir:")


class _RematOomInfo(ctypes.Structure):
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


_REMAT_OBSERVER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_RematOomInfo), ctypes.c_void_p)
# The C functions the allocator may call, by observer id: kept here, not only on the OomObserver,
# because freeing one the allocator still holds would crash the next OOM.
_callbacks_lock = threading.Lock()
_callbacks: dict = {}


def _tagging_allocator_installed() -> bool:
    """Whether remat's tagging allocator is PyTorch's CUDA allocator (remat_alloc.install())."""
    remat_alloc = sys.modules.get("remat_alloc")
    if remat_alloc is None or getattr(remat_alloc, "_lib", None) is None:
        return False  # install() loads the library
    return _pluggable_allocator_installed()


def _pluggable_allocator_installed() -> bool:
    import torch

    pluggable = getattr(torch._C, "_CUDAPluggableAllocator", None)
    get = getattr(torch._C, "_cuda_getAllocator", None)
    if pluggable is None or get is None:
        return False
    try:
        return isinstance(get(), pluggable)
    except Exception:  # noqa: BLE001  (no CUDA allocator to ask about)
        return False


def _attach_to_tagging_allocator(observer: OomObserver) -> None:
    import remat_alloc

    directory = observer.dump_dir
    if "," in directory or directory != directory.strip():
        raise ValueError(f"attach_oom_observer: dump_dir {directory!r:.200} holds a comma or starts or ends with "
                         "white space, which the tagging allocator's key:value settings cannot carry; pass a "
                         "directory without them")
    remat_alloc.configure(f"oom_dump_dir:{directory}")
    lib = remat_alloc.load()
    lib.remat_register_oom_observer.restype = ctypes.c_int
    lib.remat_register_oom_observer.argtypes = [_REMAT_OBSERVER, ctypes.c_void_p]
    lib.remat_unregister_oom_observer.restype = ctypes.c_int
    lib.remat_unregister_oom_observer.argtypes = [ctypes.c_int]

    def on_oom(info, _user_data) -> None:
        try:
            if not observer._attached or not info:
                return
            event = info.contents
            path = os.fsdecode(event.dump_path or b"")
            if path and (observer.device is None or event.device == observer.device):
                with observer._lock:
                    observer.dumps.append(path)
        except Exception as error:  # noqa: BLE001  (a ctypes callback must not raise)
            _stderr_line(f"remat: OOM observer failed: {type(error).__name__}: {error}")

    callback = _REMAT_OBSERVER(on_oom)
    observer_id = lib.remat_register_oom_observer(callback, None)
    if observer_id <= 0:
        raise remat_alloc.RematError(lib.remat_last_error().decode(errors="replace"))
    with _callbacks_lock:
        _callbacks[observer_id] = callback
    observer.allocator = "remat"
    observer._remat_id = observer_id


def attach_oom_observer(dump_dir, *, device=None, allocator: str = "auto") -> OomObserver:
    """Writes an `oom` report (schemas/oom.schema.json; `remat-report oom FILE` renders it) into
    dump_dir whenever a CUDA allocation fails, one file per OOM
    (oom-<host>-r<rank>-p<pid>-d<device>-<n>.json), before PyTorch raises torch.OutOfMemoryError.

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
    if allocator == "remat" or (allocator == "auto" and _tagging_allocator_installed()):
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
    if _pluggable_allocator_installed():
        ours = _tagging_allocator_installed()
        raise RuntimeError(
            "attach_oom_observer: PyTorch's CUDA allocator is a pluggable allocator, which has no OOM observers"
            + ("; it is remat's tagging allocator: pass allocator='auto' or 'remat' to use its own report"
               if ours else "; install remat's tagging allocator (remat_alloc.install()) or keep PyTorch's native "
               "one to get OOM reports"))
    observer.device = _device_arg(device)
    torch._C._cuda_attach_out_of_memory_observer(observer)
    return observer
