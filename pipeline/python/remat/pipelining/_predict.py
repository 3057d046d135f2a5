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
_REMAT_RUNTIME = "remat::pipeline"
# The bounds remat-report predict takes: --ranks, --virtual-stages, --spare-sets and --slack up
# to 2^16, --microbatches up to 2^20 (the planner counts them in a C int).
_LARGEST_COUNT = 1 << 16
_LARGEST_MICROBATCHES = 1 << 20


def _count(name: str, value: Any, low: int, high: int, meaning: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"predict: {name} must be an int ({meaning}), got {type(value).__name__} {value!r:.80}")
    if not low <= value <= high:
        raise ValueError(f"predict: {name}={value} is out of range; give {meaning}, from {low} to {high}")
    return value


def _profile_text(profile: Any, index: int) -> str:
    if isinstance(profile, dict):
        return json.dumps(profile)
    if isinstance(profile, (str, os.PathLike)):
        try:
            with open(profile, encoding="utf-8") as f:
                return f.read()
        except FileNotFoundError:
            raise FileNotFoundError(f"predict: profiles[{index}]: no file {os.fspath(profile)!r}; give the path "
                                    "profile_stage(..., path=...) wrote, or profile_stage's result") from None
        except IsADirectoryError:
            raise IsADirectoryError(f"predict: profiles[{index}]: {os.fspath(profile)!r} is a directory; give each "
                                    "stage's profile file") from None
        except UnicodeDecodeError:
            raise ValueError(f"predict: profiles[{index}]: {os.fspath(profile)!r} is not UTF-8 text; give a "
                             "stage_profile dump (profile_stage(..., path=...))") from None
    hint = " (decode bytes first)" if isinstance(profile, (bytes, bytearray)) else ""
    raise TypeError(f"predict: profiles[{index}] must be a stage_profile dict (profile_stage's result) or the path of "
                    f"its dump{hint}, got {type(profile).__name__}")


def _runtime_of(texts: Sequence[str]) -> str:
    """The runtime the first profile names (a corrupt profile is refused by the prediction itself)."""
    try:
        first = json.loads(texts[0]) if texts else None
    except ValueError:
        return ""
    runtime = first.get("runtime") if isinstance(first, dict) else None
    return runtime if isinstance(runtime, str) else ""


def predict(profiles: Sequence[Any], schedule: Any, *, ranks: Optional[int] = None,
            microbatches: Optional[int] = None, virtual_stages: Optional[int] = None,
            lowering: Optional[str] = None, buffers: str = "stock", spare_sets: Optional[int] = None,
            slack: Optional[int] = None, optimizer_step: bool = True) -> dict:
    """The `pipeline-prediction` dump (schemas/pipeline-prediction.schema.json) as a dict.

    profiles: one stage_profile per stage (dicts from profile_stage, or paths of their dumps).
    schedule: a name remat-report knows ("1f1b", "interleaved-1f1b", "zbv-zero-bubble", ...) with
      ranks and microbatches, or a torch.distributed.pipelining schedule object built for the job
      (its own order, before its first step).
    lowering: how the order is lowered; default what the profiles' runtime runs, as
      `remat-report predict` chooses: PyTorch's "step" for gpipe and 1f1b and "runtime" for the
      others, remat::pipeline's "add-send-recv".
    buffers: "stock" (one receive-buffer set per microbatch) or "pooled" (the plan's rings).
    spare_sets: pooled, PyTorch's stages: spare sets per ring (pool_recv_buffers's slack; default 0).
    slack: pooled, remat::pipeline's stages: the runtime's slack (RuntimeOptions::slack; default 2).
    optimizer_step: the step ends with an optimizer step whose state is held throughout.
    Raises TypeError or ValueError naming the argument or what does not fit (a profile of another
    model or split, a schedule with another stage count, spare_sets for remat::pipeline's stages).
    """
    if isinstance(profiles, (str, bytes, dict)) or not isinstance(profiles, Sequence):
        raise TypeError("predict: profiles must be a list of stage profiles, one per stage")
    if not isinstance(buffers, str) or buffers not in ("stock", "pooled"):
        raise ValueError(f"predict: buffers is {buffers!r:.80}; give \"stock\" (one set per microbatch) or "
                         "\"pooled\" (the plan's rings)")
    if not isinstance(optimizer_step, bool):
        raise TypeError(f"predict: optimizer_step must be True or False, got {type(optimizer_step).__name__} "
                        f"{optimizer_step!r:.80}")
    if lowering is not None and not isinstance(lowering, str):
        raise TypeError(f"predict: lowering must be a str or None, got {type(lowering).__name__}")
    texts = [_profile_text(p, i) for i, p in enumerate(profiles)]
    remat_runtime = _runtime_of(texts) == _REMAT_RUNTIME
    if spare_sets is not None:
        _count("spare_sets", spare_sets, 0, _LARGEST_COUNT, "spare buffer sets per ring")
        if remat_runtime:
            raise ValueError("predict: spare_sets sizes remat.pipelining's rings; these profiles are of "
                             "remat::pipeline stages, whose rings take slack= (RuntimeOptions::slack)")
    if slack is not None:
        _count("slack", slack, 0, _LARGEST_COUNT, "the runtime's spare sets per ring")
        if not remat_runtime:
            raise ValueError("predict: slack sizes remat::pipeline's rings; these profiles are of "
                             "torch.distributed.pipelining stages, whose pooled rings take spare_sets=")
    if isinstance(schedule, str):
        name = schedule.lower()
        if ranks is None or microbatches is None:
            raise ValueError(f"predict: schedule '{schedule}' needs ranks= and microbatches=")
        _count("ranks", ranks, 1, _LARGEST_COUNT, "pipeline ranks")
        _count("microbatches", microbatches, 1, _LARGEST_MICROBATCHES, "microbatches per step")
        if virtual_stages is not None:
            _count("virtual_stages", virtual_stages, 1, _LARGEST_COUNT, "stages per rank")
        if lowering is None:
            if remat_runtime:
                lowering = "add-send-recv"  # PipelineRuntime runs lower_schedule's order
            else:
                lowering = "step" if name in _STEP_LOOPS else "runtime"
        orders, stage_to_rank = _pipeline_plan.lowered_order(name, ranks, microbatches, virtual_stages, lowering)
    else:
        from ._plan import layout_of  # torch is needed only for a schedule object

        if ranks is not None or microbatches is not None or virtual_stages is not None:
            raise ValueError("predict: a schedule object gives its own ranks, stages and microbatches; leave out "
                             "ranks=, microbatches= and virtual_stages=")
        layout = layout_of(schedule, pooling=False)  # the order is the same after step() has run
        orders, stage_to_rank, microbatches = layout.orders, layout.stage_to_rank, layout.microbatches
        name, lowering = layout.name, layout.lowering
    text = _pipeline_plan.predict_json(orders, stage_to_rank, microbatches, texts, schedule=name, lowering=lowering,
                                       buffers=buffers, spare_sets=0 if spare_sets is None else spare_sets,
                                       slack=2 if slack is None else slack, optimizer_step=optimizer_step)
    return json.loads(text)
