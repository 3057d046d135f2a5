#!/usr/bin/env python3
"""remat.CpuOffload on the CPU, beside torch.autograd.graph.save_on_cpu in the same run:

1. per tensor: pack then unpack of one tensor (64 KiB and 4 MiB) through CpuOffload's pair,
   through a pair that copies the tensor out and back with PyTorch's allocator (what save_on_cpu
   does with a CUDA tensor), and through save_on_cpu's own pair (on a CPU tensor it copies
   nothing: tensor.cpu() is the tensor), median of rounds that alternate them;
2. a training step of 8 checkpointed MLP layers with everything they keep offloaded (CpuOffload
   with the pair of each checkpoint; save_on_cpu around the same layers uncheckpointed, which is
   what it offers, and which on the CPU copies nothing), CPU time against the same step without
   offload;
3. 1,000 steps: the host bytes resident after each step, and the allocator's reserved bytes after
   step 10 and after step 1,000 (the pool reuses its buffers: no growth).

    PYTHONPATH=build/python:allocator/python REMAT_ALLOC_LIBRARY=build/allocator/libremat_alloc.so \\
        python3 bench/python/offload_bench.py [--rounds 7] [--steps 1000]
"""

import argparse
import statistics
import time

import torch

import remat
import remat_alloc


def per_tensor_seconds(pack, unpack, tensor, repeats):
    start = time.perf_counter()
    for _ in range(repeats):
        unpack(pack(tensor))
    return (time.perf_counter() - start) / repeats


def per_tensor(rounds):
    print("per tensor, pack then unpack (median of rounds):")
    print(f"  {'size':>8} {'CpuOffload us':>14} {'copy pair us':>13} {'ratio':>6} {'save_on_cpu us':>15}")
    off = remat.CpuOffload(prefetch=0, min_bytes=0)
    native = torch.autograd.graph.save_on_cpu()
    pairs = {"CpuOffload": (off.pack, off.unpack), "copy": (torch.clone, torch.clone),
             "save_on_cpu": (native.pack_hook, native.unpack_hook)}
    for size in (64 << 10, 4 << 20):
        tensor = torch.randn(size // 4)
        repeats = max(20, (64 << 20) // size)
        seconds = {name: [] for name in pairs}
        for _ in range(rounds):
            for name, (pack, unpack) in pairs.items():
                seconds[name].append(per_tensor_seconds(pack, unpack, tensor, repeats))
        ours, copy, native_s = (statistics.median(seconds[n]) * 1e6 for n in pairs)
        print(f"  {size >> 10:>6}KiB {ours:>14.1f} {copy:>13.1f} {ours / copy:>5.2f}x {native_s:>15.1f}")


def make_layers(width, layers):
    torch.manual_seed(0)
    return [(torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width)) for _ in range(layers)]


def step(layers, x, mode, off):
    for up, down in layers:
        for p in (*up.parameters(), *down.parameters()):
            p.grad = None

    def body(h, up, down):
        return h + down(torch.nn.functional.gelu(remat.region(up, "up", recompute=False)(h)))

    start = time.thread_time()
    h = x
    if mode == "save_on_cpu":
        with torch.autograd.graph.save_on_cpu():
            for up, down in layers:
                h = body(h, up, down)
    else:
        hooks = (off.pack, off.unpack) if mode == "CpuOffload" else None
        for i, (up, down) in enumerate(layers):
            h = remat.checkpoint(region_name=f"layers.{i}", saved_tensors_hooks=hooks)(body)(h, up, down)
    h.square().sum().backward()
    return time.thread_time() - start


def training_step(rounds, width, batch):
    layers = make_layers(width, 8)
    x = torch.randn(batch, width, requires_grad=True)
    off = remat.CpuOffload(prefetch=1)
    modes = ["checkpoint, nothing offloaded", "CpuOffload", "save_on_cpu"]
    times = {mode: [] for mode in modes}
    for r in range(rounds):
        for mode in modes[r % len(modes):] + modes[:r % len(modes)]:
            times[mode].append(step(layers, x, mode, off))
    base = statistics.median(times[modes[0]])
    print(f"training step, 8 checkpointed layers of width {width}, batch {batch} (CPU time, median of {rounds}):")
    for mode in modes:
        t = statistics.median(times[mode])
        print(f"  {mode:<32} {t * 1e3:8.2f} ms  {t / base:5.2f}x")
    stats = off.stats()
    print(f"  CpuOffload step: {stats['offloaded_tensors']} tensors, {stats['offloaded_bytes'] >> 20} MiB offloaded, "
          f"{stats['kept_resident_tensors']} kept ({stats['kept_resident_reasons']}), "
          f"prefetch hits {stats['prefetch_hits']}, misses {stats['prefetch_misses']}")


def many_steps(steps, width, batch):
    layers = make_layers(width, 8)
    x = torch.randn(batch, width, requires_grad=True)
    off = remat.CpuOffload(prefetch=1, min_bytes=0)
    worst = 0
    reserved_at = {}
    for i in range(1, steps + 1):
        step(layers, x, "CpuOffload", off)
        worst = max(worst, off.stats()["resident_host_bytes"])
        if i in (10, steps):
            reserved_at[i] = remat_alloc.memory_stats(0)["reserved_bytes"]
    print(f"{steps} steps: host bytes resident after a step at most {worst}; peak during a step "
          f"{off.stats()['peak_host_bytes'] >> 10} KiB; allocator reserved after step 10 "
          f"{reserved_at[10] >> 20} MiB, after step {steps} {reserved_at[steps] >> 20} MiB")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=1000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    per_tensor(args.rounds)
    training_step(args.rounds, width=256, batch=512)
    many_steps(args.steps, width=64, batch=64)


if __name__ == "__main__":
    main()
