"""The tagging allocator against PyTorch's native CUDA caching allocator, side by side.

    torch_allocator_bench.py [--out DIR] [--rounds N] [--quick]

Each allocator runs in a fresh process (PyTorch cannot swap an allocator it has used), pinned
to the same two CPU cores, in rounds that alternate the allocators so drift on the machine hits
them alike:
  - native:          PyTorch's own caching allocator;
  - remat:           remat_alloc.install() with the default configuration (trace ring on);
  - remat-untraced:  the same with trace_entries:0.
Each process measures, with the cache emptied and peaks reset in between:
  1. a torch.empty/del loop over a training-like size mix (ns per allocation and free, peak
     reserved bytes);
  2. training steps of a small transformer (median step time, peak allocated and reserved);
  3. the same at a size where the step is bound by kernel launches on the host, where an
     allocator's own cost shows most.
Needs REMAT_ALLOC_LIBRARY (or the library beside remat_alloc) and PYTHONPATH for remat_alloc.
Prints a table of ratios against native and writes every figure to DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import statistics
import subprocess
import sys
import time

MODES = ("native", "remat", "remat-untraced")
KiB, MiB = 1 << 10, 1 << 20

# Sizes a transformer step allocates (bf16, width 1024, batch x seq = 4096 tokens) and how
# often: norms and biases, weights, activations, MLP hidden states, attention scores.
SIZE_MIX = [
    (512, 10), (2 * KiB, 12), (8 * KiB, 8), (64 * KiB, 6), (512 * KiB, 6),
    (2 * MiB, 10), (6 * MiB, 6), (8 * MiB, 14), (12 * MiB, 6), (32 * MiB, 10), (64 * MiB, 4),
]


def empty_del_loop(torch, pairs: int, window: int = 64) -> dict:
    rng = random.Random(0)
    sizes = rng.choices([s for s, _ in SIZE_MIX], weights=[w for _, w in SIZE_MIX], k=pairs)
    victims = [rng.random() for _ in range(pairs)]

    def run(count: int) -> float:
        live = []
        start = time.perf_counter_ns()
        for size, victim in zip(sizes[:count], victims[:count]):
            live.append(torch.empty(size, dtype=torch.uint8, device="cuda"))
            if len(live) > window:
                i = int(victim * len(live))
                live[i] = live[-1]  # frees the tensor that was at i
                live.pop()
        elapsed = time.perf_counter_ns() - start
        live.clear()
        return elapsed / count

    run(min(pairs, 5000))  # warm the cache
    return {"ns_per_pair": min(run(pairs) for _ in range(3)), "pairs": pairs}


def transformer_steps(torch, width: int, layers: int, batch: int, seq: int, steps: int) -> dict:
    torch.manual_seed(0)
    vocab = 8192
    model = torch.nn.Sequential(
        torch.nn.Embedding(vocab, width),
        *[torch.nn.TransformerEncoderLayer(width, max(1, width // 64), 4 * width, dropout=0.1, batch_first=True,
                                           norm_first=True) for _ in range(layers)],
        torch.nn.LayerNorm(width),
        torch.nn.Linear(width, vocab),
    ).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, vocab, (batch, seq), device="cuda")
    targets = torch.randint(0, vocab, (batch, seq), device="cuda")

    def step() -> float:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(tokens).flatten(0, 1), targets.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return {"median_ms": statistics.median(times), "min_ms": min(times), "steps": steps,
            "final_loss": float(loss), "shape": f"width {width}, {layers} layers, batch {batch} x seq {seq}"}


def child(mode: str, quick: bool) -> dict:
    # The same two cores for every process (the Python thread and autograd's device thread):
    # host-bound steps vary more between cores than between allocators.
    if hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) > 4:
        os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[2:4]))
    import torch

    torch.set_num_threads(1)

    if mode != "native":
        import remat_alloc

        remat_alloc.install()
        if mode == "remat-untraced":
            remat_alloc.configure("trace_entries:0")

    def peaks() -> dict:
        if mode == "native":
            return {"peak_allocated": torch.cuda.max_memory_allocated(), "peak_reserved": torch.cuda.max_memory_reserved()}
        stats = remat_alloc.memory_stats()
        return {"peak_allocated": stats["allocated_bytes_peak"], "peak_reserved": stats["reserved_bytes_peak"]}

    def reset() -> None:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        if mode == "native":
            torch.cuda.reset_peak_memory_stats()
        else:
            remat_alloc.reset_peak_stats()

    torch.cuda.init()
    results = {"mode": mode}
    reset()
    results["empty_del"] = {**empty_del_loop(torch, 20000 if quick else 60000), **peaks()}
    reset()
    results["train"] = {**transformer_steps(torch, 1024, 8, 8, 512, 10 if quick else 25), **peaks()}
    reset()
    results["train_launch_bound"] = {**transformer_steps(torch, 256, 4, 8, 128, 20 if quick else 50), **peaks()}
    return results


def ratio(value: float, baseline: float) -> str:
    return f"{value / baseline:.3f}x" if baseline else "n/a"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="bench-out", help="folder for the figures (default: bench-out)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the three allocators (default: 3)")
    parser.add_argument("--quick", action="store_true", help="fewer iterations, for a smoke test")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.quick)))
        return 0
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")

    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    for round_index in range(args.rounds):
        for mode in MODES:
            command = [sys.executable, __file__, "--child", mode] + (["--quick"] if args.quick else [])
            done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=os.environ.copy())
            if done.returncode != 0:
                print(f"{mode} (round {round_index + 1}) failed with exit code {done.returncode}:\n{done.stderr}")
                return 1
            result = json.loads(done.stdout.strip().splitlines()[-1])
            result["round"] = round_index + 1
            runs.append(result)
            print(f"round {round_index + 1} {mode}: empty/del {result['empty_del']['ns_per_pair']:.0f} ns/pair, "
                  f"step {result['train']['median_ms']:.2f} ms, launch-bound step "
                  f"{result['train_launch_bound']['median_ms']:.2f} ms", flush=True)

    def median_of(mode: str, workload: str, key: str) -> float:
        return statistics.median(r[workload][key] for r in runs if r["mode"] == mode)

    def round_ratios(mode: str, workload: str, key: str) -> str:
        per_round = []
        for index in range(1, args.rounds + 1):
            value = next(r[workload][key] for r in runs if r["mode"] == mode and r["round"] == index)
            base = next(r[workload][key] for r in runs if r["mode"] == "native" and r["round"] == index)
            per_round.append(f"{value / base:.2f}")
        return " ".join(per_round)

    lines = [f"allocator vs PyTorch's native caching allocator, median over {args.rounds} round(s) "
             "(per-round ratios in brackets)", ""]
    for workload, key, unit in (("empty_del", "ns_per_pair", "ns/pair"), ("train", "median_ms", "ms/step"),
                                ("train_launch_bound", "median_ms", "ms/step")):
        shape = runs[0][workload].get("shape", "training-like size mix, 64 live tensors")
        lines.append(f"{workload} ({shape}):")
        base = median_of("native", workload, key)
        base_reserved = median_of("native", workload, "peak_reserved")
        for mode in MODES:
            value = median_of(mode, workload, key)
            reserved = median_of(mode, workload, "peak_reserved")
            allocated = median_of(mode, workload, "peak_allocated")
            lines.append(f"  {mode:15} {value:10.2f} {unit:8} {ratio(value, base):>8} [{round_ratios(mode, workload, key)}]"
                         f"   peak reserved "
                         f"{reserved / MiB:9.1f} MiB {ratio(reserved, base_reserved):>8}   peak allocated "
                         f"{allocated / MiB:9.1f} MiB")
        lines.append("")
    table = "\n".join(lines)
    print(table)
    (out / "allocator_vs_native.txt").write_text(table + "\n")
    (out / "allocator_vs_native.json").write_text(json.dumps(runs, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
