"""One rank of the remat.pipelining parity job (started by test_pipelining.py, 4 ranks, Gloo).

For each schedule and stage layout, trains 3 steps with stock receive buffers and with each
pooled mode from the same initial parameters, and writes per rank: whether the losses and
every parameter gradient are bitwise equal, the plan's slots, and the buffers' memory.
Usage: pipelining_worker.py OUT_DIR SCHEDULE[,SCHEDULE...]   (RANK, WORLD_SIZE, MASTER_* set)
"""

import os
import sys
import tempfile

import torch
import torch.nn as nn
from torch.distributed.pipelining import PipelineStage, schedules

import remat
import remat.pipelining
from gloo_rank import run_rank

DIM = 8
MICROBATCHES = 8
STEPS = 3
KINDS = ("plain", "residual", "bias", "pass", "torch_checkpoint", "remat_checkpoint")
SPLIT_BACKWARD = ("interleaved_zero_bubble", "zbv", "dualpipev")  # schedules that run I and W


class Stage(nn.Module):
    """plain tanh(W x); residual x + tanh(W x); bias x + b (the gradient passes through); pass
    returns x itself; the checkpointed kinds run plain under torch.utils.checkpoint or remat.checkpoint."""

    def __init__(self, kind, seed):
        super().__init__()
        self.kind = kind
        generator = torch.Generator().manual_seed(seed)
        if kind == "bias":
            self.bias = nn.Parameter(torch.randn(DIM, generator=generator) * 0.1)
        elif kind not in ("pass", "pass_copy"):
            self.linear = nn.Linear(DIM, DIM)
            with torch.no_grad():
                self.linear.weight.copy_(torch.randn(DIM, DIM, generator=generator) * 0.3)
                self.linear.bias.copy_(torch.randn(DIM, generator=generator) * 0.1)

    def plain(self, x):
        return torch.tanh(self.linear(x))

    def forward(self, x):
        if self.kind == "plain":
            return self.plain(x)
        if self.kind == "residual":
            return x + self.plain(x)
        if self.kind == "bias":
            return x + self.bias
        if self.kind == "pass":
            return x
        if self.kind == "pass_copy":
            return x * 1.0
        if self.kind == "torch_checkpoint":
            return torch.utils.checkpoint.checkpoint(self.plain, x, use_reentrant=False)
        return remat.checkpoint()(self.plain)(x)


def without_self_sends(stage, rank):
    # PyTorch's first step exchanges a dummy tensor with each neighbour stage, even one on the
    # same rank (V schedules); Gloo cannot send to its own rank, so those are left out here.
    exchange = stage._get_init_p2p_neighbors_ops

    def neighbours():
        return [op for op in exchange() if op.group_peer != rank]

    stage._get_init_p2p_neighbors_ops = neighbours


def stage_indices(name, rank, world):
    if name in ("gpipe", "1f1b"):
        return [rank]
    if name in ("zbv", "dualpipev"):
        return [rank, 2 * world - 1 - rank]
    return [rank, rank + world]


