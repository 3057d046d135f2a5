"""remat: activation checkpointing with save and recompute regions, for PyTorch.

    import remat

    def block(x):
        h = remat.region(attention, "attention", recompute=False)(x)   # kept for backward
        return remat.region(mlp, "mlp")(h)                             # recomputed in backward

    y = remat.checkpoint(region_name="layers.0")(block)(x)

Forward keeps only what backward needs from save regions; the rest is recomputed when backward
first needs it, and recompute stops as soon as every needed tensor exists. The runtime is C++
(the same as LibTorch programs use): it installs an autograd engine that handles only its own
saved-tensor hooks and hands everything else to PyTorch's, so saved_tensors_hooks,
save_on_cpu, torch.utils.checkpoint and detect_anomaly keep working around it.

The modules, one idea each: _extension (loading remat._C), _arguments (argument checks), _api
(checkpoint, region, name scopes), _saved_tensors_hooks (how kept tensors are held), _offload
(CpuOffload: kept tensors held in host memory), _state (state hooks), _trace (collect_trace),
_reporting (memory report of the running checkpoint), _saved_report (what is kept behind a
loss), _oom_saved_report (that report in an out-of-memory observer), _annotate (allocation
sites from PyTorch's snapshot), _replay (NeMo's record/replay channel), _memory (tagged memory,
sites, dumps), _oom_dump (an `oom` dump from PyTorch's snapshot), _oom (the observer that
writes it on PyTorch's own allocator, or the tagging allocator's own report), _compile
(checkpoints under torch.compile), _huggingface (Hugging Face models), _plans (budget plans:
profile_regions, use_plan), _fit (remat.fit: a step-peak budget kept by plans made as the
steps run), _tracking (track: categories and modules without annotations).
"""

from __future__ import annotations  # torch_remat's package exports the name too

from ._extension import _C  # noqa: F401  (raises an ImportError that says how to fix a missing extension)
from ._C import RecomputeStopped, RematError
from ._api import (checkpoint, is_placeholder, is_recomputing, name_scope, recompute_needs_tensor, region,
                   verify_recompute)
from ._saved_tensors_hooks import SavedTensorInfo, SavedTensorKind, current_saved_tensor_info, saved_tensors_hooks
from ._offload import CpuOffload
from ._state import RecomputeStateHook, cpu_rng_state_hook, cuda_rng_state_hook, generator_state_hook
from ._trace import collect_trace, trace_scope
from ._plans import Plan, RegionCost, RegionProfile, load_plan, use_plan
from ._profiling import profile_regions
from ._reporting import current_memory_report, format_current_memory_report, print_current_memory_report, save_for_backward
from ._saved_report import (format_saved_tensors_report, print_saved_tensors_report, saved_report, saved_tensors_report,
                            track_saved_tensors)
from ._replay import RecomputeReplay, RecomputeReplayRecorder
from ._memory import live_bytes, site, tag_cpu_tensors, write_dump
from ._oom import OomObserver, attach_oom_observer, oom_dump_from_snapshot
from ._oom_saved_report import discover_autograd_roots, format_oom_saved_tensors_report, oom_observer
from ._annotate import clear_memory_snapshot_cache, memory_snapshot_annotate
from ._fit import fit, unfit
from ._huggingface import unwrap_decoder_layers, wrap_decoder_layers
from ._tracking import Tracker, track, untrack

__all__ = [
    "checkpoint",
    "region",
    "recompute_needs_tensor",
    "is_recomputing",
    "is_placeholder",
    "name_scope",
    "saved_tensors_hooks",
    "current_saved_tensor_info",
    "SavedTensorInfo",
    "SavedTensorKind",
    "CpuOffload",
    "trace_scope",
    "discover_autograd_roots",
    "format_oom_saved_tensors_report",
    "oom_observer",
    "memory_snapshot_annotate",
    "clear_memory_snapshot_cache",
    "RecomputeStateHook",
    "cpu_rng_state_hook",
    "generator_state_hook",
    "cuda_rng_state_hook",
    "verify_recompute",
    "collect_trace",
    "current_memory_report",
    "format_current_memory_report",
    "print_current_memory_report",
    "save_for_backward",
    "saved_tensors_report",
    "format_saved_tensors_report",
    "print_saved_tensors_report",
    "saved_report",
    "track_saved_tensors",
    "RecomputeReplay",
    "RecomputeReplayRecorder",
    "tag_cpu_tensors",
    "site",
    "live_bytes",
    "write_dump",
    "attach_oom_observer",
    "oom_dump_from_snapshot",
    "OomObserver",
    "wrap_decoder_layers",
    "unwrap_decoder_layers",
    "profile_regions",
    "fit",
    "unfit",
    "use_plan",
    "load_plan",
    "RegionProfile",
    "RegionCost",
    "Plan",
    "RecomputeStopped",
    "RematError",
    "track",
    "untrack",
    "Tracker",
]
