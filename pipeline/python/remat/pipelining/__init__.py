"""Pooled receive buffers for torch.distributed.pipelining schedules.

PyTorch's pipeline stages allocate one full-size receive buffer per microbatch and direction
for the whole step. ``pool_recv_buffers(schedule)`` replaces them, per local stage and
direction, by a ring of real buffer sets sized and slotted by remat's planner from the
order the schedule really runs (``remat-report plan`` prints the same plan), or allocates
each buffer just in time. NeMo AutoModel's entry points are here too, with NeMo's
semantics, except that a closed-form ring smaller than the colored minimum is never used.

    schedule = ScheduleInterleaved1F1B(stages, n_microbatches=16, loss_fn=loss_fn)
    plan = remat.pipelining.pool_recv_buffers(schedule)   # before the first step()
    schedule.step(x, target=y)

Before a job runs, profile_stage measures what each stage costs on one microbatch and
predict(profiles, schedule, ...) gives each rank's peak (as `remat-report predict`).
"""

from __future__ import annotations

import logging
import weakref
from typing import Any, Optional

from .. import _pipeline_plan
from . import _torch_internals as internals
from ._plan import UnsupportedSchedule, layout_of, plan_of
from ._pool import RecvSlotInUse, SchedulePool
from ._predict import predict
from ._profile import profile_stage

__all__ = [
    "pool_recv_buffers",
    "recv_buffer_memory",
    "RecvSlotInUse",
    "UnsupportedSchedule",
    "install_recv_buffer_pool",
    "install_interleaved_recv_pool",
    "schedule_supports_recv_pool",
    "profile_stage",
    "predict",
]

logger = logging.getLogger(__name__)

_POOL_ATTRIBUTE = "_remat_recv_pool"
_POOLED_BY_ATTRIBUTE = "_remat_recv_pool_schedule"  # on each pooled stage: a weak reference to its schedule
# Spare buffer sets per ring: more than a step's microbatches are never used, and the planner
# counts them in a C int.
_MAX_SLACK = 1 << 16


def _check_slack(slack: Any, api: str) -> int:
    if isinstance(slack, bool) or not isinstance(slack, int):
        raise TypeError(f"{api}: slack must be an int, got {type(slack).__name__}")
    if slack < 0:
        raise ValueError(f"{api}: slack must be >= 0, got {slack}")
    if slack > _MAX_SLACK:
        raise ValueError(f"{api}: slack must be at most {_MAX_SLACK} (spare buffer sets per ring; more than a step's "
                         f"microbatches are never used), got {slack}")
    return slack


def _install_pool(schedule: Any, *, slack: int, mode: str, closed_form: bool) -> dict:
    if getattr(schedule, _POOL_ATTRIBUTE, None) is not None:
        raise RuntimeError("remat.pipelining: this schedule's receive buffers are pooled already; pool a schedule once")
    layout = layout_of(schedule)  # refuses what is no schedule, before anything changes
    for stage in internals.stages_of(schedule):
        owner = getattr(stage, _POOLED_BY_ATTRIBUTE, None)
        if owner is not None and owner() is not None:
            # The pool patches the stage for its own schedule's order: another schedule
            # running the same stages would hand out slots that plan never saw.
            raise RuntimeError(f"remat.pipelining: these stages are pooled by another schedule "
                               f"({type(owner()).__name__}, at stage {stage.stage_index}), whose pool runs them in "
                               "its own order; build separate stages for each schedule you pool, or pool only one")
    plan = plan_of(layout, slack=slack, use_closed_form=closed_form)
    pool = SchedulePool(layout, plan, mode)
    pool.install()
    setattr(schedule, _POOL_ATTRIBUTE, pool)
    for stage in internals.stages_of(schedule):
        setattr(stage, _POOLED_BY_ATTRIBUTE, weakref.ref(schedule))
    return plan


def pool_recv_buffers(schedule: Any, *, slack: int = 0, mode: str = "ring") -> dict:
    """Pools the receive buffers of this rank's stages of `schedule`; returns the plan.

    Call after the schedule and its stages are built and before the first ``step()``.
    mode:
      - "ring": per stage and direction, a ring of the colored minimum plus `slack` spare
        buffer sets (spares lengthen the time between a slot's release and its reuse);
      - "shared_ring": one ring per direction for all of this rank's stages whose buffers
        have the same shapes (interleaved and V schedules), the colored minimum of them all.
        A shared ring takes no spare sets (the planner colors every stage's receives together
        at that minimum), so `slack` reaches only a stage whose shapes differ from the others',
        which keeps a ring of its own; use mode "ring" for spares on every stage;
      - "just_in_time": each buffer set allocated at its receive and dropped after its last
        reader (the peak is the live set; no fixed addresses).
    Returns the `pipeline-plan` dump (schemas/pipeline-plan.schema.json) as a dict.
    Raises UnsupportedSchedule, before changing anything, where the schedule or this torch is
    not the layout adapted here; RecvSlotInUse during a step where a slot is handed to a
    microbatch while its previous holder still needs it (an order the plan did not see).
    """
    slack = _check_slack(slack, "pool_recv_buffers")
    return _install_pool(schedule, slack=slack, mode=mode, closed_form=False)


def recv_buffer_memory(schedule: Any) -> list:
    """The receive buffers this rank's stages hold, per stage (or shared ring) and direction.

    Each row: ``stages``, ``direction`` ("F" activations, "B" gradients), ``sets`` and
    ``bytes`` held between steps, ``peak_sets`` and ``peak_bytes`` held at once during the
    last step (just in time: the live set; otherwise what is held). Works on a stock
    schedule too, counting the stage's own buffers, after its first step.
    """
    pool = getattr(schedule, _POOL_ATTRIBUTE, None)
    if pool is not None:
        return pool.memory()
    return _stock_memory(internals.read_schedule(schedule)[1])  # refuses what is no schedule


