"""remat.pipelining checks that need no data between ranks, run one rank at a time over
PyTorch's fake process group (sends and receives complete at once, carrying nothing): the
ownership guard's negative controls, NeMo's entry points, refusals and receive-slot tags.

Usage: pipelining_fake_worker.py CHECK OUT_JSON [ARG]; prints nothing on success, writes results.
"""

import json
import logging
import sys

import torch
import torch.distributed as dist
from torch.distributed.pipelining import schedules
from torch.testing._internal.distributed.fake_pg import FakeStore

import remat
import remat.pipelining
from remat.pipelining import _pool

import pipelining_worker as parity

WORLD = 4


def as_rank(rank):
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", rank=rank, world_size=WORLD, store=FakeStore())


def step(schedule, stages):
    first = any(stage.is_first for stage in stages)
    last = any(stage.is_last for stage in stages)
    x = torch.randn(2 * parity.MICROBATCHES, parity.DIM)
    schedule.step(*((x,) if first else ()), target=torch.zeros_like(x) if last else None)


def one_slot_short(plan, rank):
    """The plan with the largest ring of `rank` one set smaller: (plan, stage, direction)."""
    entries = [e for e in plan["entries"] if e["rank"] == rank and e["received"] > 0 and e["min_slots"] >= 2]
    if not entries:
        return None
    worst = max(entries, key=lambda e: e["min_slots"])
    worst["ring_size"] = worst["min_slots"] - 1
    worst["slots"] = [None if s is None else s % worst["ring_size"] for s in worst["slots"]]
    return plan, worst["stage"], worst["direction"]


def guard(names):
    """Per schedule, the rank with the largest ring, one slot short: the guard must raise."""
    results = {}
    for name in names:
        caught = None
        for rank in range(WORLD):
            as_rank(rank)
            schedule, stages = parity.build(name, 0, rank, WORLD, ".", stock=False)
            layout = remat.pipelining._plan.layout_of(schedule)
            plan = remat.pipelining._plan.plan_of(layout, slack=0, use_closed_form=False)
            shortened = one_slot_short(plan, rank)
            if shortened is None:
                continue
            plan, stage, direction = shortened
            _pool.SchedulePool(layout, plan, "ring").install()
            try:
                step(schedule, stages)
                caught = {"rank": rank, "stage": stage, "direction": direction, "error": None}
            except remat.pipelining.RecvSlotInUse as error:
                caught = {"rank": rank, "stage": stage, "direction": direction, "error": str(error)}
            break
        results[name] = caught
    return results


def nemo(slack):
    """install_recv_buffer_pool on 1F1B: NeMo's ring sizes per stage and direction, one rank at a time."""
    logging.basicConfig(level=logging.WARNING)
    out = {"installed": remat.pipelining.install_recv_buffer_pool(slack=slack),
           "again": remat.pipelining.install_recv_buffer_pool(slack=slack + 5)}
    try:
        remat.pipelining.install_recv_buffer_pool(slack=-1)
        out["negative"] = None
    except ValueError as error:
        out["negative"] = str(error)
    out["rings"] = {}
    for rank in range(WORLD):
        as_rank(rank)
        schedule, stages = parity.build("1f1b", 0, rank, WORLD, ".", stock=False)
        step(schedule, stages)
        step(schedule, stages)
        out["rings"][rank] = remat.pipelining.recv_buffer_memory(schedule)
        # GPipe is not a 1F1B schedule: stock buffers, one set per microbatch.
        gpipe, gpipe_stages = parity.build("gpipe", 0, rank, WORLD, ".", stock=False)
        step(gpipe, gpipe_stages)
        out.setdefault("gpipe", {})[rank] = remat.pipelining.recv_buffer_memory(gpipe)
    return out


def nemo_per_stage(slack):
    """The later NeMo form, install_recv_buffer_pool(stage, slack=...): the 1F1B schedule running
    a stage given to it is pooled with NeMo's ring; a schedule whose stage was not given stays
    stock."""
    out = {"rings": {}, "stock": {}}
    for rank in range(WORLD):
        as_rank(rank)
        schedule, stages = parity.build("1f1b", 0, rank, WORLD, ".", stock=False)
        out["installed"] = all(remat.pipelining.install_recv_buffer_pool(stage, slack=slack) for stage in stages)
        step(schedule, stages)
        out["rings"][rank] = remat.pipelining.recv_buffer_memory(schedule)
        other, other_stages = parity.build("1f1b", 0, rank, WORLD, ".", stock=False)
        step(other, other_stages)
        out["stock"][rank] = remat.pipelining.recv_buffer_memory(other)
    try:
        remat.pipelining.install_recv_buffer_pool("stage 0", slack=slack)
        out["not_a_stage"] = None
    except TypeError as error:
        out["not_a_stage"] = str(error)
    return out


