#!/usr/bin/env python3
"""What a checkpoint pays to give recompute the buffers its forward changed as forward read them
(docs/python.md, "Buffers a checkpoint changes"): a chain of small blocks, each a checkpoint, with
and without a BatchNorm (whose running statistics every training forward changes), or with a
buffer each forward reads and assigns anew, against no
checkpointing and torch.utils.checkpoint (non-reentrant) in one run. A step is forward and backward,
timed as the thread's CPU time, the median over rounds that alternate the modes; per checkpoint:
(mode - none) / blocks. Also says whether each mode's gradients and buffers after the run are
bitwise those without checkpointing.

    PYTHONPATH=build/python:allocator/python REMAT_ALLOC_LIBRARY=build/allocator/libremat_alloc.so \\
        python3 bench/python/written_buffers_bench.py [--rounds 201] [--blocks 32]
"""

import argparse
import copy
import statistics
import time

import torch
import torch.utils.checkpoint

import remat


class Block(torch.nn.Module):
    def __init__(self, width, kind):
        super().__init__()
        self.lin = torch.nn.Linear(width, width)
        self.kind = kind
        self.norm = torch.nn.BatchNorm1d(width) if kind == "batch norm" else torch.nn.LayerNorm(width)
        if kind == "assigned average":
            self.register_buffer("average", torch.zeros(width))

    def forward(self, x):
        h = torch.relu(self.norm(self.lin(x)))
        if self.kind == "assigned average":  # read, then assigned anew (no in-place change)
            h = h * (1.0 + self.average)
            self.average = 0.9 * self.average + 0.1 * h.detach().mean(0)
        return x + h


KINDS = {"layer norm": "Linear, LayerNorm, ReLU (no buffers)", "batch norm": "Linear, BatchNorm1d, ReLU",
         "assigned average": "Linear, LayerNorm, ReLU, an average buffer assigned anew"}


def remat_call(index, block, x):
    return remat.checkpoint(region_name=f"blocks.{index}")(block)(x)


def torch_call(index, block, x):
    return torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)


MODES = {"none": lambda index, block, x: block(x), "torch.utils.checkpoint": torch_call, "remat": remat_call}


def step(model, call, x):
    model.zero_grad(set_to_none=True)
    started = time.thread_time_ns()
    h = x
    for index, block in enumerate(model):
        h = call(index, block, h)
    h.square().sum().backward()
    return time.thread_time_ns() - started


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=201)
    parser.add_argument("--blocks", type=int, default=32)
    parser.add_argument("--width", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    x = torch.randn(16, args.width)
    for kind, description in KINDS.items():
        torch.manual_seed(0)
        base = torch.nn.ModuleList(Block(args.width, kind) for _ in range(args.blocks))
        models = {mode: copy.deepcopy(base) for mode in MODES}
        times = {mode: [] for mode in MODES}
        for round_index in range(args.rounds + 5):
            for mode, call in MODES.items():
                elapsed = step(models[mode], call, x)
                if round_index >= 5:  # the first rounds warm up
                    times[mode].append(elapsed)
        none_us = statistics.median(times["none"]) / 1e3
        print(f"{args.blocks} checkpoints of {description}; a step (forward and backward), median of "
              f"{args.rounds} rounds:")
        for mode in MODES:
            us = statistics.median(times[mode]) / 1e3
            same = all(torch.equal(a.grad, b.grad) for a, b in zip(models[mode].parameters(),
                                                                  models["none"].parameters())) and \
                all(torch.equal(a, b) for a, b in zip(models[mode].buffers(), models["none"].buffers()))
            extra = "" if mode == "none" else f", {(us - none_us) / args.blocks:6.1f} us per checkpoint"
            print(f"  {mode:24s} {us:9.1f} us{extra}; gradients and buffers as without checkpointing: "
                  f"{'yes' if same else 'no'}")


if __name__ == "__main__":
    main()
