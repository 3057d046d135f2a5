"""remat under torch.nn.parallel.DistributedDataParallel: two Gloo ranks (127.0.0.1, a free port,
bounded by a timeout, every child reaped) train a model of remat checkpoints, and under remat.fit,
each rank on its own batches (data_parallel_worker.py). Every parameter after 4 steps must equal
plain DDP's bitwise, in each DDP setting; under fit every planned step peaks within the budget
and at most 3% above its prediction, fit applied to the module DDP wraps or to the DDP itself,
with no_sync() accumulation too. A region that runs an all-reduce is saved on every rank, each
rank fitted to its own budget (planned apart, one rank's recompute would run the all-reduce
again alone). A tiny Hugging Face Llama under FSDP2 (fully_shard on each
decoder layer), wrap_decoder_layers applied before or after sharding, ends with every local shard
bitwise that of FSDP2 without remat."""

import pytest

from test_pipelining import run_ranks

RUNS = ["checkpoints", "checkpoints, find_unused_parameters", "checkpoints, static_graph, bucket views",
        "fit, then DDP", "DDP, then fit", "fit, no_sync accumulation",
        "fit, a collective in a region, a budget per rank",
        "FSDP2, wrap_decoder_layers before fully_shard", "FSDP2, wrap_decoder_layers after fully_shard"]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return run_ranks("data_parallel_worker.py", [], str(tmp_path_factory.mktemp("data_parallel")),
                     "data parallel job", timeout=300, world=2)


@pytest.mark.parametrize("run", RUNS)
def test_every_rank_trains_bitwise_as_without_remat(ranks, run):
    for rank, results in enumerate(ranks):
        assert results[run]["bitwise"], (rank, run)
        assert results[run]["checkpoints"] >= 6, (rank, run, results[run]["checkpoints"])  # a layer's, each step


@pytest.mark.parametrize("run", [run for run in RUNS if run.startswith(("fit", "DDP")) and "per rank" not in run])
def test_planned_steps_peak_within_the_budget_and_their_prediction(ranks, run):
    for rank, results in enumerate(ranks):
        budget, steps = results["budget"], results[run]["steps"]
        # The first step runs profiled (its first micro-batch, under accumulation), every later one planned
        planned = steps[1:]
        assert all(predicted is not None for _, predicted, _ in planned), (rank, run, steps)
        assert all(peak <= budget and peak <= predicted * 1.03 for peak, predicted, _ in planned), \
            (rank, run, budget, steps)
        assert all(recomputed > 0 for _, _, recomputed in planned), (rank, run, steps)  # the budget asks for some
        # Only the profiled step (everything saved) may be said to be over the budget
        assert all("profiled step" in message for message in results[run]["told"]), (rank, run, results[run]["told"])


def test_a_region_running_a_collective_is_saved_on_every_rank_whatever_its_budget(ranks):
    run = "fit, a collective in a region, a budget per rank"
    for rank, results in enumerate(ranks):
        must_save = results[run]["must_save"]
        assert all(("all-reduce" in reason or "allreduce" in reason) == name.endswith("::mlp")
                   for name, reason in must_save.items()), (rank, must_save)
    # Rank 1's budget asks for recompute: its plans recompute the attention regions only
    assert all(recomputed > 0 for _, _, recomputed in ranks[1][run]["steps"][1:]), ranks[1][run]["steps"]
