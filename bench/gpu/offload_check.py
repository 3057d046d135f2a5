#!/usr/bin/env python3
"""remat.CpuOffload on a GPU, the checks CPU CI cannot make: gradients bitwise those without
offload (the same CUDA kernels run), the copies on their own stream and the device memory they
free (peak allocated below the same checkpoints keeping their tensors on the device), prefetch
(one miss a step), max_inflight_bytes bounding what waits on copies, and nothing left on the host
or in flight after backward. Prints one line a check and exits 1 when any fails.

    PYTHONPATH=build/python:allocator/python REMAT_ALLOC_LIBRARY=build/allocator/libremat_alloc.so \\
        python3 bench/gpu/offload_check.py [--allocator native|remat]
"""

import argparse
import sys

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--allocator", choices=("native", "remat"), default="native")
args = parser.parse_args()
if args.allocator == "remat":
    import remat_alloc

    remat_alloc.install()
import remat  # noqa: E402

failures = []


def check(ok, what):
    print(f"[{'ok' if ok else 'FAILED'}] {what}")
    if not ok:
        failures.append(what)


def model(width=1024, layers=8):
    torch.manual_seed(0)
    return [(torch.nn.Linear(width, 4 * width).cuda(), torch.nn.Linear(4 * width, width).cuda()) for _ in range(layers)]


def step(layers, x, off=None):
    for up, down in layers:
        for p in (*up.parameters(), *down.parameters()):
            p.grad = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()

    def body(h, up, down):
        return h + down(torch.nn.functional.gelu(remat.region(up, "up", recompute=False)(h)))

    h = x
    hooks = None if off is None else (off.pack, off.unpack)
    for i, (up, down) in enumerate(layers):
        h = remat.checkpoint(region_name=f"layers.{i}", saved_tensors_hooks=hooks)(body)(h, up, down)
    h.float().square().sum().backward()
    torch.cuda.synchronize()
    grads = [p.grad.clone() for up, down in layers for p in (*up.parameters(), *down.parameters())]
    return torch.cuda.max_memory_allocated() - base, grads


layers = model()
x = torch.randn(8192, 1024, device="cuda", requires_grad=True)
kept_peak, expected = step(layers, x)
for prefetch in (1, 2):
    off = remat.CpuOffload(prefetch=prefetch)
    for _ in range(3):  # the pool and the streams warm up
        peak, grads = step(layers, x, off)
    stats = off.stats()
    check(all(torch.equal(a, b) for a, b in zip(expected, grads)), f"prefetch {prefetch}: gradients bitwise")
    check(stats["offloaded_tensors"] > 0 and stats["resident_host_bytes"] == 0 and stats["inflight_bytes"] == 0,
          f"prefetch {prefetch}: {stats['offloaded_tensors']} tensors offloaded, none left after backward")
    check(stats["prefetch_misses"] == 1, f"prefetch {prefetch}: misses {stats['prefetch_misses']} (expected 1), "
                                         f"hits {stats['prefetch_hits']}")
    check(peak < kept_peak, f"prefetch {prefetch}: peak allocated {peak >> 20} MiB below {kept_peak >> 20} MiB kept "
                            f"on the device")
bounded = remat.CpuOffload(max_inflight_bytes=1)
step(layers, x, bounded)
check(bounded.stats()["wait_bytes"] > 0, f"max_inflight_bytes=1: packs waited for {bounded.stats()['wait_bytes']} bytes")
print("all checks passed" if not failures else f"{len(failures)} check(s) failed")
sys.exit(1 if failures else 0)
