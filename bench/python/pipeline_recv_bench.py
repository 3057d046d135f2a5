#!/usr/bin/env python3
"""Receive-buffer memory and step time of PyTorch's pipeline schedules, stock against
remat.pipelining, on 4 ranks of this machine (Gloo on 127.0.0.1).

CPU tensors come from remat's caching allocator (remat.tag_cpu_tensors(), the ring buffers
tagged with their slot), as CUDA tensors do under remat_alloc.install(); with --system-malloc
from glibc, whose mmap and trim thresholds make any change in the order of frees cost 5-10%
of a step here, in either direction. Memory is read from the stages' own receive buffers after a step (remat.pipelining.
recv_buffer_memory): buffer sets and bytes per rank, summed over the ranks, for stock, ring,
shared ring, and the just-in-time peak. Step time: stock and ring schedules built side by
side, steps alternating (stock first in even rounds, ring first in odd ones), each step
between barriers on every rank, median over the rounds.

    PYTHONPATH=build/python:allocator/python REMAT_ALLOC_LIBRARY=build/allocator/libremat_alloc.so \\
        python3 bench/python/pipeline_recv_bench.py [--microbatches 16,32] [--rounds 9] [--json out.json]
"""

import argparse
import datetime
import json
import os
import socket
import statistics
import subprocess
import sys
import time

WORLD = 4
SCHEDULES = ["gpipe", "1f1b", "interleaved_1f1b", "looped_bfs", "interleaved_zero_bubble", "zbv", "dualpipev"]
MODES = ["ring", "shared_ring", "just_in_time"]


