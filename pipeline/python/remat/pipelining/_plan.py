"""What a torch.distributed.pipelining schedule runs, and the plan of its receive buffers.

The order comes from the schedule object itself where PyTorch runs a lowered order (every
PipelineScheduleMulti runtime: its pipeline_order_with_comms, a CSV loaded with _load_csv
included) and from remat::pipeline_plan's step lowering where PyTorch's loop is hand-written
(ScheduleGPipe, Schedule1F1B). The plan is remat::pipeline_plan's, as `remat-report plan`
prints it; nothing here colors or sizes rings.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

from .. import _pipeline_plan
from . import _torch_internals as internals
from ._torch_internals import UnsupportedSchedule

__all__ = ["ScheduleLayout", "layout_of", "plan_of", "UnsupportedSchedule"]

# PyTorch's class names, as remat-report names the schedules.
_SINGLE_STAGE = {"ScheduleGPipe": "gpipe", "Schedule1F1B": "1f1b"}
_MULTI_STAGE = {
    "ScheduleInterleaved1F1B": "interleaved-1f1b",
    "ScheduleLoopedBFS": "looped-bfs",
    "ScheduleInterleavedZeroBubble": "interleaved-zero-bubble",
    "ScheduleZBVZeroBubble": "zbv-zero-bubble",
    "ScheduleDualPipeV": "dualpipev",
}


@dataclass
class ScheduleLayout:
    """One rank's view of a schedule: its stages and every rank's lowered order."""

    schedule: Any
    stages: list  # this rank's PipelineStage objects, by stage index
    name: str  # remat-report's schedule name; "" for one loaded from CSV or of another class
    lowering: str  # "step" (single-stage loops) or "runtime" (pipeline_order_with_comms)
    orders: list  # orders[rank]: that rank's actions in PyTorch's text
    stage_to_rank: list
    microbatches: int
    rank: int


def layout_of(schedule: Any, pooling: bool = True) -> ScheduleLayout:
    """The schedule's stages and lowered order; UnsupportedSchedule names what is missing or unknown.
    To pool its buffers (`pooling`), its stages must not have set them up yet."""
    single, stages, initialized, microbatches = internals.read_schedule(schedule)
    if initialized and pooling:
        raise RuntimeError(
            "remat.pipelining: the schedule's stages already allocated their receive buffers (step() has run); "
            "pool them after the schedule and its stages are built and before the first step()"
        )
    num_stages = stages[0].num_stages
    rank = stages[0].group_rank

    if single:
        name = internals.schedule_class_name(schedule, _SINGLE_STAGE)
        if not name or not internals.runs_stock_loop(schedule, "ScheduleGPipe" if name == "gpipe" else "Schedule1F1B"):
            raise UnsupportedSchedule(
                f"remat.pipelining: {type(schedule).__name__} runs its own _step_microbatches loop, whose order of "
                "receives is unknown here; the single-stage schedules it plans for are ScheduleGPipe and Schedule1F1B "
                "(or write the order as a CSV and load it into a _PipelineScheduleRuntime)"
            )
        orders = _pipeline_plan.step_order(name, num_stages, microbatches)
        return ScheduleLayout(schedule, stages, name, "step", orders, list(range(num_stages)), microbatches, rank)

    lowered = internals.lowered_orders(schedule)
    if lowered is None:
        raise UnsupportedSchedule(
            f"remat.pipelining: {type(schedule).__name__} is a PipelineScheduleMulti without the action runtime "
            "(_PipelineScheduleRuntime): its loop posts receives in an order not written down anywhere; use one of "
            "PyTorch's multi-stage schedules or load the order into a _PipelineScheduleRuntime with _load_csv"
        )
    orders, stage_to_rank = lowered
    return ScheduleLayout(schedule, stages, internals.schedule_class_name(schedule, _MULTI_STAGE), "runtime", orders,
                          stage_to_rank, microbatches, rank)


def plan_of(layout: ScheduleLayout, *, slack: int, use_closed_form: bool,
            buffer_bytes: Optional[int] = None) -> dict:
    """remat::pipeline_plan's `pipeline-plan` dump for the layout, as a dict.

    With use_closed_form, NeMo's closed form sets the 1F1B rings where it is safe (slack is
    NeMo's); otherwise every ring is the colored minimum plus `slack` spare sets.
    """
    text = _pipeline_plan.plan_json(
        layout.orders, layout.stage_to_rank, layout.microbatches, schedule=layout.name, lowering=layout.lowering,
        slack=slack, spare_sets=0 if use_closed_form else slack,
        use_closed_form=use_closed_form, buffer_bytes=buffer_bytes)
    return json.loads(text)
