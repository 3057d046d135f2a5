"""Allocation sites of tensors from PyTorch's CUDA memory snapshot, torch_remat's annotator.

With memory history recording on, each live block of PyTorch's caching allocator carries its
address and the stack that allocated it. memory_snapshot_annotate() indexes one snapshot by
address and returns annotate(tensor) -> "file.py:42 fn" (the innermost frame outside torch and
remat) or None. The snapshot is fetched once and kept until clear_memory_snapshot_cache().
remat's own reports name the site from the tagging allocator's tags instead (remat.site).
"""

import bisect

import torch

__all__ = ["memory_snapshot_annotate", "clear_memory_snapshot_cache"]

_cached_snapshot = None


def clear_memory_snapshot_cache():
    """Drops the kept snapshot: the next memory_snapshot_annotate() fetches a new one."""
    global _cached_snapshot
    _cached_snapshot = None


def _snapshot():
    global _cached_snapshot
    if _cached_snapshot is None:
        _cached_snapshot = torch.cuda.memory._snapshot()
    return _cached_snapshot


def _site_of(frames):
    """'file.py:42 fn' of the innermost frame outside torch and remat, else of the innermost."""
    for frame in frames or ():
        filename = frame.get("filename", "")
        if "/torch/" not in filename and "/remat/" not in filename:
            return f"{filename.rsplit('/', 1)[-1]}:{frame.get('line')} {frame.get('name', '')}".rstrip()
    if frames:
        return f"{frames[0].get('filename', '?').rsplit('/', 1)[-1]}:{frames[0].get('line')}"
    return None


def memory_snapshot_annotate(snapshot=None):
    """annotate(tensor) -> the allocation site of the block holding the tensor's storage, or None.
    `snapshot` is a torch.cuda.memory._snapshot() dict (default: one fetched and kept)."""
    if snapshot is None:
        snapshot = _snapshot()
    blocks = []  # (address, size, site), by address
    for segment in snapshot.get("segments", ()):
        for block in segment.get("blocks", ()):
            if block.get("state") == "active_allocated":
                site = _site_of(block.get("frames"))
                if site is not None:
                    blocks.append((block["address"], block["size"], site))
    blocks.sort()
    addresses = [address for address, _, _ in blocks]

    def annotate(tensor):
        try:
            pointer = tensor.untyped_storage().data_ptr()
        except Exception:  # a placeholder or a tensor without storage has no site
            return None
        index = bisect.bisect_right(addresses, pointer) - 1
        if index >= 0:
            address, size, site = blocks[index]
            if address <= pointer < address + size:
                return site
        return None

    return annotate