def launch(args):
    """Starts the 4 ranks, waits for them (bounded), and prints rank 0's tables."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    children = []
    try:
        for rank in range(WORLD):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                       OMP_NUM_THREADS="1")
            children.append(subprocess.Popen([sys.executable, __file__, "--worker", *sys.argv[1:]], env=env,
                                             stdout=None if rank == 0 else subprocess.DEVNULL))
        codes = [child.wait(timeout=args.timeout) for child in children]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
            child.wait()
    if any(codes):
        sys.exit(f"pipeline_recv_bench: ranks exited with {codes}")


def build(name, rank, microbatches, rows, hidden):
    import torch
    import torch.nn as nn
    from torch.distributed.pipelining import PipelineStage, schedules

    class Block(nn.Module):
        def __init__(self, seed):
            super().__init__()
            torch.manual_seed(seed)
            self.linear = nn.Linear(hidden, hidden)

        def forward(self, x):
            return x + torch.tanh(self.linear(x))

    if name in ("gpipe", "1f1b"):
        indices, num_stages = [rank], WORLD
    elif name in ("zbv", "dualpipev"):
        indices, num_stages = [rank, 2 * WORLD - 1 - rank], 2 * WORLD
    else:
        indices, num_stages = [rank, rank + WORLD], 2 * WORLD
    example = torch.zeros(rows, hidden)
    stages = []
    for index in indices:
        stage = PipelineStage(Block(index), index, num_stages, torch.device("cpu"), input_args=(example,),
                              output_args=(example,))
        exchange = stage._get_init_p2p_neighbors_ops
        # PyTorch's first step exchanges a dummy tensor with a neighbour on the same rank too
        # (V schedules), which Gloo cannot send to itself.
        stage._get_init_p2p_neighbors_ops = lambda exchange=exchange: [op for op in exchange()
                                                                       if op.group_peer != rank]
        stages.append(stage)
    loss_fn = lambda output, target: ((output - target) ** 2).mean()  # noqa: E731
    classes = {"gpipe": schedules.ScheduleGPipe, "1f1b": schedules.Schedule1F1B,
               "interleaved_1f1b": schedules.ScheduleInterleaved1F1B, "looped_bfs": schedules.ScheduleLoopedBFS,
               "interleaved_zero_bubble": schedules.ScheduleInterleavedZeroBubble,
               "zbv": schedules.ScheduleZBVZeroBubble, "dualpipev": schedules.ScheduleDualPipeV}
    single = name in ("gpipe", "1f1b")
    schedule = classes[name](stages[0] if single else stages, microbatches, loss_fn=loss_fn)
    return schedule, stages



def step(schedule, stages, microbatches, rows, hidden):
    import torch

    first = any(stage.is_first for stage in stages)
    last = any(stage.is_last for stage in stages)
    x = torch.randn(rows * microbatches, hidden)
    schedule.step(*((x,) if first else ()), target=torch.zeros_like(x) if last else None)


def totals(rows_per_rank):
    sets = sum(row["sets"] for rows in rows_per_rank for row in rows)
    peak = sum(row["peak_sets"] for rows in rows_per_rank for row in rows)
    nbytes = sum(row["bytes"] for rows in rows_per_rank for row in rows)
    peak_bytes = sum(row["peak_bytes"] for rows in rows_per_rank for row in rows)
    return {"sets": sets, "bytes": nbytes, "peak_sets": peak, "peak_bytes": peak_bytes}


def mib(n):
    return f"{n / 2**20:.1f} MiB"


def worker(args):
    import torch.distributed as dist

    import remat

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    if args.system_malloc:
        measure(args)
    else:
        with remat.tag_cpu_tensors():
            measure(args)
    dist.destroy_process_group()


def measure(args):
    import torch
    import torch.distributed as dist

    import remat.pipelining

    rank = dist.get_rank()
    report = {"memory": [], "time": []}
    for microbatches in args.microbatches:
        for name in args.schedules:
            row = {"schedule": name, "microbatches": microbatches}
            for mode in ["stock"] + MODES:
                schedule, stages = build(name, rank, microbatches, args.rows, args.hidden)
                if mode != "stock":
                    remat.pipelining.pool_recv_buffers(schedule, mode=mode)
                step(schedule, stages, microbatches, args.rows, args.hidden)
                gathered = [None] * WORLD
                dist.all_gather_object(gathered, remat.pipelining.recv_buffer_memory(schedule))
                row[mode] = totals(gathered)
            report["memory"].append(row)
    for name in args.schedules:
        microbatches = args.microbatches[0]
        pair = {}
        for mode in ("stock", "ring"):
            schedule, stages = build(name, rank, microbatches, args.rows, args.hidden)
            if mode == "ring":
                remat.pipelining.pool_recv_buffers(schedule)
            step(schedule, stages, microbatches, args.rows, args.hidden)  # warm-up: buffers made, first step's exchange
            pair[mode] = (schedule, stages)
        times = {"stock": [], "ring": []}
        cpu = {"stock": [], "ring": []}
        for round_index in range(args.rounds):
            order = ("stock", "ring") if round_index % 2 == 0 else ("ring", "stock")
            for mode in order:
                schedule, stages = pair[mode]
                dist.barrier()
                start, start_cpu = time.perf_counter(), time.process_time()
                step(schedule, stages, microbatches, args.rows, args.hidden)
                used = torch.tensor([time.process_time() - start_cpu], dtype=torch.float64)
                dist.all_reduce(used)  # also the barrier that ends the step
                times[mode].append(time.perf_counter() - start)
                cpu[mode].append(float(used))
        report["time"].append({"schedule": name, "microbatches": microbatches,
                               "stock_ms": [t * 1e3 for t in times["stock"]],
                               "ring_ms": [t * 1e3 for t in times["ring"]],
                               "stock_cpu_ms": [t * 1e3 for t in cpu["stock"]],
                               "ring_cpu_ms": [t * 1e3 for t in cpu["ring"]]})
    if rank == 0:
        print_tables(report, args)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(report, f, indent=1)


def print_tables(report, args):
    set_bytes = args.rows * args.hidden * 4
    print(f"Receive buffers, all 4 ranks together (one buffer set = {args.rows} x {args.hidden} float32 = "
          f"{set_bytes // 1024} KiB); sets (bytes)")
    print("| schedule | M | stock | ring | shared ring | just in time (peak) | ring / stock |")
    print("|---|---|---|---|---|---|---|")
    for row in report["memory"]:
        cells = [f"{row[m]['sets']} ({mib(row[m]['bytes'])})" for m in ("stock", "ring", "shared_ring")]
        jit = f"{row['just_in_time']['peak_sets']} ({mib(row['just_in_time']['peak_bytes'])})"
        share = row["ring"]["bytes"] / row["stock"]["bytes"]
        print(f"| {row['schedule']} | {row['microbatches']} | {' | '.join(cells)} | {jit} | {share:.2f} |")
    print()
    print(f"Step time, stock against ring, {args.rounds} alternating rounds: wall time, median (min-max) ms, "
          "and the median of each round's stock / ring (the two steps of a round run back to back); "
          "CPU time of the 4 ranks together, median, and stock / ring of the medians")
    print("| schedule | M | stock | ring | stock / ring (rounds' min-max) | CPU stock | CPU ring | CPU stock / ring |")
    print("|---|---|---|---|---|---|---|---|")
    for row in report["time"]:
        stock, ring = row["stock_ms"], row["ring_ms"]
        ratios = [s / r for s, r in zip(stock, ring)]
        cpu_stock, cpu_ring = statistics.median(row["stock_cpu_ms"]), statistics.median(row["ring_cpu_ms"])
        print(f"| {row['schedule']} | {row['microbatches']} | {statistics.median(stock):.1f} "
              f"({min(stock):.1f}-{max(stock):.1f}) | {statistics.median(ring):.1f} "
              f"({min(ring):.1f}-{max(ring):.1f}) | {statistics.median(ratios):.3f} "
              f"({min(ratios):.2f}-{max(ratios):.2f}) | {cpu_stock:.1f} | {cpu_ring:.1f} | "
              f"{cpu_stock / cpu_ring:.3f} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--microbatches", default="16,32", help="microbatch counts (memory); the first also times")
    parser.add_argument("--schedules", default=",".join(SCHEDULES))
    parser.add_argument("--rows", type=int, default=32, help="rows of one microbatch")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--timeout", type=int, default=900, help="seconds before the ranks are killed")
    parser.add_argument("--json", help="also write the figures here (rank 0)")
    parser.add_argument("--system-malloc", action="store_true",
                        help="CPU tensors from glibc malloc instead of remat's caching allocator (tag_cpu_tensors)")
    args = parser.parse_args()
    args.microbatches = [int(m) for m in args.microbatches.split(",")]
    args.schedules = args.schedules.split(",")
    worker(args) if args.worker else launch(args)


if __name__ == "__main__":
    main()
