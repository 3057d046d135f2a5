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

__all__ = ["ScheduleLayout", "layout_of", "plan_of", "UnsupportedSchedule", "STAGE_METHODS"]

# PyTorch's class names, as remat-report names the schedules.
_SINGLE_STAGE = {"ScheduleGPipe": "gpipe", "Schedule1F1B": "1f1b"}
_MULTI_STAGE = {
    "ScheduleInterleaved1F1B": "interleaved-1f1b",
    "ScheduleLoopedBFS": "looped-bfs",
    "ScheduleInterleavedZeroBubble": "interleaved-zero-bubble",
    "ScheduleZBVZeroBubble": "zbv-zero-bubble",
    "ScheduleDualPipeV": "dualpipev",
}


class UnsupportedSchedule(TypeError):
    """A schedule, or a PyTorch build, whose internals are not the ones remat.pipelining adapts."""


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


def _require(owner: Any, names: tuple, what: str) -> None:
    missing = [name for name in names if not hasattr(owner, name)]
    if missing:
        raise UnsupportedSchedule(
            f"remat.pipelining: {what} has no {', '.join(missing)}; this torch "
            f"({_torch_version()}) is not the torch.distributed.pipelining layout remat.pipelining adapts "
            "(PyTorch 2.11's PipelineStage and schedules). Nothing was changed; run without pooled receive buffers."
        )


def _torch_version() -> str:
    import torch

    return torch.__version__


def _class_named(schedule: Any, names: dict) -> str:
    for cls in type(schedule).__mro__:
        if cls.__name__ in names and cls.__module__.startswith("torch.distributed.pipelining"):
            return names[cls.__name__]
    return ""


# The stage methods remat.pipelining wraps, and the attributes it reads.
STAGE_METHODS = (
    "_prepare_forward_infra", "_prepare_backward_infra", "get_fwd_recv_ops", "get_bwd_recv_ops", "get_fwd_send_ops",
    "get_bwd_send_ops", "forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk",
    "clear_runtime_states", "set_local_fwd_input", "set_local_bwd_input", "get_local_bwd_output",
)
_STAGE_ATTRIBUTES = STAGE_METHODS + (
    "args_recv_info", "grad_recv_info", "output_chunks", "stage_index", "num_stages", "group_rank", "group_size",
    "stage_index_to_group_rank", "is_first", "is_last", "has_backward",
)


def layout_of(schedule: Any) -> ScheduleLayout:
    """The schedule's stages and lowered order; UnsupportedSchedule names what is missing or unknown."""
    from torch.distributed.pipelining import schedules

    if isinstance(schedule, schedules.PipelineScheduleSingle):
        _require(schedule, ("_stage", "_n_microbatches", "_stage_forward_initialized"), type(schedule).__name__)
        stages = [schedule._stage]
        initialized = schedule._stage_forward_initialized
    elif isinstance(schedule, schedules.PipelineScheduleMulti):
        _require(schedule, ("_stages", "_n_microbatches", "_stages_forward_initialized", "stage_index_to_group_rank"),
                 type(schedule).__name__)
        stages = sorted(schedule._stages, key=lambda stage: stage.stage_index)
        initialized = schedule._stages_forward_initialized
    else:
        raise UnsupportedSchedule(
            f"remat.pipelining: {type(schedule).__name__} is not a torch.distributed.pipelining schedule "
            "(PipelineScheduleSingle or PipelineScheduleMulti); pass the schedule object whose step() you call"
        )
    for stage in stages:
        _require(stage, _STAGE_ATTRIBUTES, f"stage {getattr(stage, 'stage_index', '?')} ({type(stage).__name__})")
    if initialized:
        raise RuntimeError(
            "remat.pipelining: the schedule's stages already allocated their receive buffers (step() has run); "
            "pool them after the schedule and its stages are built and before the first step()"
        )
    microbatches = int(schedule._n_microbatches)
    num_stages = stages[0].num_stages
    rank = stages[0].group_rank

    if isinstance(schedule, schedules.PipelineScheduleSingle):
        name = _class_named(schedule, _SINGLE_STAGE)
        own_loop = type(schedule)._step_microbatches
        if not name or own_loop is not getattr(schedules, "ScheduleGPipe" if name == "gpipe" else "Schedule1F1B")._step_microbatches:
            raise UnsupportedSchedule(
                f"remat.pipelining: {type(schedule).__name__} runs its own _step_microbatches loop, whose order of "
                "receives is unknown here; the single-stage schedules it plans for are ScheduleGPipe and Schedule1F1B "
                "(or write the order as a CSV and load it into a _PipelineScheduleRuntime)"
            )
        orders = _pipeline_plan.step_order(name, num_stages, microbatches)
        return ScheduleLayout(schedule, stages, name, "step", orders, list(range(num_stages)), microbatches, rank)

    if not isinstance(schedule, schedules._PipelineScheduleRuntime):
        raise UnsupportedSchedule(
            f"remat.pipelining: {type(schedule).__name__} is a PipelineScheduleMulti without the action runtime "
            "(_PipelineScheduleRuntime): its loop posts receives in an order not written down anywhere; use one of "
            "PyTorch's multi-stage schedules or load the order into a _PipelineScheduleRuntime with _load_csv"
        )
    lowered = getattr(schedule, "pipeline_order_with_comms", None)
    if not lowered:
        raise RuntimeError(
            f"remat.pipelining: {type(schedule).__name__} has no lowered order yet (pipeline_order_with_comms is "
            "empty); call _load_csv or _prepare_schedule_with_comms first, then pool the receive buffers"
        )
    ranks = stages[0].group_size
    orders = [[None if action is None else str(action) for action in lowered.get(r, [])] for r in range(ranks)]
    mapping = schedule.stage_index_to_group_rank
    stage_to_rank = [int(mapping[s]) for s in range(num_stages)]
    return ScheduleLayout(schedule, stages, _class_named(schedule, _MULTI_STAGE), "runtime", orders, stage_to_rank,
                          microbatches, rank)


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
