"""One rank of test_data_parallel's Gloo job (RANK, WORLD_SIZE, MASTER_* set; argv: out_dir).

Trains the same 4-layer model for 4 steps (SGD with momentum, each rank on its own batches)
plain under DistributedDataParallel, then with remat checkpoints under DDP in several settings,
then under remat.fit at a budget between the least step peak and everything saved (fit on the
module DDP wraps, and on the DDP itself), and with no_sync() accumulation under fit. Writes, per
run, whether every parameter equals the plain run's bitwise, the steps' measured peaks, fit's
predictions and its warnings."""

import os
import sys
import warnings

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import remat
import remat_alloc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fit_loop  # noqa: E402
from gloo_rank import run_rank  # noqa: E402

WIDTH, LAYERS, STEPS = 64, 4, 4


def batch(rank, step):
    return torch.randn(8, 32, WIDTH, generator=torch.Generator().manual_seed(1000 * rank + step))


def train(rank, *, checkpointed=True, budget=None, fit_outer=False, micro_batches=1, **ddp_options):
    """(parameters after the steps, per step (peak, fit's prediction, regions its plan recomputes),
    fit's warnings, fit's profile)."""
    torch.manual_seed(0)
    with remat.tag_cpu_tensors(), warnings.catch_warnings(record=True) as told:
        warnings.simplefilter("always")
        model = fit_loop.CheckpointedLayers([fit_loop.Layer(WIDTH) for _ in range(LAYERS)], checkpointed)
        if budget is not None and not fit_outer:
            remat.fit(model, budget=budget)
        ddp = DistributedDataParallel(model, **ddp_options)
        fitted = ddp if fit_outer else model
        if budget is not None and fit_outer:
            remat.fit(ddp, budget=budget)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        steps = []
        for step in range(STEPS):
            optimizer.zero_grad(set_to_none=True)
            remat_alloc.reset_peak_stats()
            for micro in range(micro_batches - 1):
                with ddp.no_sync():
                    ddp(batch(rank, 10 * step + micro)).backward()
            ddp(batch(rank, 10 * step + micro_batches - 1)).backward()
            optimizer.step()
            state = getattr(fitted, "remat_fit", None)
            planned = state is not None and state.plan is not None
            steps.append((remat_alloc.memory_stats()["requested_bytes_peak"],
                          state.predicted_peak_bytes if planned else None,
                          sum(decision == "recompute" for decision in state.plan.decisions.values()) if planned else 0))
        profile = None
        if budget is not None:
            profile = next(iter(fitted.remat_fit.profiles.values())).profile
            fit_loop.unfit(fitted, batch(rank, 99))
        parameters = [p.detach().clone() for p in model.parameters()]
    return parameters, steps, fit_loop.messages(told, "remat"), profile


def work(rank, world):
    results = {}
    plain, _, _, _ = train(rank, checkpointed=False)
    plain_accumulated, _, _, _ = train(rank, checkpointed=False, micro_batches=2)

    def record(name, run, reference=plain):
        parameters, steps, told, _ = run
        results[name] = {"bitwise": all(torch.equal(a, b) for a, b in zip(parameters, reference)),
                         "steps": steps, "told": told}

    record("checkpoints", train(rank))
    record("checkpoints, find_unused_parameters", train(rank, find_unused_parameters=True))
    record("checkpoints, static_graph, bucket views", train(rank, static_graph=True, gradient_as_bucket_view=True))
    # The budget: midway between the least step peak and everything saved, with the optimizer's
    # state (the steps after the first), the same on every rank.
    _, steps, _, profile = train(rank, budget="1GiB")
    steady = max(peak for peak, _, _ in steps[1:])
    figures = torch.tensor([steady - (profile.step_peak_bytes - profile.least_peak_bytes()), steady])
    dist.all_reduce(figures, op=dist.ReduceOp.MAX)
    least, everything = figures.tolist()
    budget = (least + everything) // 2
    results["budget"] = budget
    record("fit, then DDP", train(rank, budget=budget))
    record("DDP, then fit", train(rank, budget=budget, fit_outer=True))
    record("fit, no_sync accumulation", train(rank, budget=budget, micro_batches=2), plain_accumulated)
    return results


if __name__ == "__main__":
    run_rank(sys.argv[1], work)