def _stock_memory(stages: list) -> list:
    local = {stage.stage_index for stage in stages}
    rows = []
    for stage in sorted(stages, key=lambda s: s.stage_index):
        for direction, receives in (("F", not stage.is_first and stage.stage_index - 1 not in local),
                                    ("B", not stage.is_last and stage.stage_index + 1 not in local)):
            infos = internals.recv_infos(stage, direction)
            if not receives or not infos:
                continue
            storages = {}
            for records in infos.values():
                for buffer in map(internals.buffer_of, internals.received(records)):
                    if buffer.numel() > 0:
                        storage = buffer.untyped_storage()
                        storages[storage.data_ptr()] = storage.nbytes()
            per_set = len(internals.received(infos[0])) or 1
            sets = len(storages) // per_set
            total = sum(storages.values())
            rows.append({"stages": [stage.stage_index], "direction": direction, "sets": sets, "bytes": total,
                         "peak_sets": sets, "peak_bytes": total})
    return rows


# NeMo AutoModel's entry points (nemo_automodel.components.distributed.pipelining.recv_buffer_pool).

_installed_slack: Optional[int] = None  # process-wide (NeMo 0.7.0's form), once installed
_STAGE_SLACK_ATTRIBUTE = "_remat_nemo_recv_pool_slack"  # on a stage given to the per-stage form
_first_step_hooked = False


def schedule_supports_recv_pool(pp_schedule: Optional[str]) -> bool:
    """NeMo's gate for its closed-form ring: True for "1f1b" (any letter case) only.

    pool_recv_buffers covers every schedule; this answers NeMo's question, whether its
    closed form max(2, min(M, S - s + slack)) applies.
    """
    return pp_schedule is not None and _pipeline_plan.schedule_supports_recv_pool(pp_schedule)


def _pool_at_first_step(schedule: Any) -> None:
    """At a Schedule1F1B's first step: pools it where install_recv_buffer_pool asked for it."""
    if getattr(schedule, _POOL_ATTRIBUTE, None) is not None:
        return
    slack = _installed_slack
    if slack is None:
        marked = [getattr(stage, _STAGE_SLACK_ATTRIBUTE, None) for stage in internals.stages_of(schedule)]
        slack = next((given for given in marked if given is not None), None)
    if slack is not None:
        _install_pool(schedule, slack=slack, mode="ring", closed_form=True)


def install_recv_buffer_pool(stage: Any = None, *, slack: int = 2) -> bool:
    """Pools the receive buffers of Schedule1F1B, as NeMo does, in either of NeMo's forms:

        install_recv_buffer_pool(slack=2)          # NeMo 0.7.0: every Schedule1F1B from now on
        install_recv_buffer_pool(stage, slack=2)   # later NeMo: the Schedule1F1B that runs `stage`

    The process-wide form is idempotent: the first call's `slack` wins (a bare int as the first
    argument is that form's slack, as NeMo 0.7.0 took it). Each 1F1B stage gets NeMo's ring of
    max(2, min(M, S - s + slack)) buffer sets, microbatch m in set m % K, at the schedule's first
    step, where that ring is at least the colored minimum of the order Schedule1F1B runs;
    elsewhere the colored minimum (NeMo would use its smaller ring and corrupt gradients).
    Returns True when installed (or already installed); False, with one warning, where the
    torch internals it adapts are not recognised (stock behaviour is kept). A negative slack is
    a ValueError.
    """
    global _installed_slack, _first_step_hooked
    if isinstance(stage, int) and not isinstance(stage, bool):  # NeMo 0.7.0: install_recv_buffer_pool(3)
        stage, slack = None, stage
    slack = _check_slack(slack, "install_recv_buffer_pool")
    if stage is not None and not (hasattr(stage, "stage_index") and hasattr(stage, "num_stages")):
        raise TypeError(f"install_recv_buffer_pool: stage must be a torch.distributed.pipelining stage, got "
                        f"{type(stage).__name__}; or call install_recv_buffer_pool(slack=...) for every 1F1B schedule")
    if stage is None and _installed_slack is not None:
        return True
    if not _first_step_hooked:
        try:
            internals.on_first_1f1b_step(_pool_at_first_step)
        except UnsupportedSchedule as error:
            logger.warning("remat.pipelining: torch internals not recognised, receive buffers stay stock: %s", error)
            return False
        _first_step_hooked = True
    if stage is None:
        _installed_slack = slack
    else:
        setattr(stage, _STAGE_SLACK_ATTRIBUTE, slack)
    return True


def install_interleaved_recv_pool(schedule: Any, slack: int = 2) -> bool:
    """Pools one multi-stage schedule's receive buffers (Interleaved1F1B and the others).

    Rings of the colored minimum plus `slack` spare sets, per stage and direction, as
    pool_recv_buffers(schedule, slack=slack). Returns True when pooled; False, with one
    warning, where the schedule or the torch internals are not recognised (stock behaviour
    is kept). A negative slack is a ValueError.
    """
    slack = _check_slack(slack, "install_interleaved_recv_pool")
    try:
        _install_pool(schedule, slack=slack, mode="ring", closed_form=False)
    except UnsupportedSchedule as error:
        logger.warning("%s", error)
        return False
    return True
