"""One rank of test_data_parallel's Gloo job (RANK, WORLD_SIZE, MASTER_* set; argv: out_dir).

Trains the same 4-layer model for 4 steps (SGD with momentum, each rank on its own batches)
plain under DistributedDataParallel, then with remat checkpoints under DDP in several settings,
then under remat.fit at a budget between the least step peak and everything saved (fit on the
module DDP wraps, and on the DDP itself), and with no_sync() accumulation under fit; then a tiny
Hugging Face Llama under FSDP2 (fully_shard) with wrap_decoder_layers before or after sharding.
Writes, per run, whether every parameter equals the run without remat bitwise, the steps'
measured peaks, fit's predictions and its warnings, and how many checkpoints ran."""

import gc
import json
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


class SyncedLayer(fit_loop.Layer):
    """fit_loop's layer whose "mlp" region ends in a norm that takes the mean over every rank's
    batch (an all-reduce in forward, as SyncBatchNorm's or a tensor-parallel layer's)."""

    def forward(self, x, plain=False):
        from torch.distributed.nn.functional import all_reduce

        def mlp(t):
            y = self.down(self.up(t).cos())
            # (the sine saves what the all-reduce took part in: recompute runs it again)
            return (y - all_reduce(y.mean((0, 1))) / dist.get_world_size()).sin() + t

        attn = lambda t: self.attn(t).sin() + t  # noqa: E731
        if plain:
            return mlp(attn(x))
        return remat.region(mlp, "mlp")(remat.region(attn, "attn")(x))


def train(rank, *, checkpointed=True, budget=None, fit_outer=False, micro_batches=1, layer=fit_loop.Layer,
          **ddp_options):
    """(parameters after the steps, per step (peak, fit's prediction, regions its plan recomputes),
    fit's warnings, fit's profile, checkpoint calls made)."""
    torch.manual_seed(0)
    with remat.tag_cpu_tensors(), warnings.catch_warnings(record=True) as told, remat.collect_trace() as trace:
        warnings.simplefilter("always")
        model = fit_loop.CheckpointedLayers([layer(WIDTH) for _ in range(LAYERS)], checkpointed)
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
    return parameters, steps, fit_loop.messages(told, "remat"), profile, len(trace.scopes)


def fsdp2_llama(rank, mesh, wrap=None):
    """A tiny Hugging Face Llama under FSDP2 (fully_shard on each decoder layer and the model),
    with wrap_decoder_layers before sharding (wrap="before"), after it ("after") or not at all;
    3 AdamW steps. Returns each parameter's local shard after them."""
    from torch.distributed.fsdp import fully_shard
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         vocab_size=256, intermediate_size=256, max_position_embeddings=64, use_cache=False)
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config).train()
    if wrap == "before":
        remat.wrap_decoder_layers(model)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if wrap == "after":
        remat.wrap_decoder_layers(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with remat.collect_trace() as trace:
        for step in range(3):
            optimizer.zero_grad(set_to_none=True)
            ids = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(100 * rank + step))
            model(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
    return [p.detach().to_local().clone() for p in model.parameters()], len(trace.scopes)


def work(rank, world):
    results = {}
    plain = train(rank, checkpointed=False)[0]
    plain_accumulated = train(rank, checkpointed=False, micro_batches=2)[0]

    def record(name, run, reference=plain):
        parameters, steps, told, _, checkpoints = run
        results[name] = {"bitwise": all(torch.equal(a, b) for a, b in zip(parameters, reference)),
                         "steps": steps, "told": told, "checkpoints": checkpoints}

    record("checkpoints", train(rank))
    record("checkpoints, find_unused_parameters", train(rank, find_unused_parameters=True))
    record("checkpoints, static_graph, bucket views", train(rank, static_graph=True, gradient_as_bucket_view=True))
    # The budget: midway between the least step peak and everything saved, with the optimizer's
    # state (the steps after the first), the same on every rank.
    _, steps, _, profile, _ = train(rank, budget="1GiB")
    steady = max(peak for peak, _, _ in steps[1:])
    figures = torch.tensor([steady - (profile.step_peak_bytes - profile.least_peak_bytes()), steady])
    dist.all_reduce(figures, op=dist.ReduceOp.MAX)
    least, everything = figures.tolist()
    budget = (least + everything) // 2
    results["budget"] = budget
    record("fit, then DDP", train(rank, budget=budget))
    record("DDP, then fit", train(rank, budget=budget, fit_outer=True))
    record("fit, no_sync accumulation", train(rank, budget=budget, micro_batches=2), plain_accumulated)
    # A collective in each layer's "mlp" region, each rank under its own budget: rank 0 saves
    # everything, rank 1 recomputes what its plan may. Ranks planning such a region apart would
    # run its all-reduce again in one rank's backward only, pairing it with the other's gradient
    # all-reduce (wrong gradients, or Gloo's size mismatch)
    synced = train(rank, checkpointed=False, layer=SyncedLayer)[0]
    _, steps, _, profile, _ = train(rank, budget="1GiB", layer=SyncedLayer)
    steady = max(peak for peak, _, _ in steps[1:])
    least = steady - (profile.step_peak_bytes - profile.least_peak_bytes())
    run = train(rank, budget="1GiB" if rank == 0 else least + (steady - least) // 64, layer=SyncedLayer)
    record("fit, a collective in a region, a budget per rank", run, synced)
    results["fit, a collective in a region, a budget per rank"]["must_save"] = {
        region["name"]: region.get("must_save", "") for region in json.loads(run[3].to_json())["regions"]}
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    sharded, _ = fsdp2_llama(rank, mesh)
    for wrap in ("before", "after"):
        parameters, checkpoints = fsdp2_llama(rank, mesh, wrap)
        results[f"FSDP2, wrap_decoder_layers {wrap} fully_shard"] = {
            "bitwise": all(torch.equal(a, b) for a, b in zip(parameters, sharded)), "checkpoints": checkpoints}
    gc.collect()  # every DDP and FSDP2 state freed (fit's reference cycles too) before the job ends
    return results


if __name__ == "__main__":
    run_rank(sys.argv[1], work)