def unrecognised():
    """install_recv_buffer_pool where the adapted internals are missing: False, one warning."""
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("remat.pipelining").addHandler(handler)
    del schedules.PipelineScheduleSingle._initialize_stage
    installed = remat.pipelining.install_recv_buffer_pool()
    return {"installed": installed, "warnings": [r.getMessage() for r in records if r.levelno == logging.WARNING]}


def refusals():
    as_rank(1)
    out = {}

    def error_of(call):
        try:
            call()
        except Exception as error:  # noqa: BLE001 - the test reads the type and the message
            return [type(error).__name__, str(error)]
        return None

    schedule, stages = parity.build("1f1b", 0, 1, WORLD, ".", stock=False)
    out["negative_slack"] = error_of(lambda: remat.pipelining.pool_recv_buffers(schedule, slack=-1))
    out["bad_mode"] = error_of(lambda: remat.pipelining.pool_recv_buffers(schedule, mode="fifo"))
    out["not_a_schedule"] = error_of(lambda: remat.pipelining.pool_recv_buffers(stages[0]))
    out["untouched_after_refusals"] = "get_fwd_recv_ops" not in vars(stages[0])
    out["huge_slack"] = error_of(lambda: remat.pipelining.pool_recv_buffers(schedule, slack=10**12))
    remat.pipelining.pool_recv_buffers(schedule)
    out["twice"] = error_of(lambda: remat.pipelining.pool_recv_buffers(schedule))
    other = schedules.ScheduleGPipe(stages[0], parity.MICROBATCHES)  # a second schedule over the pooled stage
    out["second_schedule"] = error_of(lambda: remat.pipelining.pool_recv_buffers(other))

    after, after_stages = parity.build("1f1b", 0, 1, WORLD, ".", stock=False)
    step(after, after_stages)
    out["after_step"] = error_of(lambda: remat.pipelining.pool_recv_buffers(after))

    # A torch whose stages lack a method remat.pipelining wraps: refused before anything changes.
    renamed, renamed_stages = parity.build("1f1b", 0, 1, WORLD, ".", stock=False)
    stage_class = type(renamed_stages[0])
    saved = stage_class.get_local_bwd_output
    try:
        del type(renamed_stages[0]).__mro__[1].get_local_bwd_output
        out["renamed"] = error_of(lambda: remat.pipelining.pool_recv_buffers(renamed))
        out["renamed_untouched"] = "get_fwd_recv_ops" not in vars(renamed_stages[0])
    finally:
        type(renamed_stages[0]).__mro__[1].get_local_bwd_output = saved

    class OwnLoop(schedules.Schedule1F1B):
        def _step_microbatches(self, *args, **kwargs):
            return super()._step_microbatches(*args, **kwargs)

    own, _ = parity.build("gpipe", 0, 1, WORLD, ".", stock=False)
    own_stage = own._stage
    custom = OwnLoop(own_stage, parity.MICROBATCHES)
    out["own_loop"] = error_of(lambda: remat.pipelining.pool_recv_buffers(custom))
    return out


def tags(snapshot):
    """The ring buffers of rank 1's 1F1B stage, allocated through the tagging allocator."""
    as_rank(1)
    with remat.tag_cpu_tensors():
        schedule, stages = parity.build("1f1b", 0, 1, WORLD, ".", stock=False)
        plan = remat.pipelining.pool_recv_buffers(schedule)
        step(schedule, stages)
        import remat_alloc

        remat_alloc.dump_snapshot(snapshot)
        return {"plan": [e for e in plan["entries"] if e["rank"] == 1]}


def main():
    check, out_path = sys.argv[1], sys.argv[2]
    arg = sys.argv[3] if len(sys.argv) > 3 else None
    if check == "guard":
        result = guard(arg.split(","))
    elif check == "nemo":
        result = nemo(int(arg))
    elif check == "nemo_per_stage":
        result = nemo_per_stage(int(arg))
    elif check == "unrecognised":
        result = unrecognised()
    elif check == "refusals":
        result = refusals()
    else:
        result = tags(arg)
    with open(out_path, "w") as f:
        json.dump(result, f)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
