#!/usr/bin/env python3
"""A training-like remat trace (JSON Lines) for benchmarking `remat-report whatif`.

Each step runs a forward pass over N layers whose activations depend on that step's sequence
length (drawn from a few buckets, as with packed or variable-length batches), each layer
allocating several activations of different sizes plus short-lived temporaries; then a
backward pass in reverse layer order frees the activations, allocates and frees gradient
temporaries, and hands gradient buckets to a communication stream (freed there later, as
free_requested then free_completed). Parameters and optimizer state are allocated once at
the start. Sizes are block sizes (multiples of 512 B), as this allocator's traces record.

usage: make_trace.py OUT.jsonl [--events N] [--seed S]
"""
import argparse
import json
import random

MiB = 1 << 20


def round512(n):
    return (n + 511) // 512 * 512


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--layers", type=int, default=24)
    args = parser.parse_args()
    rng = random.Random(args.seed)

    layers = args.layers
    names = [""] + [f"layers.{i}" for i in range(layers)] + ["parameters", "optimizer.state", "grad.buckets"]
    # tag 0 untagged; per layer a forward and a backward tag; then parameters, optimizer, buckets.
    tags = [{"region": 0, "policy": "none", "phase": "other", "site": 0, "recv": None}]
    for i in range(layers):
        tags.append({"region": 1 + i, "policy": "none", "phase": "forward", "site": 0, "recv": None})
        tags.append({"region": 1 + i, "policy": "none", "phase": "backward", "site": 0, "recv": None})
    param_tag = len(tags)
    tags.append({"region": layers + 1, "policy": "none", "phase": "other", "site": 0, "recv": None})
    optim_tag = len(tags)
    tags.append({"region": layers + 2, "policy": "none", "phase": "other", "site": 0, "recv": None})
    bucket_tag = len(tags)
    tags.append({"region": layers + 3, "policy": "none", "phase": "backward", "site": 0, "recv": None})

    header = {"kind": "trace", "schema_version": 1, "producer": "bench/whatif/make_trace.py",
              "created_at": "2026-01-01T00:00:00Z", "host": "bench", "pid": 1, "rank": 0, "device": 0,
              "names": names, "tags": tags, "event_count": None}

    out = open(args.out, "w", buffering=1 << 22)
    out.write(json.dumps(header, separators=(",", ":")) + "\n")
    state = {"events": 0, "time": 1_000_000, "next": 0x7F0000000000}
    lines = []

    def emit(action, address, size, stream, tag):
        state["time"] += 1
        lines.append('{"action":"%s","time_us":%d,"address":%d,"size":%d,"stream":%d,"tag":%d}\n'
                     % (action, state["time"], address, size, stream, tag))
        state["events"] += 1
        if len(lines) >= 65536:
            out.write("".join(lines))
            lines.clear()

    # Addresses only need to be unique while live: hand out fresh ones.
    def alloc(size, stream, tag):
        address = state["next"]
        state["next"] += size + 512
        emit("alloc", address, size, stream, tag)
        return address

    hidden = 4096
    for i in range(layers):
        for shape in (hidden * hidden * 2, hidden * hidden * 2 * 4 // 3, hidden * 2):
            alloc(round512(shape), 0, param_tag)
            alloc(round512(shape * 2), 0, optim_tag)

    seq_buckets = [512, 1024, 1536, 2048, 3072, 4096]
    micro = 2
    step = 0
    while state["events"] < args.events:
        seq = rng.choice(seq_buckets)
        tokens = seq * micro
        saved = []
        for i in range(layers):
            ftag = 1 + 2 * i
            for scale in (2, 2, 6, 8, 2):  # qkv, attention out, mlp up, activation, mlp down
                size = round512(tokens * hidden * scale // 4 + rng.randrange(0, 64) * 512)
                saved.append((alloc(size, 0, ftag), size, ftag))
            for _ in range(3):  # temporaries freed at once
                size = round512(tokens * rng.choice((64, 256, 1024, 4096)))
                a = alloc(size, 0, ftag)
                emit("free_completed", a, size, 0, ftag)
        pending = []  # gradient buckets on the communication stream
        for i in reversed(range(layers)):
            btag = 2 + 2 * i
            for _ in range(4):
                size = round512(tokens * hidden * rng.choice((1, 2, 4)) // 4)
                a = alloc(size, 0, btag)
                emit("free_completed", a, size, 0, btag)
            for _ in range(5):
                a, size, tag = saved.pop()
                emit("free_completed", a, size, 0, tag)
            if i % 4 == 0:
                size = round512(25 * MiB)
                a = alloc(size, 1, bucket_tag)
                emit("free_requested", a, size, 1, bucket_tag)
                pending.append((a, size))
            if len(pending) > 2:
                a, size = pending.pop(0)
                emit("free_completed", a, size, 1, bucket_tag)
        for a, size in pending:
            emit("free_completed", a, size, 1, bucket_tag)
        step += 1
    out.write("".join(lines))
    out.close()
    print(f"{args.out}: {state['events']} events, {step} steps")


if __name__ == "__main__":
    main()
