"""One rank of the prediction job (started by test_pipeline_predict.py, 4 ranks, Gloo): for each
case, trains a tiny Llama split over the ranks with every CPU tensor through remat's tagging
allocator, and records the rank's peak allocated over a steady step (the second: receive
buffers and optimizer state exist), optimizer step included, and a snapshot.
Usage: pipeline_predict_worker.py OUT_DIR CASES_JSON   (RANK, WORLD_SIZE, MASTER_* set)
"""

import gc
import json
import os
import sys

import remat_alloc
import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, schedules

import pipeline_llama as llama
from gloo_rank import run_rank
import remat
import remat.pipelining

CLASSES = {"gpipe": schedules.ScheduleGPipe, "1f1b": schedules.Schedule1F1B,
           "interleaved-1f1b": schedules.ScheduleInterleaved1F1B, "zbv-zero-bubble": schedules.ScheduleZBVZeroBubble,
           "dualpipev": schedules.ScheduleDualPipeV}


def stage_indices(name, rank, world):
    if name in ("gpipe", "1f1b"):
        return [rank]
    if name in ("zbv-zero-bubble", "dualpipev"):
        return [rank, 2 * world - 1 - rank]
    return [rank, rank + world]


def without_self_sends(stage, rank):
    # Gloo cannot send to its own rank: PyTorch's first-step neighbour exchange skips it here.
    exchange = stage._get_init_p2p_neighbors_ops
    stage._get_init_p2p_neighbors_ops = lambda: [op for op in exchange() if op.group_peer != rank]


def run_case(case, rank, world):
    gc.collect()
    name, split, microbatches = case["schedule"], case["split"], case["microbatches"]
    num_stages = len(split)
    remat_alloc.reset_peak_stats(0)
    stages = []
    for index in stage_indices(name, rank, world):
        module = llama.stage_module(index, num_stages, split, case["checkpoint"])
        x, _ = llama.example_microbatch(index)
        stage = PipelineStage(module, index, num_stages, torch.device("cpu"), input_args=(x,))
        without_self_sends(stage, rank)
        stages.append(stage)
    cls = CLASSES[name]
    schedule = cls(stages[0] if name in ("gpipe", "1f1b") else stages, microbatches, loss_fn=llama.loss_fn)
    if case["buffers"] == "pooled":
        remat.pipelining.pool_recv_buffers(schedule)
    params = [p for stage in stages for p in stage.submod.parameters()]
    optimizer = llama.optimizer(params)
    generator = torch.Generator().manual_seed(11)
    ids = torch.randint(0, llama.VOCAB, (llama.MICROBATCH * microbatches, llama.SEQ), generator=generator)
    target = ids.clone()
    first = any(stage.is_first for stage in stages)
    last = any(stage.is_last for stage in stages)
    peak = 0
    for step in range(2):
        if step == 1:
            remat_alloc.reset_peak_stats(0)
        schedule.step(*((ids,) if first else ()), target=target if last else None)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        peak = remat_alloc.memory_stats(0)["allocated_bytes_peak"]
    return peak


def main():
    out_dir, cases = sys.argv[1], json.loads(sys.argv[2])

    def peaks(rank, world):
        results = []
        with remat.tag_cpu_tensors():
            for i, case in enumerate(cases):
                peak = run_case(case, rank, world)
                case_dir = os.path.join(out_dir, f"case{i}")
                os.makedirs(case_dir, exist_ok=True)
                remat_alloc.dump_snapshot(os.path.join(case_dir, f"snapshot-rank{rank}.json"))
                results.append(peak)
                dist.barrier()
        return results

    run_rank(out_dir, peaks)


if __name__ == "__main__":
    main()
