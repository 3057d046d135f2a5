"""One rank of a Gloo job that the pipeline tests start (RANK, WORLD_SIZE, MASTER_* set)."""

import datetime
import json
import os

import torch.distributed as dist


def run_rank(out_dir, work):
    """Joins the job, runs work(rank, world) and writes what it returns to OUT_DIR/rank{rank}.json,
    then waits for every rank before leaving the job."""
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    results = work(rank, world)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()
