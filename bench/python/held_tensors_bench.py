#!/usr/bin/env python3
"""What a checkpoint pays to note the tensors its function holds: recompute the parameters and
buffers (the check of weights swapped between forward and backward), forward the buffers (those
it changes are given back to recompute as forward read them; docs/python.md). A chain of small
layers, each a checkpoint, run two ways in one run: given the layer itself (its own modules are
walked) and through a closure over the whole model (every layer's are walked, at every forward and
recompute). Forward and backward are timed apart, as the thread's CPU time, the median over rounds
that alternate the two; the difference per checkpoint is what walking the rest of the model costs.
Gradients of both are checked bitwise.

    PYTHONPATH=build/python:allocator/python REMAT_ALLOC_LIBRARY=build/allocator/libremat_alloc.so \\
        python3 bench/python/held_tensors_bench.py [--rounds 301] [--layers 32]
"""

import argparse
import statistics
import time

import torch

import remat


class Layer(torch.nn.Module):
    """Eight modules, sixteen parameters."""

    def __init__(self, width):
        super().__init__()
        self.q, self.k, self.v, self.o = (torch.nn.Linear(width, width) for _ in range(4))
        self.norm_1, self.norm_2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.up, self.down = torch.nn.Linear(width, 2 * width), torch.nn.Linear(2 * width, width)

    def forward(self, x):
        h = self.norm_1(x)
        h = x + self.o(torch.tanh(self.q(h) * self.k(h) + self.v(h)))
        return h + self.down(torch.relu(self.up(self.norm_2(h))))


def step_times(model, x, whole):
    model.zero_grad(set_to_none=True)
    forward_started = time.thread_time_ns()
    h = x
    for index, layer in enumerate(model):
        body = (lambda t, index=index: model[index](t)) if whole else layer
        h = remat.checkpoint(region_name=f"layers.{index}")(body)(h)
    loss = h.sum()
    started = time.thread_time_ns()
    loss.backward()
    ended = time.thread_time_ns()
    return (started - forward_started, ended - started), [p.grad.clone() for p in model.parameters()]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=301)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--width", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.ModuleList(Layer(args.width) for _ in range(args.layers))
    x = torch.randn(4, args.width, requires_grad=True)
    times = {(phase, whole): [] for phase in (0, 1) for whole in (False, True)}
    gradients = {}
    for round_index in range(args.rounds + 5):
        for whole in (False, True):
            elapsed, gradients[whole] = step_times(model, x, whole)
            if round_index >= 5:  # the first rounds warm up
                for phase in (0, 1):
                    times[(phase, whole)].append(elapsed[phase])
    assert all(torch.equal(a, b) for a, b in zip(gradients[False], gradients[True]))
    parameters = sum(1 for _ in model.parameters())
    modules = sum(1 for _ in model.modules())
    for phase, (name, each) in enumerate([("forward", "forward"), ("backward", "recompute")]):
        layer_us, whole_us = (statistics.median(times[(phase, whole)]) / 1e3 for whole in (False, True))
        print(f"{args.layers} checkpoints, {modules} modules and {parameters} parameters in the model; {name} per "
              f"step (median of {args.rounds} rounds):")
        print(f"  given the layer itself          {layer_us:9.1f} us")
        print(f"  a closure over the whole model  {whole_us:9.1f} us ({whole_us / layer_us:.2f}x)")
        print(f"  walking the rest of the model: {(whole_us - layer_us) / args.layers:.1f} us per {each}")


if __name__ == "__main__":
    main()
