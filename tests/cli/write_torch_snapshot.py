#!/usr/bin/env python3
"""Writes a small memory snapshot pickle in the layout of torch.cuda.memory._dump_snapshot
(without needing torch): two devices' worth of segments with blocks and frames, and a
device trace, pickled with the default protocol as PyTorch does.

usage: write_torch_snapshot.py OUT.pickle
"""
import pickle
import sys

MiB = 1 << 20


def frames(*sites):
    stack = [{"filename": "/usr/lib/python3/site-packages/torch/nn/modules/linear.py", "line": 125, "name": "forward"}]
    stack += [{"filename": f, "line": l, "name": n} for f, l, n in sites]
    stack.append({"filename": "??", "line": 0, "name": "c10::cuda::CUDACachingAllocator::malloc"})
    return stack


def snapshot():
    train = ("train.py", 42, "step")
    model = ("model.py", 17, "attention")
    base = 0x7F0000000000
    segments = [
        {"device": 0, "address": base, "total_size": 20 * MiB, "allocated_size": 12 * MiB, "active_size": 12 * MiB,
         "requested_size": 12 * MiB - 512, "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
         "is_expandable": False, "frames": frames(train),
         "blocks": [
             {"address": base, "size": 8 * MiB, "requested_size": 8 * MiB, "state": "active_allocated",
              "frames": frames(train)},
             {"address": base + 8 * MiB, "size": 4 * MiB, "requested_size": 4 * MiB - 512,
              "state": "active_allocated", "frames": frames(model, train)},
             {"address": base + 12 * MiB, "size": 8 * MiB, "requested_size": 0, "state": "inactive", "frames": []},
         ]},
        {"device": 0, "address": base + 64 * MiB, "total_size": 2 * MiB, "allocated_size": 512, "active_size": 1024,
         "requested_size": 1000, "stream": 7, "segment_type": "small", "segment_pool_id": (0, 0),
         "is_expandable": False, "frames": [],
         "blocks": [
             {"address": base + 64 * MiB, "size": 512, "requested_size": 500, "state": "active_allocated",
              "frames": frames(model, train)},
             {"address": base + 64 * MiB + 512, "size": 512, "requested_size": 500,
              "state": "active_pending_free", "frames": frames(model, train)},
             {"address": base + 64 * MiB + 1024, "size": 2 * MiB - 1024, "requested_size": 0, "state": "inactive",
              "frames": []},
         ]},
        {"device": 1, "address": base + 128 * MiB, "total_size": 2 * MiB, "allocated_size": 0, "active_size": 0,
         "requested_size": 0, "stream": 0, "segment_type": "small", "segment_pool_id": (0, 0),
         "is_expandable": False, "frames": [],
         "blocks": [{"address": base + 128 * MiB, "size": 2 * MiB, "requested_size": 0, "state": "inactive",
                     "frames": []}]},
    ]
    t = 1_000_000
    trace = [
        {"action": "segment_alloc", "addr": base, "size": 20 * MiB, "stream": 0, "time_us": t, "frames": frames(train)},
        {"action": "alloc", "addr": base, "size": 8 * MiB, "stream": 0, "time_us": t + 1, "frames": frames(train)},
        {"action": "alloc", "addr": base + 8 * MiB, "size": 4 * MiB, "stream": 0, "time_us": t + 5,
         "frames": frames(model, train)},
        {"action": "alloc", "addr": base + 12 * MiB, "size": 8 * MiB, "stream": 0, "time_us": t + 9,
         "frames": frames(model, train)},
        {"action": "free_requested", "addr": base + 12 * MiB, "size": 8 * MiB, "stream": 0, "time_us": t + 12,
         "frames": frames(model, train)},
        {"action": "free_completed", "addr": base + 12 * MiB, "size": 8 * MiB, "stream": 0, "time_us": t + 13,
         "frames": frames(model, train)},
        {"action": "snapshot", "addr": 0, "size": 0, "stream": 0, "time_us": t + 20, "frames": []},
    ]
    return {"segments": segments, "device_traces": [trace, []],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": None, "max_split_size": -1}}


if __name__ == "__main__":
    with open(sys.argv[1], "wb") as f:
        pickle.dump(snapshot(), f)
