"""An `oom` dump from PyTorch's memory snapshot, where its native CUDA allocator failed.

PyTorch's caching allocator tags nothing, but it can describe every segment and block it holds
(torch.cuda.memory._snapshot()). oom_dump_from_snapshot() turns that description, and the
storages the checkpoint runtime reports live, into this project's `oom` dump
(schemas/oom.schema.json: the same fields and meanings as the tagging allocator's own report, so
`remat-report oom` renders both): memory and fragmentation on the failing device, the request,
live blocks billed to the checkpoint regions that keep them (matched by address; every storage
counted once) and the rest to `<untagged>`, and the newest trace events. A pure function of its
arguments, tested without a GPU; the observer that calls it at an OOM is in _oom.
"""

from __future__ import annotations

import bisect
import json
import os
from collections.abc import Mapping
from typing import Optional

from ._extension import _C

__all__ = ["oom_dump_from_snapshot"]

OOM_SCHEMA_VERSION = 1
TOP_HOLDERS = 10  # as the tagging allocator: the largest holders of each kind
LAST_EVENTS = 64  # as the tagging allocator: the newest trace events
UNTAGGED = "<untagged>"
INPUTS = "<inputs>"  # MemoryReport's region for a checkpoint's inputs

# The dumps' names are the allocator's (_C.dump_names()), as remat-report reads them; PyTorch's
# snapshot spells a few its own way (segment_map for segment_alloc, active_awaiting_free for
# active_pending_free, ...), mapped onto ours as `remat-report import` maps them. Its other
# actions (snapshot markers) have no counterpart and are left out.
_NAMES = _C.dump_names()
_ALLOCATED, _PENDING_FREE = _NAMES["block_state"][:2]  # and inactive, the rest
_EVENT_ACTIONS = frozenset(_NAMES["trace_action"])


def _our_state(state):
    return _NAMES["torch_block_state"].get(state, state) if isinstance(state, str) else state


def _our_action(action):
    return _NAMES["torch_trace_action"].get(action, action) if isinstance(action, str) else action


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# The largest number a dump holds: remat-report reads every figure as a 64-bit signed integer.
_MAX_FIGURE = (1 << 63) - 1
_MAX_DEVICE = (1 << 31) - 1  # a CUDA device index is a C int
_SMALL_REQUEST_LIMIT = 1 << 20  # PyTorch's small pool takes requests of at most this
_SMALL_SEGMENT = 2 << 20  # in segments of this size


def _magnitude(value: int) -> str:
    """A huge int in a message: 1.845e+19, or 10**400 where a float cannot hold it."""
    if abs(value) < 10**300:
        return f"{value:.3e}"
    return f"{'-' if value < 0 else ''}about 10**{len(str(abs(value))) - 1}"


def _count(value, where: str) -> int:
    if not _is_int(value) or value < 0:
        shown = f"{value!r:.80}" if not _is_int(value) else _magnitude(value)
        raise ValueError(f"{where} must be a non-negative int, got {type(value).__name__} {shown}")
    if value > _MAX_FIGURE:
        raise ValueError(f"{where} is {_magnitude(value)}, more than any allocator holds (at most 2**63 - 1); the "
                         "snapshot is not a real allocator's")
    return value


def _figures_fit(dump: dict) -> None:
    """Every int in the dump fits what remat-report reads (sums of many large figures may not).
    Walks without recursion, so a deeply nested header is checked, not a RecursionError."""
    pending = [(dump, "dump")]
    while pending:
        value, where = pending.pop()
        if isinstance(value, dict):
            pending.extend((item, f"{where}.{key}") for key, item in value.items())
        elif isinstance(value, list):
            pending.extend((item, f"{where}[{i}]") for i, item in enumerate(value))
        elif _is_int(value) and not -_MAX_FIGURE - 1 <= value <= _MAX_FIGURE:
            raise ValueError(f"{where} would be {_magnitude(value)}, more than a 64-bit figure holds; the snapshot's "
                             "sizes add up to more than any allocator holds, so no report is written from it")


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


def _items(value, where: str) -> list:
    """Any iterable but a string or a mapping, as a list (the reports' region and tensor lists)."""
    if isinstance(value, (str, bytes, Mapping)):
        raise ValueError(f"{where} must be a list, got {type(value).__name__}")
    try:
        return list(value)
    except TypeError:
        raise ValueError(f"{where} must be a list, got {type(value).__name__}") from None