def build(name, layout, rank, world, workdir, stock):
    indices = stage_indices(name, rank, world)
    num_stages = world if name in ("gpipe", "1f1b") else 2 * world
    example = torch.zeros(2, DIM)
    stages = []
    for index in indices:
        kind = KINDS[(index + layout) % len(KINDS)]
        if kind == "pass" and stock and (index == num_stages - 1 or name in SPLIT_BACKWARD):
            # Stock PyTorch cannot train past one step a last stage that returns its input
            # (backward_one_chunk detaches the stage output in place, and it is the persistent
            # receive buffer), nor any such stage under the I/W split (stage_backward_input does
            # the same): stock runs x * 1, bitwise the same values and gradients, unaliased.
            kind = "pass_copy"
        module = Stage(kind, seed=1000 * layout + index)
        stages.append(PipelineStage(module, index, num_stages, torch.device("cpu"), input_args=(example,),
                                    output_args=(example,)))
    for stage in stages:
        without_self_sends(stage, rank)
    loss_fn = lambda output, target: ((output - target) ** 2).mean()  # noqa: E731
    if name == "gpipe":
        return schedules.ScheduleGPipe(stages[0], MICROBATCHES, loss_fn=loss_fn), stages
    if name == "1f1b":
        return schedules.Schedule1F1B(stages[0], MICROBATCHES, loss_fn=loss_fn), stages
    classes = {"interleaved_1f1b": schedules.ScheduleInterleaved1F1B, "looped_bfs": schedules.ScheduleLoopedBFS,
               "interleaved_zero_bubble": schedules.ScheduleInterleavedZeroBubble,
               "zbv": schedules.ScheduleZBVZeroBubble, "dualpipev": schedules.ScheduleDualPipeV}
    if name == "csv":
        # Interleaved1F1B's order written by PyTorch's _dump_csv and loaded into the bare runtime.
        source = schedules.ScheduleInterleaved1F1B(stages, MICROBATCHES, loss_fn=loss_fn)
        path = os.path.join(workdir, f"order_{rank}.csv")
        source._dump_csv(path, format="compute_only")
        schedule = schedules._PipelineScheduleRuntime(stages, MICROBATCHES, loss_fn=loss_fn)
        schedule._load_csv(path, format="compute_only")
        return schedule, stages
    return classes[name](stages, MICROBATCHES, loss_fn=loss_fn), stages


def train(name, layout, mode, rank, world, workdir):
    print(f"rank {rank}: {name}, layout {layout}, {mode}", file=sys.stderr, flush=True)
    schedule, stages = build(name, layout, rank, world, workdir, stock=mode == "stock")
    plan = None
    if mode != "stock":
        plan = remat.pipelining.pool_recv_buffers(schedule, mode=mode)
    generator = torch.Generator().manual_seed(7)
    losses_seen, grads_seen = [], []
    for _ in range(STEPS):
        x = torch.randn(2 * MICROBATCHES, DIM, generator=generator)
        y = torch.randn(2 * MICROBATCHES, DIM, generator=generator)
        for stage in stages:
            stage.submod.zero_grad(set_to_none=True)
        losses = []
        first = any(stage.is_first for stage in stages)
        last = any(stage.is_last for stage in stages)
        schedule.step(*((x,) if first else ()), target=y if last else None, losses=losses)
        losses_seen.append([loss.detach().clone() for loss in losses])
        grads = {f"{stage.stage_index}.{n}": p.grad.clone() for stage in stages
                 for n, p in stage.submod.named_parameters()}
        grads_seen.append(grads)
        with torch.no_grad():
            for stage in stages:
                for p in stage.submod.parameters():
                    p -= 0.1 * p.grad
    return losses_seen, grads_seen, plan, remat.pipelining.recv_buffer_memory(schedule)


def bitwise_equal(a, b):
    losses_a, grads_a = a
    losses_b, grads_b = b
    if len(losses_a) != len(losses_b) or any(len(x) != len(y) for x, y in zip(losses_a, losses_b)):
        return False
    if any(not torch.equal(p, q) for x, y in zip(losses_a, losses_b) for p, q in zip(x, y)):
        return False
    for x, y in zip(grads_a, grads_b):
        if x.keys() != y.keys() or any(not torch.equal(x[k], y[k]) for k in x):
            return False
    return True


def compare_modes(names, rank, world):
    results = {}
    with tempfile.TemporaryDirectory() as workdir:
        for name in names:
            for layout in (0, 3):
                stock = train(name, layout, "stock", rank, world, workdir)
                entry = {"stock_memory": stock[3], "modes": {}}
                for mode in ("ring", "shared_ring", "just_in_time"):
                    pooled = train(name, layout, mode, rank, world, workdir)
                    entry["modes"][mode] = {"equal": bitwise_equal(stock[:2], pooled[:2]), "memory": pooled[3],
                                            "losses": [[float(v) for v in step] for step in pooled[0]]}
                    entry["plan"] = pooled[2]
                entry["stock_losses"] = [[float(v) for v in step] for step in stock[0]]
                results[f"{name}/{layout}"] = entry
    return results


def main():
    out_dir, names = sys.argv[1], sys.argv[2].split(",")
    run_rank(out_dir, lambda rank, world: compare_modes(names, rank, world))


if __name__ == "__main__":
    main()
