"""Every use of torch.distributed.pipelining's private internals, in this one module.

remat.pipelining reads schedules' private attributes, wraps thirteen PipelineStage methods,
rewrites the stage's receive records (_RecvInfo) and hooks Schedule1F1B's stage setup. None
of that is public API, so it all lives here: a torch upgrade is checked and adapted in this
file alone. KNOWN_TORCH lists the releases whose internals this was written against. On any
other torch the names are checked before anything changes, and a missing one is
UnsupportedSchedule naming it.

The rest of the package sees a stage through StageHooks: the pool says what it pools, and
hears each receive, each action a microbatch runs, each handoff and each new step.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Protocol

__all__ = [
    "KNOWN_TORCH", "UnsupportedSchedule", "StageHooks", "RAN_F", "RAN_B", "RAN_I", "RAN_W", "SENT_F", "SENT_B",
    "HANDED_B", "require", "torch_version", "stages_of", "read_schedule", "schedule_class_name",
    "runs_stock_loop", "lowered_orders", "recv_infos", "received", "buffer_of", "with_buffer", "set_buffer",
    "wrap_stage", "on_first_1f1b_step",
]

KNOWN_TORCH = ("2.11",)

# What a microbatch has run on a stage, as the stage's methods tell it: F, B (full backward),
# I (input gradients), W (weight gradients), its sends, and the handoff of its input gradient
# to the previous stage on the same rank.
RAN_F, RAN_B, RAN_I, RAN_W, SENT_F, SENT_B, HANDED_B = (1 << bit for bit in range(7))

# The stage methods wrap_stage wraps, and the attributes read from a stage.
STAGE_METHODS = (
    "_prepare_forward_infra", "_prepare_backward_infra", "get_fwd_recv_ops", "get_bwd_recv_ops", "get_fwd_send_ops",
    "get_bwd_send_ops", "forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk",
    "clear_runtime_states", "set_local_fwd_input", "set_local_bwd_input", "get_local_bwd_output",
)
STAGE_ATTRIBUTES = STAGE_METHODS + (
    "args_recv_info", "grad_recv_info", "output_chunks", "stage_index", "num_stages", "group_rank", "group_size",
    "stage_index_to_group_rank", "is_first", "is_last", "has_backward",
)


class UnsupportedSchedule(TypeError):
    """A schedule, or a PyTorch build, whose internals are not the ones remat.pipelining adapts."""


def torch_version() -> str:
    import torch

    return torch.__version__


def require(owner: Any, names: tuple, what: str) -> None:
    missing = [name for name in names if not hasattr(owner, name)]
    if missing:
        raise UnsupportedSchedule(
            f"remat.pipelining: {what} has no {', '.join(missing)}; this torch ({torch_version()}) is not the "
            f"torch.distributed.pipelining layout remat.pipelining adapts (PyTorch {', '.join(KNOWN_TORCH)}'s "
            "PipelineStage and schedules). Nothing was changed; run without pooled receive buffers."
        )


# Schedules.

def stages_of(schedule: Any) -> list:
    """The schedule's stages on this rank, as it holds them."""
    stages = getattr(schedule, "_stages", None)
    return list(stages) if stages is not None else [schedule._stage]


def read_schedule(schedule: Any) -> tuple:
    """(single_stage, stages by index, whether they set up their buffers, microbatches per step).

    UnsupportedSchedule where `schedule` is no torch.distributed.pipelining schedule, or one
    without the attributes read here.
    """
    from torch.distributed.pipelining import schedules

    if isinstance(schedule, schedules.PipelineScheduleSingle):
        require(schedule, ("_stage", "_n_microbatches", "_stage_forward_initialized"), type(schedule).__name__)
        single, stages, initialized = True, [schedule._stage], schedule._stage_forward_initialized
    elif isinstance(schedule, schedules.PipelineScheduleMulti):
        require(schedule, ("_stages", "_n_microbatches", "_stages_forward_initialized", "stage_index_to_group_rank"),
                type(schedule).__name__)
        single = False
        stages = sorted(schedule._stages, key=lambda stage: stage.stage_index)
        initialized = schedule._stages_forward_initialized
    else:
        raise UnsupportedSchedule(
            f"remat.pipelining: {type(schedule).__name__} is not a torch.distributed.pipelining schedule "
            "(PipelineScheduleSingle or PipelineScheduleMulti); pass the schedule object whose step() you call"
        )
    for stage in stages:
        require(stage, STAGE_ATTRIBUTES, f"stage {getattr(stage, 'stage_index', '?')} ({type(stage).__name__})")
    return single, stages, bool(initialized), int(schedule._n_microbatches)


