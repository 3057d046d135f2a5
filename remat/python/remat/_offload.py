"""Offload, the third choice beside save and recompute: remat.CpuOffload holds what checkpoints
keep in host memory and brings it back ahead of backward.

The offloader is a saved-tensor hook pair (torch_remat's contract, remat._saved_tensors_hooks)
whose engine is C++ (remat::CpuOffload): the runtime calls it without Python when the pair is
given as (off.pack, off.unpack) or entered with `with off:`. Pack copies a kept tensor into a
buffer of the allocator's pinned host pool, tagged with the region it was packed in and phase
`offloaded`; on CUDA the copy runs on a stream of its own, ordered after the compute stream by an
event, and the device tensor is let go once the copy is done (max_inflight_bytes bounds the
device memory waiting on copies). Backward reaches checkpoints last first, and a checkpoint's
tensors are unpacked together (its inputs and save-region outputs as recompute reaches them, in
forward order; the rest when their autograd nodes run): the first unpack of a checkpoint's
tensors starts bringing back that checkpoint's and the `prefetch` checkpoints' before it, on the
copy stream, and the compute stream waits on their events, not the host. Without CUDA the same
path runs on CPU tensors with synchronous copies into the host pool, so CPU tests cover the
bookkeeping: exact gradients, bytes, prefetch order, release.

A host buffer goes back to the pool when its payload is dropped: after backward frees the graph,
or when a forward that raised drops it. Tensors that would gain nothing stay as they are and
are counted by reason in stats(): parameters and views of them, sparse or overlapping tensors,
tensors under min_bytes, and tensors on another device than the one offloaded from.
"""

import threading

from ._extension import _C
from ._saved_tensors_hooks import _SavedTensorsHooks

__all__ = ["CpuOffload"]

_DEFAULT_MIN_BYTES = 1 << 16  # smaller copies cost more than the memory they free
_COUNT_LIMIT = (1 << 64) - 1  # the engine's counts are 64-bit


def _count(where, name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= _COUNT_LIMIT:
        raise ValueError(f"{where}: {name} must be an int from {minimum} to 2**64 - 1, got {value!r}")
    return value


class CpuOffload:
    """Holds what checkpoints keep in pinned host memory and brings it back ahead of backward.

        off = remat.CpuOffload(prefetch=1)
        y = remat.checkpoint(region_name="layers.0", saved_tensors_hooks=(off.pack, off.unpack))(block)(x)
        with off:                       # the short form: every checkpoint called inside
            loss = model(x).sum()
        loss.backward()
        off.stats()                     # offloaded_bytes, resident_host_bytes, prefetch_hits, ...

    prefetch: checkpoints whose tensors come back ahead of the one backward reaches (0: none).
    max_inflight_bytes: device bytes that may wait on copies to the host at once (None: no bound).
    min_bytes: smaller tensors stay where they are (default 64 KiB).
    """

    def __init__(self, prefetch=1, max_inflight_bytes=None, min_bytes=_DEFAULT_MIN_BYTES):
        _count("CpuOffload", "prefetch", prefetch, 0)
        if max_inflight_bytes is not None:
            _count("CpuOffload", "max_inflight_bytes", max_inflight_bytes, 1)
        _count("CpuOffload", "min_bytes", min_bytes, 0)
        self._engine = _C.CpuOffload(prefetch, max_inflight_bytes, min_bytes)
        self._runtime_pair = self._engine  # (off.pack, off.unpack) runs as this pair, without Python
        self._entered = threading.local()

    def pack(self, tensor):
        """The pack hook: the payload held in place of `tensor`."""
        return self._engine.pack(tensor)

    def unpack(self, payload):
        """The unpack hook: the tensor back from its payload."""
        return self._engine.unpack(payload)

    def stats(self):
        """A dict: offloaded_bytes and offloaded_tensors, shared_tensors (saves of a tensor already
        offloaded, held by its one copy), kept_resident_bytes, kept_resident_tensors
        and kept_resident_reasons (this step: since the first pack after every payload of the
        previous step was dropped); resident_host_bytes and inflight_bytes (now); peak_host_bytes
        (since it was made); prefetch_hits and prefetch_misses, wait_bytes and wait_seconds (this
        step: what unpack and pack waited for, copies done on the spot included)."""
        return self._engine.stats()

    def __enter__(self):
        stack = self._entered.__dict__.setdefault("blocks", [])
        block = _SavedTensorsHooks(self._engine)
        block.__enter__()
        stack.append(block)
        return self

    def __exit__(self, *exc_info):
        stack = getattr(self._entered, "blocks", None)
        if not stack:
            raise RuntimeError("CpuOffload: exited on a thread that did not enter it (or exited once more than "
                               "entered); exit the with block on the thread that entered it")
        return stack.pop().__exit__(*exc_info)

    def __repr__(self):
        return f"CpuOffload(resident_host_bytes={self._engine.stats()['resident_host_bytes']})"