def _segments_of(snapshot, device: int) -> list:
    """[(segment's total size, [(address, size, requested, state)], its pool: "small", "large" or
    None where the snapshot does not say)] of `device`, checked."""
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
        pool = segment.get("segment_type")
        if pool is not None and pool not in ("small", "large"):
            raise ValueError(f"{where}['segment_type'] is {pool!r:.80}; expected 'small' or 'large'")
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
            state = _our_state(_field(block, "state", here))
            if state not in _NAMES["block_state"]:
                expected = ", ".join([*_NAMES["block_state"], *_NAMES["torch_block_state"]])
                raise ValueError(f"{here}['state'] is {state!r:.80}; expected one of {expected}")
            parsed.append((block_address, size, requested, state))
            at = block_address + size
        used = sum(size for _, size, _, _ in parsed)
        if used > total:
            raise ValueError(f"{where}: its blocks add up to {used} bytes, more than its total_size {total}")
        out.append((total, parsed, pool))
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
        action = _our_action(entry.get("action"))
        if not isinstance(action, str) or action not in _EVENT_ACTIONS:
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
    for i, report in enumerate(_items(resident, "resident")):
        where = f"resident[{i}]"
        checkpoint = _member(report, "checkpoint", where)
        if not isinstance(checkpoint, str):
            raise ValueError(f"{where}.checkpoint must be a str, got {type(checkpoint).__name__}")
        for j, region in enumerate(_items(_member(report, "regions", where), f"{where}.regions")):
            here = f"{where}.regions[{j}]"
            name = _member(region, "region", here)
            if not isinstance(name, str) or not name:
                raise ValueError(f"{here}.region must be a non-empty str, got {name!r:.80}")
            # Save regions are named checkpoint::region already; inputs are per checkpoint, and only
            # a save region's bytes go away by switching it to recompute.
            saved = name != INPUTS
            holder = name if saved else (_C.region_path(checkpoint, INPUTS) if checkpoint else INPUTS)
            for k, tensor in enumerate(_items(_member(region, "tensors", here), f"{here}.tensors")):
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
    if device > _MAX_DEVICE:
        raise ValueError(f"device={device} is not a CUDA device index (at most 2**31 - 1)")
    if header is not None and not isinstance(header, Mapping):
        raise ValueError(f"header must be a dict of the common dump header fields, got {type(header).__name__}")
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
    # Per pool, where every segment says its pool: free bytes, those in split segments, their blocks
    pools = {"small": [0, 0, 0], "large": [0, 0, 0]} if all(pool for _, _, pool in segments) else None
    for total, blocks, pool in segments:
        reserved += total
        pool_free = pools[pool] if pools is not None else [0, 0, 0]
        for address, size, requested, state in blocks:
            if state == _ALLOCATED:
                allocated += size
                requested_live += requested
                active += size
                live.append((address, size))
            elif state == _PENDING_FREE:
                active += size
            else:
                largest_free = max(largest_free, size)
                pool_free[0] += size
                if size == total:  # a whole free segment: what empty_cache() gives back
                    releasable += size
                else:
                    fragmented += size
                    split_free_blocks += 1
                    pool_free[1] += size
                    pool_free[2] += 1

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

    ooms = [entry for entry in trace if isinstance(entry.get("action"), str) and entry.get("action") == "oom"]
    request_known = rounded_bytes is not None or bool(ooms)
    if rounded_bytes is None:
        rounded_bytes = _count(ooms[-1].get("size", segment_bytes), "the 'oom' trace event's size") if ooms \
            else segment_bytes
    rounded_bytes = _count(rounded_bytes, "rounded_bytes")
    requested_bytes = rounded_bytes if requested_bytes is None else _count(requested_bytes, "requested_bytes")
    num_ooms = max(1, len(ooms)) if num_ooms is None else _count(num_ooms, "num_ooms")
    if num_ooms < 1:
        raise ValueError("num_ooms must be at least 1: this OOM counts")

    request_pool = None  # the free blocks of the pool the request goes to: only they could hold it
    if pools is not None:
        # As PyTorch's allocator; where the request is not known (its observer is handed the segment,
        # not the request), a segment of 2 MiB is the small pool's: larger requests get 20 MiB or more
        small = rounded_bytes <= _SMALL_REQUEST_LIMIT if request_known else segment_bytes == _SMALL_SEGMENT
        pool = "small" if small else "large"
        request_pool = dict(zip(("pool", "free_bytes", "fragmented_free_bytes", "free_blocks_in_split_segments"),
                                (pool, *pools[pool])))

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
            **({} if request_pool is None else {"request_pool": request_pool}),
        },
        "num_ooms": num_ooms,
        "config": config,
        # The native allocator keeps no receive slots, sites or phases, nor a tag stack.
        "holders": {"by_region": _holders(regions), "by_recv_slot": [], "by_site": [], "by_phase": []},
        "tag_stack": [],
        "last_events": _last_events(trace, device),
    })
    _figures_fit(dump)
    return dump


# --- the common dump header -----------------------------------------------------------------------

def _dump_header(device: int) -> dict:
    """The header every dump has, from the allocator's one writer of it, with the producer saying
    where the figures came from (a reader tells this report from the tagging allocator's)."""
    header = json.loads(_C.dump_header("oom", OOM_SCHEMA_VERSION, device))
    header["producer"] += " (PyTorch's native allocator)"
    return header


def _write_dump(path: str, text: str) -> None:
    """Through the project's atomic write (temporary file, fsync, rename)."""
    _C.write_dump(os.fsencode(path), text)