def schedule_class_name(schedule: Any, names: dict) -> str:
    """names[class name] for the first of PyTorch's own schedule classes `schedule` is; "" for none."""
    for cls in type(schedule).__mro__:
        if cls.__name__ in names and cls.__module__.startswith("torch.distributed.pipelining"):
            return names[cls.__name__]
    return ""


def runs_stock_loop(schedule: Any, class_name: str) -> bool:
    """Whether a single-stage schedule steps with PyTorch's own loop of `class_name`."""
    from torch.distributed.pipelining import schedules

    return type(schedule)._step_microbatches is getattr(schedules, class_name)._step_microbatches


def lowered_orders(schedule: Any) -> Optional[tuple]:
    """A multi-stage schedule's (orders per rank as text, the rank of each stage), as its action
    runtime runs them; None where the schedule has no such runtime. RuntimeError where the
    order is not lowered yet."""
    from torch.distributed.pipelining import schedules

    if not isinstance(schedule, schedules._PipelineScheduleRuntime):
        return None
    lowered = getattr(schedule, "pipeline_order_with_comms", None)
    if not lowered:
        raise RuntimeError(
            f"remat.pipelining: {type(schedule).__name__} has no lowered order yet (pipeline_order_with_comms is "
            "empty); call _load_csv or _prepare_schedule_with_comms first, then pool the receive buffers"
        )
    first = stages_of(schedule)[0]
    orders = [[None if action is None else str(action) for action in lowered.get(r, [])]
              for r in range(first.group_size)]
    mapping = schedule.stage_index_to_group_rank
    return orders, [int(mapping[s]) for s in range(first.num_stages)]


# A stage's receive records: per microbatch, a tuple of records, the received ones (_RecvInfo)
# holding the buffer the receive writes into.

def recv_infos(stage: Any, direction: str) -> dict:
    """The stage's records per microbatch: "F" activations, "B" gradients."""
    return stage.args_recv_info if direction == "F" else stage.grad_recv_info


def received(records: tuple) -> list:
    """The records of one microbatch that are received (not handed over on the rank)."""
    from torch.distributed.pipelining.stage import _RecvInfo

    return [record for record in records if isinstance(record, _RecvInfo)]


def buffer_of(record: Any) -> Any:
    return record.buffer


def set_buffer(record: Any, buffer: Any) -> None:
    record.buffer = buffer


def with_buffer(record: Any, buffer: Any) -> Any:
    import copy

    fresh = copy.copy(record)
    fresh.buffer = buffer
    return fresh


# Wrapping a stage.

class StageHooks(Protocol):
    """What the pool does at a stage's methods; `direction` is "F" or "B"."""

    def pools(self, direction: str) -> bool:
        """Whether the stage's receive buffers in `direction` are the pool's (set up once, then set_up)."""

    def set_up(self, direction: str, infos: dict, microbatches: int) -> None:
        """infos[0] holds the one set of records the stage made; fill infos[0..microbatches-1]."""

    def before_receive(self, direction: str, mb: int) -> None:
        """The receive of `mb` is about to be posted."""

    def handed_over(self, direction: str, mb: int) -> None:
        """`mb`'s input in `direction` came from a stage on this rank, not a receive."""

    def ran(self, mb: int, action: int) -> None:
        """`mb` ran `action` (RAN_F, ..., HANDED_B) on the stage."""

    def unaliased(self, value: Any) -> Any:
        """`value` with every tensor sharing a pooled buffer's storage replaced by a copy."""

    def new_step(self) -> None:
        """The stage clears its state for the next step."""


