#!/usr/bin/env python3
"""The checkpoint runtime from Python against torch.utils.checkpoint (non-reentrant), against
torch_remat (when it is importable: `pip install --no-deps torch-remat` into an environment
that sees torch) and against no checkpointing, on the same model in one run.

The model is a chain of checkpoints over [4]-element tensors, so each implementation's own
cost dominates; every checkpoint runs K ops that each save a tensor for backward. Forward and
backward are timed separately (thread CPU time, median over rounds that alternate the modes).
Per checkpoint: (mode - none) / checkpoints at K = 1. Per saved tensor: the slope between
K = 1 and K = 9, per checkpoint, beyond what the same ops cost without checkpointing. Last, in
torch_remat's call style (the checkpoint and two regions, one saved, made anew at every call),
forward and backward together per checkpoint beyond no checkpointing.

    PYTHONPATH=build/python:allocator/python REMAT_ALLOC_LIBRARY=build/allocator/libremat_alloc.so \\
        python3 bench/python/checkpoint_bench.py [--rounds 41] [--checkpoints 50]
"""

import importlib.util

import argparse
import statistics
import time

import torch
import torch.utils.checkpoint

import remat

torch_remat = importlib.import_module("torch_remat") if importlib.util.find_spec("torch_remat") else None


def body_of(k, weight):
    def body(x):
        for _ in range(k):
            x = torch.tanh(x * weight)  # saves its input and output
        return x

    return body


def model(mode, checkpoints, k, weights, x):
    for i in range(checkpoints):
        body = body_of(k, weights[i])
        if mode == "none":
            x = body(x)
        elif mode == "torch":
            x = torch.utils.checkpoint.checkpoint(body, x, use_reentrant=False)
        elif mode == "torch_remat":
            x = torch_remat.checkpoint(region_name=f"layers.{i}")(body)(x)
        else:
            x = remat.checkpoint(region_name=f"layers.{i}")(body)(x)
    return x.sum()


def model_with_regions(mode, checkpoints, k, weights, x):
    """Each checkpoint's body is two regions made at the call, as torch_remat's users write it."""
    library = {"torch_remat": torch_remat, "remat": remat}.get(mode)
    for i in range(checkpoints):
        def step(t, weight=weights[i]):
            return torch.tanh(t * weight)

        if library is None:
            x = step(step(x))
            continue

        def body(t, step=step):
            t = library.region(step, "attn", recompute=False)(t)
            return library.region(step, "mlp", recompute=True)(t)

        x = library.checkpoint(region_name=f"layers.{i}")(body)(x)
    return x.sum()


def measure(mode, checkpoints, k, weights, build=model):
    x = torch.randn(4, requires_grad=True)
    started = time.thread_time_ns()
    loss = build(mode, checkpoints, k, weights, x)
    forward = time.thread_time_ns() - started
    started = time.thread_time_ns()
    loss.backward()
    backward = time.thread_time_ns() - started
    return forward, backward


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=41)
    parser.add_argument("--checkpoints", type=int, default=50)
    args = parser.parse_args()
    torch.set_num_threads(1)
    modes = ["none", "torch", "remat"] + (["torch_remat"] if torch_remat is not None else [])
    depths = [1, 9]
    weights = [torch.randn(4, requires_grad=True) for _ in range(args.checkpoints)]
    samples = {(mode, k): ([], []) for mode in modes for k in depths}
    for round_index in range(args.rounds + 2):  # two warm-up rounds
        order = modes[round_index % len(modes):] + modes[:round_index % len(modes)]
        for k in depths:
            for mode in order:
                forward, backward = measure(mode, args.checkpoints, k, weights)
                if round_index >= 2:
                    samples[(mode, k)][0].append(forward)
                    samples[(mode, k)][1].append(backward)
    us = {key: (statistics.median(f) / 1e3, statistics.median(b) / 1e3) for key, (f, b) in samples.items()}

    n = args.checkpoints
    print(f"{n} checkpoints over [4]-element tensors, median of {args.rounds} rounds (thread CPU time)\n")
    print(f"{'mode':<8}{'K':>3}{'forward us':>13}{'backward us':>13}")
    for mode in modes:
        for k in depths:
            f, b = us[(mode, k)]
            print(f"{mode:<8}{k:>3}{f:>13.1f}{b:>13.1f}")
    print()
    for phase, index in (("forward", 0), ("backward", 1)):
        none1, none9 = us[("none", 1)][index], us[("none", 9)][index]
        figures = {}
        for mode in modes[1:]:
            per_checkpoint = (us[(mode, 1)][index] - none1) / n
            per_saved = ((us[(mode, 9)][index] - none9) - (us[(mode, 1)][index] - none1)) / n / (2 * 8)
            figures[mode] = (per_checkpoint, per_saved)
            print(f"{phase:<9} {mode:<6} {per_checkpoint:7.2f} us per checkpoint, {per_saved:6.2f} us per saved tensor "
                  "beyond no checkpointing")
        for baseline in modes[1:]:
            if baseline == "remat":
                continue
            cost = figures[baseline][0]
            ratio = figures["remat"][0] / cost if cost > 0 else float("nan")
            print(f"{phase:<9} remat/{baseline} per checkpoint: {ratio:.2f}x")
        print()

    styles = ["none", "remat"] + (["torch_remat"] if torch_remat is not None else [])
    totals = {mode: [] for mode in styles}
    for round_index in range(args.rounds + 2):
        for mode in styles[round_index % len(styles):] + styles[:round_index % len(styles)]:
            forward, backward = measure(mode, args.checkpoints, 1, weights, build=model_with_regions)
            if round_index >= 2:
                totals[mode].append(forward + backward)
    added = {mode: (statistics.median(totals[mode]) - statistics.median(totals["none"])) / 1e3 / n
             for mode in styles[1:]}
    print("wrappers made at every call, two regions per checkpoint (forward + backward):")
    for mode, cost in added.items():
        print(f"  {mode:<12} {cost:7.2f} us per checkpoint beyond no checkpointing")
    if "torch_remat" in added:
        print(f"  remat/torch_remat per checkpoint: {added['remat'] / added['torch_remat']:.2f}x")


if __name__ == "__main__":
    main()
