"""Each rank's memory peak before a pipeline job runs, from stage profiles and a schedule.

The prediction is remat::pipeline_plan's, through remat._pipeline_plan, exactly what
`remat-report predict` prints: every rank's lowered order walked with the profiles' figures
(what a forward keeps until its backward, what a send holds until it is waited for, the
receive buffers, the transients), the peak, the action at which it happens and its parts.
Nothing here predicts; this module only gathers the schedule and the profiles.

    profiles = [remat.pipelining.profile_stage(m, x, stage_index=i, num_stages=4, model="m") for i, m in ...]
    remat.pipelining.predict(profiles, schedule="1f1b", ranks=4, microbatches=8)
    remat.pipelining.predict(profiles, schedule=my_schedule)          # a built torch schedule object
    remat.pipelining.predict(profiles, schedule="zbv-zero-bubble", ranks=2, microbatches=16, buffers="pooled")
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional, Sequence

from .. import _pipeline_plan

__all__ = ["predict"]

# What PyTorch runs for each schedule name: its own loop for GPipe and 1F1B, the action runtime for the rest.
_STEP_LOOPS = {"gpipe", "1f1b"}


def _profile_text(profile: Any, index: int) -> str:
    if isinstance(profile, dict):
        return json.dumps(profile)
    if isinstance(profile, (str, os.PathLike)):
        with open(profile, encoding="utf-8") as f:
            return f.read()
    raise TypeError(f"predict: profiles[{index}] must be a stage_profile dict (profile_stage's result) or the path of "
                    f"its dump, got {type(profile).__name__}")


def predict(profiles: Sequence[Any], schedule: Any, *, ranks: Optional[int] = None,
            microbatches: Optional[int] = None, virtual_stages: Optional[int] = None,
            lowering: Optional[str] = None, buffers: str = "stock", spare_sets: int = 0,
            optimizer_step: bool = True) -> dict:
    """The `pipeline-prediction` dump (schemas/pipeline-prediction.schema.json) as a dict.

    profiles: one stage_profile per stage (dicts from profile_stage, or paths of their dumps).
    schedule: a name remat-report knows ("1f1b", "interleaved-1f1b", "zbv-zero-bubble", ...) with
      ranks and microbatches, or a torch.distributed.pipelining schedule object built for the job
      (its own order, before its first step).
    lowering: how the order is lowered; default what PyTorch runs ("step" for gpipe and 1f1b,
      "runtime" for the others).
    buffers: "stock" (one receive-buffer set per microbatch) or "pooled" (pool_recv_buffers's
      rings, `spare_sets` spares each).
    optimizer_step: the step ends with an optimizer step whose state is held throughout.
    Raises ValueError naming what does not fit (a profile of another model or split, a
    schedule with another stage count, microbatches below 1).
    """
    if isinstance(profiles, (str, bytes, dict)) or not isinstance(profiles, Sequence):
        raise TypeError("predict: profiles must be a list of stage profiles, one per stage")
    texts = [_profile_text(p, i) for i, p in enumerate(profiles)]
    if isinstance(schedule, str):
        name = schedule.lower()
        if ranks is None or microbatches is None:
            raise ValueError(f"predict: schedule '{schedule}' needs ranks= and microbatches=")
        if isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < 1:
            raise ValueError(f"predict: microbatches must be an int of 1 or more, got {microbatches!r}")
        lowering = lowering or ("step" if name in _STEP_LOOPS else "runtime")
        orders, stage_to_rank = _pipeline_plan.lowered_order(name, ranks, microbatches, virtual_stages, lowering)
    else:
        from ._plan import layout_of  # torch is needed only for a schedule object

        if ranks is not None or microbatches is not None or virtual_stages is not None:
            raise ValueError("predict: a schedule object gives its own ranks, stages and microbatches; leave out "
                             "ranks=, microbatches= and virtual_stages=")
        layout = layout_of(schedule)
        orders, stage_to_rank, microbatches = layout.orders, layout.stage_to_rank, layout.microbatches
        name, lowering = layout.name, layout.lowering
    text = _pipeline_plan.predict_json(orders, stage_to_rank, microbatches, texts, schedule=name, lowering=lowering,
                                       buffers=buffers, spare_sets=spare_sets, optimizer_step=optimizer_step)
    return json.loads(text)