def wrap_stage(stage: Any, hooks: StageHooks) -> Callable[[], None]:
    """The stage's methods wrapped to call `hooks`; returns what installs them all at once."""
    original = {name: getattr(stage, name) for name in STAGE_METHODS}

    def _prepare_forward_infra(num_microbatches, args, kwargs=None):
        if not hooks.pools("F"):
            return original["_prepare_forward_infra"](num_microbatches, args, kwargs)
        outputs = original["_prepare_forward_infra"](1, args, kwargs)
        hooks.set_up("F", stage.args_recv_info, num_microbatches)
        return outputs

    def _prepare_backward_infra(num_microbatches):
        if not hooks.pools("B"):
            return original["_prepare_backward_infra"](num_microbatches)
        result = original["_prepare_backward_infra"](1)
        stage.chunks = num_microbatches  # the schedule reads it as the step's microbatch count
        hooks.set_up("B", stage.grad_recv_info, num_microbatches)
        return result

    def get_fwd_recv_ops(fwd_chunk_id):
        hooks.before_receive("F", fwd_chunk_id)
        return original["get_fwd_recv_ops"](fwd_chunk_id)

    def get_bwd_recv_ops(bwd_chunk_id):
        if stage.has_backward:
            hooks.before_receive("B", bwd_chunk_id)
        return original["get_bwd_recv_ops"](bwd_chunk_id)

    def unaliased_ops(ops):
        # A send still in flight when its slot is received into again would send new data.
        out = []
        for op in ops:
            tensor = hooks.unaliased(op.tensor)
            out.append(op if tensor is op.tensor else type(op)(op.op, tensor, op.peer, op.group, op.tag))
        return out

    def get_fwd_send_ops(fwd_chunk_id):
        ops = unaliased_ops(original["get_fwd_send_ops"](fwd_chunk_id))
        hooks.ran(fwd_chunk_id, SENT_F)
        return ops

    def get_bwd_send_ops(bwd_chunk_id):
        ops = unaliased_ops(original["get_bwd_send_ops"](bwd_chunk_id))
        hooks.ran(bwd_chunk_id, SENT_B)
        return ops

    def forward_one_chunk(fwd_chunk_id, *args, **kwargs):
        output = original["forward_one_chunk"](fwd_chunk_id, *args, **kwargs)
        if stage.is_last and stage.output_chunks and stage.output_chunks[-1] is output:
            # The merged output is read at the end of the step, after the slot was reused.
            stage.output_chunks[-1] = hooks.unaliased(output)
        hooks.ran(fwd_chunk_id, RAN_F)
        return output

    def backward_one_chunk(bwd_chunk_id, loss=None, full_backward=True, last_backward=False):
        result = original["backward_one_chunk"](bwd_chunk_id, loss=loss, full_backward=full_backward,
                                                last_backward=last_backward)
        hooks.ran(bwd_chunk_id, RAN_B if full_backward else RAN_I)
        return result

    def backward_weight_one_chunk(bwd_chunk_id, last_backward=False):
        result = original["backward_weight_one_chunk"](bwd_chunk_id, last_backward=last_backward)
        hooks.ran(bwd_chunk_id, RAN_W)
        return result

    def clear_runtime_states():
        hooks.new_step()
        return original["clear_runtime_states"]()

    def set_local_fwd_input(prev_stage_outputs, mb_index):
        original["set_local_fwd_input"](hooks.unaliased(prev_stage_outputs), mb_index)
        hooks.handed_over("F", mb_index)

    def set_local_bwd_input(next_stage_bwd_outputs, mb_index):
        original["set_local_bwd_input"](next_stage_bwd_outputs, mb_index)
        hooks.handed_over("B", mb_index)

    def get_local_bwd_output(mb_index):
        grads = hooks.unaliased(original["get_local_bwd_output"](mb_index))
        hooks.ran(mb_index, HANDED_B)
        return grads

    wrappers = {
        "_prepare_forward_infra": _prepare_forward_infra, "_prepare_backward_infra": _prepare_backward_infra,
        "get_fwd_recv_ops": get_fwd_recv_ops, "get_bwd_recv_ops": get_bwd_recv_ops,
        "get_fwd_send_ops": get_fwd_send_ops, "get_bwd_send_ops": get_bwd_send_ops,
        "forward_one_chunk": forward_one_chunk, "backward_one_chunk": backward_one_chunk,
        "backward_weight_one_chunk": backward_weight_one_chunk, "clear_runtime_states": clear_runtime_states,
        "set_local_fwd_input": set_local_fwd_input, "set_local_bwd_input": set_local_bwd_input,
        "get_local_bwd_output": get_local_bwd_output,
    }

    def install() -> None:
        for name, function in wrappers.items():
            setattr(stage, name, function)

    return install


def on_first_1f1b_step(before: Callable[[Any], None]) -> None:
    """Calls before(schedule) when a Schedule1F1B (not a subclass) sets up its stage, at its
    first step, for every such schedule from now on. UnsupportedSchedule where the internals
    this hooks are missing; nothing changes then."""
    try:
        from torch.distributed.pipelining import schedules, stage
    except ImportError as error:
        raise UnsupportedSchedule(f"remat.pipelining: torch.distributed.pipelining does not import: {error}") from error
    one_f_one_b = schedules.Schedule1F1B
    require(one_f_one_b, ("_initialize_stage",), "Schedule1F1B")
    require(stage.PipelineStage, STAGE_METHODS, "PipelineStage")
    require(stage, ("_RecvInfo",), "torch.distributed.pipelining.stage")
    original = one_f_one_b._initialize_stage

    def _initialize_stage(self, args, kwargs):
        if type(self) is one_f_one_b and not self._stage_forward_initialized:
            before(self)
        return original(self, args, kwargs)

    one_f_one_b._initialize_stage = _initialize_stage


def stage_backward_functions():
    """PyTorch's own stage backward functions (full, input part, weight part), which
    profile_stage measures a stage through, as the pipeline stage runs them."""
    from torch.distributed.pipelining import _backward

    return _backward.stage_backward, _backward.stage_backward_input, _backward.stage_backward_weight
